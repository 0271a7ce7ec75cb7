"""Do a graph's logits depend on how its tokens were split into passes, and what does padding odd
passes cost? Feeds the same tokens after a prompt in several splits (one token per pass, odd verify
passes, a split prefill) with ``RuntimeSettings.even_passes`` off and on, and prints each split's max
|logit difference| from the reference (the prompt, then pairs), then the time of a pass of M tokens.

    .venv/bin/python bench/scripts/pass_rows.py ~/.cache/specls-real/onnx/qwen-1.5b-int4-b64 [--threads 1]

ORT 1.32, this CPU, the int4 (block 64, accuracy_level 4) Qwen2.5-Coder graphs: off, every split with
an odd pass differs by 0.3-0.5; on, all are bitwise equal (0.0), prefill splits included. The cause:
MatMulNBits' int8 path computes rows in pairs and the last row of an odd pass alone (compare
bench/scripts/matmulnbits_rows.py), and GroupQueryAttention has its own one-token path (bench/scripts/gqa_rows.py);
every pass of 2+ tokens computes each row the same way. A diagnostic (run it on an otherwise idle
machine), not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
from specls.models.runtime import OnnxCausalLM, OrtKVCache, RuntimeSettings

SPLITS = ((1,) * 12, (3, 3, 3, 3), (5, 7), (12,), (1, 1, 2, 8))


def feed(lm: OnnxCausalLM, ids: list[int], prefill: tuple[int, ...], split: tuple[int, ...]) -> np.ndarray:
    """The logits of the tokens after sum(prefill), fed in passes of ``split``: [sum(split), vocab]."""
    cache: OrtKVCache = lm.new_cache()
    at = 0
    for n in prefill:
        cache.append(ids[at : at + n])
        at += n
    rows = []
    for n in split:
        rows.append(cache.forward(ids[at : at + n]))
        at += n
    return np.concatenate(rows)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="a specls model directory")
    p.add_argument("--prompt", type=int, default=300, help="prompt tokens")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    text = (
        Path(json.__file__).with_name("decoder.py").read_text()
        + Path(json.__file__).with_name("encoder.py").read_text()
    )
    for even in (False, True):
        lm = OnnxCausalLM(args.model, RuntimeSettings(threads=args.threads, provider="cpu", even_passes=even))
        ids = lm.tokenizer.encode(text)[: args.prompt + 12]
        ref = feed(lm, ids, (args.prompt,), (2,) * 6)
        cells = [
            f"{'+'.join(map(str, s)) if len(s) < 6 else f'{s[0]}x{len(s)}'}: {np.abs(feed(lm, ids, (args.prompt,), s) - ref).max():.1e}"
            for s in SPLITS
        ]
        half = args.prompt // 2 + 1  # an odd first prefill run
        cells.append(
            f"prefill {half}+{args.prompt - half}: {np.abs(feed(lm, ids, (half, args.prompt - half), (2,) * 6) - ref).max():.1e}"
        )
        print(f"even_passes={even}: max |logit - reference|  " + "  ".join(cells), flush=True)
        cache = lm.new_cache()
        cache.append(ids[: args.prompt])
        cells = []
        for m in (1, 2, 3, 4, 6, 8):
            times = []
            for _ in range(7):
                t0 = time.perf_counter()
                cache.forward_greedy(ids[args.prompt : args.prompt + m])
                times.append(time.perf_counter() - t0)
                cache.truncate(args.prompt)
            cells.append(f"M{m} {statistics.median(times) * 1e3:.1f}")
        print(f"even_passes={even}: pass ms  " + "  ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
