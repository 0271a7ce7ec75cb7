"""Transports: our own JSON-RPC framing over stdio and TCP.

Why not a maintained reader. pygls 2.1's ``pygls.io_.run_async`` (and python-lsp-jsonrpc's
``JsonRpcStreamReader``, the same design) reads a header line with ``readline()`` (unbounded: a line
without a newline is buffered whole), accepts only an exact ``Content-Length: N\r\n`` line, calls
``int()`` on any number of digits (more than 4,300 raise and end the loop), then reads exactly N bytes for
any N (a 200 MB declared length is buffered whole; a too-long one swallows the messages behind it) and
never resynchronises; a pygls TCP server also serves only its first connection. So ours stays:

- ``Framer`` finds message bodies in a byte stream. Linear: every search starts where the previous one
  stopped (less a header's length of overlap) and ``Framer.scanned`` counts the bytes examined (about
  one pass over the stream for well-formed traffic). Bounded: a header block is at most
  ``MAX_HEADER_BYTES``, a length at most ``_MAX_DIGITS`` digits, and a message over ``max_body`` is
  refused (``on_refused``: the connection answers with an error) while its bytes are discarded as they
  stream, never buffered whole. Resynchronising: garbage is skipped up to the next ``Content-Length``
  header; a raw header line can never occur inside a JSON body (JSON escapes CR/LF inside strings and
  the word is no JSON token), so a header found inside a pending body, or a body that ends in the start
  of one, means the declared length was wrong and the next message starts there; in a header block the
  last ``Content-Length`` counts (a header repeated or left without its blank line is not the next
  message's end) and a line that is no header field ends the block as invalid.
- ``Connection`` turns bodies into pygls messages. Not JSON: a parse error (id null). Not a JSON-RPC
  2.0 message (``{"method": 5}``, an id that is an object, params that are a number, neither method nor
  result): InvalidRequest, for the id when there is a valid one and it was a request. A notification
  method sent with an id (``textDocument/didOpen`` with ``"id"``): it is applied as the notification
  it is (dropping it would lose the client's edit) and the id gets an InvalidRequest error saying so.
  Invalid params for a request: InvalidParams for its id. Every error response leaves through
  ``scrub_frame``: no traceback and no server path ever reaches a client (pygls puts the traceback of
  an internal error into ``error.data`` and the exception text, paths included, into the message).
- ``serve_stdio`` runs one session on stdin/stdout. Over TCP (``specls serve --tcp``) the team
  listener (``specls.team.listener.Listener``) accepts any number of connections, each its own session
  (own documents and settings) sharing one ``EngineHost``, and feeds each through ``connect``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import re
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from specls.lsp.server import SpeclsServer

from specls.memory import release_freed_memory

logger = logging.getLogger(__name__)

# Why 64 MiB: JSON escapes can make a source file up to twice as large on the wire, so this still admits
# files far past anything worth completing in, while a hostile or broken client cannot make us hold more.
MAX_BODY = 64 * 1024 * 1024
MAX_HEADER_BYTES = 8192  # a header block (Content-Length line to blank line); real ones are < 100 bytes
_MAX_FIRST_LINE = 256  # the Content-Length line itself
_MAX_DIGITS = 20  # more digits is garbage (and int() refuses more than 4,300)
_LOUD_WARNINGS = 20  # framing warnings per connection at WARNING level; the rest at DEBUG
_SNIFF_BYTES = 1024  # how much of a refused body is kept to find its id
_READ_CHUNK = 65536
_READ_AHEAD = 16  # chunks read ahead of the framer (1 MiB)
RELEASE_AFTER = 1024 * 1024  # after a message this large, give freed heap pages back to the OS

_PARSE_ERROR = -32700
_INVALID_REQUEST = -32600
_INVALID_PARAMS = -32602
_INTERNAL_ERROR = -32603

_TOKEN = b"content-length"
_TOKEN_RE = re.compile(re.escape(_TOKEN), re.IGNORECASE)
_LENGTH_LINE = re.compile(rb"content-length[ \t]*:[ \t]*([^ \t\r\n]*)[ \t]*\r?\n", re.IGNORECASE)
_FIELD_LINE = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+[ \t]*:[^\r\n]*\r?\n")
_BLANK_LINE = re.compile(rb"\r?\n")
_NON_SPACE = re.compile(rb"\S")
# a header line inside a pending body; bounded so that a search can resume _NESTED_MAX bytes back
_NESTED = re.compile(rb"content-length[ \t]{0,4}:[ \t]{0,4}\d{1,20}[ \t]{0,4}\r?\n", re.IGNORECASE)
_NESTED_MAX = len(_TOKEN) + 4 + 1 + 4 + 20 + 4 + 2


def _prefixes(word: bytes) -> bytes:
    """A regex matching every non-empty prefix of ``word``: b"ab" -> b"a(?:b)?"."""
    out = b""
    for ch in reversed(word):
        c = re.escape(bytes([ch]))
        out = c + (b"(?:" + out + b")?" if out else b"")
    return out


# the start of a header line, cut off by the end of a body: "...}Content-Le" or "...}Content-Length: 5\r"
_TAIL = re.compile(
    rb"(?:" + _prefixes(_TOKEN) + rb"|content-length[ \t]{0,4}(?::[ \t]{0,4}(?:\d{1,20}[ \t]{0,4}\r?)?)?)\Z",
    re.IGNORECASE,
)
_SNIFF_ID = re.compile(rb'"id"\s*:\s*(-?\d{1,15}(?![\d.eE])|"(?:[^"\\]|\\.){0,64}")')
_PATH = re.compile(r"(?<![\w$/:.\\-])(?:/[^\s'\"/:,()\[\]]+){2,}/?|\b[A-Za-z]:\\[^\s'\"]+")

_SEEK, _HEADERS, _BODY, _DISCARD = "seek", "headers", "body", "discard"


@dataclass(frozen=True)
class Refused:
    """A message refused for its size. ``msg_id``: its id when one was found near the start of the
    body (a best effort: LSP clients put ``id`` before ``params``), else None."""

    declared: int
    limit: int
    msg_id: int | str | None


def sniff_id(start: bytes) -> int | str | None:
    """The id of a JSON-RPC message from the first bytes of its body, when it comes before ``params``.

    >>> sniff_id(b'{"jsonrpc":"2.0","id":7,"method":"textDocument/didOpen","params":{"text')
    7
    >>> sniff_id(b'{"jsonrpc":"2.0","method":"x","params":{"id": 3')  # an id inside params is not it
    """
    params = start.find(b'"params"')
    m = _SNIFF_ID.search(start, 0, params if params >= 0 else len(start))
    if m is None:
        return None
    try:
        value = json.loads(m.group(1))
    except ValueError:
        return None
    return value if isinstance(value, (int, str)) else None


class Framer:
    """Byte stream in, message bodies out (see the module docstring for the rules).

    ``scanned`` counts the bytes the searches examined: for a stream of n bytes fed in k chunks it stays
    below about 2n + 64k (well-formed traffic) and a small constant times n (hostile traffic)."""

    def __init__(self, max_body: int = MAX_BODY, on_refused: Callable[[Refused], None] | None = None) -> None:
        self.max_body = max_body
        self.on_refused = on_refused
        self.received = 0  # bytes fed
        self.scanned = 0  # bytes examined by searches (the linearity counter)
        self.dropped = 0  # bytes of garbage skipped (whitespace between messages not counted)
        self.refused = 0  # messages refused for their size
        self.resynced = 0  # messages whose declared length was wrong and that were cut at the next header
        self._buf = bytearray()  # unconsumed bytes: everything before them is gone
        self._state = _SEEK
        self._scan = 0  # the current state's searches have examined _buf[:_scan]
        self._line = 0  # _HEADERS: start of the block's next line
        self._length = -1  # declared length of the message being read
        self._body = 0  # _BODY: offset of the body in _buf
        self._left = 0  # _DISCARD: bytes of the refused message still to come
        self._sniff = bytearray()
        self._reported = False
        self._warnings = 0

    @property
    def buffered(self) -> int:
        """Bytes held (a refused message's are not)."""
        return len(self._buf)

    def feed(self, data: bytes) -> None:
        self._buf += data
        self.received += len(data)

    def reset(self) -> None:
        """Forget everything buffered (after a bug, so that one bad stream does not stop a session)."""
        self._buf = bytearray()
        self._to(_SEEK)

    def messages(self) -> Iterator[bytes]:
        """The complete message bodies buffered so far (call after each ``feed``)."""
        while True:
            if self._state is _SEEK:
                if not self._seek():
                    return
            elif self._state is _HEADERS:
                if not self._headers():
                    return
            elif self._state is _BODY:
                body = self._take_body()
                if body is None:
                    return
                yield body
            elif not self._discard():
                return

    # ------------------------------------------------------------------ states
    def _to(self, state: str) -> None:
        self._state = state
        self._scan = 0
        self._line = 0

    def _seek(self) -> bool:
        buf = self._buf
        start = max(0, self._scan - (len(_TOKEN) - 1))
        m = _TOKEN_RE.search(buf, start)
        if m is None:
            self.scanned += len(buf) - start
            keep = len(_TOKEN) - 1  # a header may be arriving in pieces
            if len(buf) > keep:
                self._skip(len(buf) - keep, "no header")
            self._scan = len(self._buf)
            return False
        self.scanned += m.end() - start
        self._skip(m.start(), "garbage before a header")
        self._to(_HEADERS)
        self._length = -1
        return True

    def _headers(self) -> bool:
        buf = self._buf
        while True:
            start = max(self._line, self._scan)
            limit = _MAX_FIRST_LINE if self._line == 0 else MAX_HEADER_BYTES
            nl = buf.find(b"\n", start, limit)
            if nl < 0:
                self.scanned += min(len(buf), limit) - start
                self._scan = min(len(buf), limit)
                if len(buf) >= limit:
                    return self._bad_block(
                        f"a Content-Length line over {_MAX_FIRST_LINE} bytes"
                        if self._line == 0
                        else f"a header block over {MAX_HEADER_BYTES} bytes"
                    )
                return False
            self.scanned += nl + 1 - start
            self._scan = end = nl + 1
            line = bytes(buf[self._line : end])
            if _BLANK_LINE.fullmatch(line):
                self._body = end
                if self._length > self.max_body:
                    del buf[:end]
                    self._start_discard()
                else:
                    self._state = _BODY
                    self._scan = end
                return True
            m = _LENGTH_LINE.fullmatch(line)
            if m is not None:
                value = m.group(1)
                if not value.isdigit() or len(value) > _MAX_DIGITS:
                    shown = value[:20] + (b"..." if len(value) > 20 else b"")
                    return self._bad_block(f"bad Content-Length {shown!r} ({len(value)} characters)")
                length = int(value)
                if self._length >= 0:
                    self.warn(
                        "two Content-Length headers (%d, then %d): the last one counts", self._length, length
                    )
                self._length = length
            elif self._line == 0 or not _FIELD_LINE.fullmatch(line) or _TOKEN_RE.search(line):
                # (a field line that holds the word is the next header glued to garbage)
                return self._bad_block("a header block without the blank line")
            self._line = end

    def _bad_block(self, why: str) -> bool:
        """Drop the Content-Length token that began this block and look for the next one."""
        self.warn("skipped a header (%s): %r", why, bytes(self._buf[:80]))
        self.dropped += len(_TOKEN)
        del self._buf[: len(_TOKEN)]
        self._to(_SEEK)
        return True

    def _take_body(self) -> bytes | None:
        buf = self._buf
        end = self._body + self._length
        avail = min(len(buf), end)
        start = max(self._body, self._scan - (_NESTED_MAX - 1))
        if avail > start:
            m = _NESTED.search(buf, start, avail)
            self.scanned += avail - start
            self._scan = avail
            if m is not None:  # the declared length runs into the next message
                self.warn("Content-Length %d ran into the next message; resynchronised", self._length)
                return self._emit(m.start())
        if len(buf) < end:
            return None
        lo = max(self._body, end - _NESTED_MAX)
        t = _TAIL.search(buf, lo, end)
        self.scanned += end - lo
        if t is not None:  # the declared length ends inside the next message's header
            self.warn("Content-Length %d ended inside the next header; resynchronised", self._length)
            return self._emit(t.start())
        return self._emit(end)

    def _emit(self, cut: int) -> bytes:
        if cut < self._body + self._length:
            self.resynced += 1
        with memoryview(self._buf) as view:
            body = bytes(view[self._body : cut])
        if cut >= len(self._buf):
            self._buf = bytearray()  # let a large buffer go (del would keep its capacity)
        else:
            del self._buf[:cut]
        self._to(_SEEK)
        return body

    def _start_discard(self) -> None:
        self._state = _DISCARD
        self._scan = 0
        self._left = self._length
        self._sniff = bytearray()
        self._reported = False
        self.refused += 1

    def _discard(self) -> bool:
        """A refused message: drop its bytes as they come, still watching for the next header."""
        buf = self._buf
        avail = min(len(buf), self._left)
        start = max(0, self._scan - (_NESTED_MAX - 1))
        m = _NESTED.search(buf, start, avail) if avail > start else None
        self.scanned += max(0, avail - start)
        if m is not None:
            self.warn("Content-Length %d ran into the next message; resynchronised", self._length)
            self.resynced += 1
            return self._end_discard(m.start())
        if avail == self._left:  # all of it arrived
            lo = max(0, avail - _NESTED_MAX)
            t = _TAIL.search(buf, lo, avail)
            self.scanned += avail - lo
            return self._end_discard(t.start() if t is not None else avail)
        keep = max(0, avail - (_NESTED_MAX - 1))  # a header may straddle the next chunk
        self._consume(keep)
        self._scan = avail - keep
        if len(self._sniff) >= _SNIFF_BYTES:
            self._report()
        return False

    def _consume(self, n: int) -> None:
        if len(self._sniff) < _SNIFF_BYTES:
            self._sniff += self._buf[: min(n, _SNIFF_BYTES - len(self._sniff))]
        del self._buf[:n]
        self._left -= n

    def _end_discard(self, cut: int) -> bool:
        self._consume(cut)
        self._report()
        if not self._buf:
            self._buf = bytearray()
        self._to(_SEEK)
        return True

    def _report(self) -> None:
        if self._reported:
            return
        self._reported = True
        refused = Refused(self._length, self.max_body, sniff_id(bytes(self._sniff)))
        self._sniff = bytearray()
        self.warn(
            "refused a message of %d bytes (the maximum is %d)%s; its bytes are discarded",
            refused.declared,
            refused.limit,
            "" if refused.msg_id is None else f", id {refused.msg_id!r}",
        )
        if self.on_refused is not None:
            self.on_refused(refused)

    # ------------------------------------------------------------------ helpers
    def _skip(self, n: int, why: str) -> None:
        if n <= 0:
            return
        m = _NON_SPACE.search(self._buf, 0, n)
        self.scanned += m.start() + 1 if m is not None else n
        if m is not None:
            self.dropped += n
            self.warn("skipped %d bytes (%s): %r", n, why, bytes(self._buf[: min(n, 80)]))
        del self._buf[:n]

    def warn(self, message: str, *args: object) -> None:
        """Log a problem with this stream's input: the first few at WARNING, the rest at DEBUG (a broken
        or hostile client must not flood the log)."""
        self._warnings += 1
        if self._warnings <= _LOUD_WARNINGS:
            logger.warning(message, *args)
            if self._warnings == _LOUD_WARNINGS:
                logger.warning("further problems with this connection's input are logged at DEBUG level")
        else:
            logger.debug(message, *args)


def encode(message: dict[str, Any]) -> bytes:
    body = json.dumps(message).encode("utf-8")
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


# ---------------------------------------------------------------------- what clients may see

_REDACTED = "Internal error (details are in the server log)"


def scrub_text(text: str) -> str:
    """``text`` without absolute file paths.

    >>> scrub_text("No such file: '/srv/specls/lsp/server.py' for textDocument/didOpen")
    "No such file: '<path>' for textDocument/didOpen"
    """
    return _PATH.sub("<path>", text)


def scrub_error(error: dict[str, Any]) -> dict[str, Any]:
    """A JSON-RPC response error fit for a client: an internal error (pygls sends the exception text and,
    in ``data``, its traceback) becomes a fixed message; other messages lose file paths; ``data`` is kept
    only when it holds neither a traceback nor a path.

    >>> scrub_error({"code": -32603, "message": "TypeError: x", "data": {"traceback": ['File "/a/b.py"']}})
    {'code': -32603, 'message': 'Internal error (details are in the server log)'}
    >>> scrub_error({"code": -32001, "message": "specls: unauthorized", "data": {"retry": False}})
    {'code': -32001, 'message': 'specls: unauthorized', 'data': {'retry': False}}
    """
    code = error.get("code")
    message = str(error.get("message", ""))
    if code == _INTERNAL_ERROR or "traceback" in message.lower() or 'File "' in message:
        message = _REDACTED
    out: dict[str, Any] = {"code": code, "message": scrub_text(message)}
    if "data" in error:
        try:
            shown = json.dumps(error["data"])
        except (TypeError, ValueError):
            shown = "traceback"
        if "traceback" not in shown.lower() and not _PATH.search(shown):
            out["data"] = error["data"]
    return out


def scrub_frame(data: bytes) -> bytes:
    """One outgoing frame, with its error (if it is an error response) scrubbed (``scrub_error``)."""
    if b'"error"' not in data:
        return data
    _, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return data
    try:
        message = json.loads(body)
    except ValueError:
        return data
    if not isinstance(message, dict) or "method" in message or not isinstance(message.get("error"), dict):
        return data
    clean = scrub_error(message["error"])
    if clean == message["error"]:
        return data
    message["error"] = clean
    return encode(message)


class ScrubbingWriter:
    """The writer pygls and ``Connection`` send through: every frame passes ``scrub_frame``."""

    def __init__(self, write: Callable[[bytes], object], close: Callable[[], object] | None = None) -> None:
        self._write = write
        self._close = close

    def write(self, data: bytes) -> None:
        self._write(scrub_frame(data))

    def close(self) -> None:
        if self._close is not None:
            self._close()


# ---------------------------------------------------------------------- messages


@dataclass(frozen=True)
class Problem:
    """Why a JSON value is not a JSON-RPC 2.0 message, and the id to answer (None: answer id null)."""

    msg_id: int | str | None
    message: str
    code: int = _INVALID_REQUEST


def _valid_id(value: object) -> bool:
    return value is None or (isinstance(value, (int, str)) and not isinstance(value, bool))


def check_message(raw: object) -> Problem | None:
    """None for a well-formed JSON-RPC 2.0 request, notification or response; else the Problem.

    >>> check_message({"jsonrpc": "2.0", "id": 1, "method": "shutdown"}) is None
    True
    >>> check_message({"jsonrpc": "2.0", "id": 3, "method": 5})
    Problem(msg_id=3, message="Invalid Request: 'method' must be a string", code=-32600)
    >>> check_message({"jsonrpc": "2.0", "id": {"a": 1}, "method": "shutdown"}).msg_id is None
    True
    """
    if not isinstance(raw, dict):
        return Problem(None, "Invalid Request: expected a JSON-RPC 2.0 object")
    if "id" in raw and not _valid_id(raw["id"]):
        return Problem(None, "Invalid Request: 'id' must be an integer, a string or null")
    msg_id = raw.get("id")
    if raw.get("jsonrpc") != "2.0":
        return Problem(msg_id, "Invalid Request: expected a JSON-RPC 2.0 object")
    if "method" in raw:
        if not isinstance(raw["method"], str):
            return Problem(msg_id, "Invalid Request: 'method' must be a string")
        params = raw.get("params")
        if params is not None and not isinstance(params, (dict, list)):
            return Problem(msg_id, "Invalid Request: 'params' must be an object or an array")
        return None
    if "id" not in raw or ("result" in raw) == ("error" in raw):
        # not a request (no method) and not a response: answering its id could hit a client request
        return Problem(
            None, "Invalid Request: a message needs a 'method', or an 'id' and a 'result' or 'error'"
        )
    error = raw.get("error", {"code": 0, "message": ""})
    code = error.get("code") if isinstance(error, dict) else None
    if not (isinstance(code, int) and not isinstance(code, bool) and isinstance(error.get("message"), str)):
        return Problem(None, "Invalid Request: 'error' must be an object with a code and a message")
    return None


class _QuietDeserializeErrors(logging.Filter):
    """pygls logs a full traceback for every message it cannot structure; ``Connection.dispatch`` logs
    one line for those instead (a broken client must not fill the log with tracebacks)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Unable to deserialize message")


logging.getLogger("pygls.protocol.json_rpc").addFilter(_QuietDeserializeErrors())


def is_notification(method: str) -> bool:
    """An LSP notification method (lsprotocol: a method without a result type)."""
    known = types.METHOD_TO_TYPES.get(method)
    return known is not None and known[1] is None


class Connection:
    """Feeds framed messages of one stream to one pygls server."""

    def __init__(
        self, server: SpeclsServer, write: Callable[[bytes], None], max_body: int = MAX_BODY
    ) -> None:
        self.server = server
        self.write = write
        self.framer = Framer(max_body, on_refused=self._refused)

    def error(self, msg_id: Any, code: int, message: str) -> None:
        try:
            self.write(encode({"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}}))
        except Exception:
            logger.debug("could not send an error response", exc_info=True)

    def _refused(self, refused: Refused) -> None:
        self.error(
            refused.msg_id,
            _INVALID_REQUEST,
            f"message refused: {refused.declared} bytes is over the maximum of {refused.limit} bytes",
        )

    def feed(self, data: bytes) -> None:
        self.framer.feed(data)
        try:
            for body in self.framer.messages():
                large = len(body) >= RELEASE_AFTER
                self.dispatch(body)
                del body
                if large:
                    release_freed_memory()
        except Exception:  # a framing bug must not end the session: drop what is buffered, go on
            logger.exception("framing failed; %d buffered bytes dropped", self.framer.buffered)
            self.framer.reset()

    def dispatch(self, body: bytes) -> None:
        protocol = self.server.protocol
        try:
            raw = json.loads(body)
        except Exception as exc:  # bad JSON, bad UTF-8, absurd nesting (RecursionError), a 5,000-digit number
            self.framer.warn("malformed JSON message: %s", str(exc)[:200])
            self.error(None, _PARSE_ERROR, "Parse error: the message is not valid JSON")
            return
        problem = check_message(raw)
        if problem is not None:
            self.framer.warn("invalid message: %s", problem.message)
            self.error(problem.msg_id, problem.code, problem.message)
            return
        assert isinstance(raw, dict)
        method = raw.get("method")
        if getattr(protocol, "_shutdown", False) and "id" in raw and method not in (None, "exit"):
            self.error(raw["id"], _INVALID_REQUEST, "the server is shutting down")
            return
        if "id" in raw and isinstance(method, str) and is_notification(method):
            # applied as the notification it is (dropping it would lose an edit), the id told so
            msg_id = raw.pop("id")
            self.framer.warn(
                "notification %r sent with id %r: applied, answered with an error", method, msg_id
            )
            self.error(
                msg_id, _INVALID_REQUEST, f"{method!r} is a notification and takes no id; it was applied"
            )
        if "method" in raw and "params" not in raw:
            raw["params"] = None  # pygls' generic message types require the field
        try:
            message = protocol.structure_message(raw)
        except Exception as exc:
            self.framer.warn("invalid message %r: %s", method, exc)
            if "id" in raw and "method" in raw:
                self.error(raw["id"], _INVALID_PARAMS, f"Invalid params for {method!r}")
            return
        try:
            protocol.handle_message(message)
        except SystemExit:
            raise
        except Exception:
            logger.exception("error handling %r", method)


def connect(
    server: LanguageServer,
    write: Callable[[bytes], object],
    close: Callable[[], object] | None = None,
    max_body: int = MAX_BODY,
) -> Connection:
    """Wire one stream's writer to ``server`` (through ``ScrubbingWriter``) and return the Connection
    to feed its bytes to."""
    assert isinstance(server, SpeclsServer)
    out = ScrubbingWriter(write, close)
    server.protocol.set_writer(out)
    return Connection(server, out.write, max_body)


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
    # bounded: a client writing faster than we frame waits in its pipe instead of filling our memory
    queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=_READ_AHEAD)
    conn = connect(server, writer.write, writer.close)
    session = server.session
    done = asyncio.Event()
    session.on_exit = lambda clean: done.set()

    def pump() -> None:
        fd = in_stream.fileno()
        while True:
            try:
                chunk = os.read(fd, _READ_CHUNK)
            except OSError:
                chunk = b""
            try:
                asyncio.run_coroutine_threadsafe(queue.put(chunk), loop).result()
            except (RuntimeError, concurrent.futures.CancelledError):  # the loop is gone
                return
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
