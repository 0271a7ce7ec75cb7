"""A stub OpenAI-compatible back end on 127.0.0.1 for start-up tests: answers 503 "Loading model" (as
llama-server and vLLM do while they load) until ``ready`` is set -- by the test, or by the stub itself
after ``loading_answers`` 503s -- then serves ``/v1/models`` and non-streaming ``/v1/completions``."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = "stub-coder"
COMPLETION = "return a + b"


class StubBackend:
    def __init__(self, loading_answers: int | None = None, status_while_loading: int = 503) -> None:
        self.ready = threading.Event()
        self.loading_answers = loading_answers  # None: loading until the test sets ready
        self.status_while_loading = status_while_loading
        self.seen: list[tuple[str, str, int]] = []  # (method, path, status answered)
        self.lock = threading.Lock()
        self.first_request = threading.Event()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def _answer(self, status: int, obj: object) -> None:
                body = json.dumps(obj).encode()
                with stub.lock:  # before the answer: a client that has it may count it at once
                    stub.seen.append((self.command, self.path, status))
                stub.first_request.set()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _loading(self) -> bool:
                with stub.lock:
                    loading_so_far = sum(1 for _, _, s in stub.seen if s == stub.status_while_loading)
                if stub.loading_answers is not None and loading_so_far >= stub.loading_answers:
                    stub.ready.set()
                if stub.ready.is_set():
                    return False
                self._answer(stub.status_while_loading, {"error": {"message": "Loading model", "code": 503}})
                return True

            def do_GET(self) -> None:  # noqa: N802
                if self._loading():
                    return
                self._answer(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})

            def do_POST(self) -> None:  # noqa: N802
                n = int(self.headers.get("Content-Length", "0"))
                self.rfile.read(n)
                if self._loading():
                    return
                self._answer(
                    200,
                    {
                        "object": "text_completion",
                        "model": MODEL,
                        "choices": [{"index": 0, "text": COMPLETION, "finish_reason": "stop"}],
                        "usage": {"completion_tokens": 4},
                    },
                )

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def answered(self, status: int) -> int:
        with self.lock:
            return sum(1 for _, _, s in self.seen if s == status)


@contextmanager
def stub_backend(
    loading_answers: int | None = None, status_while_loading: int = 503
) -> Iterator[StubBackend]:
    stub = StubBackend(loading_answers, status_while_loading)
    stub.thread.start()
    try:
        yield stub
    finally:
        stub.httpd.shutdown()
        stub.httpd.server_close()
