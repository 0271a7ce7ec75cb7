"""A model by name (specls.models.hub) against a local hub (tests/hub_server.py, via HF_ENDPOINT): a hub
id is downloaded, converted and cached; later uses load from the cache with the hub gone; an interrupted
download resumes; a hub GGUF and a local .gguf convert; failures leave nothing loadable and say why."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest
from specls.models.hub import HubError, parse_spec, resolve_model
from specls.models.loader import load_model
from specls.models.model_store import ConvertSettings, EntryKey, ModelStore
from specls.models.progress import RecordingProgress
from specls.models.spec import SPEC_FILE

from specls.cli import main
from tests.hub_server import HubServer
from tests.models.conftest import build_checkpoint
from tests.models.tiny_gguf import QWEN_PARTIAL_FIM, write_tiny_gguf


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubServer]:
    root = tmp_path_factory.mktemp("hub-src")
    ckpt = build_checkpoint(root / "qwen2", "qwen2")
    gguf_dir = root / "gguf"
    gguf_dir.mkdir()
    write_tiny_gguf(gguf_dir / "tiny-q8_0.gguf", "qwen2", QWEN_PARTIAL_FIM, quantize=True)
    write_tiny_gguf(gguf_dir / "tiny-q4_k_m.gguf", "qwen2", QWEN_PARTIAL_FIM, seed=1)  # F32 inside; a name
    server = HubServer()
    server.add_dir("org/tiny", ckpt)
    files = {p.name: p.read_bytes() for p in ckpt.iterdir() if p.is_file()}
    server.add_repo(
        "org/tiny-GGUF", {p.name: p.read_bytes() for p in gguf_dir.iterdir()} | {"README.md": b"#"}
    )
    broken = dict(
        files, **{"model.safetensors": b"\x10\x00\x00\x00\x00\x00\x00\x00not a header" + b"\0" * 64}
    )
    server.add_repo("org/broken", broken)
    server.add_repo("org/readme-only", {"README.md": b"# nothing to convert"})
    server.add_repo("org/two-GGUF", {"m-Q4_0.gguf": b"GGUF", "m-Q5_0.gguf": b"GGUF"})
    with server:
        yield server


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> ModelStore:
    return ModelStore(tmp_path_factory.mktemp("specls-cache"))


@pytest.fixture(scope="module")
def hf_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hf-cache")


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, hub: HubServer, hf_cache: Path, store: ModelStore) -> None:
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(hf_cache))
    monkeypatch.setenv("SPECLS_CACHE", str(store.root))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")


@pytest.fixture(scope="module")
def tiny(hub: HubServer, store: ModelStore, hf_cache: Path) -> tuple[Path, list[tuple[str, float, str]]]:
    """org/tiny resolved once (downloaded, converted, cached), with the progress it reported."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_ENDPOINT", hub.url)
        mp.setenv("HF_HUB_CACHE", str(hf_cache))
        seen: list[tuple[str, float, str]] = []
        path = resolve_model("org/tiny", store=store, progress=RecordingProgress(seen))
    return path, seen


def test_hub_id_is_downloaded_converted_and_cached(
    tiny: tuple[Path, list[tuple[str, float, str]]], hub: HubServer, store: ModelStore
) -> None:
    path, seen = tiny
    assert path.parent == store.root and (path / SPEC_FILE).is_file()
    (entry,) = [e for e in store.entries() if e.path == path]
    assert entry.manifest.source == "hf:org/tiny" and entry.manifest.revision == hub.repos["org/tiny"].commit
    assert (entry.manifest.requested, entry.manifest.ref) == ("org/tiny", "main")
    stages = [s for s, _, _ in seen]
    assert stages[0] == "resolving" and stages[-1] == "ready"
    assert stages.index("downloading") < stages.index("converting")
    downloads = [f for s, f, _ in seen if s == "downloading"]
    assert downloads == sorted(downloads) and downloads[-1] == 1.0
    assert any(0 < f < 1 for s, f, _ in seen if s == "converting")
    assert hub.file_gets("model.safetensors") and not hub.file_gets("README.md")
    model = load_model(path)
    assert model.vocab_size == 300


def test_cached_model_loads_without_the_hub(
    tiny: tuple[Path, list[tuple[str, float, str]]],
    hub: HubServer,
    store: ModelStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path, _ = tiny
    commit = hub.repos["org/tiny"].commit
    n = len(hub.requests)
    assert resolve_model(f"org/tiny@{commit}", store=store) == path  # a commit: no question to the hub
    assert len(hub.requests) == n
    assert resolve_model("org/tiny", store=store) == path  # online: one question, no download
    assert [r.path for r in hub.requests[n:]] == ["/api/models/org/tiny/revision/main"]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    n = len(hub.requests)
    assert resolve_model("org/tiny", store=store) == path
    assert len(hub.requests) == n
    monkeypatch.delenv("HF_HUB_OFFLINE")
    hub.stop()
    try:
        seen: list[tuple[str, float, str]] = []
        assert resolve_model("org/tiny", store=store, progress=RecordingProgress(seen)) == path
        assert seen[-1][0] == "ready"
        with pytest.raises(HubError, match="not in the model cache .* the hub cannot be reached"):
            resolve_model("org/never-seen", store=store)
        with pytest.raises(HubError, match="not in the model cache"):
            resolve_model("org/tiny", store=store, settings=ConvertSettings(draft_head="ascii"))
    finally:
        hub.start()


def test_specls_models_pull_and_list(
    tiny: tuple[Path, list[tuple[str, float, str]]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = tiny
    assert main(["models", "pull", "org/tiny"]) == 0
    assert f"model: org/tiny -> {path}" in capsys.readouterr().out
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert path.name in out and "org/tiny@" in out and "fp32, quantize auto" in out


def test_interrupted_download_resumes_hub_gguf(
    hub: HubServer, store: ModelStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub.constants

    # small reads, so the bytes before the cut reach the file as they would for a large model
    monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 4096)
    hub.drop_once.add(("org/tiny-GGUF", "tiny-q8_0.gguf"))
    path = resolve_model("org/tiny-GGUF:Q8_0", store=store)
    gets = hub.file_gets("tiny-q8_0.gguf")
    assert len(gets) == 2 and gets[0].range is None
    assert gets[1].range is not None and gets[1].range.startswith("bytes=") and gets[1].range != "bytes=0-"
    (entry,) = [e for e in store.entries() if e.path == path]
    assert entry.manifest.source == "hf:org/tiny-GGUF/tiny-q8_0.gguf"
    assert entry.manifest.requested == "org/tiny-GGUF:Q8_0"
    assert load_model(path).vocab_size == 300
    assert not hub.file_gets("tiny-q4_k_m.gguf")
    # no tag: the repo's Q8_0 file (the conversion dequantizes: the most precise one), already converted
    assert resolve_model("org/tiny-GGUF", store=store) == path
    assert resolve_model("org/tiny-GGUF:tiny-q8_0.gguf", store=store) == path


def test_local_gguf_is_converted_once(tmp_path: Path, store: ModelStore) -> None:
    gguf = write_tiny_gguf(tmp_path / "mine.gguf", "qwen2", QWEN_PARTIAL_FIM, seed=2).path
    path = resolve_model(str(gguf), store=store)
    assert (path / SPEC_FILE).is_file()
    (entry,) = [e for e in store.entries() if e.path == path]
    assert entry.manifest.source == f"file:{gguf.resolve()}"
    seen: list[tuple[str, float, str]] = []
    assert resolve_model(str(gguf), store=store, progress=RecordingProgress(seen)) == path
    assert [s for s, _, _ in seen] == ["ready"]  # no conversion the second time


def test_a_directory_is_itself(tiny: tuple[Path, list[tuple[str, float, str]]], store: ModelStore) -> None:
    path, _ = tiny
    assert resolve_model(str(path), store=store) == path


def test_failed_conversion_leaves_nothing_loadable(hub: HubServer, store: ModelStore) -> None:
    before = {e.id for e in store.entries()}
    with pytest.raises(HubError, match="org/broken: conversion failed, nothing was cached") as err:
        resolve_model("org/broken", store=store)
    assert "Traceback" not in str(err.value)
    assert {e.id for e in store.entries()} == before
    assert not any(p.name.startswith(".build-") for p in store.root.iterdir())
    key = EntryKey("hf:org/broken", hub.repos["org/broken"].commit, ConvertSettings())
    assert not store.path_for(key).exists()
    assert "conversion failed" in (store.last_failure(key) or "")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("org/missing", "org/missing: no such model on the hub"),
        ("org/tiny@v9", "org/tiny: no revision 'v9' on the hub"),
        ("org/tiny-GGUF:Q2_K", "no GGUF file matches 'Q2_K'.*tiny-q4_k_m.gguf, tiny-q8_0.gguf"),
        ("org/two-GGUF", "holds 2 GGUF files; name one as org/two-GGUF:QUANT.*m-Q4_0.gguf, m-Q5_0.gguf"),
        ("org/readme-only", "no safetensors weights and no GGUF file"),
        ("./nowhere/model", "not a model directory or a .gguf file"),
        ("nowhere.gguf", "no such GGUF file"),
        ("a/b/c", "not a model directory, a .gguf file, or a Hugging Face hub id"),
    ],
)
def test_clear_errors(spec: str, message: str, store: ModelStore) -> None:
    with pytest.raises(HubError, match=message):
        resolve_model(spec, store=store)


def test_without_the_export_extra_the_message_names_the_install(
    store: ModelStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = importlib.util.find_spec

    def no_torch(name: str, *args: object) -> object:
        return None if name == "torch" else real(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(importlib.util, "find_spec", no_torch)
    with pytest.raises(
        HubError, match=r"needs the export tools \(torch not installed\): pip install 'specls\[export\]'"
    ):
        resolve_model("org/tiny", store=store, settings=ConvertSettings(quantize="none"))


def test_parse_spec() -> None:
    assert parse_spec("org/x-GGUF:x-q8_0.gguf@" + "a" * 40).tag == "x-q8_0.gguf"
    assert parse_spec("org/x").ref == "main"


def test_conversion_in_a_child_process_logs_to_the_cache(
    tmp_path: Path, store: ModelStore, capfd: pytest.CaptureFixture[str]
) -> None:
    """What a language server over stdio uses: nothing on this process's stdout, the child's output
    in the cache's log, its progress passed up."""
    gguf = write_tiny_gguf(tmp_path / "child.gguf", "qwen2", QWEN_PARTIAL_FIM, seed=3).path
    seen: list[tuple[str, float, str]] = []
    path = resolve_model(str(gguf), store=store, progress=RecordingProgress(seen), isolated=True)
    assert capfd.readouterr().out == ""
    assert load_model(path).vocab_size == 300
    converting = [(f, m) for s, f, m in seen if s == "converting"]
    assert any(0 < f < 1 for f, _ in converting) and any("tracing" in m for _, m in converting)
    assert seen[-1][0] == "ready"
    st = gguf.resolve().stat()
    key = EntryKey(f"file:{gguf.resolve()}", f"{st.st_size}-{st.st_mtime_ns}", ConvertSettings())
    assert store.log_path(key).is_file()


def test_a_failed_conversion_in_a_child_names_its_log(hub: HubServer, store: ModelStore) -> None:
    with pytest.raises(
        HubError, match=r"org/broken: conversion failed, nothing was cached: .*\(log: "
    ) as err:
        resolve_model("org/broken", store=store, settings=ConvertSettings(quantize="none"), isolated=True)
    assert "Traceback" not in str(err.value)
    assert not any(p.name.startswith(".build-") for p in store.root.iterdir())
    key = EntryKey("hf:org/broken", hub.repos["org/broken"].commit, ConvertSettings(quantize="none"))
    assert "Traceback" in store.log_path(key).read_text()  # the details are in the log
