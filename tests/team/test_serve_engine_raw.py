"""``specls serve-engine``'s raw prompts: a completion without ``suffix`` (or with ``"raw": true``)
reaches the engine as the prompt itself, never wrapped in a FIM template, so ``--engine remote``
pointed at another specls serves next edits (``RemoteEngine.next_edit`` sends the layout's prompt)."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator

import pytest
from specls.decoder.api import CancelCheck, never_cancelled

from specls.api import CompletionRequest, CompletionResult
from specls.next_edit.edits import apply_edits
from specls.team.fake import FakeEngine, FakeEngineSettings
from specls.team.remote import RemoteEngine, RemoteSettings
from specls.team.serve_engine import EngineHTTPServer, ServeEngineSettings
from tests.team.rename_case import AFTER, NEXT, rename_request, sweep_prompt


class RawEngine(FakeEngine):
    """Keeps every request; answers a raw one with ``answer`` (cut by the request's stop)."""

    def __init__(self) -> None:
        super().__init__(FakeEngineSettings(pass_s=0.0))
        self.requests: list[CompletionRequest] = []
        self.answer = ""

    def complete(
        self, request: CompletionRequest, cancelled: CancelCheck = never_cancelled
    ) -> CompletionResult:
        with self._lock:
            self.requests.append(request)
        if not request.raw:
            return super().complete(request, cancelled)
        text, reason = self.answer, "max_tokens"
        keep = request.stop(text) if request.stop is not None else None
        if keep is not None:
            text, reason = text[:keep], "stop"
        if request.on_text is not None:
            request.on_text(text)
        return CompletionResult(text=text, tokens=len(text.split()), stop_reason=reason, provider="fake")


@pytest.fixture
def served() -> Iterator[tuple[EngineHTTPServer, RawEngine]]:
    engine = RawEngine()
    engine.load()
    settings = ServeEngineSettings(port=0, model_name="sweepai/sweep-next-edit-1.5B")
    server = EngineHTTPServer(settings, engine).start()
    try:
        yield server, engine
    finally:
        server.close()


def _post(server: EngineHTTPServer, body: object) -> tuple[int, dict[str, object]]:
    host, port = server.address
    conn = http.client.HTTPConnection(host, port, timeout=5)
    try:
        conn.request("POST", "/v1/completions", body=json.dumps(body))
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def test_a_prompt_without_suffix_reaches_the_engine_as_it_is(
    served: tuple[EngineHTTPServer, RawEngine],
) -> None:
    server, engine = served
    prompt = "<|file_sep|>original/a.py\nx = 1\n<|file_sep|>updated/a.py\n"
    engine.answer = "x = 2\n<|file_sep|>tail"
    status, obj = _post(server, {"prompt": prompt, "max_tokens": 40, "stop": ["<|file_sep|>"], "user": "u"})
    assert status == 200
    (sent,) = engine.requests
    assert sent.raw and sent.prefix == prompt and sent.suffix == ""  # no FIM template around it
    assert obj["choices"][0]["text"] == "x = 2\n"  # type: ignore[index]
    assert obj["choices"][0]["finish_reason"] == "stop"  # type: ignore[index]
    # with a suffix: the engine's own FIM prompt, on the user's completion document, not the raw one's
    status, _ = _post(server, {"prompt": "x = ", "suffix": "", "max_tokens": 2, "user": "u"})
    assert status == 200 and not engine.requests[1].raw
    raw_doc, fim_doc = (r.doc_id.split("\x1f")[-1] for r in engine.requests)
    assert (raw_doc, fim_doc) == ("api:raw:u", "api:u")
    # the flag says it either way
    _post(server, {"prompt": "p", "suffix": "", "raw": True, "max_tokens": 1})
    _post(server, {"prompt": "p", "raw": False, "max_tokens": 1})
    assert [r.raw for r in engine.requests[2:]] == [True, False]
    for bad in ({"prompt": "p", "suffix": "s", "raw": True}, {"prompt": "p", "raw": "yes"}):
        status, obj = _post(server, bad)
        assert status == 400 and obj["error"]["message"]  # type: ignore[index]
    assert len(engine.requests) == 4


@pytest.mark.parametrize("stream", [True, False])
def test_remote_next_edit_through_serve_engine(
    served: tuple[EngineHTTPServer, RawEngine], stream: bool
) -> None:
    server, engine = served
    remote = RemoteEngine(RemoteSettings(server.url, stream=stream))
    remote.load()
    request = rename_request()
    layout, rendered = sweep_prompt(request)  # the served model's name says which
    new_region = rendered.region_text.replace("return w * h\n", "return width * h\n", 1)
    engine.answer = layout.output_of(new_region) + "\ndef more(): ..."  # ends at its end marker
    result = remote.next_edit(request)
    (sent,) = engine.requests
    assert sent.raw and sent.prefix == rendered.prompt and sent.suffix == ""
    assert result.provider == "remote" and result.layout == "sweep"
    assert apply_edits(AFTER, result.edits) == NEXT
