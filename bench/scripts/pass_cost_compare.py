"""What does a target pass of M rows cost in each of several exports of one model? Loads every
model dir, prefills the same prompt in each, then times passes of M rows after it (truncated back
each time), the dirs interleaved round by round so that a host's drift hits them alike; prints the
median and the fastest of each.

    .venv/bin/python bench/scripts/pass_cost_compare.py OLD_DIR NEW_DIR [--threads 2] [--rounds 6]

A diagnostic for a change to the exported graph (run it alone on the machine), not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from specls.models.runtime import OnnxCausalLM, OrtKVCache, RuntimeSettings

ROWS = (1, 2, 4, 8, 16, 32, 64, 128)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="+", help="specls model directories")
    p.add_argument("--prompt", type=int, default=600, help="prompt tokens before the timed passes")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=6)
    args = p.parse_args()
    text = Path(json.__file__).with_name("decoder.py").read_text() * 3
    settings = RuntimeSettings(threads=args.threads, provider="cpu")
    lms = {m: OnnxCausalLM(m, settings) for m in args.models}
    ids = next(iter(lms.values())).tokenizer.encode(text)
    caches: dict[str, OrtKVCache] = {}
    for m, lm in lms.items():
        cache = lm.new_cache()
        cache.append(ids[: args.prompt])
        caches[m] = cache
    times: dict[str, dict[int, list[float]]] = {m: {r: [] for r in ROWS} for m in lms}
    for _ in range(args.rounds):
        for m, cache in caches.items():
            for rows in ROWS:
                t0 = time.perf_counter()
                cache.forward(ids[args.prompt : args.prompt + rows])
                times[m][rows].append(time.perf_counter() - t0)
                cache.truncate(args.prompt)
    print(
        f"pass ms after a {args.prompt}-token prompt, {args.threads} threads, {args.rounds} rounds: median (fastest)"
    )
    print("| model | " + " | ".join(f"M={r}" for r in ROWS) + " |")
    print("|---|" + "---|" * len(ROWS))
    for m in lms:
        cells = [f"{statistics.median(v) * 1e3:.1f} ({min(v) * 1e3:.1f})" for v in times[m].values()]
        print(f"| {Path(m).name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
