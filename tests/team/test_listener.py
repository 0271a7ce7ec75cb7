"""Issue 13 item 5 (team mode before initialize) and item 9 (log floods): the TCP ``Listener`` with
the real language server and the fake engine, on loopback only. Nothing but ``initialize`` with a valid
token is served before authentication; unauthenticated and idle connections are closed; connections
are capped per address and in total. Deadlines are checked with a fake clock (``read_deadline``); the
socket tests only wait (bounded) for an outcome that cannot depend on timing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pygls.lsp.server import LanguageServer
from specls.lsp.server import EngineHost, create_server
from specls.lsp.settings import ServerSettings

from specls.bench.team import LspClient, initialize
from specls.team.fake import FakeEngine, FakeEngineSettings
from specls.team.glue import UNAUTHORIZED, TeamHooks, team_hooks
from specls.team.listener import ConnectionTable, Listener, read_deadline
from specls.team.service import ConnectionSettings, TeamSettings

TOKENS = "alice:alice-token-0001\nbob:bob-token-00002\n"
WAIT_S = 30.0  # hang bound for socket outcomes, never a timing assertion
NOT_INITIALIZED = -32002


# --------------------------------------------------------------------------- pure parts


@pytest.mark.parametrize(
    ("opened", "last_read", "authenticated", "idle", "expected"),
    [
        (100.0, 101.0, False, 3600.0, (110.0, "auth_timeout")),  # wrong: None (never closed, the bug)
        (100.0, 105.0, False, 3600.0, (110.0, "auth_timeout")),  # wrong: 115 (reset by any byte)
        (100.0, 101.0, True, 3600.0, (3701.0, "idle")),  # wrong: 110 (auth deadline after auth)
        (100.0, 101.0, True, 0.0, (None, "idle")),  # idle timeout off; wrong: 101 (closed at once)
    ],
)
def test_read_deadline(
    opened: float, last_read: float, authenticated: bool, idle: float, expected: tuple[float | None, str]
) -> None:
    settings = ConnectionSettings(auth_timeout_s=10.0, idle_timeout_s=idle)
    got = read_deadline(settings, opened=opened, last_read=last_read, authenticated=authenticated)
    assert got == expected


def test_connection_table_caps_per_address_and_total() -> None:
    table = ConnectionTable(ConnectionSettings(max_connections=3, max_per_address=2))
    steps = [
        ("a", None),
        ("a", None),
        ("a", "per_address"),  # wrong: None (no per-address cap)
        ("b", None),
        ("c", "total"),  # wrong: None (no total cap)
    ]
    for address, expected in steps:
        assert table.admit(address) == expected, address
    table.release("a")
    assert table.admit("c") is None  # a released slot is free again
    assert table.total == 3 and table.by_address == {"a": 1, "b": 1, "c": 1}
    for address in ("a", "b", "c"):
        table.release(address)
    assert table.total == 0 and table.by_address == {}  # no per-address entry outlives its connections


# --------------------------------------------------------------------------- over loopback


@dataclass
class Served:
    port: int
    hooks: TeamHooks
    host: EngineHost
    engine: FakeEngine
    listener: Listener

    def closed(self, reason: str) -> float:
        return self.hooks.service.metrics.value("connections_closed", {"reason": reason})

    def refused(self, reason: str) -> float:
        return self.hooks.service.metrics.value("connections_refused", {"reason": reason})

    def flush_engine_thread(self) -> None:
        """Wait for everything already submitted to the engine host's thread (document updates)."""
        self.host.submit(lambda: None).result(timeout=WAIT_S)


@contextlib.asynccontextmanager
async def listening(tmp_path: Path, **connections: float) -> AsyncIterator[Served]:
    token_file = tmp_path / "tokens"
    token_file.write_text(TOKENS)
    token_file.chmod(0o600)
    engine = FakeEngine(FakeEngineSettings(pass_s=0.001))
    host = EngineHost(engine)
    settings = TeamSettings(
        host="127.0.0.1",
        token_file=str(token_file),
        require_token=True,
        connections=ConnectionSettings(**connections),  # type: ignore[arg-type]
    )
    hooks = team_hooks(settings, engine)
    host.team = hooks
    host.start_load().result(timeout=WAIT_S)
    listener = Listener(
        host,
        lambda h: create_server(ServerSettings(), h.engine, host=h),
        settings.connections,
        hooks.service.metrics,
    )
    bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(listener.serve("127.0.0.1", 0, bound.set_result))
    try:
        yield Served(await asyncio.wait_for(bound, WAIT_S), hooks, host, engine, listener)
    finally:
        listener.stop()
        await asyncio.wait_for(task, WAIT_S)
        hooks.close()
        host.close()


async def connect(port: int, source: str = "127.0.0.1") -> LspClient:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    return LspClient(reader, writer)


async def closed_by_server(client: LspClient) -> bool:
    """True once the server closed the connection (the client's read loop ends at EOF)."""
    await asyncio.wait_for(asyncio.shield(client.task), WAIT_S)
    return client.reader.at_eof()


def did_open(client: LspClient, uri: str, text: str) -> None:
    client.notify(
        "textDocument/didOpen",
        {"textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": text}},
    )


async def test_nothing_but_initialize_is_served_before_authentication(tmp_path: Path) -> None:
    async with listening(tmp_path) as srv:
        stranger = await connect(srv.port)
        try:
            did_open(stranger, "file:///big.py", "x = 1\n" * 1000)
            stats = await stranger.call("specls/stats", {}, WAIT_S)
            # wrong before the fix: a result with the server's counters and the client names
            assert "result" not in stats and stats["error"]["code"] == NOT_INITIALIZED
            complete = await stranger.call(
                "textDocument/inlineCompletion",
                {
                    "textDocument": {"uri": "file:///big.py"},
                    "position": {"line": 0, "character": 0},
                    "context": {"triggerKind": 1},
                },
                WAIT_S,
            )
            assert complete["error"]["code"] == NOT_INITIALIZED
            shutdown = await stranger.call("shutdown", None, WAIT_S)
            assert shutdown["error"]["code"] == NOT_INITIALIZED
            srv.flush_engine_thread()
            # wrong before the fix: 1 (the stranger's didOpen reached the shared engine)
            assert srv.engine.stats()["open_documents"] == 0
            assert srv.engine.calls == []
            # the same connection may still authenticate, and is then served
            assert "result" in await initialize(stranger, "alice-token-0001")
            did_open(stranger, "file:///mine.py", "y = ")
            stats = await stranger.call("specls/stats", {}, WAIT_S)
            assert stats["result"]["team"]["clients"] == {"alice": 1}
            srv.flush_engine_thread()
            assert srv.engine.stats()["open_documents"] == 1  # only the post-auth didOpen
        finally:
            await stranger.close()


async def test_a_refused_initialize_logs_one_line_and_closes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with listening(tmp_path) as srv:
        for token in (None, "alice-token-0002", "x" * 40):
            client = await connect(srv.port)
            try:
                refused = await initialize(client, token, WAIT_S)
                assert refused["error"]["code"] == UNAUTHORIZED
                assert "data" not in refused["error"] or "Traceback" not in str(refused["error"]["data"])
                assert await closed_by_server(client)
            finally:
                await client.close()
    # wrong before the fix: pygls logged "Failed to handle request" with a traceback (and the params,
    # token included) for each refused initialize
    assert not [r for r in caplog.records if r.exc_info], [
        r.getMessage() for r in caplog.records if r.exc_info
    ]
    refusals = [
        r for r in caplog.records if r.levelno >= logging.WARNING and "refused a client" in r.getMessage()
    ]
    assert len(refusals) == 3
    for r in caplog.records:
        assert "alice-token-0002" not in r.getMessage() and "x" * 40 not in r.getMessage()


async def test_cancel_for_unknown_ids_is_not_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with listening(tmp_path) as srv:
        client = await connect(srv.port)
        try:
            assert "result" in await initialize(client, "alice-token-0001")
            for i in range(200):
                client.notify("$/cancelRequest", {"id": 10_000 + i})
            assert "result" in await client.call("specls/stats", {}, WAIT_S)  # all 200 were handled
        finally:
            await client.close()
    noisy = [r for r in caplog.records if r.levelno >= logging.WARNING and "ancel" in r.getMessage()]
    assert noisy == []  # wrong before the fix: 200 warnings from pygls
    assert len([r for r in caplog.records if "$/cancelRequest for unknown id" in r.getMessage()]) == 200


async def test_unauthenticated_connection_is_closed_after_the_auth_timeout(tmp_path: Path) -> None:
    async with listening(tmp_path, auth_timeout_s=0.2) as srv:
        silent = await connect(srv.port)
        try:
            assert await closed_by_server(silent)  # wrong before the fix: open forever
            assert srv.closed("auth_timeout") == 1
        finally:
            await silent.close()


async def test_unauthenticated_connection_may_not_send_much(tmp_path: Path) -> None:
    async with listening(tmp_path, max_unauthenticated_bytes=4096) as srv:
        flood = await connect(srv.port)
        try:
            body = (
                b'{"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"x": "'
                + b"a" * 20_000
                + b'"}}'
            )
            flood.writer.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
            assert await closed_by_server(flood)
            assert srv.closed("unauthenticated_bytes") == 1
        finally:
            await flood.close()


async def test_idle_authenticated_connection_is_closed(tmp_path: Path) -> None:
    async with listening(tmp_path, idle_timeout_s=0.2) as srv:
        idle = await connect(srv.port)
        try:
            assert "result" in await initialize(idle, "alice-token-0001")
            assert await closed_by_server(idle)
            assert srv.closed("idle") == 1
            assert srv.hooks.service.scheduler.active_clients == 0
        finally:
            await idle.close()


async def test_connections_are_capped_per_address_and_in_total(tmp_path: Path) -> None:
    async with listening(tmp_path, max_per_address=2, max_connections=3) as srv:
        kept = [await connect(srv.port, "127.0.0.1"), await connect(srv.port, "127.0.0.1")]
        try:
            for c in kept:  # both admitted and served
                assert "result" in await initialize(c, "alice-token-0001")
            third = await connect(srv.port, "127.0.0.1")
            assert await closed_by_server(third)  # wrong before the fix: admitted
            assert srv.refused("per_address") == 1
            other = await connect(srv.port, "127.0.0.2")
            kept.append(other)
            assert "result" in await initialize(other, "bob-token-00002")
            fourth = await connect(srv.port, "127.0.0.3")
            assert await closed_by_server(fourth)
            assert srv.refused("total") == 1
            await kept.pop().close()  # a slot frees up when a connection ends ...
            for _ in range(int(WAIT_S / 0.01)):
                if srv.listener.table.total == 2:
                    break
                await asyncio.sleep(0.01)
            again = await connect(srv.port, "127.0.0.3")  # ... and is given to the next one
            kept.append(again)
            assert "result" in await initialize(again, "bob-token-00002")
            for c in (third, fourth):
                await c.close()
        finally:
            for c in kept:
                await c.close()


async def test_stop_closes_every_connection_and_returns(tmp_path: Path) -> None:
    async with listening(tmp_path) as srv:
        clients = [await connect(srv.port) for _ in range(3)]
        try:
            assert "result" in await initialize(clients[0], "alice-token-0001")
            for _ in range(int(WAIT_S / 0.01)):  # all three accepted by the server
                if srv.listener.table.total == 3:
                    break
                await asyncio.sleep(0.01)
            srv.listener.stop()
            for c in clients:
                assert await closed_by_server(c)
            assert srv.closed("stopping") == 3
            with pytest.raises(OSError):  # no longer accepting
                await asyncio.open_connection("127.0.0.1", srv.port)
        finally:
            for c in clients:
                await c.close()


async def test_error_responses_leave_without_a_traceback_or_a_server_path(tmp_path: Path) -> None:
    """The Listener sends through the transport's scrubbing writer, as stdio does. Wrong before it did:
    a handler bug's error reached the TCP client with the server path in its message and pygls'
    traceback in its data."""
    async with listening(tmp_path) as srv:
        plain = srv.listener.make_server

        def with_a_bug(host: EngineHost) -> LanguageServer:
            server = plain(host)

            @server.feature("test/boom")
            def boom(params: Any) -> None:
                raise ValueError(f"bad state in {Path(__file__)}")

            return server

        srv.listener.make_server = with_a_bug
        client = await connect(srv.port)
        try:
            assert "result" in await initialize(client, "alice-token-0001")
            answer = await client.call("test/boom", {}, WAIT_S)
            assert answer["error"]["code"] == -32603 and "server log" in answer["error"]["message"]
            shown = json.dumps(answer)
            assert str(Path(__file__).parent) not in shown and "Traceback" not in shown
        finally:
            await client.close()
