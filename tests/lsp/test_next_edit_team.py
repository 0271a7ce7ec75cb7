"""Next edits in team mode (the team service inside the real language server over TCP): a client's
next edit goes through its scheduler view, comes back in the same shape, and the client's completion
request preempts a running one."""

from __future__ import annotations

import asyncio
from pathlib import Path

from specls.lsp.next_edit_feature import INLINE_EDIT_METHOD

from specls.bench.team import LspClient, initialize
from tests.team.engines import EditGateEngine
from tests.team.test_lsp_team import team_server

URI = "file:///w/a.py"


def open_doc(client: LspClient, text: str) -> None:
    item = {"uri": URI, "languageId": "python", "version": 1, "text": text}
    client.notify("textDocument/didOpen", {"textDocument": item})


def edit_params(line: int) -> dict[str, object]:
    return {"textDocument": {"uri": URI, "version": 1}, "position": {"line": line, "character": 0}}


async def test_a_team_clients_next_edit_and_its_preemption(tmp_path: Path) -> None:
    engine = EditGateEngine()
    engine.gate.set()
    async with team_server(tmp_path, engine) as (port, _):
        alice = await LspClient.connect("127.0.0.1", port)
        try:
            assert "result" in await initialize(alice, "alice-token-0001")
            open_doc(alice, "x = 1\ny = 2\n")
            resp = await alice.call(INLINE_EDIT_METHOD, edit_params(0), 30)
            (item,) = resp["result"]["edits"]
            assert item["text"] == "edited\n" and item["textDocument"] == {"uri": URI, "version": 1}
            assert item["range"] == {"start": {"line": 0, "character": 0}, "end": {"line": 1, "character": 0}}
            assert engine.edit_requests[-1].path == "/w/a.py"
            # a running next edit, then a completion of the same client: the completion goes first
            engine.gate.clear()
            engine.edit_entered.clear()
            _, pending = alice.request(INLINE_EDIT_METHOD, edit_params(1))
            await asyncio.to_thread(engine.edit_entered.wait, 10)
            _, completion = alice.request(
                "textDocument/inlineCompletion",
                {
                    "textDocument": {"uri": URI},
                    "position": {"line": 1, "character": 5},
                    "context": {"triggerKind": 1},
                },
            )
            edit_resp = await asyncio.wait_for(pending, 30)
            assert edit_resp["result"] == {"edits": []}  # preempted, not answered
            engine.gate.set()
            assert "result" in await asyncio.wait_for(completion, 30)
            stats = await alice.call("specls/stats", {}, 30)
            counters = stats["result"]["server"]["next_edit"]
            assert counters["answered"] == 1 and counters["cancelled"] == 1, counters
        finally:
            await alice.close()
