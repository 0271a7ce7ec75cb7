"""``specls serve --model org/tiny`` through a real LSP client (pytest-lsp), against a local hub
(tests/hub_server.py, via HF_ENDPOINT) and a fresh model cache: the first start downloads, converts (in a
child process: the LSP stream on stdout stays clean), caches and completes, showing the preparing stages
as ``$/progress``; a second start completes from the cache with the hub stopped.

The load times (first start, second start, a local directory) are printed (``pytest -s``), never
asserted."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from lsprotocol import types
from specls.models.model_store import ModelStore
from specls.models.progress import preparing_stage

from tests.hub_server import HubServer
from tests.models.conftest import build_checkpoint

from .lsp_helpers import SPECLS, fake_env, inline, open_doc, stats, stdio_client, wait_state

pytestmark = pytest.mark.slow

URI = "file:///work/add.py"
SOURCE = "def add(a, b):\n    return a + b\n\n\nclass Point:\n    def __init__(self, x, y):\n        self."


@dataclass
class Start:
    load_s: float  # from starting the process to the model loaded
    messages: list[str]  # the $/progress report messages
    answer: str | None  # the inline completion's text (a random tiny model's: any text, or none)
    engine_calls: int  # completions the engine decoded

    @property
    def completed(self) -> bool:
        return self.engine_calls >= 1


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubServer]:
    ckpt = build_checkpoint(tmp_path_factory.mktemp("hub-src") / "qwen2", "qwen2")
    server = HubServer()
    server.add_dir("org/tiny", ckpt)
    with server:
        yield server


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, hub: HubServer) -> dict[str, str]:
    root = tmp_path_factory.mktemp("serve-hub")
    return fake_env() | {
        "HF_ENDPOINT": hub.url,
        "HF_HUB_CACHE": str(root / "hf"),
        "SPECLS_CACHE": str(root / "specls-models"),
        "XDG_CACHE_HOME": str(root / "xdg-cache"),  # the pass-costs cache: fresh too
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }


async def start(model: str, env: dict[str, str]) -> Start:
    t0 = time.monotonic()
    cmd = [SPECLS, "serve", "--model", model, "--threads", "1", "--max-tokens", "8"]
    async with stdio_client(cmd, env) as (client, _):
        s = await wait_state(client, ("ready", "failed"), timeout=600)
        load_s = time.monotonic() - t0
        assert s["server"]["state"] == "ready", s["server"].get("error")
        open_doc(client, URI, SOURCE)
        lines = SOURCE.split("\n")
        items = await inline(client, URI, len(lines) - 1, len(lines[-1]))
        engine_calls = (await stats(client))["server"]["engine_calls"]
        reports: list[object] = [v for values in client.progress_reports.values() for v in values]
        messages = [v.message for v in reports if isinstance(v, types.WorkDoneProgressReport) and v.message]
    return Start(load_s, messages, str(items[0].insert_text) if items else None, engine_calls)


async def test_a_model_by_name_is_prepared_once_then_served_from_the_cache(
    hub: HubServer, env: dict[str, str]
) -> None:
    first = await start("org/tiny", env)
    stages = [preparing_stage(m) for m in first.messages]
    assert "downloading" in stages and "converting" in stages, first.messages
    assert stages.index("downloading") < stages.index("converting")
    assert any(m.startswith("downloading ") and m.endswith("%") for m in first.messages)
    assert first.completed
    assert hub.file_gets("model.safetensors")
    (entry,) = ModelStore(Path(env["SPECLS_CACHE"])).entries()
    assert entry.manifest.requested == "org/tiny"
    assert (Path(env["SPECLS_CACHE"]) / ".logs" / f"{entry.id}.log").is_file()  # the child's output

    hub.stop()
    try:
        asked = len(hub.requests)
        second = await start("org/tiny", env)
        assert len(hub.requests) == asked  # the hub is gone: nothing was asked of it
        assert not any(preparing_stage(m) in ("downloading", "converting") for m in second.messages)
        assert second.completed and second.answer == first.answer  # the same model
        local = await start(str(entry.path), env)
        assert local.completed and local.answer == first.answer
    finally:
        hub.start()
    print(
        f"\nload time, specls serve --model org/tiny (tiny random qwen2, 1 thread): first start "
        f"(download + convert + load) {first.load_s:.1f} s; second start from the cache, hub stopped "
        f"{second.load_s:.1f} s; a local directory {local.load_s:.1f} s; answer {first.answer!r}"
    )
