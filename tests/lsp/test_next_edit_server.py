"""Next edits over a real LSP client (pytest-lsp) against the server with the scripted fake engine
(``SPECLS_FAKE_NEXT_EDIT``: "old=>new", the first ``old`` at or below the cursor's line becomes
``new``): the item's shape and version, no edit for a superseded version, a completion request
preempting a slow next edit, the accept command counted."""

from __future__ import annotations

import asyncio
from typing import Any

from lsprotocol import types
from pygls.exceptions import JsonRpcRequestCancelled
from pygls.protocol.json_rpc import JsonRPCNotification
from pytest_lsp import LanguageClient
from specls.lsp.cli import plain
from specls.lsp.next_edit_feature import ACCEPT_COMMAND, INLINE_EDIT_METHOD

from .lsp_helpers import (
    FAKE_SERVER,
    fake_env,
    inline,
    insert,
    open_doc,
    python_cmd,
    stats,
    stdio_client,
    wait_state,
)

FAKE = python_cmd(FAKE_SERVER)
URI = "file:///work/demo.py"
TEXT = "def area(r):\n    return 3.14 * r * r\n\n\ndef volume(r, h):\n    return 3.14 * r * r * h\n"


def edit_params(uri: str, version: int, line: int, character: int) -> dict[str, Any]:
    return {
        "textDocument": {"uri": uri, "version": version},
        "position": {"line": line, "character": character},
    }


async def next_edit(client: LanguageClient, uri: str, version: int, line: int, character: int) -> list[Any]:
    result = plain(
        await asyncio.wait_for(
            client.protocol.send_request_async(
                INLINE_EDIT_METHOD, edit_params(uri, version, line, character)
            ),
            60,
        )
    )
    assert isinstance(result, dict) and isinstance(result["edits"], list), result
    return list(result["edits"])


async def next_edit_stats(client: LanguageClient) -> dict[str, Any]:
    counters: dict[str, Any] = (await stats(client))["server"]["next_edit"]
    return counters


async def engine_started_next_edit(client: LanguageClient, n: int) -> None:
    async def poll() -> None:
        while (await stats(client))["engine"].get("next_edit", 0) < n:
            await asyncio.sleep(0.02)

    await asyncio.wait_for(poll(), 30)


async def test_an_edit_comes_back_in_copilots_shape_for_the_requests_version() -> None:
    async with stdio_client(FAKE, fake_env(next_edit="3.14=>math.pi")) as (client, init):
        assert init is not None
        caps = init.capabilities
        assert isinstance(caps.experimental, dict) or hasattr(caps.experimental, "_asdict")
        assert plain(caps.experimental)["nextEdit"]["method"] == INLINE_EDIT_METHOD
        assert caps.execute_command_provider is not None
        assert ACCEPT_COMMAND in caps.execute_command_provider.commands
        await wait_state(client, ("ready",))
        open_doc(client, URI, TEXT, version=3)
        (edit,) = await next_edit(client, URI, 3, 0, 0)
        assert edit["text"] == "math.pi"
        assert edit["range"] == {"start": {"line": 1, "character": 11}, "end": {"line": 1, "character": 15}}
        assert edit["textDocument"] == {"uri": URI, "version": 3}
        command = edit["command"]
        assert command["command"] == ACCEPT_COMMAND and command["title"]
        assert len(command["arguments"]) == 1 and isinstance(command["arguments"][0], str)
        # below the cursor's line only (the fake's rule): the second function's constant
        (lower,) = await next_edit(client, URI, 3, 4, 0)
        assert lower["range"]["start"] == {"line": 5, "character": 11}
        assert await next_edit(client, "file:///not-open.py", 1, 0, 0) == []
        assert await next_edit(client, URI, 3, 99, 0) == []  # no such line
        s = await next_edit_stats(client)
        assert s["requests"] == 4 and s["answered"] == 2 and s["empty"] == 2
        assert s["latency_ms"]["n"] == 4
        # the two that reached the engine: how long each waited for it and ran in it
        assert s["queued_ms"]["n"] == s["engine_ms"]["n"] == 2
        assert s["engine_ms"]["p50"] <= s["latency_ms"]["p95"]
        # and one by one, in order: the two edits ran in the engine, the two empty answers did not
        assert [sorted(r) for r in s["recent"]] == [["engine_ms", "ms", "queued_ms"]] * 2 + [["ms"]] * 2
        assert all(r["queued_ms"] + r["engine_ms"] <= r["ms"] + 1 for r in s["recent"][:2])


async def test_no_edit_for_a_superseded_version() -> None:
    async with stdio_client(FAKE, fake_env(next_edit="3.14=>math.pi", pass_ms=400)) as (client, _):
        await wait_state(client, ("ready",))
        open_doc(client, URI, TEXT, version=1)
        pending = asyncio.ensure_future(next_edit(client, URI, 1, 0, 0))
        await engine_started_next_edit(client, 1)
        insert(client, URI, 2, 2, 0, "# a change while the edit is computed\n")
        assert await pending == []  # computed for version 1, which is gone
        # a request naming a version the document has left is answered empty at once
        assert await next_edit(client, URI, 1, 0, 0) == []
        s = await next_edit_stats(client)
        assert s["answered"] == 0 and s["stale_dropped"] >= 1
        assert s["stale_dropped"] + s["cancelled"] == 2
        # the current version gets its edit, for that version
        (edit,) = await next_edit(client, URI, 2, 0, 0)
        assert edit["textDocument"]["version"] == 2 and edit["range"]["start"]["line"] == 1


async def test_an_inline_completion_preempts_a_slow_next_edit() -> None:
    env = fake_env(next_edit="3.14=>math.pi", pass_ms=1500, tokens=1)
    async with stdio_client(FAKE, env) as (client, _):
        await wait_state(client, ("ready",))
        open_doc(client, URI, TEXT, version=1)
        pending = asyncio.ensure_future(next_edit(client, URI, 1, 0, 0))
        await engine_started_next_edit(client, 1)
        items = await inline(client, URI, 1, 23)
        assert len(items) == 1  # the completion is answered ...
        assert await pending == []  # ... and the next edit it preempted is not
        s = await next_edit_stats(client)
        assert s["cancelled"] == 1 and s["answered"] == 0
        assert (await stats(client))["server"]["answered"] == 1


async def test_shown_and_accepted_are_counted_once_per_edit() -> None:
    async with stdio_client(FAKE, fake_env(next_edit="3.14=>math.pi")) as (client, _):
        await wait_state(client, ("ready",))
        open_doc(client, URI, TEXT, version=1)
        (edit,) = await next_edit(client, URI, 1, 0, 0)
        command = edit["command"]
        client.protocol.notify("textDocument/didShowInlineEdit", {"item": {"command": command}})
        client.protocol.notify("textDocument/didShowInlineEdit", {"item": edit})  # the same edit again
        client.protocol.notify("textDocument/didFocus", {"textDocument": {"uri": URI}})  # Copilot's clients
        await client.workspace_execute_command_async(
            types.ExecuteCommandParams(command=command["command"], arguments=command["arguments"])
        )
        s = await next_edit_stats(client)
        assert (s["shown"], s["accepted"]) == (1, 1)
        await client.workspace_execute_command_async(
            types.ExecuteCommandParams(command=command["command"], arguments=command["arguments"])
        )
        await client.workspace_execute_command_async(
            types.ExecuteCommandParams(command=ACCEPT_COMMAND, arguments=["never-offered"])
        )
        assert (await next_edit_stats(client))["accepted"] == 1
        # copilot.el sends the command as a notification
        (second,) = await next_edit(client, URI, 1, 4, 0)
        note = JsonRPCNotification(method="workspace/executeCommand", params=second["command"], jsonrpc="2.0")
        client.protocol._send_data(note)  # notify() would make it a request without an id
        assert (await next_edit_stats(client))["accepted"] == 2
        assert (await stats(client))["server"]["errors"] == 0


async def test_cancel_request_stops_a_running_next_edit() -> None:
    async with stdio_client(FAKE, fake_env(next_edit="3.14=>math.pi", pass_ms=800)) as (client, _):
        await wait_state(client, ("ready",))
        open_doc(client, URI, TEXT, version=1)
        pending = asyncio.ensure_future(
            client.protocol.send_request_async(INLINE_EDIT_METHOD, edit_params(URI, 1, 0, 0), msg_id="ne-1")
        )
        await engine_started_next_edit(client, 1)
        client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id="ne-1"))
        try:
            result = plain(await asyncio.wait_for(pending, 30))
            assert result == {"edits": []}
        except JsonRpcRequestCancelled:
            pass

        async def counted() -> dict[str, Any]:
            while (s := await next_edit_stats(client))["cancelled"] < 1:
                await asyncio.sleep(0.02)
            return s

        s = await asyncio.wait_for(counted(), 30)
        assert s["answered"] == 0
        # the server is fine: the next request gets its edit
        assert len(await next_edit(client, URI, 1, 0, 0)) == 1
