"""Sweep llama-server's speculative configurations on bench real's points: which one is llama.cpp's best.

``specls bench real`` runs a few llama.cpp configurations (``specls.bench.real.llama_configs``); this
script times many more on the same seeded points and the same prompt token ids (specls's FIM prompts,
built by a plain engine on ``--model``), one server at a time, so that the ones the benchmark keeps
are the fastest there are, not llama.cpp's defaults. One line per configuration: decode tok/s as
bench real counts it (tokens / ``predicted_ms``), drafted and accepted tokens, and how many points
gave llama.cpp's own plain output.

    .venv/bin/python bench/scripts/llama_ngram_sweep.py --model DIR --gguf-target T.gguf --gguf-draft D.gguf \\
        --llama-server BIN --threads 2 plain ngram-simple ngram-map-k4v-n4m16 draft-n3p0.8

Names: ``plain``, ``ngram-simple``, ``ngram-mod``, ``ngram-cache`` (llama.cpp's defaults),
``ngram-simple-nNmM``, ``ngram-map-k-nNmM[hH]``, ``ngram-map-k4v-nNmM[hH]`` (lookup n-gram N, draft
M tokens, min hits H) and ``draft-nNpP`` (``-md`` with ``--spec-draft-n-max N --spec-draft-p-min P``).
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

from specls.bench.decode import make_points, source_files
from specls.bench.real import LlamaConfig, LlamaError, LlamaServer, Run, _specls_run
from specls.engine import EngineSettings, OnnxEngine


def config_args(name: str, gguf_draft: str, threads: int) -> tuple[str, ...]:
    """llama-server arguments for a configuration name (see the module docstring)."""
    if name == "plain":
        return ()
    if name in ("ngram-simple", "ngram-mod", "ngram-cache"):
        return ("--spec-type", name)
    m = re.fullmatch(r"ngram-(simple|map-k|map-k4v)-n(\d+)m(\d+)(?:h(\d+))?", name)
    if m:
        kind, n, size_m, hits = m.group(1), m.group(2), m.group(3), m.group(4)
        args = (
            "--spec-type",
            f"ngram-{kind}",
            f"--spec-ngram-{kind}-size-n",
            n,
            f"--spec-ngram-{kind}-size-m",
            size_m,
        )
        return (*args, f"--spec-ngram-{kind}-min-hits", hits) if hits else args
    m = re.fullmatch(r"draft-n(\d+)p([0-9.]+)", name)
    if m:
        t = str(threads)
        return (
            *("-md", gguf_draft, "--spec-type", "draft-simple", "-td", t, "-tbd", t),
            *("--spec-draft-n-max", m.group(1), "--spec-draft-p-min", m.group(2)),
        )
    raise ValueError(f"unknown configuration {name!r}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="specls target dir (builds the prompts)")
    p.add_argument("--gguf-target", required=True)
    p.add_argument("--gguf-draft", required=True)
    p.add_argument("--llama-server", required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--n", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("configs", nargs="+")
    a = p.parse_args()
    configs = {name: config_args(name, a.gguf_draft, a.threads) for name in a.configs}
    points = make_points(source_files(None), a.n, a.seed)
    engine = OnnxEngine(
        EngineSettings(
            model=a.model, threads=a.threads, speculation=False, lru_size=0, completion_reuse=False
        )
    )
    engine.load()
    prompts = []
    for i, point in enumerate(points):
        _specls_run(engine, point, f"p{i}", 1, "64")
        prompts.append(list(engine.last_prompt))
    del engine
    print(f"{len(prompts)} prompts, tokens {[len(x) for x in prompts]}, {a.threads} thread(s)", flush=True)
    log_dir = Path(tempfile.mkdtemp(prefix="llama-sweep-"))
    reference: list[Run] | None = None
    for name, extra in configs.items():
        server = LlamaServer(
            a.llama_server, a.gguf_target, LlamaConfig(name, extra), a.threads, 4096, 180, 300, log_dir
        )
        try:
            server.start()
            server.client.complete(prompts[0], 4)  # warm-up
            runs = [server.client.complete(x, a.max_tokens) for x in prompts]
        except LlamaError as exc:
            print(f"{name:22s} failed: {exc}", flush=True)
            continue
        finally:
            server.stop()
        if name == "plain":
            reference = runs
        tokens = sum(len(r.tokens) for r in runs)
        decode_ms = sum(r.decode_ms for r in runs)
        same = (
            "-"
            if reference is None
            else str(sum(x.tokens == y.tokens for x, y in zip(runs, reference, strict=True)))
        )
        print(
            f"{name:22s} tokens {tokens} decode {1e3 * tokens / decode_ms:6.2f} tok/s  "
            f"drafted {sum(r.drafted for r in runs)} accepted {sum(r.accepted for r in runs)}  "
            f"identical-to-plain {same}/{len(runs)}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
