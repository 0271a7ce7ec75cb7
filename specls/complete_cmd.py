"""``specls complete FILE --line L --character C``: one completion at an LSP-style position (0-based line,
character in UTF-16 code units), printed to stdout; ``--stats`` adds a speculation summary on stderr,
``--json`` prints one JSON object instead."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from collections.abc import Callable

    from specls.engine import OnnxEngine
    from specls.engine_settings import EngineSettings

_LINE_BREAK = re.compile(r"\r\n|\r|\n")


class PositionError(ValueError):
    """A line/character outside the document."""


def offset_of(text: str, line: int, character: int) -> int:
    """The str index of an LSP position (lines split at \\n, \\r\\n or \\r; character counted in UTF-16
    code units). Raises PositionError when the position is outside the text or inside a surrogate
    pair."""
    if line < 0 or character < 0:
        raise PositionError(f"position {line}:{character} is negative")
    start = 0
    for _ in range(line):
        m = _LINE_BREAK.search(text, start)
        if m is None:
            raise PositionError(f"line {line} is past the end of the file ({_count_lines(text)} lines)")
        start = m.end()
    m = _LINE_BREAK.search(text, start)
    end = m.start() if m is not None else len(text)
    units = 0
    i = start
    while units < character:
        if i >= end:
            raise PositionError(
                f"character {character} is past the end of line {line} ({units} UTF-16 units)"
            )
        units += 2 if ord(text[i]) > 0xFFFF else 1
        i += 1
    if units != character:
        raise PositionError(f"character {character} of line {line} splits a surrogate pair")
    return i


def _count_lines(text: str) -> int:
    return len(_LINE_BREAK.findall(text)) + 1


def _err(message: str) -> None:
    sys.stderr.write(f"specls complete: {message}\n")


def register(sub: Any) -> None:
    from specls.model_options import add_model_arguments

    p = sub.add_parser("complete", help="complete a file at a position (prints the completion)")
    add_position_arguments(p)
    add_model_arguments(p)  # --model, --preset, --draft, --no-draft, --no-lookup, --threads, ... (one place)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    add_output_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from specls.api import CompletionRequest, EngineError
    from specls.engine import EngineSettings, result_to_dict
    from specls.model_options import engine_settings

    path: Path = args.file
    at = read_at(path, args.line, args.character, _err)
    if at is None:
        return 2
    text, offset = at
    if args.max_tokens < 0 or args.temperature < 0:
        _err("--max-tokens and --temperature must not be negative")
        return 2
    settings = engine_settings(vars(args), EngineSettings(temperature=args.temperature, seed=args.seed))
    engine = load_engine(settings, _err)
    if engine is None:
        return 2
    doc_id = path.resolve().as_uri()
    engine.update_document(doc_id, text)
    request = CompletionRequest(
        doc_id=doc_id, prefix=text[:offset], suffix=text[offset:], max_tokens=args.max_tokens
    )
    try:
        result = engine.complete(request)
    except EngineError as exc:
        _err(str(exc))
        return 2
    if args.json:
        sys.stdout.write(json.dumps(result_to_dict(result)) + "\n")
    else:
        sys.stdout.write(result.text)
        if not result.text.endswith("\n"):
            sys.stdout.write("\n")
        sys.stdout.flush()
    if args.stats:
        sys.stderr.write(format_stats(result_to_dict(result)) + "\n")
        policy = engine.stats().get("drafting_policy")
        if isinstance(policy, dict) and policy.get("choices"):
            sys.stderr.write(format_policy(policy) + "\n")
    return 0


def add_position_arguments(p: argparse.ArgumentParser) -> None:
    """FILE and the LSP-style position in it: the arguments of ``complete`` and ``next-edit``."""
    p.add_argument("file", type=Path)
    p.add_argument("--line", type=int, required=True, help="0-based line")
    p.add_argument("--character", type=int, required=True, help="0-based character (UTF-16 code units)")


def add_output_arguments(p: argparse.ArgumentParser) -> None:
    """How ``complete`` and ``next-edit`` print their answer: ``--json``, ``--stats``."""
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--stats", action="store_true", help="speculation summary on stderr")


def read_text(path: Path, err: Callable[[str], None]) -> str | None:
    """``path``'s text (UTF-8, bad bytes replaced), or None once ``err`` is told why it cannot be read."""
    try:
        return path.read_bytes().decode("utf-8", errors="replace")
    except OSError as exc:
        err(f"cannot read {path}: {exc.strerror or exc}")
        return None


def read_at(path: Path, line: int, character: int, err: Callable[[str], None]) -> tuple[str, int] | None:
    """``path``'s text and the str index of a position in it, or None once ``err`` is told what is wrong."""
    text = read_text(path, err)
    if text is None:
        return None
    try:
        return text, offset_of(text, line, character)
    except PositionError as exc:
        err(f"{path}: {exc}")
        return None


def load_engine(settings: EngineSettings, err: Callable[[str], None]) -> OnnxEngine | None:
    """The in-process engine, loaded (a model being prepared reported on stderr), or None once ``err``
    is told why it cannot load."""
    from specls.api import EngineError
    from specls.engine import OnnxEngine

    engine = OnnxEngine(settings)
    try:
        engine.load(PreparingReport(sys.stderr))
    except EngineError as exc:
        err(str(exc))
        return None
    return engine


class PreparingReport:
    """The load's progress on ``stream`` while a model given by name is prepared (downloaded,
    converted): a line when the step changes, at most one every ``interval`` seconds within a step.
    Loading itself is quiet: it takes seconds."""

    def __init__(self, stream: TextIO, interval: float = 5.0) -> None:
        self.stream = stream
        self.interval = interval
        self._stage: str | None = None
        self._last = -float("inf")

    def __call__(self, message: str, fraction: float) -> None:
        from specls.models.progress import preparing_stage

        stage = preparing_stage(message)
        now = time.monotonic()
        if stage is None or (stage == self._stage and now - self._last < self.interval):
            return
        self.stream.write(f"specls: {message}\n")
        self.stream.flush()
        self._stage, self._last = stage, now


def format_policy(p: dict[str, Any]) -> str:
    """The drafting policy's choices and what it measured, one line."""
    choices = ", ".join(f"{k} {v}" for k, v in sorted(p["choices"].items()))
    verify = p.get("verify_cost") or []
    return (
        f"policy passes: {choices}; costs per target pass: draft step {p.get('draft_step_cost')}, "
        f"catch-up {p.get('draft_catchup_cost')}/token, verify of {len(verify)} tokens "
        f"{verify[-1] if verify else '-'}x (learned from {p.get('costs_learned_from_passes', 0)} passes)"
    )


def format_stats(r: dict[str, Any]) -> str:
    """A short human summary of one completion's speculation numbers."""
    passes = int(r.get("target_passes") or 0)
    tokens = int(r.get("tokens") or 0)
    drafted = int(r.get("drafted") or 0)
    accepted = int(r.get("accepted") or 0)
    lines = [
        f"tokens {tokens} in {passes} target passes = {tokens / passes if passes else 0.0:.2f} tokens/pass"
        f" (stop: {r.get('stop_reason')})",
        f"drafted {drafted}, accepted {accepted} ({100.0 * accepted / drafted if drafted else 0.0:.0f}%)",
    ]
    for name, d in sorted((r.get("per_drafter") or {}).items()):
        dr, ac = int(d.get("drafted", 0)), int(d.get("accepted", 0))
        lines.append(f"  {name:8s} drafted {dr:4d} accepted {ac:4d} ({100.0 * ac / dr if dr else 0.0:.0f}%)")
    decode_ms = float(r.get("decode_ms") or 0.0)
    lines.append(
        f"prefill {r.get('prefill_tokens')} tokens {float(r.get('prefill_ms') or 0.0):.1f} ms, decode "
        f"{decode_ms:.1f} ms ({1e3 * tokens / decode_ms if decode_ms > 0 else 0.0:.0f} tokens/s), "
        f"provider {r.get('provider')}"
    )
    return "\n".join(lines)
