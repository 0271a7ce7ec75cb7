"""`specls bench edit`: tasks mined offline from two local releases (directories and sdist archives
made here), the quality scores, and the bench's mechanics and exactness on the bundled pair (which
cannot edit: no quality is asserted there)."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from specls.api import NextEditResult
from specls.bench import edit_tasks
from specls.bench.edit import EditBenchOptions, Quality, run_bench
from specls.bench.edit_tasks import EditTask, fetch_sdist, file_tasks, mine_tasks, python_files
from specls.engine import EngineSettings, OnnxEngine
from specls.next_edit.confidence import EditConfidence
from specls.next_edit.edits import Position, Region, TextEdit
from specls.next_edit.settings import NextEditSettings

OLD = "".join(f"def f{i}(x):\n    return x + {i}\n\n\n" for i in range(20))
# three hunks: two near each other at the top, one far below
NEW = OLD.replace("return x + 1\n", "return x + 10\n").replace("return x + 2\n", "return x + 20\n")
NEW = NEW.replace("return x + 18\n", "return x + 180\n")


def release(root: Path, text: str) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text(text, encoding="utf-8")
    (root / "pkg" / "same.py").write_text("x = 1\n", encoding="utf-8")
    return root


def test_tasks_of_a_file() -> None:
    tasks = file_tasks("demo", "mod.py", OLD, NEW, before=11, after=12)
    assert [t.source for t in tasks] == ["demo/mod.py#1", "demo/mod.py#2"]
    first, second = tasks
    # after hunk 1: cursor at its end, the next hunk (4 lines below) is near
    assert first.text == OLD.replace("return x + 1\n", "return x + 10\n")
    assert (first.line, first.character) == (5, len("    return x + 10"))
    assert [(d.old, d.new, d.start_line) for d in first.history] == [
        ("    return x + 1\n", "    return x + 10\n", 5)
    ]
    assert first.expected == OLD.replace("return x + 1\n", "return x + 10\n").replace(
        "return x + 2\n", "return x + 20\n"
    )
    # after hunk 2 the last one is 64 lines further: far, no edit expected
    assert second.expected is None and len(second.history) == 2


def test_mining_reads_directories_and_sdists_the_same(tmp_path: Path) -> None:
    old, new = release(tmp_path / "old" / "demo-1.0", OLD), release(tmp_path / "new" / "demo-2.0", NEW)
    archive = tmp_path / "demo-2.0.tar.gz"
    with tarfile.open(archive, "w:gz") as t:
        t.add(new, arcname="demo-2.0")
    assert python_files(archive) == python_files(new) == {"pkg/mod.py": NEW, "pkg/same.py": "x = 1\n"}
    from_dirs = mine_tasks([("demo", old, new)], n=10, seed=1)
    from_archive = mine_tasks([("demo", old, archive)], n=10, seed=1)
    assert from_dirs == from_archive and len(from_dirs) == 2
    assert mine_tasks([("demo", old, new)], n=1, seed=1) == from_dirs[:1]  # seeded


def test_a_cached_sdist_is_not_downloaded_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cached = tmp_path / "demo-1.0" / "demo-1.0.tar.gz"
    cached.parent.mkdir()
    cached.write_bytes(b"")

    def no_pip(*args: object, **kwargs: object) -> None:
        raise AssertionError("pip ran")

    monkeypatch.setattr(edit_tasks.subprocess, "run", no_pip)
    assert fetch_sdist("demo", "1.0", tmp_path) == cached


def test_quality_scores() -> None:
    (near,) = file_tasks("demo", "mod.py", OLD, NEW, 11, 12)[:1]
    far = EditTask("demo/far", "mod.py", OLD, 0, 0, (), None)
    right = TextEdit(Position(9, 15), Position(9, 16), "20")
    wrong = TextEdit(Position(9, 15), Position(9, 16), "3")
    q = Quality()
    for task, edits in ((near, (right,)), (near, (wrong,)), (near, ()), (far, (wrong,)), (far, ())):
        q.add(task, NextEditResult(edits, Region(0, 24), None))
    s = q.summary()
    assert (s["near_tasks"], s["far_tasks"]) == (3, 2)
    assert s["exact_pct"] == pytest.approx(33.3) and s["no_edit_pct"] == pytest.approx(33.3)
    assert s["false_edit_pct"] == 50.0 and s["undo_pct"] == 0.0
    assert 0.0 < s["changed_lines_similarity"] < 1.0


def test_the_show_rule_trades_coverage_for_precision() -> None:
    (near,) = file_tasks("demo", "mod.py", OLD, NEW, 11, 12)[:1]
    far = EditTask("demo/far", "mod.py", OLD, 0, 0, (), None)
    right = TextEdit(Position(9, 15), Position(9, 16), "20")
    wrong = TextEdit(Position(9, 15), Position(9, 16), "3")
    q = Quality()
    sure, unsure = EditConfidence(9.0, 9.0, 0.99, 0.99, 1), EditConfidence(0.2, 0.5, 0.4, 0.5, 2)
    q.add(near, NextEditResult((right,), Region(0, 24), None), sure)
    q.add(near, NextEditResult((wrong,), Region(0, 24), None), unsure)
    q.add(far, NextEditResult((wrong,), Region(0, 24), None), unsure)  # a false edit counts as a miss
    q.add(near, NextEditResult((), Region(0, 24), None, dropped="malformed"))
    s = q.summary()
    rule = [(r["min_margin"], r["shown"], r["exact"], r["precision_pct"]) for r in s["show_rule"]]
    assert rule == [(9.0, 1, 1, 100.0), (0.2, 2, 1, 50.0), (0.2, 3, 1, 33.3)]
    assert s["show_rule"][0]["coverage_pct"] == 25.0 and s["malformed_pct"] == 25.0
    # task by task, in order: which were right, shown, dropped, and how sure
    outcomes = [(t["near"], t["shown"], t["exact"], t["dropped"], t["margin"]) for t in s["tasks"]]
    assert outcomes == [
        (True, True, True, "", 9.0),
        (True, True, False, "", 0.2),  # Not exact: one character off
        (False, True, False, "", 0.2),
        (True, False, False, "malformed", None),
    ]
    # the fixed bars: all three shown with no bar, only the sure one from a bar of 0.5 on
    bars = {r["bar"]: (r["shown"], r["exact"], r["precision_pct"]) for r in s["show_bars"]}
    assert bars[None] == (3, 1, 33.3) and bars[0.5] == (1, 1, 100.0) and bars[8.0] == (1, 1, 100.0)
    # the wrong near edit changed one character of the expected line: nearly right, not exact
    assert s["show_rule"][-1]["similar"] == 2 and s["show_bars"][0]["similar"] == 2  # with the exact one


def _demo_run(tmp_path: Path, **options: Any) -> dict[str, Any]:
    """``bench edit`` on the bundled pair over the demo release pair (2 tasks, 40 tokens): its JSON."""
    old, new = release(tmp_path / "old", OLD), release(tmp_path / "new", NEW)
    engine = OnnxEngine(EngineSettings(threads=1, costs_cache=False))
    engine.load()
    out = tmp_path / "edit.json"
    opt = EditBenchOptions(
        packages=(), sources=(f"demo={old}:{new}",), n=2, max_tokens=40, json_out=str(out), **options
    )
    assert run_bench(engine, opt, NextEditSettings(lines_before=4, lines_after=4)) == 0
    data: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return data


def test_bench_on_the_bundled_pair_is_exact(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _demo_run(tmp_path, layouts=("fim-rewrite", "sweep"), arms=("region", "lookup", "policy"))
    assert data["tasks"] == 2 and sorted(data["layouts"]) == ["fim-rewrite", "sweep"]
    for d in data["layouts"].values():
        assert d["quality"]["near_tasks"] + d["quality"]["far_tasks"] == 2
        assert sorted(d["arms"]) == ["lookup", "plain", "policy", "region"]
        for arm in ("region", "lookup", "policy"):
            assert d["arms"][arm]["identical_to_plain"] == 100.0, d["arms"][arm]["divergences"]
        assert d["arms"]["plain"]["tokens_per_pass"] == 1.0
        assert set(d["arms"]["plain"]["pass_ms_by_rows"]) == {"1-1"}  # plain passes feed one token
        assert sum(v["passes"] for v in d["arms"]["policy"]["pass_ms_by_rows"].values()) > 0
    assert "layout sweep: exact" in capsys.readouterr().out


def test_a_quality_run_without_the_plain_arm(tmp_path: Path) -> None:
    data = _demo_run(tmp_path, layouts=("fim-rewrite",), arms=("policy",), plain=False)
    d = data["layouts"]["fim-rewrite"]
    assert sorted(d["arms"]) == ["policy"] and d["arms"]["policy"]["identical_to_plain"] is None
    assert d["quality"]["near_tasks"] + d["quality"]["far_tasks"] == 2  # the quality from the policy arm
