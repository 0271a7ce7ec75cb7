"""``specls serve`` as a process. Issue 13 item 8: SIGTERM and SIGINT stop stdio and TCP servers
cleanly (in-flight work cancelled, sockets closed, exit status 0; before: -15 with nothing closed).
Item 11: ``--engine`` works over stdio too (before: ignored, the bundled model was loaded), and team
options that only mean something over TCP are refused there."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from pathlib import Path

import pytest

from specls.bench.team import LspClient
from tests.team.procs import WAIT_S, StderrWatch, StdioClient, specls
from tests.team.stub_backend import COMPLETION, stub_backend

# A fake engine whose completion would take ~1000 s: a process that exits within WAIT_S after the
# signal has cancelled it (the fake engine checks cancellation at every pass).
SLOW = ("--engine", "fake", "--fake-pass-ms", "1000")
LONG_REQUEST = {"maxTokens": 1000}


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def open_and_request(client: StdioClient, uri: str = "file:///a.py", text: str = "x = ") -> int:
    client.notify(
        "textDocument/didOpen",
        {"textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": text}},
    )
    lines = text.split("\n")
    return client.request(
        "textDocument/inlineCompletion",
        {
            "textDocument": {"uri": uri},
            "position": {"line": len(lines) - 1, "character": len(lines[-1])},
            "context": {"triggerKind": 1},
        },
    )


def wait_ready(client: StdioClient) -> None:
    for _ in range(int(WAIT_S / 0.02)):
        if client.call("specls/stats", {})["result"]["server"]["state"] == "ready":
            return
        time.sleep(0.02)
    raise AssertionError("the engine never became ready")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stdio_serve_stops_on_a_signal_with_work_in_flight(sig: signal.Signals) -> None:
    proc = specls("serve", *SLOW, stdin=True)
    try:
        err = StderrWatch(proc)
        client = StdioClient(proc)
        assert "result" in client.initialize(LONG_REQUEST)
        open_and_request(client)
        for _ in range(int(WAIT_S / 0.05)):  # until the engine is generating
            stats = client.call("specls/stats", {})["result"]
            if stats["session"]["in_flight"] == 1 and stats["engine"].get("kv_cached_sequences") == 1:
                break
        assert stats["session"]["in_flight"] == 1
        proc.send_signal(sig)
        assert proc.wait(timeout=WAIT_S) == 0  # wrong before the fix: -15 (SIGTERM), 130 (SIGINT)
    finally:
        stop(proc)
    assert "Traceback" not in err.text, err.text


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_tcp_serve_stops_on_a_signal_closing_connections(sig: signal.Signals) -> None:
    proc = specls("serve", "--tcp", "127.0.0.1:0", *SLOW)
    try:
        err = StderrWatch(proc)
        port = int(err.wait_for(r"specls listening on 127\.0\.0\.1:(\d+)").group(1))
        client = await LspClient.connect("127.0.0.1", port)
        idle = await LspClient.connect("127.0.0.1", port)  # never authenticates
        init = await client.call(
            "initialize",
            {"processId": None, "capabilities": {}, "initializationOptions": LONG_REQUEST},
            WAIT_S,
        )
        assert "result" in init
        client.notify("initialized", {})
        client.notify(
            "textDocument/didOpen",
            {"textDocument": {"uri": "file:///a.py", "languageId": "python", "version": 1, "text": "x = "}},
        )
        _, pending = client.request(
            "textDocument/inlineCompletion",
            {
                "textDocument": {"uri": "file:///a.py"},
                "position": {"line": 0, "character": 4},
                "context": {"triggerKind": 1},
            },
        )
        for _ in range(int(WAIT_S / 0.05)):
            stats = (await client.call("specls/stats", {}, WAIT_S))["result"]
            if stats["team"]["running"] == 1:
                break
            await asyncio.sleep(0.05)
        assert stats["team"]["running"] == 1
        proc.send_signal(sig)
        # both connections are closed by the server (the read loops end at EOF) ...
        await asyncio.wait_for(asyncio.shield(client.task), WAIT_S)
        await asyncio.wait_for(asyncio.shield(idle.task), WAIT_S)
        assert client.reader.at_eof() and idle.reader.at_eof()
        with pytest.raises(ConnectionError):
            await pending  # the in-flight request was not answered: its connection closed
        # ... and the process exits 0 although its request had ~1000 s of passes left
        assert await asyncio.to_thread(proc.wait, WAIT_S) == 0  # wrong before the fix: -15
        await client.close()
        await idle.close()
    finally:
        stop(proc)
    assert "Traceback" not in err.text, err.text


def test_stdio_serve_uses_the_remote_engine() -> None:
    with stub_backend() as stub:
        stub.ready.set()
        proc = specls("serve", "--engine", "remote", "--remote-url", stub.url, stdin=True)
        try:
            client = StdioClient(proc)
            assert "result" in client.initialize()
            wait_ready(client)
            resp = client.response(open_and_request(client, text="def add(a, b):\n    "))
            # wrong before the fix: the bundled model's completion (the flag was ignored)
            assert [i["insertText"] for i in resp["result"]["items"]] == [COMPLETION]
            assert client.call("specls/stats", {})["result"]["engine"]["engine"] == "remote"
            client.call("shutdown", None)
            client.notify("exit", None)
            assert proc.wait(timeout=WAIT_S) == 0
        finally:
            stop(proc)
        assert any(method == "POST" and path == "/v1/completions" for method, path, _ in stub.seen)


def test_stdio_serve_uses_the_fake_engine() -> None:
    proc = specls("serve", "--engine", "fake", "--fake-pass-ms", "1", stdin=True)
    try:
        client = StdioClient(proc)
        assert "result" in client.initialize()
        wait_ready(client)
        resp = client.response(open_and_request(client))
        assert resp["result"]["items"][0]["insertText"].startswith("w")  # the fake engine's words
        assert "kv_cached_sequences" in client.call("specls/stats", {})["result"]["engine"]
        client.call("shutdown", None)
        client.notify("exit", None)
        assert proc.wait(timeout=WAIT_S) == 0
    finally:
        stop(proc)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--engine", "remote"), "--engine remote needs --remote-url"),
        (("--token-file", "/tmp/x"), "--token-file: only with --tcp"),
        (("--metrics-port", "9100"), "--metrics-port: only with --tcp"),
    ],
)
def test_stdio_serve_refuses_options_it_cannot_honour(
    tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    proc = specls("serve", *args, stdin=True)
    try:
        assert proc.wait(timeout=WAIT_S) == 2
    finally:
        stop(proc)
    assert proc.stderr is not None
    assert message in proc.stderr.read().decode()
