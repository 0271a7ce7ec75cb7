"""Transports: our own JSON-RPC framing over stdio and TCP.

pygls' reader needs an exact ``Content-Length: N\\r\\n`` line and loses its place on a bad length; a TCP
pygls server also serves only its first connection. Here:

- ``Framer`` finds messages in a byte stream and resynchronises on the next ``Content-Length`` header
  after garbage, a bad length, a too-short body or a too-long declared length (a raw header line can
  never occur inside a JSON body, so a header found inside a pending body means the length was wrong).
- ``serve_stdio`` runs one session on stdin/stdout; ``serve_tcp`` accepts any number of connections,
  each its own session (own documents and settings) sharing one ``EngineHost``.

Malformed JSON gets a JSON-RPC parse error (id null), a request with invalid params an
InvalidParams error for its id; the connection stays up.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, BinaryIO

from pygls.lsp.server import LanguageServer
from specls.lsp.server import EngineHost, SpeclsServer

logger = logging.getLogger(__name__)

MAX_BODY = 64 * 1024 * 1024  # a 5 MB buffer is ~6-12 MB of JSON
_HEADER = re.compile(rb"content-length[ \t]*:[ \t]*([^\r\n:]*?)[ \t]*\r?\n", re.IGNORECASE)
_STRICT_HEADER = re.compile(rb"content-length[ \t]*:[ \t]*\d+[ \t]*\r?\n", re.IGNORECASE)
_HEADERS_END = re.compile(rb"\r?\n\r?\n")
_PARSE_ERROR = -32700
_INVALID_REQUEST = -32600
_INVALID_PARAMS = -32602


class Framer:
    """Byte stream in, message bodies out."""

    def __init__(self, max_body: int = MAX_BODY) -> None:
        self.buf = bytearray()
        self.max_body = max_body
        self.dropped = 0  # bytes of garbage skipped

    def feed(self, data: bytes) -> None:
        self.buf += data

    def _drop(self, n: int, why: str) -> None:
        chunk = bytes(self.buf[:n])
        if chunk.strip():
            self.dropped += n
            logger.warning("skipped %d bytes (%s): %r", n, why, chunk[:80])
        del self.buf[:n]

    def messages(self) -> Iterator[bytes]:
        while True:
            m = _HEADER.search(self.buf)
            if m is None:
                keep = 64  # a header may be arriving in pieces
                if len(self.buf) > keep:
                    self._drop(len(self.buf) - keep, "no header")
                return
            if m.start() > 0:
                self._drop(m.start(), "garbage before a header")
                continue
            end = _HEADERS_END.search(self.buf, m.end() - 2)
            if end is None:
                if len(self.buf) > 8192:
                    self._drop(m.end(), "header without an end")
                    continue
                return
            body_start = end.end()
            raw = m.group(1).strip()
            if not raw.isdigit() or int(raw) > self.max_body:
                self._drop(body_start, f"bad Content-Length {raw[:20]!r}")
                continue
            length = int(raw)
            available = self.buf[body_start : body_start + length]
            nested = _STRICT_HEADER.search(available)
            if nested is not None:  # the declared length runs into the next message
                body = bytes(available[: nested.start()])
                del self.buf[: body_start + nested.start()]
                logger.warning("Content-Length %d ran into the next message; resynchronised", length)
                yield body
                continue
            if len(available) < length:
                return
            del self.buf[: body_start + length]
            yield bytes(available)


def encode(message: dict[str, Any]) -> bytes:
    body = json.dumps(message).encode("utf-8")
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


class Connection:
    """Feeds framed messages of one stream to one pygls server."""

    def __init__(self, server: SpeclsServer, write: Callable[[bytes], None]) -> None:
        self.server = server
        self.write = write
        self.framer = Framer()

    def error(self, msg_id: Any, code: int, message: str) -> None:
        try:
            self.write(encode({"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}}))
        except Exception:
            logger.debug("could not send an error response", exc_info=True)

    def feed(self, data: bytes) -> None:
        self.framer.feed(data)
        for body in self.framer.messages():
            self.dispatch(body)

    def dispatch(self, body: bytes) -> None:
        protocol = self.server.protocol
        try:
            raw = json.loads(body)
        except Exception as exc:  # bad JSON, bad UTF-8, absurd nesting (RecursionError)
            logger.warning("malformed JSON message: %s", exc)
            self.error(None, _PARSE_ERROR, f"Parse error: {exc}")
            return
        if not isinstance(raw, dict) or raw.get("jsonrpc") != "2.0":
            msg_id = raw.get("id") if isinstance(raw, dict) else None
            self.error(msg_id, _INVALID_REQUEST, "Invalid Request: expected a JSON-RPC 2.0 object")
            return
        if getattr(protocol, "_shutdown", False) and "id" in raw and raw.get("method") not in (None, "exit"):
            self.error(raw["id"], _INVALID_REQUEST, "the server is shutting down")
            return
        if "method" in raw and "params" not in raw:
            raw["params"] = None  # pygls' generic message types require the field
        try:
            message = protocol.structure_message(raw)
        except Exception as exc:
            logger.warning("invalid message %r: %s", raw.get("method"), exc)
            if "id" in raw and "method" in raw:
                self.error(raw["id"], _INVALID_PARAMS, f"Invalid params for {raw.get('method')!r}")
            return
        try:
            protocol.handle_message(message)
        except SystemExit:
            raise
        except Exception:
            logger.exception("error handling %r", raw.get("method"))


class _StdoutWriter:
    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream
        self.lock = threading.Lock()

    def write(self, data: bytes) -> None:
        with self.lock:
            self.stream.write(data)
            self.stream.flush()

    def close(self) -> None:
        pass


def serve_stdio(server: LanguageServer, stdin: BinaryIO | None = None, stdout: BinaryIO | None = None) -> int:
    """Run one session on stdin/stdout until ``exit`` or EOF. Returns the LSP exit code (0 after a
    shutdown request, 1 otherwise)."""
    assert isinstance(server, SpeclsServer)
    in_stream = stdin or sys.stdin.buffer
    writer = _StdoutWriter(stdout or sys.stdout.buffer)
    return asyncio.run(_serve_stdio(server, in_stream, writer))


async def _read_or_stop(read: Awaitable[bytes], stop: asyncio.Event) -> bytes | None:
    """The next chunk from ``read``, or None (the read cancelled) when ``stop`` is set first."""
    reading = asyncio.ensure_future(read)
    stopping = asyncio.ensure_future(stop.wait())
    finished, _ = await asyncio.wait({reading, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if reading not in finished:
        reading.cancel()
        return None
    stopping.cancel()
    return reading.result()


async def _serve_stdio(server: SpeclsServer, in_stream: BinaryIO, writer: _StdoutWriter) -> int:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    server.protocol.set_writer(writer)
    conn = Connection(server, writer.write)
    session = server.session
    done = asyncio.Event()
    session.on_exit = lambda clean: done.set()

    def pump() -> None:
        fd = in_stream.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                chunk = b""
            loop.call_soon_threadsafe(queue.put_nowait, chunk)
            if not chunk:
                return

    threading.Thread(target=pump, name="specls-stdin", daemon=True).start()
    try:
        while not done.is_set():
            chunk = await _read_or_stop(queue.get(), done)
            if chunk is None:
                break
            if not chunk:
                logger.info("stdin closed")
                break
            conn.feed(chunk)
    finally:
        session.close()
        session.host.close()
    return 0 if session.exit_clean else 1


async def serve_tcp(
    host: EngineHost,
    make_server: Callable[[EngineHost], LanguageServer],
    address: str,
    port: int,
    ready: Callable[[int], None] | None = None,
) -> None:
    """Accept connections forever; each gets ``make_server(host)`` (its own session)."""

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        server = make_server(host)
        assert isinstance(server, SpeclsServer)
        peer = writer.get_extra_info("peername")
        logger.info("connection from %s", peer)
        server.protocol.set_writer(writer)  # type: ignore[arg-type]
        conn = Connection(server, writer.write)
        closed = asyncio.Event()
        server.session.on_exit = lambda clean: closed.set()
        try:
            while not closed.is_set():
                chunk = await _read_or_stop(reader.read(65536), closed)
                if not chunk:  # stopped (None) or end of stream (b"")
                    break
                conn.feed(chunk)
        except (ConnectionError, OSError) as exc:
            logger.info("connection %s lost: %s", peer, exc)
        finally:
            server.session.close()
            try:
                writer.close()
            except Exception:
                logger.debug("close failed", exc_info=True)
            logger.info("connection from %s closed", peer)

    tcp = await asyncio.start_server(on_connection, address, port)
    bound = tcp.sockets[0].getsockname()[1]
    logger.info("specls listening on %s:%d", address, bound)
    if ready is not None:
        ready(bound)
    async with tcp:
        await tcp.serve_forever()
