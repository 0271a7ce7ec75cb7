"""The house rules of issue 37, kept: a class of 500 lines is several classes, a function of 140 lines
is several steps. Measured on the source, for the shipped code whose rooms were split."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAX_CLASS_LINES = 320
MAX_FUNCTION_LINES = 70
# the decoder, the language server, the models and the engine's own modules (specls/*.py); the user
# benchmarks and the team service are not in it yet
CHECKED = sorted(
    [*ROOT.glob("decoder/*.py"), *ROOT.glob("lsp/*.py"), *ROOT.glob("models/*.py"), *ROOT.glob("specls/*.py")]
)


def oversized(source: str) -> list[str]:
    """Classes and functions over the limits, as ``kind name lines``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            kind, limit = "class", MAX_CLASS_LINES
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            kind, limit = "function", MAX_FUNCTION_LINES
        else:
            continue
        lines = (node.end_lineno or node.lineno) - node.lineno + 1
        if lines > limit:
            found.append(f"{kind} {node.name} {lines}")
    return found


def test_the_check_sees_the_files() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in CHECKED}
    # Not a vacuous pass: the files the issue named are among those checked
    assert {"specls/engine.py", "decoder/loop.py", "lsp/server.py"} <= names


def test_oversized_finds_a_long_function() -> None:
    assert oversized("def f():\n" + "    x = 1\n" * 70) == ["function f 71"]  # Not []: 71 > 70
    assert oversized("def f():\n" + "    x = 1\n" * 69) == []  # 70 lines: at the limit


@pytest.mark.parametrize("path", CHECKED, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_oversized_rooms(path: Path) -> None:
    assert oversized(path.read_text(encoding="utf-8")) == []
