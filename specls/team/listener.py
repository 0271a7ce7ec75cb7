"""The TCP listener of ``specls serve --tcp``: every connection is its own language-server session
sharing one ``EngineHost``, with the limits a shared server needs against careless and hostile
clients:

- a cap on connections in total and per peer address (refused connections are closed at once);
- an authentication deadline: a connection that has not completed ``initialize`` with a valid token
  within ``auth_timeout_s`` is closed (the session itself serves nothing but ``initialize`` before
  that, see ``SpeclsProtocol.handle_message``), and may send at most ``max_unauthenticated_bytes``;
- an idle timeout for authenticated connections that send nothing (and wait for nothing);
- ``stop()``: stop accepting, close every connection (cancelling its in-flight work), return.

Framing, dispatch and the scrubbing of error responses are the transport's
(``specls.lsp.transport.connect``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable

from pygls.lsp.server import LanguageServer

from specls.lsp.server import EngineHost, SpeclsServer
from specls.lsp.transport import connect
from specls.memory import release_freed_memory
from specls.team.metrics import Metrics
from specls.team.service import ConnectionSettings

log = logging.getLogger(__name__)


class ConnectionTable:
    """Open connections per peer address; ``admit`` says why one more is refused, or None."""

    def __init__(self, settings: ConnectionSettings) -> None:
        self.settings = settings
        self.by_address: dict[str, int] = {}
        self.total = 0

    def admit(self, address: str) -> str | None:
        """Reserve a slot for ``address``: None when admitted (``release`` it later), else the reason
        ("total" or "per_address"). E.g. with max_per_address=2: admit("a"), admit("a") -> None, None;
        admit("a") -> "per_address"; admit("b") -> None."""
        if self.total >= max(1, self.settings.max_connections):
            return "total"
        if self.by_address.get(address, 0) >= max(1, self.settings.max_per_address):
            return "per_address"
        self.by_address[address] = self.by_address.get(address, 0) + 1
        self.total += 1
        return None

    def release(self, address: str) -> None:
        n = self.by_address.get(address, 0) - 1
        if n > 0:
            self.by_address[address] = n
        else:
            self.by_address.pop(address, None)
        self.total = max(0, self.total - 1)


def read_deadline(
    settings: ConnectionSettings, *, opened: float, last_read: float, authenticated: bool
) -> tuple[float | None, str]:
    """When the connection must next send something (monotonic seconds; None = no deadline) and the
    reason it is closed if it does not. Pure, for table tests with a fake clock.

    Example (auth 10 s, idle 3600 s): opened=100, last_read=101, not authenticated ->
    (110.0, "auth_timeout"); authenticated -> (3701.0, "idle"); idle_timeout_s=0 -> (None, "idle")."""
    if not authenticated:
        return opened + settings.auth_timeout_s, "auth_timeout"
    if settings.idle_timeout_s <= 0:
        return None, "idle"
    return last_read + settings.idle_timeout_s, "idle"


CLOSE_REASONS = ("auth_timeout", "idle", "unauthenticated_bytes", "stopping")


class Listener:
    """Accepts connections (``serve``) until ``stop``; ``make_server(host)`` builds each session."""

    def __init__(
        self,
        host: EngineHost,
        make_server: Callable[[EngineHost], LanguageServer],
        settings: ConnectionSettings | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        settings = settings or ConnectionSettings()
        self.host = host
        self.make_server = make_server
        self.settings = settings
        self.table = ConnectionTable(settings)
        self.metrics = metrics
        self._stop = asyncio.Event()  # set by stop(), also before serve() starts
        self._closers: set[asyncio.Event] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        if metrics is not None:
            metrics.counter("connections_refused", "TCP connections refused at accept, by reason")
            metrics.counter("connections_closed", "TCP connections closed by the server, by reason")
            metrics.gauge(
                "open_connections", "Open TCP connections", callback=lambda: [({}, float(self.table.total))]
            )

    def stop(self) -> None:
        """Stop accepting and close every connection (safe to call from a signal handler on the loop)."""
        self._stop.set()
        for closed in list(self._closers):
            closed.set()

    async def serve(self, address: str, port: int, ready: Callable[[int], None] | None = None) -> None:
        if self._stop.is_set():
            return
        tcp = await asyncio.start_server(self._on_connection, address, port)
        bound = tcp.sockets[0].getsockname()[1]
        log.info("specls listening on %s:%d", address, bound)
        if ready is not None:
            ready(bound)
        try:
            await self._stop.wait()
        finally:
            tcp.close()  # stop accepting
            self.stop()
            handlers = list(self._handlers)
            if handlers:
                await asyncio.wait(handlers, timeout=10)
            await tcp.wait_closed()

    def _count(self, family: str, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.inc(family, labels={"reason": reason})

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        if self._stop.is_set():
            writer.close()
            return
        refused = self.table.admit(address)
        if refused is not None:
            self._count("connections_refused", refused)
            log.warning(
                "refused a connection from %s: %s",
                address,
                f"{self.table.total} connections open (max {self.settings.max_connections})"
                if refused == "total"
                else f"{self.settings.max_per_address} connections from that address already",
            )
            writer.close()
            return
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        closed = asyncio.Event()
        self._closers.add(closed)
        try:
            await self._serve_connection(reader, writer, address, closed)
        finally:
            self._closers.discard(closed)
            self._handlers.discard(task)
            self.table.release(address)
            if self.table.total == 0 and not self._stop.is_set():
                # the last client left: after the engine thread's queued work (its documents' close),
                # give the C heap's freed pages back (glibc keeps a peak's KV and activations per arena)
                self.host.submit(release_freed_memory)

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, address: str, closed: asyncio.Event
    ) -> None:
        loop = asyncio.get_running_loop()
        server = self.make_server(self.host)
        assert isinstance(server, SpeclsServer)
        session = server.session
        log.info("connection from %s", address)
        sock = writer.get_extra_info("socket")
        if sock is not None:  # the kernel notices a peer that vanished without closing
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        conn = connect(server, writer.write)  # error responses leave scrubbed of paths and tracebacks
        session.on_exit = lambda clean: closed.set()
        opened = last_read = loop.time()
        unauthenticated_bytes = 0
        why = "eof"
        try:
            while not closed.is_set():
                if session.jobs:  # waiting for an answer of its own is not idle
                    last_read = loop.time()
                deadline, reason = read_deadline(
                    self.settings, opened=opened, last_read=last_read, authenticated=session.authenticated
                )
                timeout = None if deadline is None else max(0.0, deadline - loop.time())
                chunk = await _read(reader, closed, timeout)
                if chunk is None:  # closed, or the deadline passed
                    if closed.is_set():
                        break
                    if not session.jobs and deadline is not None and loop.time() >= deadline:
                        why = reason
                        break
                    continue
                if not chunk:
                    break
                last_read = loop.time()
                if not session.authenticated:
                    unauthenticated_bytes += len(chunk)
                    if unauthenticated_bytes > self.settings.max_unauthenticated_bytes:
                        why = "unauthenticated_bytes"
                        break
                conn.feed(chunk)
        except (ConnectionError, OSError) as exc:
            log.info("connection %s lost: %s", address, exc)
        finally:
            if closed.is_set():
                why = "stopping" if self._stop.is_set() else "exit"
            session.close()  # cancels its in-flight work, frees its documents
            if why in CLOSE_REASONS:
                self._count("connections_closed", why)
                level = logging.INFO if why in ("idle", "stopping") else logging.WARNING
                log.log(level, "closed the connection from %s (%s)", address, why.replace("_", " "))
            try:
                writer.close()
            except Exception:
                log.debug("close failed", exc_info=True)
            log.info("connection from %s closed", address)


async def _read(reader: asyncio.StreamReader, closed: asyncio.Event, timeout: float | None) -> bytes | None:
    """The next chunk (b"" at end of stream), or None when ``closed`` is set or ``timeout`` passes."""
    reading = asyncio.ensure_future(reader.read(65536))
    stopping = asyncio.ensure_future(closed.wait())
    try:
        done, _ = await asyncio.wait(
            {reading, stopping}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        stopping.cancel()
    if reading in done:
        return reading.result()
    reading.cancel()
    return None
