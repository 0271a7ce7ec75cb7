"""End-to-end tests of the language server over stdio and TCP with a deterministic fake engine."""

from __future__ import annotations

import asyncio
import subprocess

import pytest
from lsprotocol import types
from pygls.exceptions import JsonRpcRequestCancelled
from specls.lsp.cli import fetch_stats

from .fake_server import fake_completion
from .lsp_helpers import (
    FAKE_SERVER,
    ROOT,
    fake_env,
    inline,
    inline_params,
    insert,
    open_doc,
    python_cmd,
    raw_stdio,
    raw_tcp,
    stats,
    stdio_client,
    tcp_client,
    tcp_server,
    wait_state,
)

FAKE = python_cmd(FAKE_SERVER)
URI = "file:///work/demo.py"
EMOJI = "\U0001f600"


async def test_capabilities_and_a_completion():
    async with stdio_client(FAKE, fake_env()) as (client, init):
        assert init is not None
        caps = init.capabilities
        assert caps.inline_completion_provider is not None
        assert caps.completion_provider is not None
        sync = caps.text_document_sync
        assert isinstance(sync, types.TextDocumentSyncOptions)
        assert sync.change == types.TextDocumentSyncKind.Incremental
        await wait_state(client, ("ready",))
        text = "def area(r):\n    return 3.14 * r\n"
        open_doc(client, URI, text)
        items = await inline(client, URI, 1, 19)
        assert len(items) == 1
        prefix = "def area(r):\n    return 3.14 * r"
        assert items[0].insert_text == fake_completion(prefix)
        pos = types.Position(line=1, character=19)
        assert items[0].range == types.Range(start=pos, end=pos)
        # textDocument/completion fallback carries the same text
        listing = await client.text_document_completion_async(
            types.CompletionParams(text_document=types.TextDocumentIdentifier(uri=URI), position=pos)
        )
        assert isinstance(listing, types.CompletionList)
        assert len(listing.items) == 1
        edit = listing.items[0].text_edit
        assert isinstance(edit, types.TextEdit) and edit.new_text == fake_completion(prefix)
        s = await stats(client)
        assert s["server"]["answered"] == 2 and s["engine"]["complete"] == 2
        # specls/accepted is counted
        client.protocol.notify("specls/accepted", {"uri": URI})
        s = await stats(client)
        assert s["server"]["accepted"] == 1


async def test_not_ready_gives_empty_then_progress_and_completion():
    async with stdio_client(FAKE, fake_env(load_ms=1500)) as (client, _):
        open_doc(client, URI, "x = 1\n")
        items = await inline(client, URI, 0, 5)  # the model is still loading
        assert items == []
        s = await wait_state(client, ("ready",))
        assert s["server"]["not_ready"] >= 1
        assert await inline(client, URI, 0, 5) != []
        # work done progress: begin ... end
        reports = [r for token in client.progress_reports for r in client.progress_reports[token]]
        assert isinstance(reports[0], types.WorkDoneProgressBegin)
        assert isinstance(reports[-1], types.WorkDoneProgressEnd)
        assert any(isinstance(r, types.WorkDoneProgressReport) for r in reports)


async def test_utf16_positions_with_emoji():
    async with stdio_client(FAKE, fake_env()) as (client, _):
        await wait_state(client, ("ready",))
        text = f's = "{EMOJI}{EMOJI}"\nt = 1\n'
        open_doc(client, URI, text)
        # after the two emoji: 's = "' is 5 units, each emoji 2 -> 9
        items = await inline(client, URI, 0, 9)
        assert len(items) == 1
        assert items[0].insert_text == fake_completion(f's = "{EMOJI}{EMOJI}')  # not one emoji more or less
        assert items[0].range is not None and items[0].range.start.character == 9
        # an edit addressed in UTF-16 after the emoji lands after them
        insert(client, URI, 2, 0, 9, "!")
        items = await inline(client, URI, 0, 10)
        assert items and items[0].insert_text == fake_completion(f's = "{EMOJI}{EMOJI}!')


async def test_invalid_text_lone_surrogate():
    async with stdio_client(FAKE, fake_env()) as (client, _):
        await wait_state(client, ("ready",))
        open_doc(client, URI, "bad = '\ud800'\nx = ")  # a lone surrogate (an invalid \\ud800 escape)
        items = await inline(client, URI, 1, 4)
        assert len(items) == 1
        # the engine got the text with the bad code unit replaced one for one
        assert items[0].insert_text == fake_completion("bad = '?'\nx = ")


async def test_out_of_range_positions_are_empty():
    async with stdio_client(FAKE, fake_env()) as (client, _):
        await wait_state(client, ("ready",))
        open_doc(client, URI, f"ab{EMOJI}\ncd\n")
        assert await inline(client, URI, 99, 0) == []  # no such line
        assert await inline(client, URI, 1, 50) == []  # past the line end
        assert await inline(client, URI, 0, 3) == []  # inside the surrogate pair
        assert await inline(client, "file:///not-open.py", 0, 0) == []
        assert await inline(client, URI, 1, 2) != []  # the server is fine


async def test_storm_of_changes_only_answers_current_version():
    async with stdio_client(FAKE, fake_env(pass_ms=15, tokens=6)) as (client, _):
        await wait_state(client, ("ready",))
        text = "value = "
        open_doc(client, URI, text)
        pending: list[tuple[asyncio.Future, str]] = []
        version = 1
        typed = "compute_total(items, tax=0.2) + offset * 3 - len(names) // 2 if flag else fallback_value(12345678)  # done"
        assert len(typed) >= 100
        for i, ch in enumerate(typed[:100]):
            col = len(text)
            version += 1
            insert(client, URI, version, 0, col, ch)
            text += ch
            if i % 5 == 4:
                fut = client.text_document_inline_completion_async(inline_params(URI, 0, len(text)))
                pending.append((asyncio.ensure_future(fut), text))
        results = [await asyncio.wait_for(f, 60) for f, _ in pending]
        answered = 0
        for result, prefix in zip(results, [p for _, p in pending], strict=True):
            items = [] if result is None else list(result.items)
            if items:
                answered += 1
                # computed for exactly the text the request was made for
                assert items[0].insert_text == fake_completion(prefix)
        final = results[-1]
        assert final is not None and list(final.items), "the newest request must be answered"
        s = await stats(client)
        dropped = s["server"]["cancelled"] + s["server"]["stale_dropped"]
        assert dropped >= 1
        assert answered + dropped <= len(pending) + s["server"]["cancelled"]


async def test_cancel_request_mid_generation():
    async with stdio_client(FAKE, fake_env(pass_ms=100, tokens=200)) as (client, _):
        await wait_state(client, ("ready",))
        open_doc(client, URI, "total = ")
        fut = asyncio.ensure_future(
            client.protocol.send_request_async(
                types.TEXT_DOCUMENT_INLINE_COMPLETION, inline_params(URI, 0, 8), msg_id="slow-1"
            )
        )

        async def started() -> None:
            while (await stats(client))["engine"]["complete"] < 1:
                await asyncio.sleep(0.02)

        await asyncio.wait_for(started(), 30)
        client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id="slow-1"))
        try:
            result = await asyncio.wait_for(fut, 30)  # it returns (200 passes would be 20 s)
            assert result is None or list(result.items) == []
        except JsonRpcRequestCancelled:
            pass

        async def engine_saw_cancel() -> dict:
            while True:
                s = await stats(client)
                if s["engine"]["cancelled_seen"] >= 1 and s["server"]["cancelled"] >= 1:
                    return s
                await asyncio.sleep(0.02)

        s = await asyncio.wait_for(engine_saw_cancel(), 30)
        assert s["server"]["cancelled"] >= 1


async def test_newer_request_cancels_running_generation():
    async with stdio_client(FAKE, fake_env(pass_ms=100, tokens=200)) as (client, _):
        await wait_state(client, ("ready",))
        open_doc(client, URI, "total = ")
        first = asyncio.ensure_future(client.text_document_inline_completion_async(inline_params(URI, 0, 8)))

        async def started() -> None:
            while (await stats(client))["engine"]["complete"] < 1:
                await asyncio.sleep(0.02)

        await asyncio.wait_for(started(), 30)
        second = asyncio.ensure_future(client.text_document_inline_completion_async(inline_params(URI, 0, 7)))
        r1 = await asyncio.wait_for(first, 30)
        assert isinstance(r1, types.InlineCompletionList) and list(r1.items) == []  # superseded
        s = await stats(client)
        assert s["engine"]["cancelled_seen"] >= 1
        second.cancel()


async def test_missing_model_one_message_then_empty():
    async with stdio_client(FAKE, fake_env(fail_load="model directory /nope not found")) as (client, _):
        await wait_state(client, ("failed",))
        open_doc(client, URI, "x = 1\n")
        for _ in range(3):
            assert await inline(client, URI, 0, 5) == []
        await stats(client)  # a round trip so every notification has arrived
        errors = [m for m in client.messages if m.type == types.MessageType.Error]
        assert len(errors) == 1
        assert "/nope not found" in errors[0].message


async def test_bad_settings_reported_once():
    opts = {"specls": {"maxTokens": "lots", "colour": "blue"}}
    async with stdio_client(FAKE, fake_env(), init_options=opts) as (client, _):
        await wait_state(client, ("ready",))
        client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings=opts))
        await stats(client)
        warnings = [m for m in client.messages if m.type == types.MessageType.Warning]
        assert len(warnings) == 1
        assert "colour" in warnings[0].message and "maxTokens" in warnings[0].message
        # a valid change applies without complaint
        client.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(settings={"specls": {"languages": ["rust"]}})
        )
        open_doc(client, URI, "x = 1\n")
        assert await inline(client, URI, 0, 5) == []  # python is no longer enabled
        await stats(client)
        assert len([m for m in client.messages if m.type == types.MessageType.Warning]) == 1


async def test_engine_settings_from_initialization_options():
    async with stdio_client(FAKE, fake_env(), init_options={"model": "/models/mine"}) as (client, _):
        s = await wait_state(client, ("ready",))
        assert s["engine"]["model"] == "/models/mine"  # the engine was rebuilt before loading
        change = types.DidChangeConfigurationParams(settings={"specls": {"model": "/models/other"}})
        client.workspace_did_change_configuration(change)
        client.workspace_did_change_configuration(change)
        s = await stats(client)
        assert s["engine"]["model"] == "/models/mine"  # a loaded engine is not swapped under the user
        warnings = [m.message for m in client.messages if m.type == types.MessageType.Warning]
        assert len(warnings) == 1 and "restart" in warnings[0]


def _raw_session_checks(conn, first_id: int = 1) -> None:
    """Malformed input leaves the server alive and answering."""
    conn.send({"jsonrpc": "2.0", "id": first_id, "method": "initialize", "params": {"capabilities": {}}})
    assert "result" in conn.response(first_id)
    conn.send({"jsonrpc": "2.0", "method": "initialized", "params": {}})
    # malformed JSON body
    conn.write(b"Content-Length: 9\r\n\r\n{not json")
    err = conn.next_response()
    assert err["error"]["code"] == -32700 and err["id"] is None
    # garbage without a header, then a non-numeric and a negative Content-Length
    conn.write(b"hello there\r\n\r\n")
    conn.write(b"Content-Length: abc\r\n\r\n{}")
    conn.write(b"Content-Length: -5\r\n\r\n{}")
    # a too-long declared length running into the next message
    body = b'{"jsonrpc": "2.0", "id": 90, "method": "specls/stats"}'
    conn.write(b"Content-Length: %d\r\n\r\n" % (len(body) + 500) + body)
    # unknown method (request) and unknown notification
    conn.send({"jsonrpc": "2.0", "id": 91, "method": "no/suchMethod", "params": {}})
    conn.send({"jsonrpc": "2.0", "method": "no/suchNotification", "params": {}})
    # invalid params for a known request
    conn.send({"jsonrpc": "2.0", "id": 92, "method": "textDocument/inlineCompletion", "params": {"x": 1}})
    # a JSON array is not a request; absurd nesting is not a crash
    conn.write(b"Content-Length: 2\r\n\r\n[]")
    deep = b"[" * 200_000 + b"]" * 200_000
    conn.write(b"Content-Length: %d\r\n\r\n" % len(deep) + deep)
    conn.send({"jsonrpc": "2.0", "id": 93, "method": "specls/stats", "params": {}})
    got: dict = {}
    while 93 not in got:
        msg = conn.read()
        if "id" in msg and "method" not in msg:
            got[msg["id"]] = msg
    assert "result" in got[90]  # recovered after the bad length
    assert got[91]["error"]["code"] == -32601
    assert got[92]["error"]["code"] == -32602
    assert got[93]["result"]["server"]["state"] in ("loading", "ready")
    conn.send({"jsonrpc": "2.0", "id": 94, "method": "shutdown"})
    assert "result" in conn.response(94)
    conn.send({"jsonrpc": "2.0", "id": 95, "method": "specls/stats"})
    assert conn.response(95)["error"]["code"] == -32600  # answered, not left hanging
    conn.send({"jsonrpc": "2.0", "method": "exit"})


def test_malformed_input_over_stdio():
    proc = subprocess.Popen(
        FAKE, env=fake_env(), cwd=str(ROOT), stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        _raw_session_checks(raw_stdio(proc))
        assert proc.wait(30) == 0  # clean exit after shutdown + exit
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_tcp_many_sessions_one_engine_and_stats_command():
    async with tcp_server([*FAKE, "--tcp", "0"], fake_env()) as (port, _proc):
        async with tcp_client(port) as a, tcp_client(port) as b:
            await wait_state(a, ("ready",))
            open_doc(a, URI, "alpha = 1\n")
            open_doc(b, URI, "beta = 22\n")  # same uri, different session: separate documents
            items_a = await inline(a, URI, 0, 9)
            items_b = await inline(b, URI, 0, 9)
            assert items_a[0].insert_text == fake_completion("alpha = 1")
            assert items_b[0].insert_text == fake_completion("beta = 22")
            # a third connection (what `specls stats` does) sees the shared counters
            s = await fetch_stats("127.0.0.1", port)
            assert s["server"]["sessions"] >= 3
            assert s["server"]["answered"] == 2
            assert len(s["engine"]["docs"]) == 2  # both sessions' buffers, kept apart
        # clients gone: their documents were closed in the engine, the server still serves
        async with tcp_client(port) as c:
            s = await stats(c)
            assert s["engine"]["docs"] == []
            open_doc(c, URI, "gamma = 3\n")
            assert await inline(c, URI, 0, 9) != []
        # raw malformed input over TCP
        conn, sock = raw_tcp(port)
        try:
            await asyncio.get_running_loop().run_in_executor(None, _raw_session_checks, conn)
        finally:
            sock.close()


@pytest.mark.parametrize("size_mb", [6])
async def test_huge_document_does_not_break_the_server(size_mb):
    async with stdio_client(FAKE, fake_env()) as (client, _):
        await wait_state(client, ("ready",))
        line = "value = compute(1, 2, 3)  # " + "x" * 70 + "\n"
        text = line * (size_mb * 1024 * 1024 // len(line))
        open_doc(client, URI, text)
        last = text.count("\n")
        insert(client, URI, 2, last, 0, "result = ")
        items = await inline(client, URI, last, 9)
        assert len(items) == 1  # the engine got a capped prefix, the answer is for it
        s = await stats(client)
        assert s["server"]["answered"] == 1
