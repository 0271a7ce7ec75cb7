"""The workspace as a lookup source: which files (git's list with .gitignore, else a walk with a skip
list), the size bound, the background build publishing into the static sources, the root of a
document."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest
from specls.decoder.datastore import StaticSources

from specls.workspace_index import WorkspaceIndex, WorkspaceLimits, build_workspace, root_of, workspace_files


class CharTokenizer:
    """One token per character (its code point): enough to find text again."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(chr(i) for i in ids)

    def token_to_id(self, token: str) -> int | None:
        return ord(token) if len(token) == 1 else None


def _tree(root: Path) -> None:
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "a.py").write_text("def helper(x):\n    return x * 42\n")
    (root / "pkg" / "b.py").write_text("import os\n")
    (root / "notes.bin.py").write_bytes(b"\0\0binary")
    (root / "big.py").write_text("x = 1\n" * 200)
    (root / "image.png").write_bytes(b"png")
    (root / "node_modules" / "dep").mkdir(parents=True)
    (root / "node_modules" / "dep" / "index.js").write_text("module.exports = 1\n")
    (root / "ignored").mkdir()
    (root / "ignored" / "secret.py").write_text("TOKEN = 'x'\n")


def test_a_walk_skips_vcs_envs_and_non_code(tmp_path: Path) -> None:
    _tree(tmp_path)
    names = {p.relative_to(tmp_path).as_posix() for p in workspace_files(tmp_path)}
    assert names == {"pkg/a.py", "pkg/b.py", "notes.bin.py", "big.py", "ignored/secret.py"}


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_a_git_checkout_respects_gitignore(tmp_path: Path) -> None:
    _tree(tmp_path)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("ignored/\n")
    names = {p.relative_to(tmp_path).as_posix() for p in workspace_files(tmp_path)}
    assert "ignored/secret.py" not in names and "pkg/a.py" in names
    assert "node_modules/dep/index.js" not in names  # the skip list holds for git's list too


def test_the_size_bound_keeps_the_smallest_files(tmp_path: Path) -> None:
    _tree(tmp_path)
    small = workspace_files(tmp_path, WorkspaceLimits(max_total_bytes=60))
    assert [p.name for p in small] == [
        "notes.bin.py",
        "b.py",
        "secret.py",
    ]  # 8, 10, 12 bytes; a.py's 35 would pass 60
    assert all(p.stat().st_size <= 60 for p in small)
    assert workspace_files(tmp_path, WorkspaceLimits(max_file_bytes=100)) == [
        p for p in workspace_files(tmp_path) if p.name != "big.py"
    ]
    excluded = workspace_files(tmp_path, exclude=[tmp_path / "pkg" / "a.py"])
    assert tmp_path / "pkg" / "a.py" not in excluded


def test_build_reads_text_files_and_skips_binary(tmp_path: Path) -> None:
    _tree(tmp_path)
    store = build_workspace(workspace_files(tmp_path), CharTokenizer())
    assert store.documents == 4  # the binary one is skipped
    m = store.match(CharTokenizer().encode("def helper(x):\n    return x"), 5)
    assert m is not None and CharTokenizer().decode(m.tokens) == " * 42"


def test_the_background_build_publishes_into_the_sources(tmp_path: Path) -> None:
    _tree(tmp_path)
    sources = StaticSources()
    index = WorkspaceIndex(sources)
    assert index.start(tmp_path, CharTokenizer())
    index.join(30)
    assert index.stats()["state"] == "ready" and index.stats()["files"] == 5
    assert not index.start(tmp_path, CharTokenizer())  # once per root
    m = sources.match(CharTokenizer().encode("return x"), 4)
    assert m is not None and m.source == "workspace"


def test_a_failed_build_is_reported_not_raised(tmp_path: Path) -> None:
    class Broken(CharTokenizer):
        def encode(self, text: str) -> list[int]:
            raise RuntimeError("no")

    _tree(tmp_path)
    index = WorkspaceIndex(StaticSources())
    index.start(tmp_path, Broken())
    index.join(30)
    assert index.stats()["state"] == "failed"


def test_root_of_a_document(tmp_path: Path) -> None:
    (tmp_path / "proj" / ".git").mkdir(parents=True)
    (tmp_path / "proj" / "src").mkdir()
    f = tmp_path / "proj" / "src" / "m.py"
    assert root_of(f.as_uri()) == tmp_path / "proj"
    assert root_of(str(f)) == tmp_path / "proj"
    assert root_of("untitled:Untitled-1") is None
    assert (
        root_of((tmp_path / "elsewhere" / "x.py").as_uri()) is None
    )  # no marker up to the file system's root
