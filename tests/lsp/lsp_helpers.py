"""Shared helpers for the end-to-end language server tests (stdio and TCP, fake or real engine)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from lsprotocol import types
from pytest_lsp import LanguageClient
from pytest_lsp.client import make_test_lsp_client
from specls.lsp.cli import plain

from specls.bench.lsp import did_insert

ROOT = Path(__file__).resolve().parents[2]
FAKE_SERVER = str(Path(__file__).with_name("fake_server.py"))
SPECLS = str(ROOT / ".venv" / "bin" / "specls")

CAPABILITIES = types.ClientCapabilities(
    window=types.WindowClientCapabilities(work_done_progress=True, show_message=None),
    text_document=types.TextDocumentClientCapabilities(
        synchronization=types.TextDocumentSyncClientCapabilities(dynamic_registration=False),
        inline_completion=types.InlineCompletionClientCapabilities(dynamic_registration=False),
        completion=types.CompletionClientCapabilities(
            completion_item=types.ClientCompletionItemOptions(snippet_support=False)
        ),
    ),
    general=types.GeneralClientCapabilities(position_encodings=[types.PositionEncodingKind.Utf16]),
)


def fake_env(**values: Any) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    for key, value in values.items():
        env[f"SPECLS_FAKE_{key.upper()}"] = str(value)
    return env


@asynccontextmanager
async def stdio_client(
    cmd: list[str], env: dict[str, str], init_options: Any = None, initialize: bool = True
) -> AsyncIterator[tuple[LanguageClient, types.InitializeResult | None]]:
    client = make_test_lsp_client()
    await client.start_io(cmd[0], *cmd[1:], env=env, cwd=str(ROOT))
    result = None
    try:
        if initialize:
            result = await asyncio.wait_for(
                client.initialize_session(
                    types.InitializeParams(capabilities=CAPABILITIES, initialization_options=init_options)
                ),
                120,
            )
        yield client, result
        if initialize:
            await asyncio.wait_for(client.shutdown_session(), 30)
    finally:
        server = client._server
        if server is not None and server.returncode is None:
            server.kill()  # a failed test must not wait forever for the server to exit
        await client.stop()


@asynccontextmanager
async def tcp_client(port: int) -> AsyncIterator[LanguageClient]:
    client = make_test_lsp_client()
    await client.start_tcp("127.0.0.1", port)
    try:
        await client.initialize_session(types.InitializeParams(capabilities=CAPABILITIES))
        yield client
        await asyncio.wait_for(client.shutdown_async(None), 30)
        client.exit(None)
    finally:
        client._stop_event.set()


@asynccontextmanager
async def tcp_server(
    cmd: list[str], env: dict[str, str]
) -> AsyncIterator[tuple[int, subprocess.Popen[bytes]]]:
    """Start a TCP server on a free port (port 0) and wait for its "listening PORT" line."""
    proc = subprocess.Popen(cmd, env=env, cwd=str(ROOT), stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert proc.stderr is not None
        port = 0
        loop = asyncio.get_running_loop()
        while not port:
            line = await asyncio.wait_for(loop.run_in_executor(None, proc.stderr.readline), 120)
            if not line:
                raise RuntimeError(f"server exited with {proc.wait()}")
            m = re.search(rb"listening (?:on \S+:)?(\d+)", line)
            if m:
                port = int(m.group(1))
        yield port, proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def open_doc(client: LanguageClient, uri: str, text: str, version: int = 1, language: str = "python") -> None:
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=uri, language_id=language, version=version, text=text)
        )
    )


def insert(client: LanguageClient, uri: str, version: int, line: int, character: int, text: str) -> None:
    did_insert(client, uri, version, line, character, text)


def inline_params(uri: str, line: int, character: int) -> types.InlineCompletionParams:
    return types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri),
        position=types.Position(line=line, character=character),
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic),
    )


async def inline(
    client: LanguageClient, uri: str, line: int, character: int
) -> list[types.InlineCompletionItem]:
    result = await asyncio.wait_for(
        client.text_document_inline_completion_async(inline_params(uri, line, character)), 120
    )
    if result is None:
        return []
    return list(result.items if isinstance(result, types.InlineCompletionList) else result)


async def stats(client: LanguageClient) -> dict[str, Any]:
    result = plain(await asyncio.wait_for(client.protocol.send_request_async("specls/stats", {}), 30))
    assert isinstance(result, dict)
    return result


async def wait_state(client: LanguageClient, states: tuple[str, ...], timeout: float = 120) -> dict[str, Any]:
    async def poll() -> dict[str, Any]:
        while True:
            s = await stats(client)
            if s["server"]["state"] in states:
                return s
            await asyncio.sleep(0.05)

    return await asyncio.wait_for(poll(), timeout)


# ------------------------------------------------------------------ raw byte-level client


class RawConnection:
    """Bytes in, parsed JSON-RPC messages out (for malformed-input tests)."""

    def __init__(self, send: Any, recv: Any) -> None:
        self._send = send
        self._recv = recv
        self.buf = b""

    def write(self, data: bytes) -> None:
        self._send(data)

    def send(self, message: dict[str, Any]) -> None:
        body = json.dumps(message).encode()
        self.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)

    def read(self) -> dict[str, Any]:
        while True:
            m = re.search(rb"Content-Length: (\d+)\r\n(?:[^\r\n]+\r\n)*\r\n", self.buf)
            if m and len(self.buf) >= m.end() + int(m.group(1)):
                n = int(m.group(1))
                body = self.buf[m.end() : m.end() + n]
                self.buf = self.buf[m.end() + n :]
                msg: dict[str, Any] = json.loads(body)
                return msg
            chunk = self._recv()
            if not chunk:
                raise EOFError("server closed the stream")
            self.buf += chunk

    def next_response(self) -> dict[str, Any]:
        """The next message that is not a notification or a server request."""
        while True:
            msg = self.read()
            if "method" not in msg:
                return msg

    def response(self, msg_id: Any) -> dict[str, Any]:
        """Read until the response with this id (notifications are skipped)."""
        while True:
            msg = self.read()
            if "method" not in msg and msg.get("id") == msg_id:
                return msg


def raw_stdio(proc: subprocess.Popen[bytes]) -> RawConnection:
    assert proc.stdin is not None and proc.stdout is not None
    stdin, stdout = proc.stdin, proc.stdout

    def send(data: bytes) -> None:
        stdin.write(data)
        stdin.flush()

    return RawConnection(send, lambda: os.read(stdout.fileno(), 65536))


def raw_tcp(port: int) -> tuple[RawConnection, socket.socket]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    return RawConnection(sock.sendall, lambda: sock.recv(65536)), sock


def python_cmd(*args: str) -> list[str]:
    return [sys.executable, *args]
