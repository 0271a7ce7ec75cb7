"""``python -m bench.lab.gpu``: options, settings from them, and the command."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from bench.lab.gpu.predict import load_acceptance
from bench.lab.gpu.report import render_markdown, write_report
from bench.lab.gpu.run import run_bench
from bench.lab.gpu.shapes import DEFAULT_ALPHAS, METHODS, SHAPES, BenchError, GpuBenchSettings
from specls.api import EngineError

DESCRIPTION = (
    "What speculative decoding buys on a GPU, predicted from measured pass costs and checked against "
    "the real decode loop."
)


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _dims(text: str) -> tuple[int, ...]:
    dims = _ints(text)
    if len(dims) != 5 or any(d < 1 for d in dims):
        raise argparse.ArgumentTypeError(f"expected HIDDEN,LAYERS,HEADS,KV_HEADS,FFN, got {text!r}")
    return dims


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--shape",
        choices=sorted(SHAPES),
        default="full",
        help="full: Qwen2.5-Coder-1.5B target / 0.5B draft shapes; small: tiny CPU dry run",
    )
    p.add_argument("--arch", choices=("qwen2", "llama"), default=None, help="override the preset's layout")
    p.add_argument(
        "--target-dims",
        type=_dims,
        default=None,
        metavar="H,L,A,KV,FFN",
        help="explicit target dims: hidden,layers,heads,kv_heads,intermediate",
    )
    p.add_argument(
        "--draft-dims", type=_dims, default=None, metavar="H,L,A,KV,FFN", help="explicit draft dims"
    )
    p.add_argument("--vocab", type=int, default=None, help="vocab size of both models (>= 263)")
    p.add_argument(
        "--backend",
        choices=("ort", "torch"),
        default="ort",
        help="ort: export + specls runtime (default); torch: transformers in torch, no export",
    )
    p.add_argument("--dtype", choices=("auto", "fp32", "fp16"), default="auto", help="auto: fp16 on CUDA")
    p.add_argument("--provider", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--require-cuda", action="store_true", help="fail unless the models run on CUDA")
    p.add_argument("--threads", type=int, default=1, help="CPU threads for the runtime (0 = default)")
    p.add_argument("--past-lengths", type=_ints, default=None, help="past lengths L (default: preset's)")
    p.add_argument("--ns", type=_ints, default=None, help="new-token counts N (must include 1)")
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument(
        "--acceptance",
        type=Path,
        default=None,
        help="JSON with acceptance rates (`specls bench decode --json` output or {method: a})",
    )
    p.add_argument("--alphas", type=_floats, default=None, help="acceptance rates for both methods")
    p.add_argument("--loop-alphas", type=_floats, default=(0.5, 0.8), help="rates forced in the real loop")
    p.add_argument("--loop-repeats", type=int, default=2)
    p.add_argument("--gen-tokens", type=int, default=None, help="new tokens per loop run")
    p.add_argument("--prompt-tokens", type=int, default=0, help="loop prompt length (0 = smallest L)")
    p.add_argument("--no-loop", action="store_true", help="skip the real decode loop")
    p.add_argument(
        "--batch-sizes",
        type=_ints,
        default=(1, 2, 4, 8),
        help="batched-pass sweep (torch backend): sequences B per target forward (must include 1)",
    )
    p.add_argument("--batch-ns", type=_ints, default=(1, 6), help="batched-pass sweep: new tokens N")
    p.add_argument(
        "--batch-past-length", type=int, default=0, help="batched-pass sweep: L (0 = smallest past length)"
    )
    p.add_argument("--no-batched", action="store_true", help="skip the batched-pass sweep")
    p.add_argument("--verify-export", action="store_true", help="check ORT vs torch after each export")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", type=Path, default=None, help="keep checkpoints/exports here (default: temp)")
    p.add_argument(
        "--ort-fusions",
        choices=("auto", "cpu", "cuda", "none"),
        default=None,
        help="export with ONNX Runtime fusions (default: the export's own default)",
    )
    p.add_argument(
        "--reuse", action="store_true", help="reuse checkpoints/exports already in --work (same shape)"
    )
    p.add_argument(
        "--out", type=Path, default=None, help="write results-<date>-<gpu>-<backend>.json/.md here"
    )
    p.add_argument("--json", action="store_true", help="print the JSON report instead of the tables")


def settings_from_args(args: argparse.Namespace) -> GpuBenchSettings:
    preset = SHAPES[args.shape]
    target, draft = preset.target, preset.draft
    if args.target_dims:
        h, n, a, kv, ff = args.target_dims
        target = replace(target, hidden=h, layers=n, heads=a, kv_heads=kv, intermediate=ff)
    if args.draft_dims:
        h, n, a, kv, ff = args.draft_dims
        draft = replace(draft, hidden=h, layers=n, heads=a, kv_heads=kv, intermediate=ff)
    if args.vocab:
        target, draft = replace(target, vocab=args.vocab), replace(draft, vocab=args.vocab)
    if args.arch:
        target, draft = replace(target, arch=args.arch), replace(draft, arch=args.arch)
    custom = bool(args.target_dims or args.draft_dims or args.vocab or args.arch)
    if args.acceptance is not None:
        found = load_acceptance(args.acceptance)
        alphas = tuple((m, found.get(m, DEFAULT_ALPHAS[m])) for m in METHODS)
        source = f"{args.acceptance} ({', '.join(sorted(found))})"
    elif args.alphas:
        alphas = tuple((m, tuple(args.alphas)) for m in METHODS)
        source = "--alphas"
    else:
        alphas = tuple(DEFAULT_ALPHAS.items())
        source = "default set"
    return GpuBenchSettings(
        target=target,
        draft=draft,
        shape_name=args.shape + (" (custom dims)" if custom else ""),
        backend=args.backend,
        dtype=args.dtype,
        provider=args.provider,
        require_cuda=args.require_cuda,
        threads=args.threads,
        past_lengths=args.past_lengths or preset.past_lengths,
        ns=tuple(sorted(set(args.ns or preset.ns))),
        warmup=preset.warmup if args.warmup is None else args.warmup,
        repeats=preset.repeats if args.repeats is None else args.repeats,
        alphas=alphas,
        alpha_source=source,
        loop=not args.no_loop,
        loop_alphas=tuple(args.loop_alphas),
        loop_repeats=max(1, args.loop_repeats),
        gen_tokens=args.gen_tokens or preset.gen_tokens,
        prompt_tokens=args.prompt_tokens,
        batched=not args.no_batched,
        batch_sizes=tuple(sorted(set(args.batch_sizes))),
        batch_ns=tuple(sorted(set(args.batch_ns))),
        batch_past_length=args.batch_past_length,
        seed=args.seed,
        verify_export=args.verify_export,
        reuse=args.reuse,
        ort_fusions=args.ort_fusions,
        work_dir=args.work,
        out_dir=args.out,
    )


def run_command(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    try:
        settings = settings_from_args(args)
        report = run_bench(
            settings,
            progress=lambda msg: print(
                f"[{time.perf_counter() - t0:7.1f}s] {msg}", file=sys.stderr, flush=True
            ),
        )
    except (BenchError, EngineError) as exc:  # EngineError: export/load failures, with their reason
        print(f"bench.lab.gpu: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(render_markdown(report))
    if settings.out_dir is not None:
        js, md = write_report(report, settings.out_dir)
        print(f"wrote {js} and {md}", file=sys.stderr)
    print(f"total {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    ok = report.greedy_matches and all(m.matches_greedy for m in report.loop)
    if not ok:
        print("bench.lab.gpu: the loop's output differs from plain greedy", file=sys.stderr)
    return 0 if ok else 1


def build_parser() -> argparse.ArgumentParser:
    """The command's options; ``func`` is ``run_command``."""
    parser = argparse.ArgumentParser(prog="python -m bench.lab.gpu", description=DESCRIPTION)
    parser.add_argument("-v", "--verbose", action="count", default=0)
    add_arguments(parser)
    parser.set_defaults(func=run_command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return run_command(args)


if __name__ == "__main__":
    sys.exit(main())
