"""``RemoteEngine.next_edit``: the edit prompt goes to the back end as a plain completion (the
layout's prompt as it is, its end markers as stop strings); the answer becomes the same edits as the
in-process path gives, and a cut answer none."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from specls.next_edit.edits import apply_edits
from specls.team.remote import RemoteEngine, RemoteSettings
from tests.hub_server import send_json
from tests.team.rename_case import AFTER, BEFORE, NEXT, rename_request, sweep_prompt


class Backend:
    """Answers every completion with ``text`` and ``finish``; keeps the bodies it was sent."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.text = ""
        self.finish = "stop"
        self.bodies: list[dict[str, Any]] = []
        backend = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                send_json(self, {"object": "list", "data": [{"id": backend.model}]})

            def do_POST(self) -> None:  # noqa: N802
                backend.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                send_json(self, {"choices": [{"text": backend.text, "finish_reason": backend.finish}]})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def backend() -> Iterator[Backend]:
    b = Backend("sweepai/sweep-next-edit-1.5B")
    yield b
    b.server.shutdown()


def test_the_edit_prompt_is_sent_as_a_completion(backend: Backend) -> None:
    engine = RemoteEngine(RemoteSettings(backend.url, stream=False))
    engine.load()
    request = rename_request()
    layout, rendered = sweep_prompt(request)  # the served model's name says which
    backend.text = NEXT  # the server leaves out the stop string it ended at
    result = engine.next_edit(request)
    (body,) = backend.bodies
    assert body["prompt"] == rendered.prompt and "suffix" not in body
    assert body["stop"] == list(layout.end_markers) and body["temperature"] == 0.0
    assert result.layout == "sweep" and result.provider == "remote"
    assert apply_edits(AFTER, result.edits) == NEXT
    assert [e.text for e in result.edits] == ["idth"]
    # an answer cut by the budget is no edit
    backend.finish = "length"
    cut = engine.next_edit(request)
    assert cut.edits == () and cut.dropped == "malformed"
    # the model puts back the user's edit: left out
    backend.finish, backend.text = "stop", BEFORE
    assert engine.next_edit(request).dropped == "undo"
    assert engine.next_edit(request, cancelled=lambda: True).cancelled


def test_an_answer_that_runs_on_into_the_file_after_the_region_ends_there(backend: Backend) -> None:
    engine = RemoteEngine(RemoteSettings(backend.url, stream=False))
    engine.load()
    tail = "".join(f"\n\ndef other_{i}(x):\n    return x + {i}\n" for i in range(12))
    base = rename_request()
    request = type(base)(base.doc_id, AFTER + tail, base.line, base.character, base.history)
    _, rendered = sweep_prompt(request)
    assert rendered.after  # the region ends inside the file
    region = rendered.region_text.replace("return w * h\n", "return width * h\n", 1)
    # the model rewrote the region and went on copying the file until the budget cut it
    backend.text, backend.finish = region + rendered.after + "def more", "length"
    result = engine.next_edit(request)
    assert result.dropped == "" and [e.text for e in result.edits] == ["idth"]  # Not "malformed"
