"""`specls bench decode`: the completion points and one tiny end-to-end run on the bundled pair."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specls.bench.decode import BenchOptions, expected_tokens_per_pass, make_points, run_bench, source_files


def test_points_are_seeded_and_cut_from_the_file() -> None:
    files = source_files(None)
    assert files and all("test" in p.parts or "tests" in p.parts or "idle_test" in p.parts for p in files)
    a = make_points(files, 6, seed=3)
    b = make_points(files, 6, seed=3)
    assert a == b and len(a) == 6
    assert make_points(files, 6, seed=4) != a
    for p in a:
        assert Path(p.path).read_text(encoding="utf-8") == p.prefix + p.middle + p.suffix
        assert p.middle  # something was removed for the model to fill in
    assert [p.kind for p in a] == ["line", "mid"] * 3
    for p in a:
        if p.kind == "line":  # cursor after the indentation, at the line's first character
            assert p.prefix.split("\n")[-1].strip() == ""


def test_expected_tokens_per_pass() -> None:
    assert expected_tokens_per_pass(0.0, 5) == 1.0
    assert expected_tokens_per_pass(1.0, 5) == 6.0
    assert expected_tokens_per_pass(0.5, 1) == pytest.approx(1.5)
    assert expected_tokens_per_pass(0.8, 4) == pytest.approx((1 - 0.8**5) / 0.2)


@pytest.mark.slow
def test_bench_runs_and_ours_are_identical(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    plot = tmp_path / "sweep.png"
    opt = BenchOptions(
        n=2, max_tokens=12, hf=False, draft_lengths=(1, 3), sweep_points=1, json_out=str(out), plot=str(plot)
    )
    assert run_bench(opt) == 0
    data = json.loads(out.read_text())
    for m in ("plain", "lookup", "draft", "hybrid"):
        assert data["methods"][m]["identical_rate"] == 1.0
    assert data["methods"]["plain"]["tokens_per_pass"] <= 1.0
    assert [row["draft_length"] for row in data["draft_length_sweep"]] == [1, 3]
    assert plot.stat().st_size > 1000
    table = capsys.readouterr().out
    assert "hybrid" in table and "tok/pass" in table
