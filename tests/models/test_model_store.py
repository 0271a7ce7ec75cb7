"""The model cache (specls.models.model_store): where it is, how entries are keyed, written whole or not
at all, found again, listed and removed. No conversions here: a "conversion" writes a specls.json."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from specls.models.model_store import (
    MANIFEST_FILE,
    ConvertSettings,
    EntryKey,
    ModelStore,
    StoreError,
    cache_root,
)
from specls.models.spec import SPEC_FILE

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _key(source: str = "hf:org/tiny", revision: str = COMMIT, **settings: object) -> EntryKey:
    return EntryKey(source, revision, ConvertSettings(**settings))  # type: ignore[arg-type]


def _fill(out: Path, size: int = 10) -> None:
    (out / SPEC_FILE).write_text("{}")
    (out / "model.onnx").write_bytes(b"x" * size)


def test_cache_root_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("SPECLS_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "specls" / "models"
    monkeypatch.setenv("SPECLS_CACHE", str(tmp_path / "mine"))
    assert cache_root() == tmp_path / "mine"
    monkeypatch.delenv("SPECLS_CACHE")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "specls" / "models"


def test_key_depends_on_source_revision_and_settings() -> None:
    ids = {
        _key().entry_id(),
        _key(revision="f" * 40).entry_id(),
        _key(source="hf:org/other").entry_id(),
        _key(draft_head="ascii").entry_id(),
        _key(dtype="fp16").entry_id(),
    }
    assert len(ids) == 5
    assert _key().entry_id() == _key().entry_id()
    assert _key().entry_id().startswith("org--tiny--")


def test_build_writes_entry_with_manifest(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    key = _key(draft_head="ascii")
    assert store.get(key) is None
    with store.build(key, "org/tiny", "main") as out:
        assert store.get(key) is None  # not loadable while being written
        _fill(out, 100)
    entry = store.get(key)
    assert entry is not None and entry.path == tmp_path / key.entry_id()
    m = entry.manifest
    assert (m.source, m.revision, m.requested, m.ref) == ("hf:org/tiny", COMMIT, "org/tiny", "main")
    assert m.settings == ConvertSettings(draft_head="ascii")
    assert m.size >= 100
    data = json.loads((entry.path / MANIFEST_FILE).read_text())
    assert data["settings"]["draft_head"] == "ascii" and data["created"].endswith("+00:00")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".build-")] == []


def test_failed_build_leaves_nothing_and_the_next_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = ModelStore(tmp_path)
    key = _key()
    with (
        pytest.raises(RuntimeError, match="agreement below the floor"),
        store.build(key, "org/tiny", "main") as out,
    ):
        _fill(out)  # even a specls.json written before the failure must not survive
        raise RuntimeError("agreement below the floor")
    assert store.get(key) is None and store.entries() == []
    assert not any(p.name.startswith(".build-") for p in tmp_path.iterdir())
    assert store.last_failure(key) == "agreement below the floor"
    with (
        caplog.at_level(logging.WARNING, "specls.models.model_store"),
        store.build(key, "org/tiny", "main") as out,
    ):
        _fill(out)
    assert "previous attempt did not finish (agreement below the floor); starting clean" in caplog.text
    assert store.get(key) is not None and store.last_failure(key) is None


def test_a_build_without_specls_json_is_not_kept(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    with (
        pytest.raises(StoreError, match="wrote no specls.json"),
        store.build(_key(), "org/tiny", "main") as out,
    ):
        (out / "model.onnx").write_bytes(b"x")
    assert store.entries() == []


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_interrupted_build_is_removed_and_named(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = ModelStore(tmp_path)
    key = _key()
    pid = _dead_pid()
    left = tmp_path / f".build-{key.entry_id()}-{pid}-abcd"
    left.mkdir(parents=True)
    _fill(left)  # complete-looking files of a killed conversion: still not an entry
    assert store.get(key) is None and store.entries() == []
    assert store.last_failure(key) == f"interrupted (process {pid} ended before it finished)"
    with (
        caplog.at_level(logging.WARNING, "specls.models.model_store"),
        store.build(key, "org/tiny", "main") as out,
    ):
        _fill(out)
    assert "interrupted" in caplog.text and "starting clean" in caplog.text
    assert not left.exists() and store.get(key) is not None


def test_a_live_build_elsewhere_is_not_touched(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    key = _key()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        busy = tmp_path / f".build-{key.entry_id()}-{other.pid}-abcd"
        busy.mkdir(parents=True)
        with pytest.raises(StoreError, match=f"another specls process \\(pid {other.pid}\\)"):
            with store.build(key, "org/tiny", "main"):
                pass
        assert busy.is_dir()
    finally:
        other.kill()
        other.wait()


def test_find_lookup_remove(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    a, b, c = _key(), _key(draft_head="ascii"), _key(source="hf:org/other")
    for key, requested in ((a, "org/tiny"), (b, "org/tiny"), (c, "org/other")):
        with store.build(key, requested, "main") as out:
            _fill(out)
    assert len(store.entries()) == 3
    assert [e.id for e in store.find("org/tiny", "main", ConvertSettings())] == [a.entry_id()]
    assert [e.id for e in store.find("org/tiny", COMMIT, ConvertSettings())] == [a.entry_id()]
    assert store.find("org/tiny", "v2", ConvertSettings()) == []
    with pytest.raises(StoreError, match="matches 2 entries"):
        store.lookup("org--tiny")
    with pytest.raises(StoreError, match="no such entry"):
        store.remove("nothing-like-it")
    removed = store.remove(c.entry_id()[:12])
    assert removed.id == c.entry_id() and not removed.path.exists()
    assert {e.id for e in store.entries()} == {a.entry_id(), b.entry_id()}
    assert not any(p.name.startswith(".build-") for p in tmp_path.iterdir())


def test_entries_ignore_incomplete_dirs(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / SPEC_FILE).write_text("{}")  # no manifest: not an entry
    assert store.entries() == []
    assert ModelStore(tmp_path / "missing").entries() == []
    assert os.listdir(tmp_path) == ["junk"]
