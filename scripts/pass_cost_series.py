"""What a target pass of 2, 4 and 10 rows costs over a minute, printed as it goes: whether this host's
pass costs, and so the drafting policy's calibration (``decoder.planned.calibrate``), hold still.

Each line: two interleaved rounds of the three shapes after a 32-token context (ms), then the 4-row
pass over the 2-row one (the fastest of the two rounds). The same ``CausalLM`` calls as ``calibrate``.
On the Zen 5 host (bench/README.md "Runs 33-35"), int8 Qwen 1.5B, 2 threads: mostly 44-45 / 50-51 /
66-68 ms (4 rows 1.08-1.19x), and for ~10 s at a time 35-37 / 49-51 / 72-76 ms (1.36-1.48x).

    .venv/bin/python scripts/pass_cost_series.py ~/.cache/specls-real/onnx/qwen-1.5b-int8 [--threads 2]

A diagnostic (run it on an otherwise idle machine), not a test.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from specls.models.loader import load_model
from specls.models.runtime import RuntimeSettings

SHAPES = (2, 4, 10)  # rows: a one-token pass (padded to two), and two verify passes
PREFIX = 32  # calibrate()'s context


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a specls model directory")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=50.0)
    args = ap.parse_args(argv)
    model = load_model(args.model, RuntimeSettings(threads=args.threads))
    ids = [(7 * i + 3) % model.vocab_size for i in range(PREFIX + max(SHAPES))]
    cache = model.new_cache()
    cache.forward(ids[:PREFIX])

    def timed(n: int) -> float:
        t0 = time.perf_counter()
        cache.forward(ids[PREFIX : PREFIX + n])
        elapsed = (time.perf_counter() - t0) * 1000
        cache.truncate(PREFIX)
        return elapsed

    for n in SHAPES:  # warm-up: a shape's first pass also pays ORT's allocations
        timed(n)
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        a = [timed(n) for n in SHAPES]
        b = [timed(n) for n in SHAPES]
        ratio = min(a[1], b[1]) / min(a[0], b[0])
        print(" ".join(f"{x:5.1f}" for x in a + b), f" 4 rows / 2 rows {ratio:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
