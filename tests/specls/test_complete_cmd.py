"""`specls complete`: LSP positions, end to end on the bundled pair, clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from specls.complete_cmd import PositionError, format_policy, offset_of

CODE = """def add(a, b):
    return a + b


def mul(a, b):
    result = 0
    for _ in range(b):
        result = add(result, a)
    return result


def square(x):
    return """


@pytest.mark.parametrize(
    ("text", "line", "character", "expected"),
    [
        ("ab\ncd", 0, 0, 0),
        ("ab\ncd", 1, 2, 5),
        ("ab\r\ncd", 1, 1, 5),  # Not 4: CRLF is one line break
        ("ab\rcd", 1, 0, 3),  # a lone CR breaks lines too (LSP)
        ("x😀y\n", 0, 3, 2),  # the emoji is 2 UTF-16 units, 1 str char
        ("x😀y\n", 0, 4, 3),
        ("", 0, 0, 0),
        ("ab\n", 1, 0, 3),  # the empty last line
    ],
)
def test_offset_of(text: str, line: int, character: int, expected: int) -> None:
    assert offset_of(text, line, character) == expected


@pytest.mark.parametrize(
    ("text", "line", "character"),
    [("ab\ncd", 2, 0), ("ab\ncd", 0, 3), ("x😀y", 0, 2), ("ab", -1, 0), ("ab", 0, -1)],
)
def test_offset_of_out_of_range(text: str, line: int, character: int) -> None:
    with pytest.raises(PositionError):
        offset_of(text, line, character)


def specls(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "specls", *args], capture_output=True, text=True, timeout=300, check=False
    )


@pytest.fixture(scope="module")
def code_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "example.py"
    path.write_text(CODE)
    return path


@pytest.mark.slow
def test_complete_json_end_to_end(code_file: Path) -> None:
    pos = ["--line", "12", "--character", "11", "--threads", "1", "--max-tokens", "16"]
    spec = specls("complete", str(code_file), *pos, "--json", "--stats")
    assert spec.returncode == 0, spec.stderr
    r = json.loads(spec.stdout)
    for key in (
        "text",
        "tokens",
        "target_passes",
        "drafted",
        "accepted",
        "per_drafter",
        "prefill_ms",
        "decode_ms",
        "provider",
    ):
        assert key in r
    assert r["provider"] == "cpu"
    assert 0 < r["tokens"] <= 16
    assert r["target_passes"] <= r["tokens"] + 1
    assert "tokens/pass" in spec.stderr  # --stats summary
    assert "policy passes:" in spec.stderr  # the drafting policy's choices (both drafters on)
    plain = specls("complete", str(code_file), *pos, "--json", "--no-speculation")
    assert plain.returncode == 0, plain.stderr
    p = json.loads(plain.stdout)
    assert p["text"] == r["text"]  # Not a drafter's guess
    assert p["drafted"] == 0 and p["target_passes"] >= p["tokens"]
    text = specls("complete", str(code_file), *pos, "--no-draft")
    assert text.returncode == 0 and text.stdout.rstrip("\n") == r["text"].rstrip("\n")
    one = specls("complete", str(code_file), *pos, "--json", "--draft-length", "1")
    assert one.returncode == 0, one.stderr
    assert json.loads(one.stdout)["text"] == r["text"]  # the cap moves plans, never the output


def test_complete_errors(code_file: Path, tmp_path: Path) -> None:
    missing = specls("complete", str(tmp_path / "nope.py"), "--line", "0", "--character", "0")
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    out_of_range = specls("complete", str(code_file), "--line", "99", "--character", "0")
    assert out_of_range.returncode == 2 and "line 99" in out_of_range.stderr
    bad_char = specls("complete", str(code_file), "--line", "0", "--character", "80")
    assert bad_char.returncode == 2 and "character 80" in bad_char.stderr
    no_model = specls("complete", str(code_file), "--line", "0", "--character", "0", "--model", str(tmp_path))
    assert no_model.returncode == 2 and str(tmp_path) in no_model.stderr
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "specls.json").write_text("{not json")
    corrupt = specls("complete", str(code_file), "--line", "0", "--character", "0", "--model", str(junk))
    assert corrupt.returncode == 2 and "specls.json" in corrupt.stderr
    assert "Traceback" not in corrupt.stderr + no_model.stderr
    no_drafts = specls("complete", str(code_file), "--line", "0", "--character", "0", "--draft-length", "0")
    assert no_drafts.returncode == 2 and "--draft-length" in no_drafts.stderr
    old = specls("complete", str(code_file), "--line", "0", "--character", "0", "--gamma", "4")
    assert old.returncode == 2 and "--gamma" in old.stderr  # gone: --draft-length is the one setting


def test_the_policy_line_says_how_many_passes_its_costs_were_learned_from() -> None:
    line = format_policy(
        {
            "choices": {"plain": 3, "lookup": 9},
            "draft_step_cost": 0.31,
            "draft_catchup_cost": 0.05,
            "verify_cost": [1.0, 1.0, 1.2],
            "costs_learned_from_passes": 12,
        }
    )
    assert line == (
        "policy passes: lookup 9, plain 3; costs per target pass: draft step 0.31, catch-up 0.05/token, "
        "verify of 3 tokens 1.2x (learned from 12 passes)"
    )


def test_complete_shows_a_model_being_prepared_on_stderr() -> None:
    import io

    from specls.complete_cmd import PreparingReport

    out = io.StringIO()
    report = PreparingReport(out, interval=3600.0)
    report("resolving org/tiny", 0.0)
    report("downloading 0%", 0.0)
    report("downloading 43%", 0.1)  # the same step within the interval: not repeated
    report("converting: quantizing model.onnx to 8 bits", 0.4)
    report("loading target model", 0.6)  # loading takes seconds: quiet
    report("ready", 1.0)
    assert out.getvalue().splitlines() == [
        "specls: resolving org/tiny",
        "specls: downloading 0%",
        "specls: converting: quantizing model.onnx to 8 bits",
    ]
