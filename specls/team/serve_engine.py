"""``specls serve-engine``: an ``Engine`` (specls's in-process ONNX engine by default) behind the
OpenAI-compatible completions API, so a specls front end on another machine (``RemoteEngine``) -- or
any OpenAI-style client -- can use it.

Endpoints: ``POST /v1/completions`` (``prompt``, ``suffix``, ``max_tokens``, ``stop``, ``stream``,
``user``, ``raw``), ``GET /v1/models``, ``GET /healthz``. Requests go through a ``FairScheduler`` (one session
per API client), so many front ends share the engine fairly. ``user`` names the document: requests
with the same ``user`` reuse that document's KV prefix. Streaming uses Server-Sent Events; a client
that disconnects cancels its generation at the next target pass. Responses carry a ``specls`` object
with decode statistics (passes, drafted/accepted per drafter).

With a ``suffix`` field the prompt and suffix are passed to the engine as text: the engine builds its
own fill-in-the-middle prompt. Without one (or with ``"raw": true``) the prompt is decoded as it is,
as the API means it and as vLLM and llama.cpp do (``CompletionRequest.raw``): a prompt the client laid
out itself, such as the next-edit prompt ``RemoteEngine.next_edit`` sends, or a FIM template it
filled in. Its decode speculates as completions do (prompt lookup over the prompt among the
drafters), on a document apart from the same ``user``'s completions, so neither evicts the other's
KV. ``"raw": false`` asks for the FIM prompt with an empty suffix. Sampling parameters other than
greedy are ignored (the engine is greedy by contract)."""

from __future__ import annotations

import json
import logging
import queue
import select
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

from specls.api import CompletionRequest, CompletionResult, Engine, EngineError
from specls.team.auth import TokenStore
from specls.team.scheduler import ClientSession, FairScheduler, SchedulerSettings

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class ServeEngineSettings:
    host: str = "127.0.0.1"
    port: int = 8000  # 0 = pick a free port
    model_name: str = "specls"
    max_tokens_limit: int = 512
    default_max_tokens: int = 16  # the OpenAI API's default
    request_timeout_s: float = 30.0  # reading a request body


class _BadRequest(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


def _stop_strings(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,) if value else ()
    if isinstance(value, list) and all(isinstance(s, str) for s in value) and len(value) <= 16:
        return tuple(s for s in value if s)
    raise _BadRequest(400, "'stop' must be a string or a list of at most 16 strings")


def _earliest_stop(text: str, stops: tuple[str, ...]) -> int | None:
    best: int | None = None
    for s in stops:
        i = text.find(s)
        if i >= 0 and (best is None or i < best):
            best = i
    return best


def _peer_closed(sock: socket.socket) -> bool:
    """True when the client hung up (readable with EOF) -- checked without blocking."""
    try:
        r, _, _ = select.select([sock], [], [], 0)
        if not r:
            return False
        return sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


def finish_reason(result: CompletionResult) -> str | None:
    if result.cancelled:
        return None
    return "length" if result.stop_reason == "max_tokens" else "stop"


def result_stats(result: CompletionResult) -> dict[str, object]:
    return {
        "tokens": result.tokens,
        "stop_reason": result.stop_reason,
        "target_passes": result.target_passes,
        "drafted": result.drafted,
        "accepted": result.accepted,
        "prefill_tokens": result.prefill_tokens,
        "prefix_reused_tokens": result.prefix_reused_tokens,
        "prefill_ms": round(result.prefill_ms, 2),
        "decode_ms": round(result.decode_ms, 2),
        "per_drafter": {
            k: {"drafted": v.drafted, "accepted": v.accepted, "proposals": v.proposals}
            for k, v in result.per_drafter.items()
        },
    }


class EngineHTTPServer:
    """Serves ``engine`` over HTTP on a background thread (``start``/``close``), or in the foreground
    with ``serve_forever``."""

    def __init__(
        self,
        settings: ServeEngineSettings,
        engine: Engine,
        tokens: TokenStore | None = None,
        scheduler_settings: SchedulerSettings | None = None,
    ) -> None:
        self.settings = settings
        self.scheduler = FairScheduler(engine, scheduler_settings or SchedulerSettings())
        self.tokens = tokens
        self._sessions: dict[str, ClientSession] = {}
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer((settings.host, settings.port), self._handler_class())
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._httpd.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{host}:{port}"

    def session_for(self, client: str) -> ClientSession:
        with self._lock:
            s = self._sessions.get(client)
            if s is None:
                s = self._sessions[client] = self.scheduler.session(client)
            return s

    def start(self) -> EngineHTTPServer:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="specls-engine-http", daemon=True
        )
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._httpd.serve_forever()

    def close(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(timeout=5)
        self._httpd.server_close()
        self.scheduler.close()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        """The request handler bound to this server (http.server makes one handler per request)."""
        owner = self

        class Handler(_EngineRequestHandler):
            engine_server = owner

        return Handler


@dataclass(frozen=True)
class _CompletionParams:
    """A ``/v1/completions`` body, checked."""

    prompt: str
    suffix: str
    max_tokens: int  # capped at ServeEngineSettings.max_tokens_limit
    stops: tuple[str, ...]
    stream: bool
    doc: str  # "api:<user>" ("api:raw:<user>"), or a fresh anonymous document closed after the request
    raw: bool = False  # the prompt as it is (no FIM template around it, no suffix)

    @property
    def anonymous(self) -> bool:
        return self.doc.startswith("api:anon:")


def _parse_completion(body: dict[str, object], st: ServeEngineSettings) -> _CompletionParams:
    prompt = body.get("prompt", "")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise _BadRequest(400, "'prompt' must be a string (one prompt per request)")
    suffix = body.get("suffix") or ""
    if not isinstance(suffix, str):
        raise _BadRequest(400, "'suffix' must be a string")
    raw = _parse_raw(body, suffix)
    max_tokens = _parse_max_tokens(body, st)
    stops = _stop_strings(body.get("stop"))
    stream = bool(body.get("stream", False))
    user = body.get("user")
    if isinstance(user, str) and user:
        doc = f"api:raw:{user}" if raw else f"api:{user}"
    else:
        doc = f"api:anon:{uuid.uuid4().hex}"
    return _CompletionParams(prompt, suffix, max_tokens, stops, stream, doc, raw)


def _parse_raw(body: dict[str, object], suffix: str) -> bool:
    """A raw prompt: ``"raw": true``, else no ``suffix`` field (the API's plain continuation)."""
    raw = body.get("raw")
    if raw is None:
        return "suffix" not in body
    if not isinstance(raw, bool):
        raise _BadRequest(400, "'raw' must be true or false")
    if raw and suffix:
        raise _BadRequest(400, "a raw prompt has no 'suffix'")
    return raw


def _parse_max_tokens(body: dict[str, object], st: ServeEngineSettings) -> int:
    max_tokens = body.get("max_tokens", st.default_max_tokens)
    if max_tokens is None:
        max_tokens = st.default_max_tokens
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0:
        raise _BadRequest(400, "'max_tokens' must be a non-negative integer")
    return min(max_tokens, st.max_tokens_limit)


class _SettledText:
    """Streams the committed text as far as it is settled: up to the earliest stop string, and
    short of the last characters that could still begin one."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = stops
        self._hold = max((len(s) for s in stops), default=1) - 1
        self._sent = 0
        self.streamed: list[str] = []
        self.deltas: queue.Queue[str | None] = queue.Queue()  # None: the engine is done

    def stop(self, text: str) -> int | None:  # pure: the decode also asks it about drafts
        return _earliest_stop(text, self._stops)

    def on_text(self, text: str) -> None:  # the committed text so far: stream what is settled
        keep = _earliest_stop(text, self._stops)
        upto = keep if keep is not None else max(self._sent, len(text) - self._hold)
        if upto > self._sent:
            self.streamed.append(text[self._sent : upto])
            self.deltas.put(self.streamed[-1])
            self._sent = upto


class _HangUp:
    """A request's cancel check: the client hung up (checked without blocking; once gone, gone)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.gone = threading.Event()

    def __call__(self) -> bool:
        if not self.gone.is_set() and _peer_closed(self._sock):
            self.gone.set()
        return self.gone.is_set()


@dataclass(frozen=True)
class _Answer:
    """The fields every chunk of one completion's answer repeats."""

    cid: str
    created: int
    model: str

    def payload(
        self, text: str, finish: str | None, result: CompletionResult | None, usage: bool
    ) -> dict[str, object]:
        out: dict[str, object] = {
            "id": self.cid,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}],
        }
        if result is not None:
            out["specls"] = result_stats(result)
            if usage:
                out["usage"] = {
                    "prompt_tokens": result.prefill_tokens,
                    "completion_tokens": result.tokens,
                    "total_tokens": result.prefill_tokens + result.tokens,
                }
        return out


class _EngineRequestHandler(BaseHTTPRequestHandler):
    """One HTTP request to an ``EngineHTTPServer`` (``engine_server``, set by ``_handler_class``)."""

    server_version = "specls-engine"
    engine_server: ClassVar[EngineHTTPServer]

    def log_message(self, format: str, *args: object) -> None:
        log.debug("engine http %s: " + format, self.client_address[0], *args)

    def _json(self, status: int, obj: object) -> None:
        body = json.dumps(obj).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        self._json(status, {"error": {"message": message, "type": kind, "code": status}})

    def _client(self) -> str:
        tokens = self.engine_server.tokens
        if tokens is None:
            return "local"
        auth = self.headers.get("Authorization", "")
        scheme, _, token = auth.partition(" ")
        name = tokens.authenticate(token.strip()) if scheme.lower() == "bearer" else None
        if name is None:
            raise _BadRequest(401, "missing or invalid API key (Authorization: Bearer <token>)", "auth")
        return name

    def do_GET(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0]
        try:
            if path == "/healthz":
                self._health()
                return
            self._client()
            if path in ("/v1/models", "/models"):
                model = {
                    "id": self.engine_server.settings.model_name,
                    "object": "model",
                    "owned_by": "specls",
                }
                self._json(200, {"object": "list", "data": [model]})
            else:
                self._error(404, f"no route {path}")
        except _BadRequest as exc:
            self._error(exc.status, str(exc), exc.kind)

    def _health(self) -> None:
        ok = self.engine_server.scheduler.ready
        body = b"ok\n" if ok else b"loading\n"
        self.send_response(200 if ok else 503)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0]
        try:
            client = self._client()
            if path not in ("/v1/completions", "/completions"):
                raise _BadRequest(404, f"no route {path}")
            body = self._read_body()
            self._complete(client, body)
        except _BadRequest as exc:
            self._error(exc.status, str(exc), exc.kind)
        except EngineError as exc:
            self._error(503, str(exc), "engine_error")
        except (BrokenPipeError, ConnectionResetError):
            log.debug("client went away")

    def _read_body(self) -> dict[str, object]:
        try:
            n = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            raise _BadRequest(400, "bad Content-Length") from None
        if n <= 0:
            raise _BadRequest(400, "a JSON body is required")
        if n > MAX_BODY_BYTES:
            raise _BadRequest(413, "request body too large")
        self.connection.settimeout(self.engine_server.settings.request_timeout_s)
        try:
            obj = json.loads(self.rfile.read(n))
        except (ValueError, OSError):
            raise _BadRequest(400, "body is not valid JSON") from None
        if not isinstance(obj, dict):
            raise _BadRequest(400, "body must be a JSON object")
        self.connection.settimeout(None)
        return obj

    def _complete(self, client: str, body: dict[str, object]) -> None:
        server = self.engine_server
        params = _parse_completion(body, server.settings)
        session = server.session_for(client)
        settled = _SettledText(params.stops)
        hang_up = _HangUp(self.connection)
        request = CompletionRequest(
            doc_id=params.doc,
            prefix=params.prompt,
            suffix=params.suffix,
            max_tokens=params.max_tokens,
            stop=settled.stop,
            on_text=settled.on_text if params.stream else None,
            raw=params.raw,
        )
        answer = _Answer(f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time()), server.settings.model_name)
        if not params.stream:
            result = session.complete(request, hang_up)
            if params.anonymous:
                session.close_document(params.doc)
            if result.cancelled:
                return
            self._json(200, answer.payload(result.text, finish_reason(result), result, True))
            return
        self._stream(session, request, params, settled, hang_up, answer)

    def _stream(
        self,
        session: ClientSession,
        request: CompletionRequest,
        params: _CompletionParams,
        settled: _SettledText,
        hang_up: _HangUp,
        answer: _Answer,
    ) -> None:
        """Server-Sent Events: each settled piece as the engine commits it, then the rest and the
        statistics; the engine runs on a worker so this thread can write."""
        box: dict[str, object] = {}

        def run() -> None:
            try:
                box["result"] = session.complete(request, hang_up)
            except BaseException as exc:
                box["error"] = exc
            finally:
                settled.deltas.put(None)

        worker = threading.Thread(target=run, name="specls-engine-req", daemon=True)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        worker.start()
        try:
            while (piece := settled.deltas.get()) is not None:
                self._event(answer.payload(piece, None, None, False))
            worker.join()
            self._stream_end(box, settled, answer)
        except (BrokenPipeError, ConnectionResetError, OSError):
            hang_up.gone.set()
            worker.join(timeout=10)
        finally:
            if params.anonymous:
                session.close_document(params.doc)

    def _stream_end(self, box: dict[str, object], settled: _SettledText, answer: _Answer) -> None:
        """The engine's error, or what it produced past the streamed pieces, with its statistics."""
        err = box.get("error")
        if isinstance(err, BaseException):
            self._event({"error": {"message": str(err), "type": "engine_error"}})
            return
        final = box["result"]
        assert isinstance(final, CompletionResult)
        if final.cancelled:
            return
        already = "".join(settled.streamed)
        if final.text.startswith(already):
            rest = final.text[len(already) :]
        else:  # the engine rewrote text it had reported: cannot take back what was sent
            log.warning("engine final text differs from streamed text; sending no remainder")
            rest = ""
        self._event(answer.payload(rest, finish_reason(final), final, False))
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def _event(self, obj: object) -> None:
        self.wfile.write(b"data: " + json.dumps(obj).encode("utf-8") + b"\n\n")
        self.wfile.flush()
