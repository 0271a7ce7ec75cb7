"""Issue 13 (9): what a client gets back for malformed JSON-RPC messages, in process (fake engine)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from specls.lsp.server import create_server
from specls.lsp.settings import ServerSettings
from specls.lsp.transport import Framer, connect, encode

from .fake_server import FakeEngine

ROOT = Path(__file__).resolve().parents[2]
# fragments of this server's file paths that must never reach a client
SERVER_PATHS = [str(ROOT), sys.prefix, "site-packages", '.py"', ".py'", "Traceback"]


class Client:
    """The client side of an in-process connection: frames written by the server, parsed."""

    def __init__(self) -> None:
        self.framer = Framer()
        self.messages: list[dict[str, Any]] = []
        self.arrived = asyncio.Event()
        self.server = create_server(ServerSettings(), FakeEngine())
        self.conn = connect(self.server, self._on_write)

    def _on_write(self, data: bytes) -> None:
        self.framer.feed(data)
        for body in self.framer.messages():
            self.messages.append(json.loads(body))
        self.arrived.set()

    def send(self, message: Any) -> None:
        self.conn.feed(encode(message) if not isinstance(message, bytes) else message)

    async def response(self, msg_id: Any) -> dict[str, Any]:
        async def wait() -> dict[str, Any]:
            while True:
                for m in self.messages:
                    if "method" not in m and m.get("id") == msg_id:
                        return m
                self.arrived.clear()
                await self.arrived.wait()

        return await asyncio.wait_for(wait(), 30)

    def errors(self) -> list[dict[str, Any]]:
        return [m for m in self.messages if "error" in m]


def did_open(uri: str, text: str, **extra: Any) -> dict[str, Any]:
    doc = {"uri": uri, "languageId": "python", "version": 1, "text": text}
    return {"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": doc}, **extra}


async def initialized_client() -> Client:
    client = Client()
    client.send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"capabilities": {}}})
    assert "result" in await client.response(0)
    return client


def test_a_notification_sent_with_an_id_is_applied_and_answered():
    async def run() -> None:
        client = await initialized_client()
        # wrong answer before: no response at all (the client waits forever)
        client.send(did_open("file:///a.py", "x = 1\n", id=7))
        error = (await client.response(7))["error"]
        assert error["code"] == -32600 and "notification" in error["message"]
        # decided: applied anyway (dropping it would lose the client's edit)
        assert client.server.session.store.get("file:///a.py") is not None  # type: ignore[attr-defined]
        client.send({"jsonrpc": "2.0", "id": 8, "method": "specls/stats"})
        assert (await client.response(8))["result"]["session"]["open_documents"] == 1

    asyncio.run(run())


@pytest.mark.parametrize(
    ("message", "answer_id"),
    [
        # wrong answer before: -32603 with the server's traceback and file paths in error.data
        ({"jsonrpc": "2.0", "id": 3, "method": 5}, 3),
        ({"jsonrpc": "2.0", "id": {"a": 1}, "method": "shutdown"}, None),
        ({"jsonrpc": "2.0", "id": 4, "method": "specls/stats", "params": 5}, 4),
        ({"method": 5}, None),
        ({"jsonrpc": "2.0", "method": ["x"]}, None),
        # wrong answer before: nothing (neither request nor response)
        ({"jsonrpc": "2.0", "id": 6}, None),
    ],
)
def test_malformed_shapes_get_invalid_request(message, answer_id):
    async def run() -> None:
        client = await initialized_client()
        client.send(message)
        error = (await client.response(answer_id))["error"]
        assert error["code"] == -32600
        assert "data" not in error

    asyncio.run(run())


def test_no_error_response_carries_a_traceback_or_a_server_path():
    async def run() -> None:
        client = await initialized_client()

        @client.server.feature("test/boom")
        def boom(params: Any) -> None:
            open(ROOT / "no" / "such" / "file.txt")  # a handler bug whose text names a server path

        @client.server.feature("test/boomAsync")
        async def boom_async(params: Any) -> None:
            raise ValueError(f"bad state in {ROOT / 'lsp' / 'server.py'}")

        bad: list[Any] = [
            {"jsonrpc": "2.0", "id": 1, "method": "test/boom"},
            {"jsonrpc": "2.0", "id": 2, "method": "test/boomAsync"},
            {"jsonrpc": "2.0", "id": 3, "method": 5},
            {"jsonrpc": "2.0", "id": 4, "method": "textDocument/inlineCompletion", "params": {"x": 1}},
            {"jsonrpc": "2.0", "id": 5, "method": "no/such"},
            {"jsonrpc": "2.0", "id": 6, "method": "textDocument/completion", "params": [1, 2]},
            {"jsonrpc": "2.0", "id": 7, "method": "initialize", "params": {"capabilities": 5}},
            b"Content-Length: 9\r\n\r\n{not json",
            b'Content-Length: 6\r\n\r\n"\xff\xfe"\r\n',
        ]
        for message in bad:
            client.send(message)
        for msg_id in range(1, 8):
            await client.response(msg_id)
        errors = client.errors()
        assert len(errors) >= 9
        shown = json.dumps(errors)
        for fragment in SERVER_PATHS:
            assert fragment not in shown, (fragment, shown)
        boom_error = next(e for e in errors if e["id"] == 1)["error"]
        assert boom_error["code"] == -32603 and "server log" in boom_error["message"]

    asyncio.run(run())
