"""Issue 13 item 8: what a connection costs and whether it is given back. Each session had its own
lsprotocol converter (~0.2 MB of generated structuring code, ~80 ms of CPU at its first initialize)
and pygls' method-level ``lru_cache`` kept up to 128 (protocol, method) pairs -- closed sessions with
their servers -- alive after the connection was gone."""

from __future__ import annotations

import gc
import json
import weakref

from specls.lsp.server import EngineHost, SpeclsServer, create_server
from specls.lsp.settings import ServerSettings

from specls.team.fake import FakeEngine

INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"processId": None, "capabilities": {"window": {"workDoneProgress": True}}},
}
METHODS = ("initialize", "initialized", "textDocument/didOpen", "textDocument/inlineCompletion", "shutdown")


def test_closed_sessions_are_freed() -> None:
    host = EngineHost(FakeEngine())
    refs = []
    for _ in range(20):
        server = create_server(ServerSettings(), host.engine, host=host)
        server.protocol.structure_message(json.loads(json.dumps(INIT)))
        for method in METHODS:  # what the lru_cache'd lookups saw per connection
            server.protocol.get_message_type(method)
            server.protocol.get_result_type(method)
        assert isinstance(server, SpeclsServer)
        server.session.close()
        refs.append(weakref.ref(server))
        del server
    gc.collect()
    # wrong before the fix: 20 alive (held by the class-level lru_cache of get_message_type)
    assert sum(r() is not None for r in refs) == 0
    host.close()


def test_sessions_share_one_converter() -> None:
    host = EngineHost(FakeEngine())
    a = create_server(ServerSettings(), host.engine, host=host)
    b = create_server(ServerSettings(), host.engine, host=host)
    assert a.protocol._converter is b.protocol._converter  # wrong before the fix: one per session
    msg = a.protocol.structure_message(json.loads(json.dumps(INIT)))
    assert msg.params.capabilities.window.work_done_progress is True
    host.close()
