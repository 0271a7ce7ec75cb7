"""RemoteEngine end to end against ``specls serve-engine``'s HTTP server on loopback (fake engine;
the bundled ONNX engine in the slow test), plus wire-level checks of the OpenAI-compatible API."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator

import pytest

from specls.api import CompletionRequest, EngineError
from specls.team.auth import TokenStore, parse_token_file
from specls.team.fake import FakeEngine, FakeEngineSettings
from specls.team.remote import QWEN_FIM, RemoteEngine, RemoteSettings, fill_template
from specls.team.remote_http import parse_sse_data
from specls.team.serve_engine import EngineHTTPServer, ServeEngineSettings


@pytest.fixture
def served() -> Iterator[tuple[EngineHTTPServer, FakeEngine]]:
    engine = FakeEngine(FakeEngineSettings(pass_s=0.002, tokens_per_pass=2))
    engine.load()
    server = EngineHTTPServer(
        ServeEngineSettings(port=0, model_name="fake-coder", max_tokens_limit=100_000), engine
    ).start()
    try:
        yield server, engine
    finally:
        server.close()


def remote(server: EngineHTTPServer, **kw: object) -> RemoteEngine:
    r = RemoteEngine(RemoteSettings(base_url=server.url + "/v1", **kw))  # type: ignore[arg-type]
    r.load()
    return r


def test_fill_template_is_literal() -> None:
    assert fill_template(QWEN_FIM, "d = {x}", "}") == "<|fim_prefix|>d = {x}<|fim_suffix|>}<|fim_middle|>"
    assert parse_sse_data(b'data: {"a": 1}\n') == '{"a": 1}'
    assert parse_sse_data(b": comment\n") is None


@pytest.mark.parametrize("stream", [True, False])
def test_remote_matches_local_engine(served: tuple[EngineHTTPServer, FakeEngine], stream: bool) -> None:
    server, engine = served
    r = remote(server, stream=stream)
    assert r.ready and r.stats()["model"] == "fake-coder"
    res = r.complete(CompletionRequest("file:///a.py", "def add(a, b):\n", "\n", max_tokens=7))
    assert res.text == engine.expected_text("def add(a, b):\n", "\n", 7)
    assert res.tokens == 7 and res.stop_reason == "max_tokens" and not res.cancelled
    # decode statistics travel back in the "specls" field
    assert res.target_passes == 4 and res.per_drafter["fake"].drafted == res.drafted > 0


def test_text_stop_closes_the_stream_early(served: tuple[EngineHTTPServer, FakeEngine]) -> None:
    server, engine = served
    r = remote(server)
    full = engine.expected_text("p", "", 40)
    cut = len("".join(full.split(" ")[:2])) + 2  # keep two words

    def stop(text: str) -> int | None:
        return cut if len(text) >= cut else None

    res = r.complete(CompletionRequest("d", "p", "", max_tokens=40, stop=stop))
    assert res.text == full[:cut] and res.stop_reason == "stop"
    assert r.stats()["http_requests"] == 1


def test_server_side_stop_strings(served: tuple[EngineHTTPServer, FakeEngine]) -> None:
    server, engine = served
    full = engine.expected_text("q", "", 10)
    third = full.split(" ")[2]
    r = remote(server, stop=(third,))
    res = r.complete(CompletionRequest("d", "q", "", max_tokens=10))
    assert res.text == full[: full.index(third)]


def test_cache_and_type_ahead(served: tuple[EngineHTTPServer, FakeEngine]) -> None:
    server, engine = served
    r = remote(server)
    first = r.complete(CompletionRequest("d", "x = ", "", max_tokens=6))
    again = r.complete(CompletionRequest("d", "x = ", "", max_tokens=6))
    assert again.text == first.text and again.cache_hit
    typed = first.text[:3]
    ahead = r.complete(CompletionRequest("d", "x = " + typed, "", max_tokens=6))
    assert ahead.type_ahead and not ahead.cache_hit and ahead.text == first.text[3:]
    assert r.stats()["http_requests"] == 1 and len(engine.calls) == 1
    r.close_document("d")
    other = r.complete(CompletionRequest("d", "x = " + first.text[:4], "", max_tokens=6))
    assert not other.type_ahead and r.stats()["http_requests"] == 2


def test_cancel_aborts_the_stream_and_stops_the_server(
    served: tuple[EngineHTTPServer, FakeEngine],
) -> None:
    server, engine = served
    r = remote(server)
    flag = threading.Event()
    box: dict[str, object] = {}

    def run() -> None:
        box["r"] = r.complete(CompletionRequest("d", "long", "", max_tokens=100_000), flag.is_set)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while engine.passes == 0 and not engine.calls and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(0.05)
    flag.set()
    t.join(10)
    res = box["r"]
    assert not t.is_alive() and res.cancelled  # type: ignore[attr-defined]
    assert r.stats()["aborted_streams"] == 1
    # the server noticed the disconnect and stopped generating long before 100k tokens
    deadline = time.monotonic() + 10
    while server.scheduler.scheduler_stats()["running"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not server.scheduler.scheduler_stats()["running"]
    assert server.scheduler.scheduler_stats()["cancelled"] == 1
    assert engine.passes < 100_000 // 2


def test_unreachable_and_auth_errors(served: tuple[EngineHTTPServer, FakeEngine]) -> None:
    server, _ = served
    dead = RemoteEngine(RemoteSettings(base_url="http://127.0.0.1:9", connect_timeout_s=1, load_wait_s=0))
    with pytest.raises(EngineError, match="cannot connect"):
        dead.load()
    with pytest.raises(EngineError, match="URL"):
        RemoteEngine(RemoteSettings(base_url="ftp://x"))
    server.tokens = TokenStore(parse_token_file("alice:alice-token-1\n"))
    with pytest.raises(EngineError, match="401"):
        RemoteEngine(RemoteSettings(base_url=server.url)).load()
    ok = RemoteEngine(RemoteSettings(base_url=server.url, api_key="alice-token-1"))
    ok.load()
    assert ok.complete(CompletionRequest("d", "a", "", max_tokens=2)).text


def _post(server: EngineHTTPServer, body: object) -> tuple[int, dict[str, object]]:
    host, port = server.address
    conn = http.client.HTTPConnection(host, port, timeout=5)
    try:
        conn.request(
            "POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"}
        )
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def test_bad_requests_get_clear_errors(served: tuple[EngineHTTPServer, FakeEngine]) -> None:
    server, _ = served
    for body in ({"prompt": 5}, {"prompt": "x", "max_tokens": -1}, {"prompt": "x", "stop": [1]}, [1]):
        status, obj = _post(server, body)
        assert status == 400 and isinstance(obj["error"], dict) and obj["error"]["message"]
    status, obj = _post(server, {"prompt": "x", "max_tokens": 3})
    assert status == 200
    choices = obj["choices"]
    assert isinstance(choices, list) and choices[0]["finish_reason"] == "length"
    assert obj["usage"]["completion_tokens"] == 3  # type: ignore[index]
