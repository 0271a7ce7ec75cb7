"""Novel-code tasks for ``bench real --tasks novel``: bodies and lines of packages from source
archives, cut to the line limits, and workspaces that leave the task files out."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from specls.bench.novel_tasks import AFTER_LINES, BEFORE_LINES, body_points, novel_tasks, workspace_of

MODULE = '''"""A module."""


def area(width, height):
    """The area."""
    product = width * height
    return product


def short(x):
    return x


class Box:
    def volume(self, depth):
        base = area(self.w, self.h)
        return base * depth
'''


def _sdist(folder: Path, name: str) -> None:
    src = folder / "src" / name
    (src / name / "tests").mkdir(parents=True)
    (src / name / "shapes.py").write_text(MODULE)
    (src / name / "more.py").write_text(MODULE.replace("area", "surface"))
    (src / name / "tests" / "test_shapes.py").write_text(MODULE)
    (src / "setup.py").write_text("from setuptools import setup\nsetup()\n")
    with tarfile.open(folder / f"{name}.tar.gz", "w:gz") as tar:
        tar.add(src, arcname=name)


def test_body_points_remove_a_body_after_its_docstring() -> None:
    points = body_points(Path("m.py"), MODULE)
    bodies = {p.middle for p in points}
    assert "product = width * height\n    return product\n" in bodies
    assert "base = area(self.w, self.h)\n        return base * depth\n" in bodies
    assert not any("return x" == b.strip() for b in bodies)  # one line: too short
    p = next(p for p in points if p.middle.startswith("product"))
    assert p.prefix.endswith('"""The area."""\n    ') and p.suffix.startswith("\n\ndef short")
    assert p.prefix + p.middle + p.suffix in MODULE


def test_novel_tasks_from_source_archives(tmp_path: Path) -> None:
    sdists = tmp_path / "sdists"
    sdists.mkdir()
    _sdist(sdists, "alpha")
    _sdist(sdists, "beta")
    tasks = novel_tasks(sdists, tmp_path / "work", n=6, seed=0)
    assert len(tasks) == 6
    assert {t.package.name for t in tasks} == {"alpha", "beta"}  # the packages take turns
    assert {t.point.kind for t in tasks} == {"body", "line"}
    for t in tasks:
        assert "tests" not in Path(t.point.path).parts and Path(t.point.path).name != "setup.py"
        assert t.point.prefix.count("\n") <= BEFORE_LINES and t.point.suffix.count("\n") <= AFTER_LINES
        text = Path(t.point.path).read_text()
        assert t.point.prefix + t.point.middle + t.point.suffix in text
    held = workspace_of(tasks)
    assert set(held) == {t.package for t in tasks}
    assert all(Path(t.point.path) in held[t.package] for t in tasks)
    again = novel_tasks(sdists, tmp_path / "again", n=6, seed=0)
    assert [t.point.middle for t in again] == [t.point.middle for t in tasks]  # seeded


@pytest.mark.slow
def test_bench_real_novel_tasks_with_the_lookup_levers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from specls.bench import real

    monkeypatch.delenv("SPECLS_CACHE", raising=False)
    sdists = tmp_path / "sdists"
    sdists.mkdir()
    _sdist(sdists, "alpha")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "lib.py").write_text(MODULE.replace("area", "size"))
    (tmp_path / "t.gguf").write_bytes(b"GGUF")
    out = tmp_path / "real.json"
    opt = real.RealBenchOptions(
        gguf_target=str(tmp_path / "t.gguf"),
        gguf_draft=str(tmp_path / "t.gguf"),
        n=2,
        max_tokens=8,
        tasks=("novel",),
        novel_sdists=str(sdists),
        datastore=str(corpus),  # not built yet: the bench builds it and says what it cost
        methods=("lookup", "lookup+workspace", "lookup+datastore"),
        json_out=str(out),
    )
    assert real.run_bench(opt) == 0
    data = json.loads(out.read_text())
    results = data["results"]["novel"]
    assert set(results) == {"plain", "lookup", "lookup+workspace", "lookup+datastore"}
    assert all(r["identical"] == 1.0 for r in results.values())  # Not a lever's guess
    sources = data["lookup_sources"]
    assert "workspace alpha" in sources and "datastore (built now)" in sources
    assert all(s["tokens"] > 0 and "start_s" in s for s in sources.values())
