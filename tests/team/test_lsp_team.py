"""The team service inside the real language server over TCP (``Listener`` + ``create_server`` with
``TeamHooks``), driven by the bench's minimal LSP client: token auth as for a non-loopback bind (bound
to 127.0.0.1 with tokens forced on), a client killed mid-request, memory released on disconnect."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from specls.decoder.api import CancelCheck, never_cancelled
from specls.lsp.server import EngineHost, create_server
from specls.lsp.settings import ServerSettings

from specls.api import CompletionRequest, CompletionResult
from specls.bench.team import LspClient, initialize
from specls.team.fake import FakeEngine, FakeEngineSettings
from specls.team.glue import UNAUTHORIZED, TeamHooks, team_hooks
from specls.team.listener import Listener
from specls.team.service import TeamSettings

TOKENS = "alice:alice-token-0001\nbob:bob-token-00002\n"


class SlowForVictim(FakeEngine):
    """One word per pass; requests of the 'victim' document are slow (many long passes)."""

    def __init__(self) -> None:
        super().__init__(FakeEngineSettings(pass_s=0.002, tokens_per_pass=1))
        self.results: list[tuple[str, CompletionResult]] = []

    def complete(
        self, request: CompletionRequest, cancelled: CancelCheck = never_cancelled
    ) -> CompletionResult:
        if "victim" in request.doc_id:
            old = self.settings
            self.settings = FakeEngineSettings(pass_s=0.02, tokens_per_pass=1)
            try:
                r = super().complete(request, cancelled)
            finally:
                self.settings = old
        else:
            r = super().complete(request, cancelled)
        self.results.append((request.doc_id, r))
        return r


@contextlib.asynccontextmanager
async def team_server(tmp_path: Path, engine: FakeEngine) -> AsyncIterator[tuple[int, TeamHooks]]:
    token_file = tmp_path / "tokens"
    token_file.write_text(TOKENS)
    token_file.chmod(0o600)
    host = EngineHost(engine)
    hooks = team_hooks(TeamSettings(host="127.0.0.1", token_file=str(token_file), require_token=True), engine)
    host.team = hooks
    host.start_load().result(timeout=30)
    bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    listener = Listener(
        host, lambda h: create_server(ServerSettings(), h.engine, host=h), metrics=hooks.service.metrics
    )
    task = asyncio.create_task(listener.serve("127.0.0.1", 0, lambda port: bound.set_result(port)))
    try:
        yield await asyncio.wait_for(bound, 30), hooks
    finally:
        listener.stop()
        await asyncio.wait_for(task, 30)
        hooks.close()
        host.close()


async def open_and_complete(client: LspClient, uri: str, text: str, timeout: float = 30) -> dict[str, Any]:
    client.notify(
        "textDocument/didOpen",
        {"textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": text}},
    )
    lines = text.split("\n")
    return await client.call(
        "textDocument/inlineCompletion",
        {
            "textDocument": {"uri": uri},
            "position": {"line": len(lines) - 1, "character": len(lines[-1])},
            "context": {"triggerKind": 1},
        },
        timeout,
    )


def items(resp: dict[str, Any]) -> list[dict[str, Any]]:
    assert "error" not in resp, resp
    return list(resp["result"]["items"])


async def test_tokens_accepted_and_missing_token_refused(tmp_path: Path) -> None:
    engine = FakeEngine(FakeEngineSettings(pass_s=0.001))
    async with team_server(tmp_path, engine) as (port, hooks):
        alice, bob = await LspClient.connect("127.0.0.1", port), await LspClient.connect("127.0.0.1", port)
        anon, wrong = await LspClient.connect("127.0.0.1", port), await LspClient.connect("127.0.0.1", port)
        try:
            assert "result" in await initialize(alice, "alice-token-0001")
            resp = await bob.call(
                "initialize",
                {
                    "processId": None,
                    "capabilities": {},
                    "initializationOptions": {"specls": {"token": "bob-token-00002"}},
                },
            )
            assert "result" in resp
            bob.notify("initialized", {})
            refused = await initialize(anon, None)
            assert refused["error"]["code"] == UNAUTHORIZED
            assert "requires a token" in refused["error"]["message"]
            bad = await initialize(wrong, "alice-token-0002")
            assert bad["error"]["code"] == UNAUTHORIZED
            assert "alice-token" not in bad["error"]["message"]
            # refused connections are closed by the server
            await asyncio.wait_for(anon.task, 10)  # the read loop ends at EOF
            assert anon.reader.at_eof()
            # the two valid clients get completions, under their own names
            a = items(await open_and_complete(alice, "file:///a.py", "import os\nx = "))
            b = items(await open_and_complete(bob, "file:///a.py", "def f():\n    return "))
            assert a and b and a[0]["insertText"] != b[0]["insertText"]
            stats = hooks.stats()
            assert stats["auth_required"] is True
            assert stats["clients"] == {"alice": 1, "bob": 1}
            assert hooks.service.metrics.value("auth_failures") == 2
        finally:
            for c in (alice, bob, anon, wrong):
                await c.close()


async def test_client_killed_mid_request_does_not_disturb_another(tmp_path: Path) -> None:
    engine = SlowForVictim()
    async with team_server(tmp_path, engine) as (port, hooks):
        victim = await LspClient.connect("127.0.0.1", port)
        other = await LspClient.connect("127.0.0.1", port)
        try:
            await victim.call(
                "initialize",
                {
                    "processId": None,
                    "capabilities": {},
                    "initializationOptions": {"token": "alice-token-0001", "maxTokens": 1024},
                },
            )
            victim.notify("initialized", {})
            assert "result" in await initialize(other, "bob-token-00002")
            victim_req = asyncio.ensure_future(open_and_complete(victim, "file:///victim.py", "x = "))
            for _ in range(500):  # until the victim's long generation is running
                if hooks.service.scheduler.scheduler_stats()["running"]:
                    break
                await asyncio.sleep(0.01)
            assert hooks.service.scheduler.scheduler_stats()["running"]
            other_req = asyncio.ensure_future(open_and_complete(other, "file:///other.py", "y = "))
            await asyncio.sleep(0.05)
            victim.writer.transport.abort()  # the editor process dies: no shutdown, no cancel
            resp = await asyncio.wait_for(other_req, 30)
            got = items(resp)
            assert got and got[0]["insertText"].startswith(engine.expected_text("y = ", "", 1))
            with pytest.raises(ConnectionError):
                await victim_req
            for _ in range(500):
                if any("victim" in d for d, _ in engine.results):
                    break
                await asyncio.sleep(0.01)
            (vr,) = [r for d, r in engine.results if "victim" in d]
            assert vr.cancelled and vr.tokens < 1024  # stopped at a target pass, not run to the end
            for _ in range(500):
                if hooks.service.scheduler.active_clients == 1:
                    break
                await asyncio.sleep(0.01)
            assert hooks.service.scheduler.active_clients == 1
        finally:
            await victim.close()
            await other.close()


async def test_documents_and_kv_freed_when_clients_leave(tmp_path: Path) -> None:
    engine = FakeEngine(FakeEngineSettings(pass_s=0.001))
    async with team_server(tmp_path, engine) as (port, hooks):
        clients = [await LspClient.connect("127.0.0.1", port) for _ in range(3)]
        for i, c in enumerate(clients):
            assert "result" in await initialize(c, "alice-token-0001" if i % 2 else "bob-token-00002")
            for j in range(2):
                items(await open_and_complete(c, f"file:///p{j}.py", f"v{i}{j} = " + "1\n" * 30 + "z = "))
        st = engine.stats()
        assert st["open_documents"] == 6 and st["kv_cached_sequences"] == 6
        await clients[0].call("shutdown", None)
        clients[0].notify("exit", None)
        clients[1].writer.transport.abort()
        await clients[2].close()
        for _ in range(500):
            st = engine.stats()
            if st["open_documents"] == 0 and st["kv_cached_sequences"] == 0:
                break
            await asyncio.sleep(0.01)
        assert (st["open_documents"], st["kv_cached_sequences"], st["kv_bytes"]) == (0, 0, 0)
        assert hooks.service.scheduler.active_clients == 0
        for c in clients:
            await c.close()


class IdRecorder(FakeEngine):
    """Records the engine document ids that updates and completions use."""

    def __init__(self) -> None:
        super().__init__(FakeEngineSettings(pass_s=0.001))
        self.updated: set[str] = set()
        self.completed: set[str] = set()

    def update_document(self, doc_id: str, text: str) -> None:
        self.updated.add(doc_id)
        super().update_document(doc_id, text)

    def complete(
        self, request: CompletionRequest, cancelled: CancelCheck = never_cancelled
    ) -> CompletionResult:
        self.completed.add(request.doc_id)
        return super().complete(request, cancelled)


async def test_a_buffer_is_one_engine_document_for_updates_and_completions(tmp_path: Path) -> None:
    engine = IdRecorder()
    async with team_server(tmp_path, engine) as (port, _hooks):
        clients = [await LspClient.connect("127.0.0.1", port) for _ in range(2)]
        for c in clients:
            assert "result" in await initialize(c, "alice-token-0001")
            items(await open_and_complete(c, "file:///same.py", "x = " + "1\n" * 10 + "y = "))
        for _ in range(500):  # updates run on the host's executor: wait until both arrived
            if len(engine.updated) >= 2:
                break
            await asyncio.sleep(0.01)
        assert len(engine.completed) == 2  # two clients, same uri: two documents. Not 1
        assert engine.updated == engine.completed  # Not {"s1|file:///same.py", ...} beside "s1|s1|..."
        for c in clients:
            await c.close()
