"""The ``specls`` command line. Each subcommand lives next to the code it drives and registers itself
here through ``register(subparsers)``; heavy imports (onnxruntime, torch) happen inside the command."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

# module path -> it defines register(subparsers) adding its subcommands, each with set_defaults(func=...)
_COMMAND_MODULES = (
    "specls.models.cli",  # export, train, eval
    "specls.models_cmd",  # models [list|pull|rm]
    "specls.datastore_cmd",  # datastore [build|list]
    "specls.head_cmd",  # head [train|show]
    "specls.complete_cmd",  # complete
    "specls.next_edit_cmd",  # next-edit
    "specls.bench",  # bench [decode|lsp|real|team]
    "specls.lsp.cli",  # serve, stats
    "specls.team.cli",  # serve-engine
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specls", description="specls: code completion by speculative decoding on ONNX Runtime"
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:  # a command module not written yet, or an optional extra
            if exc.name and name.startswith(exc.name):
                continue
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    from specls.team.logs import install_rate_limit

    for handler in logging.getLogger().handlers:  # warnings a client can trigger per message
        install_rate_limit(handler)
    # pygls logs every message it sends and receives at INFO (code, and initialize's token): never
    logging.getLogger("pygls").setLevel(max(level, logging.WARNING))
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        rc = func(args)
    except KeyboardInterrupt:
        return 130
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
