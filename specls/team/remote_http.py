"""``RemoteHttp``: RemoteEngine's HTTP exchange with an OpenAI-compatible back end: one connection per
request, the model list (``GET /v1/models``) and a completion (``POST /v1/completions``) read into a
``Reply``, streamed (Server-Sent Events, the text-level stop run on every chunk) or whole, while a
``CancelWatcher`` shuts the socket down on cancel (the server sees the disconnect and stops).
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from specls.api import EngineError
from specls.decoder.api import CancelCheck

if TYPE_CHECKING:
    from specls.team.remote import RemoteSettings

# Answers of a back end that is starting or overloaded: worth another try. Others (401, 404 model...) are not.
RETRY_STATUSES = frozenset({429, 502, 503, 504})

TextStop = Callable[[str], int | None]  # CompletionRequest.stop: the length to keep, or None


class NotYet(Exception):
    """The back end is not ready yet (a retryable answer); the message says what it answered."""


def parse_sse_data(line: bytes) -> str | None:
    """The payload of one SSE ``data:`` line, or None for other lines (comments, event names)."""
    s = line.decode("utf-8", "replace").rstrip("\r\n")
    if not s.startswith("data:"):
        return None
    return s[5:].lstrip(" ")


class RemoteHttp:
    """The back end at ``settings.base_url``; counts the HTTP requests sent and the errors raised."""

    def __init__(self, settings: RemoteSettings) -> None:
        self.settings = settings
        url = settings.base_url.rstrip("/")
        if url.endswith("/v1"):
            url = url[:-3]
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise EngineError(f"remote engine URL must be http(s)://host[:port], got {settings.base_url!r}")
        self._scheme = parsed.scheme
        self._host = parsed.hostname
        self._port = parsed.port or (443 if parsed.scheme == "https" else 80)
        self._base_path = parsed.path.rstrip("/")
        self._lock = threading.Lock()
        self._http_requests = 0
        self._errors = 0

    @property
    def url(self) -> str:
        return f"{self._scheme}://{self._host}:{self._port}{self._base_path}"

    def counts(self) -> tuple[int, int]:
        """(HTTP requests sent, errors raised)."""
        with self._lock:
            return self._http_requests, self._errors

    def fail(self, what: str, exc: BaseException | str) -> EngineError:
        """The error to raise for `what` (counted)."""
        with self._lock:
            self._errors += 1
        reason = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
        return EngineError(f"remote engine at {self.url}: {what}: {reason}")

    def _conn(self) -> http.client.HTTPConnection:
        if self._scheme == "https":
            return http.client.HTTPSConnection(
                self._host, self._port, timeout=self.settings.connect_timeout_s
            )
        return http.client.HTTPConnection(self._host, self._port, timeout=self.settings.connect_timeout_s)

    def _headers(self, body: bool) -> dict[str, str]:
        h = {"Accept": "application/json, text/event-stream", "User-Agent": "specls"}
        if body:
            h["Content-Type"] = "application/json"
        if self.settings.api_key:
            h["Authorization"] = f"Bearer {self.settings.api_key}"
        return h

    @staticmethod
    def _error_detail(resp: http.client.HTTPResponse) -> str:
        try:
            raw = resp.read(4096).decode("utf-8", "replace")
        except OSError:
            return f"HTTP {resp.status}"
        try:
            obj = json.loads(raw)
            err = obj.get("error") if isinstance(obj, dict) else None
            if isinstance(err, dict):
                raw = str(err.get("message", raw))
            elif isinstance(err, str):
                raw = err
        except ValueError:
            pass
        return f"HTTP {resp.status}: {raw.strip()[:300]}"

    def list_models(self) -> list[Any] | None:
        """One ``GET /v1/models``: the ids served, or None for a server without the endpoint (it still
        may serve completions); raises NotYet (retryable) or EngineError (permanent)."""
        conn = self._conn()
        try:
            conn.request("GET", f"{self._base_path}/v1/models", headers=self._headers(False))
            resp = conn.getresponse()
            if resp.status in (401, 403):
                raise self.fail("listing models", self._error_detail(resp) + " (check the API key)")
            if resp.status in RETRY_STATUSES:
                raise NotYet(self._error_detail(resp))
            if resp.status == 404:
                return None
            if resp.status != 200:
                raise self.fail("listing models", self._error_detail(resp))
            data = json.loads(resp.read() or b"{}")
            return [m.get("id") for m in data.get("data", []) if isinstance(m, dict)]
        except (EngineError, NotYet):
            raise
        except (OSError, http.client.HTTPException) as exc:  # not listening yet, reset, timed out
            raise NotYet(f"cannot connect: {type(exc).__name__}: {exc}") from None
        except ValueError as exc:
            raise self.fail("listing models", f"bad JSON: {exc}") from None
        finally:
            conn.close()

    def complete(
        self, fields: dict[str, object], stop: TextStop | None, watch: CancelWatcher, reply: Reply
    ) -> None:
        """POST ``fields`` to ``/v1/completions`` and read the answer into ``reply``; a read that fails
        because the request was cancelled leaves what arrived so far and ``watch.aborted`` set."""
        body = json.dumps(fields).encode("utf-8")
        conn = self._conn()
        with self._lock:
            self._http_requests += 1
        try:
            conn.request("POST", f"{self._base_path}/v1/completions", body=body, headers=self._headers(True))
            sock = conn.sock
            if sock is not None:
                sock.settimeout(self.settings.read_timeout_s)
            watch.start(sock)
            resp = conn.getresponse()
            if resp.status != 200:
                raise self.fail("completion failed", self._error_detail(resp))
            if "text/event-stream" in resp.getheader("Content-Type", ""):
                self._read_stream(resp, stop, reply)
            else:
                reply.read_body(json.loads(resp.read() or b"{}"), stop)
        except EngineError:
            raise
        except (OSError, http.client.HTTPException, ValueError, AttributeError, TypeError) as exc:
            if not watch.aborted.is_set():
                raise self.fail("completion failed", exc) from None
        finally:
            watch.done.set()
            conn.close()

    def _read_stream(self, resp: http.client.HTTPResponse, stop: TextStop | None, reply: Reply) -> None:
        """Server-Sent Events: ``stop`` runs on every chunk and ends the read as soon as the
        completion is finished."""
        while True:
            line = resp.readline()
            if not line:
                break
            data = parse_sse_data(line)
            if not data:
                continue
            if data.strip() == "[DONE]":
                break
            obj = json.loads(data)
            if isinstance(obj, dict) and obj.get("error"):
                raise self.fail("stream error", str(obj["error"])[:300])
            piece = reply.add_chunk(obj)
            if stop is not None and piece:
                reply.kept = stop(reply.raw)
                if reply.kept is not None:
                    break


class CancelWatcher:
    """Polls the cancel check while a request runs and, on cancel, shuts the socket down, which
    aborts the HTTP stream (the server sees the disconnect and stops generating)."""

    def __init__(self, cancelled: CancelCheck, poll_s: float) -> None:
        self._cancelled = cancelled
        self._poll_s = poll_s
        self.done = threading.Event()
        self.aborted = threading.Event()
        # getresponse() hands the socket to the response (conn.sock becomes None): keep our own handle
        self._socks: list[socket.socket] = []
        self._thread = threading.Thread(target=self._watch, name="specls-remote-cancel", daemon=True)

    def start(self, sock: socket.socket | None) -> None:
        if sock is not None:
            self._socks.append(sock)
        self._thread.start()

    def _watch(self) -> None:
        while not self.done.wait(self._poll_s):
            try:
                stop = self._cancelled()
            except Exception:
                stop = True
            if stop:
                self.aborted.set()
                for sock in self._socks:
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                return


@dataclass
class Reply:
    """What the server answered so far; filled while reading, so a cancelled read still counts the
    chunks that arrived."""

    raw: str = ""
    finish: str | None = None  # the server's finish_reason
    kept: int | None = None  # where the request's text-level stop cut ``raw``
    chunks: int = 0
    extra: dict[str, object] = field(default_factory=dict)  # a specls serve-engine's decode stats

    def add_chunk(self, obj: Any) -> str:
        """One streamed event; returns its text."""
        choice = (obj.get("choices") or [{}])[0]
        piece: str = choice.get("text") or ""
        if piece:
            self.chunks += 1
            self.raw += piece
        if choice.get("finish_reason"):
            self.finish = str(choice["finish_reason"])
        if isinstance(obj.get("specls"), dict):
            self.extra = obj["specls"]
        return piece

    def read_body(self, obj: Any, stop: TextStop | None) -> None:
        """A whole (not streamed) answer."""
        choice = (obj.get("choices") or [{}])[0]
        self.raw = choice.get("text") or ""
        self.finish = choice.get("finish_reason")
        usage = obj.get("usage") or {}
        self.chunks = int(usage.get("completion_tokens") or 0) if isinstance(usage, dict) else 0
        if isinstance(obj.get("specls"), dict):
            self.extra = obj["specls"]
        if stop is not None:
            self.kept = stop(self.raw)

    @property
    def complete(self) -> bool:
        """The server finished on its own (not cut by our stop or a cancel)."""
        return self.kept is None and self.finish is not None

    @property
    def text(self) -> str:
        return self.raw if self.kept is None else self.raw[: self.kept]

    def tokens(self) -> int:
        """The server's own token count when it reports one, else the chunks received."""
        reported = self.extra.get("tokens")
        return reported if isinstance(reported, int) else self.chunks

    def stop_reason(self) -> str:
        if self.kept is not None:
            return "stop"
        if self.finish == "length":
            return "max_tokens"
        return "eos" if self.finish else "max_tokens"
