"""``specls bench [decode|lsp|real|team|edit]``: the benchmarks a user runs on their own machine.

Each kind lives in its own module defining ``register(subparsers)``; ``specls bench`` alone runs
``decode``. Research-only benchmarks (GPU pass costs, quantization sweeps, FIM layouts) live in the
repository's bench/lab/ and are not shipped."""

from __future__ import annotations

import argparse
import importlib
from typing import Any


def int_list(text: object) -> tuple[int, ...]:
    """A comma-separated option as ints (``"64, 32,"`` -> (64, 32)); ValueError on a non-integer.

    >>> int_list("64, 32,")
    (64, 32)
    """
    return tuple(int(x) for x in str(text).split(",") if x.strip())


_KINDS = ("decode", "lsp", "real", "team", "edit")


def register(sub: Any) -> None:
    bench = sub.add_parser("bench", help="benchmarks (default: decode)")
    kinds = bench.add_subparsers(dest="bench_kind", metavar="KIND")
    registered = []
    for kind in _KINDS:
        try:
            module = importlib.import_module(f"specls.bench.{kind}")
        except ModuleNotFoundError as exc:
            if exc.name and f"specls.bench.{kind}".startswith(exc.name):
                continue
            raise
        module.register(kinds)
        registered.append(kind)

    def default(args: argparse.Namespace) -> int:
        if "decode" not in registered:
            bench.print_help()
            return 2
        # `specls bench` with no kind: parse again as `specls bench decode ...`
        from specls.cli import build_parser

        decode_args = build_parser().parse_args(["bench", "decode"])
        decode_args.verbose = args.verbose
        return int(decode_args.func(decode_args) or 0)

    bench.set_defaults(func=default)
