"""``specls models``: lists presets and cached entries (size, source, when made), removes entries, and
pulls; no torch is needed for any of it except a conversion (tests/models/test_hub.py pulls one)."""

from __future__ import annotations

from pathlib import Path

import pytest
from specls.models.model_store import ConvertSettings, EntryKey, ModelStore
from specls.models.spec import SPEC_FILE

from specls.cli import main
from specls.models_cmd import human_size

COMMIT = "89abcdef0123456789abcdef0123456789abcdef"


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModelStore:
    monkeypatch.setenv("SPECLS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing here may reach for a hub
    return ModelStore()


def _add(store: ModelStore, source: str, requested: str, size: int, **settings: object) -> str:
    key = EntryKey(source, COMMIT, ConvertSettings(**settings))  # type: ignore[arg-type]
    with store.build(key, requested, "main") as out:
        (out / SPEC_FILE).write_text("{}")
        (out / "model.onnx").write_bytes(b"\0" * size)
    return key.entry_id()


def test_lists_presets_and_nothing_cached(store: ModelStore, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "qwen2.5-coder-1.5b" in out and "Qwen/Qwen2.5-Coder-1.5B + draft Qwen/Qwen2.5-Coder-0.5B" in out
    assert f"cached models ({store.root}):" in out and "none" in out


def test_lists_and_removes_entries(store: ModelStore, capsys: pytest.CaptureFixture[str]) -> None:
    a = _add(store, "hf:Qwen/Qwen2.5-Coder-0.5B", "Qwen/Qwen2.5-Coder-0.5B", 2_500_000, draft_head="ascii")
    b = _add(store, "file:/models/x.gguf", "/models/x.gguf", 1000)
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert a in out and b in out
    assert f"Qwen/Qwen2.5-Coder-0.5B@{COMMIT[:12]}" in out and "fp32, quantize auto, ascii head" in out
    assert "2.5 MB" in out and "2 entries" in out
    assert main(["models", "rm", a[:20]]) == 0
    assert f"removed {a} (Qwen/Qwen2.5-Coder-0.5B, 2.5 MB)" in capsys.readouterr().out
    assert [e.id for e in store.entries()] == [b]
    assert main(["models", "rm", "no-such-entry"]) == 1
    assert "specls models: no-such-entry: no such entry" in capsys.readouterr().err


def test_pull_offline_says_what_is_missing(store: ModelStore, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "pull", "--preset", "qwen2.5-coder-0.5b"]) == 1
    err = capsys.readouterr().err
    assert "Qwen/Qwen2.5-Coder-0.5B@main: not in the model cache" in err and "HF_HUB_OFFLINE is set" in err
    assert "Traceback" not in err


def test_pull_a_directory_prints_it(
    store: ModelStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["models", "pull", str(tmp_path)]) == 0
    assert f"-> {tmp_path}" in capsys.readouterr().out


def test_human_size() -> None:
    assert human_size(0) == "0 B" and human_size(1_500) == "1.5 kB"
