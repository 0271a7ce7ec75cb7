"""Issue 13 item 10: ``--engine remote`` started while the back end still answers 503 "Loading model"
(llama-server, vLLM) waits for it with bounded backoff, says "waiting for back end" in /healthz,
specls/stats and $/progress, and then serves; a back end that never comes up is a failed load (item
7: /healthz "failed", exit status 3). A stub back end on 127.0.0.1 stands in for llama-server."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import threading
from pathlib import Path
from typing import Any

import pytest
from specls.lsp.server import EngineHost, create_server
from specls.lsp.settings import ServerSettings

from specls.api import CompletionRequest, EngineError
from specls.bench.team import LspClient
from specls.team.glue import team_hooks
from specls.team.listener import Listener
from specls.team.remote import RemoteEngine, RemoteSettings, backoff_delay
from specls.team.service import TeamSettings
from tests.team.procs import WAIT_S, StderrWatch, poll_health, specls
from tests.team.stub_backend import COMPLETION, MODEL, stub_backend


def quick(url: str, **kw: Any) -> RemoteEngine:
    """Retries every 10-20 ms so a test spends no time waiting (the count of retries is what matters)."""
    settings: dict[str, Any] = {
        "stream": False,
        "retry_initial_s": 0.01,
        "retry_max_s": 0.02,
        "load_wait_s": WAIT_S,
    }
    settings.update(kw)
    return RemoteEngine(RemoteSettings(base_url=url, **settings))


@pytest.mark.parametrize(
    ("attempt", "expected"),
    [(0, 0.5), (1, 1.0), (2, 2.0), (4, 8.0), (5, 10.0), (40, 10.0), (10_000, 10.0)],  # wrong: 16 (no cap)
)
def test_backoff_delay(attempt: int, expected: float) -> None:
    assert backoff_delay(attempt, 0.5, 10.0) == expected


def test_load_waits_for_a_back_end_that_is_still_loading() -> None:
    with stub_backend(loading_answers=3) as stub:
        engine = quick(stub.url)
        progress: list[str] = []
        engine.load(lambda msg, frac: progress.append(msg))  # wrong before the fix: EngineError HTTP 503
        assert engine.ready and stub.answered(503) == 3
        waiting = [m for m in progress if m.startswith("waiting for back end")]
        assert len(waiting) == 3 and "HTTP 503: Loading model" in waiting[0]
        stats = engine.stats()
        assert (stats["state"], stats["load_retries"], stats["model"]) == ("ready", 3, MODEL)
        result = engine.complete(CompletionRequest("file:///a.py", "def add(a, b):\n    ", "", max_tokens=8))
        assert result.text == COMPLETION


def test_load_gives_up_after_load_wait_s() -> None:
    with stub_backend() as stub:  # loading for ever
        engine = quick(stub.url, load_wait_s=0.1)
        with pytest.raises(EngineError, match=r"back end not ready.*HTTP 503: Loading model"):
            engine.load()
        assert engine.stats()["state"] == "failed" and not engine.ready
        assert stub.answered(503) >= 1


def test_a_refusal_for_good_is_not_retried() -> None:
    with stub_backend(status_while_loading=401) as stub:
        engine = quick(stub.url)
        with pytest.raises(EngineError, match="401"):
            engine.load()
        assert stub.answered(401) == 1  # wrong: several (retrying a wrong API key)


def test_close_stops_a_load_that_waits() -> None:
    with stub_backend() as stub:
        engine = quick(stub.url, load_wait_s=600, retry_initial_s=300, retry_max_s=300)
        box: dict[str, BaseException] = {}

        def load() -> None:
            try:
                engine.load()
            except BaseException as exc:
                box["error"] = exc

        t = threading.Thread(target=load, daemon=True)
        t.start()
        assert stub.first_request.wait(WAIT_S)
        engine.close()  # a server shutting down: the 300 s wait ends now
        t.join(WAIT_S)
        assert not t.is_alive()
        assert isinstance(box["error"], EngineError) and "stopped while waiting" in str(box["error"])


class RecordingClient(LspClient):
    """LspClient that also keeps the server's notifications ($/progress ...)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.notes: list[dict[str, Any]] = []
        super().__init__(reader, writer)

    def on_notification(self, msg: dict[str, Any]) -> None:
        self.notes.append(msg)


async def until(cond: Any, what: str) -> None:
    for _ in range(int(WAIT_S / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


async def test_team_server_shows_waiting_for_back_end_then_serves(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    with stub_backend() as stub:
        engine = quick(stub.url, retry_initial_s=0.02, retry_max_s=0.05)
        host = EngineHost(engine)
        hooks = team_hooks(TeamSettings(host="127.0.0.1"), engine)
        host.team = hooks
        service = hooks.service
        listener = Listener(
            host, lambda h: create_server(ServerSettings(), h.engine, host=h), metrics=service.metrics
        )
        bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        serving = asyncio.create_task(listener.serve("127.0.0.1", 0, bound.set_result))
        host.start_load(service.load_progress)  # as `specls serve --tcp` does
        port = await asyncio.wait_for(bound, WAIT_S)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        client = RecordingClient(reader, writer)
        try:
            init = await client.call(
                "initialize",
                {
                    "processId": None,
                    "capabilities": {"window": {"workDoneProgress": True}},
                    "initializationOptions": {},
                },
                WAIT_S,
            )
            assert "result" in init
            client.notify("initialized", {})
            await until(lambda: "waiting for back end" in service.health()[1], "/healthz says waiting")
            ok, detail = service.health()
            assert not ok and detail.startswith("loading: waiting for back end") and "HTTP 503" in detail
            stats = (await client.call("specls/stats", {}, WAIT_S))["result"]
            assert stats["team"]["load"]["state"] == "loading"
            assert stats["team"]["load"]["message"].startswith("waiting for back end")

            def progress_said(text: str) -> bool:
                return any(
                    n["method"] == "$/progress" and text in str(n["params"]["value"].get("message", ""))
                    for n in client.notes
                )

            await until(lambda: progress_said("waiting for back end"), "$/progress says waiting")
            stub.ready.set()  # the back end finished loading its model
            await until(lambda: service.health()[0], "/healthz ok")
            client.notify(
                "textDocument/didOpen",
                {
                    "textDocument": {
                        "uri": "file:///a.py",
                        "languageId": "python",
                        "version": 1,
                        "text": "x = ",
                    }
                },
            )
            resp = await client.call(
                "textDocument/inlineCompletion",
                {
                    "textDocument": {"uri": "file:///a.py"},
                    "position": {"line": 0, "character": 4},
                    "context": {"triggerKind": 1},
                },
                WAIT_S,
            )
            assert [i["insertText"] for i in resp["result"]["items"]] == [COMPLETION]
            await until(lambda: progress_said("ready"), "$/progress ends ready")
        finally:
            await client.close()
            listener.stop()
            await asyncio.wait_for(serving, WAIT_S)
            hooks.close()
            host.close()


def test_a_failed_load_is_reported_never_as_an_unretrieved_exception(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    asyncio.run(_failed_load_with_a_client_waiting())  # its own loop: asyncio reports unretrieved
    gc.collect()  # exceptions when the futures are collected, which may be when the loop is gone
    # wrong before the fix: asyncio's "Future exception was never retrieved" with a traceback
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]
    assert any(
        "could not be loaded" in r.getMessage() or "load failed" in r.getMessage() for r in caplog.records
    )


async def _failed_load_with_a_client_waiting() -> None:
    with stub_backend() as stub:
        engine = quick(stub.url, load_wait_s=0.2)
        host = EngineHost(engine)
        hooks = team_hooks(TeamSettings(host="127.0.0.1"), engine)
        host.team = hooks
        listener = Listener(host, lambda h: create_server(ServerSettings(), h.engine, host=h))
        bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        serving = asyncio.create_task(listener.serve("127.0.0.1", 0, bound.set_result))
        port = await asyncio.wait_for(bound, WAIT_S)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        client = RecordingClient(reader, writer)
        try:
            assert "result" in await client.call(
                "initialize", {"processId": None, "capabilities": {}}, WAIT_S
            )
            client.notify("initialized", {})  # the session waits for the load
            load = host.start_load(hooks.service.load_progress)
            await until(load.done, "load failed")
            await until(lambda: any("could not be loaded" in str(n["params"]) for n in client.notes), "told")
        finally:
            await client.close()
            listener.stop()
            await asyncio.wait_for(serving, WAIT_S)
            hooks.close()
            host.close()
        del load


def test_serve_tcp_waits_for_the_back_end_and_stops_on_sigterm(tmp_path: Path) -> None:
    with stub_backend() as stub:
        proc = specls(
            "serve",
            "--tcp",
            "127.0.0.1:0",
            "--engine",
            "remote",
            "--remote-url",
            stub.url,
            "--metrics-port",
            "0",
        )
        try:
            err = StderrWatch(proc)
            metrics = err.wait_for(r"metrics on (http://127\.0\.0\.1:\d+)/metrics").group(1)
            err.wait_for(r"specls listening on 127\.0\.0\.1:\d+")
            status, body = poll_health(metrics + "/healthz", "waiting for back end")
            assert status == 503 and "HTTP 503: Loading model" in body
            stub.ready.set()
            assert poll_health(metrics + "/healthz", "ok")[0] == 200
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=WAIT_S) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert "Traceback" not in err.text and "never retrieved" not in err.text, err.text


def test_serve_tcp_exits_3_when_the_back_end_never_comes_up() -> None:
    with stub_backend() as stub:
        proc = specls(
            "serve",
            "--tcp",
            "127.0.0.1:0",
            "--engine",
            "remote",
            "--remote-url",
            stub.url,
            "--load-wait-s",
            "0.5",
        )
        try:
            # wrong before the fix: exit status 0 only after a SIGTERM (it served empty completions)
            assert proc.wait(timeout=WAIT_S) == 3
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.stderr is not None
        text = proc.stderr.read().decode()
        assert "could not be loaded" in text and "HTTP 503: Loading model" in text
        assert "Traceback" not in text and "never retrieved" not in text


def test_serve_tcp_exits_3_when_the_model_cannot_load(tmp_path: Path) -> None:
    """Item 7: before the fix the process kept running and /healthz answered 503 "loading" forever."""
    proc = specls(
        "serve", "--tcp", "127.0.0.1:0", "--model", str(tmp_path / "no-such-model"), "--metrics-port", "0"
    )
    try:
        assert proc.wait(timeout=WAIT_S) == 3
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.stderr is not None
    text = proc.stderr.read().decode()
    assert "could not be loaded" in text and "no-such-model" in text
    assert "Traceback" not in text
