"""`specls next-edit`: the exact --json shape on the bundled pair, the history from --before, the
suggestion printed as a diff (a scripted engine), clear errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import specls.engine
from specls.api import NextEditRequest, NextEditResult
from specls.cli import main
from specls.next_edit.edits import Position, Region, TextEdit

BEFORE = "def area(w, h):\n    return w * h\n\n\ndef volume(w, h, d):\n    return w * h * d\n"
AFTER = BEFORE.replace("area(w, h)", "area(width, h)")


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "app.py", tmp_path / "app.before.py"
    a.write_text(AFTER, encoding="utf-8")
    b.write_text(BEFORE, encoding="utf-8")
    return a, b


def test_json_shape_on_the_bundled_pair(files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    a, b = files
    argv = ["next-edit", str(a), "--line", "1", "--character", "4", "--before", str(b)]
    rc = main([*argv, "--max-tokens", "24", "--threads", "1", "--json", "--stats"])
    out, err = capsys.readouterr()
    assert rc == 0
    data = json.loads(out)
    for key in ("edits", "region", "rewritten", "tokens", "target_passes", "prefill_ms", "decode_ms"):
        assert key in data
    assert data["region"] == {"start_line": 0, "end_line": 7}  # the whole file: 6 lines and the empty last
    assert 0 < data["tokens"] <= 24 and data["target_passes"] >= 1
    assert "tokens/pass" in err


class ScriptedEngine:
    """Stands in for OnnxEngine: answers with a rename of the next ``w`` and records the request."""

    seen: list[NextEditRequest] = []

    def __init__(self, settings: Any) -> None:
        self.settings = settings

    def load(self, progress: Any = None) -> None: ...

    def update_document(self, doc_id: str, text: str) -> None: ...

    def next_edit(self, request: NextEditRequest) -> NextEditResult:
        self.seen.append(request)
        rewritten = AFTER.replace("return w * h\n", "return width * h\n", 1)
        edit = TextEdit(Position(1, 11), Position(1, 12), "width")
        return NextEditResult((edit,), Region(0, 7), rewritten, tokens=30)


def test_the_suggestion_is_printed_as_a_diff(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(specls.engine, "OnnxEngine", ScriptedEngine)
    a, b = files
    assert main(["next-edit", str(a), "--line", "1", "--character", "0", "--before", str(b)]) == 0
    out = capsys.readouterr().out
    assert "-    return w * h\n+    return width * h\n" in out
    (req,) = ScriptedEngine.seen[-1:]
    assert [(d.old, d.new, d.start_line) for d in req.history] == [
        ("def area(w, h):\n", "def area(width, h):\n", 0)
    ]
    assert (req.line, req.character, req.path) == (1, 0, "app.py")
    assert main(["next-edit", str(a), "--line", "1", "--character", "0", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["edits"] == [
        {
            "range": {"start": {"line": 1, "character": 11}, "end": {"line": 1, "character": 12}},
            "text": "width",
        }
    ]
    assert ScriptedEngine.seen[-1].history == ()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--line", "40", "--character", "0"], "past the end of the file"),
        (["--line", "0", "--character", "0", "--before", "/nonexistent/x.py"], "cannot read"),
        (["--line", "0", "--character", "0", "--max-tokens", "0"], "--max-tokens must be positive"),
    ],
)
def test_errors(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["next-edit", str(files[0]), *args]) == 2
    assert message in capsys.readouterr().err
