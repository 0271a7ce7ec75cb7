"""``specls serve-engine``: an ``Engine`` (specls's in-process ONNX engine by default) behind the
OpenAI-compatible completions API, so a specls front end on another machine (``RemoteEngine``) -- or
any OpenAI-style client -- can use it.

Endpoints: ``POST /v1/completions`` (``prompt``, ``suffix``, ``max_tokens``, ``stop``, ``stream``,
``user``), ``GET /v1/models``, ``GET /healthz``. Requests go through a ``FairScheduler`` (one session
per API client), so many front ends share the engine fairly. ``user`` names the document: requests
with the same ``user`` reuse that document's KV prefix. Streaming uses Server-Sent Events; a client
that disconnects cancels its generation at the next target pass. Responses carry a ``specls`` object
with decode statistics (passes, drafted/accepted per drafter).

The prompt and suffix are passed to the engine as text: the engine builds its own fill-in-the-middle
prompt. Sampling parameters other than greedy are ignored (the engine is greedy by contract)."""

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

    # -- request handling ------------------------------------------------------------------------

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "specls-engine"

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
                if server.tokens is None:
                    return "local"
                auth = self.headers.get("Authorization", "")
                scheme, _, token = auth.partition(" ")
                name = server.tokens.authenticate(token.strip()) if scheme.lower() == "bearer" else None
                if name is None:
                    raise _BadRequest(
                        401, "missing or invalid API key (Authorization: Bearer <token>)", "auth"
                    )
                return name

            def do_GET(self) -> None:  # noqa: N802
                path = self.path.split("?", 1)[0]
                try:
                    if path == "/healthz":
                        ok = server.scheduler.ready
                        body = b"ok\n" if ok else b"loading\n"
                        self.send_response(200 if ok else 503)
                        self.send_header("Content-Type", "text/plain")
                        self.send_header("Content-Length", str(len(body)))
                        self.end_headers()
                        self.wfile.write(body)
                        return
                    self._client()
                    if path in ("/v1/models", "/models"):
                        self._json(
                            200,
                            {
                                "object": "list",
                                "data": [
                                    {
                                        "id": server.settings.model_name,
                                        "object": "model",
                                        "owned_by": "specls",
                                    }
                                ],
                            },
                        )
                    else:
                        self._error(404, f"no route {path}")
                except _BadRequest as exc:
                    self._error(exc.status, str(exc), exc.kind)

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
                self.connection.settimeout(server.settings.request_timeout_s)
                try:
                    obj = json.loads(self.rfile.read(n))
                except (ValueError, OSError):
                    raise _BadRequest(400, "body is not valid JSON") from None
                if not isinstance(obj, dict):
                    raise _BadRequest(400, "body must be a JSON object")
                self.connection.settimeout(None)
                return obj

            def _complete(self, client: str, body: dict[str, object]) -> None:
                st = server.settings
                prompt = body.get("prompt", "")
                if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
                    prompt = prompt[0]
                if not isinstance(prompt, str):
                    raise _BadRequest(400, "'prompt' must be a string (one prompt per request)")
                suffix = body.get("suffix") or ""
                if not isinstance(suffix, str):
                    raise _BadRequest(400, "'suffix' must be a string")
                max_tokens = body.get("max_tokens", st.default_max_tokens)
                if max_tokens is None:
                    max_tokens = st.default_max_tokens
                if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0:
                    raise _BadRequest(400, "'max_tokens' must be a non-negative integer")
                max_tokens = min(max_tokens, st.max_tokens_limit)
                stops = _stop_strings(body.get("stop"))
                stream = bool(body.get("stream", False))
                user = body.get("user")
                doc = f"api:{user}" if isinstance(user, str) and user else f"api:anon:{uuid.uuid4().hex}"
                session = server.session_for(client)
                hold = max((len(s) for s in stops), default=1) - 1
                sent = 0
                streamed: list[str] = []
                deltas: queue.Queue[str | None] = queue.Queue()
                gone = threading.Event()
                sock = self.connection

                def stop_fn(text: str) -> int | None:  # pure: the decode also asks it about drafts
                    return _earliest_stop(text, stops)

                def on_text(text: str) -> None:  # the committed text so far: stream what is settled
                    nonlocal sent
                    keep = _earliest_stop(text, stops)
                    upto = keep if keep is not None else max(sent, len(text) - hold)
                    if upto > sent:
                        streamed.append(text[sent:upto])
                        deltas.put(streamed[-1])
                        sent = upto

                def cancelled() -> bool:
                    if not gone.is_set() and _peer_closed(sock):
                        gone.set()
                    return gone.is_set()

                request = CompletionRequest(
                    doc_id=doc,
                    prefix=prompt,
                    suffix=suffix,
                    max_tokens=max_tokens,
                    stop=stop_fn,
                    on_text=on_text if stream else None,
                )
                cid = f"cmpl-{uuid.uuid4().hex[:24]}"
                created = int(time.time())
                if not stream:
                    result = session.complete(request, cancelled)
                    if doc.startswith("api:anon:"):
                        session.close_document(doc)
                    if result.cancelled:
                        return
                    self._json(
                        200, self._payload(cid, created, result.text, finish_reason(result), result, True)
                    )
                    return

                box: dict[str, object] = {}

                def run() -> None:
                    try:
                        box["result"] = session.complete(request, cancelled)
                    except BaseException as exc:
                        box["error"] = exc
                    finally:
                        deltas.put(None)

                worker = threading.Thread(target=run, name="specls-engine-req", daemon=True)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                worker.start()
                try:
                    while True:
                        piece = deltas.get()
                        if piece is None:
                            break
                        self._event(self._payload(cid, created, piece, None, None, False))
                    worker.join()
                    err = box.get("error")
                    if isinstance(err, BaseException):
                        self._event({"error": {"message": str(err), "type": "engine_error"}})
                        return
                    final = box["result"]
                    assert isinstance(final, CompletionResult)
                    if final.cancelled:
                        return
                    already = "".join(streamed)
                    if final.text.startswith(already):
                        rest = final.text[len(already) :]
                    else:  # the engine rewrote text it had reported: cannot take back what was sent
                        log.warning("engine final text differs from streamed text; sending no remainder")
                        rest = ""
                    self._event(self._payload(cid, created, rest, finish_reason(final), final, False))
                    self.wfile.write(b"data: [DONE]\n\n")
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError, OSError):
                    gone.set()
                    worker.join(timeout=10)
                finally:
                    if doc.startswith("api:anon:"):
                        session.close_document(doc)

            def _event(self, obj: object) -> None:
                self.wfile.write(b"data: " + json.dumps(obj).encode("utf-8") + b"\n\n")
                self.wfile.flush()

            def _payload(
                self,
                cid: str,
                created: int,
                text: str,
                finish: str | None,
                result: CompletionResult | None,
                usage: bool,
            ) -> dict[str, object]:
                out: dict[str, object] = {
                    "id": cid,
                    "object": "text_completion",
                    "created": created,
                    "model": server.settings.model_name,
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

        return Handler
