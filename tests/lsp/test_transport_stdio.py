"""Issue 13 over a real stdio subprocess: bad framing never ends the server, errors carry no internals."""

from __future__ import annotations

import json
import sys
from typing import Any

from .lsp_helpers import FAKE_SERVER, ROOT, SPECLS, fake_env, python_cmd
from .stdio_peer import StdioPeer

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"capabilities": {}}}
SERVER_PATHS = [str(ROOT), sys.prefix, "site-packages", '.py"', ".py'", "Traceback"]


def test_specls_serve_survives_a_4301_digit_content_length():
    # the reproduction; before: int() raised, `specls serve` exited 1 with a traceback
    peer = StdioPeer([SPECLS, "serve"], fake_env())
    try:
        peer.write(b"Content-Length: " + b"1" * 4301 + b"\r\n\r\n{}")
        peer.send(INIT)  # the next valid request is answered
        assert "capabilities" in peer.response(1)["result"]
        assert peer.proc.poll() is None
        assert peer.close() == 0  # and the session ends cleanly
    finally:
        peer.kill()
    assert "Traceback" not in peer.stderr


def test_refused_oversized_message_over_stdio_then_the_next_request():
    peer = StdioPeer(python_cmd(FAKE_SERVER), fake_env())
    try:
        peer.send(INIT)
        peer.response(1)
        # declared 1 GB, then 3 MB of it, then a valid request: refused and resynchronised, not buffered
        body = b'{"jsonrpc": "2.0", "id": 2, "method": "textDocument/didOpen", "params": {"t": "'
        peer.write(b"Content-Length: %d\r\n\r\n" % (1 << 30) + body + b"z" * (3 << 20))
        peer.send({"jsonrpc": "2.0", "id": 3, "method": "specls/stats"})
        assert "result" in peer.response(3)
        refused = peer.response(2)["error"]
        assert refused["code"] == -32600 and "maximum" in refused["message"]
        assert peer.close() == 0
    finally:
        peer.kill()


def test_no_error_response_over_stdio_carries_a_traceback_or_a_server_path():
    peer = StdioPeer(python_cmd(FAKE_SERVER), fake_env())
    try:
        peer.send(INIT)
        peer.response(1)
        bad: list[dict[str, Any]] = [
            {"jsonrpc": "2.0", "id": 10, "method": 5},
            {"jsonrpc": "2.0", "id": {"a": 1}, "method": "shutdown"},
            {"jsonrpc": "2.0", "id": 11, "method": "specls/stats", "params": 5},
            {"jsonrpc": "2.0", "id": 12, "method": "textDocument/inlineCompletion", "params": {"x": 1}},
            {"jsonrpc": "2.0", "id": 13, "method": "no/such"},
            {"jsonrpc": "2.0", "id": 14, "method": "textDocument/didOpen", "params": {"textDocument": 5}},
            {"jsonrpc": "2.0", "id": 15, "method": "$/cancelRequest", "params": {"id": 99}},
            {"jsonrpc": "2.0", "id": 16},
        ]
        for message in bad:
            peer.send(message)
        peer.write(b"Content-Length: 9\r\n\r\n{not json")
        peer.send({"jsonrpc": "2.0", "id": 17, "method": "specls/stats"})
        peer.response(17)
        for msg_id in range(10, 16):
            assert "error" in peer.response(msg_id)
        errors = peer.errors()
        assert len(errors) >= 9
        shown = json.dumps(errors)
        for fragment in SERVER_PATHS:
            assert fragment not in shown, (fragment, shown)
        assert peer.close() == 0
    finally:
        peer.kill()
