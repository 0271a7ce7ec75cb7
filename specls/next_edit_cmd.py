"""``specls next-edit FILE --line L --character C [--before PATH]``: the next edit the model suggests
near a position (0-based line, character in UTF-16 code units). ``--before`` is FILE as it was before
the recent edits: the history the model sees is its diff to FILE. Prints the suggestion as a unified
diff (nothing to suggest: a line on stderr saying why); ``--json`` prints one object instead (edits in
FILE's coordinates, UTF-16; the region; the rewritten region; tokens, target passes and times);
``--stats`` adds a speculation summary on stderr."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specls.next_edit.edits import Region


def _err(message: str) -> None:
    sys.stderr.write(f"specls next-edit: {message}\n")


def register(sub: Any) -> None:
    from specls.complete_cmd import add_output_arguments, add_position_arguments
    from specls.model_options import add_model_arguments

    p = sub.add_parser("next-edit", help="suggest the next edit near a position (prints it as a diff)")
    add_position_arguments(p)
    p.add_argument("--before", type=Path, metavar="PATH", help="FILE before the recent edits (the history)")
    add_model_arguments(p)  # --model, --draft, --no-draft, --no-lookup, --no-speculation, ... (one place)
    p.add_argument("--max-tokens", type=int, default=None, help="budget of the rewrite (default: by region)")
    p.add_argument("--layout", default=None, help="the prompt layout (default: the model's)")
    add_output_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from specls.api import EngineError, NextEditRequest
    from specls.complete_cmd import format_stats, load_engine, read_at, read_text
    from specls.engine import EngineSettings
    from specls.model_options import engine_settings
    from specls.next_edit.edit_diff import diffs_between

    path: Path = args.file
    at = read_at(path, args.line, args.character, _err)
    before = read_text(args.before, _err) if args.before is not None else None
    if at is None or (args.before is not None and before is None):
        return 2
    text = at[0]
    if args.max_tokens is not None and args.max_tokens <= 0:
        _err("--max-tokens must be positive")
        return 2
    engine = load_engine(engine_settings(vars(args), EngineSettings()), _err)
    if engine is None:
        return 2
    doc_id = path.resolve().as_uri()
    engine.update_document(doc_id, text)
    history = tuple(diffs_between(path.name, before, text)) if before is not None else ()
    request = NextEditRequest(
        doc_id,
        text,
        args.line,
        args.character,
        history,
        max_tokens=args.max_tokens,
        path=path.name,
        layout=args.layout,
    )
    try:
        result = engine.next_edit(request)
    except EngineError as exc:
        _err(str(exc))
        return 2
    data = result.to_dict()
    if args.json:
        sys.stdout.write(json.dumps(data) + "\n")
    elif result.edits:
        sys.stdout.write(_diff(path.name, text, result.region, result.rewritten or ""))
    else:
        sys.stderr.write(f"no edit ({result.dropped})\n")
    if args.stats:
        sys.stderr.write(format_stats(data) + "\n")
    return 0


def _diff(name: str, text: str, region: Region, rewritten: str) -> str:
    """The suggestion as a unified diff of the region (FILE's line numbers)."""
    from specls.next_edit.edit_diff import EditDiff
    from specls.next_edit.edits import normalize_rewrite, region_parts

    old = region_parts(text, region)[1]
    return EditDiff(name, old, normalize_rewrite(old, rewritten), region.start_line).unified()
