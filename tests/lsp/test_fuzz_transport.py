"""Issue 13: a seeded fuzz of the stdio transport. Malformed frames and messages (mutated headers,
lengths and bodies, random bytes, oversized declarations) interleaved with valid requests: the server
never exits, every valid request gets its result (none swallowed), and no error carries internals.

Waiting is bounded by a timeout on each response's arrival (a hang fails), never on speed."""

from __future__ import annotations

import json
import random
import sys
from collections import Counter
from collections.abc import Callable
from typing import Any

from .lsp_helpers import FAKE_SERVER, ROOT, fake_env, python_cmd
from .stdio_peer import StdioPeer, encode

SEED = 1313
MALFORMED = 1200
SERVER_PATHS = [str(ROOT), sys.prefix, "site-packages", '.py"', ".py'", "Traceback"]

Rng = random.Random


def _template(rng: Rng, n: int) -> dict[str, Any]:
    """A message body to mutate (ids apart from the valid requests' "v<i>"; never shutdown or exit)."""
    uri = f"file:///fuzz/{rng.randrange(5)}.py"
    text = rng.choice(["x = 1\n", "Content-Length: 5\r\n\r\n{}", "\u00e9\U0001f600\n" * 3, "{" * 50])
    choices: list[dict[str, Any]] = [
        {"jsonrpc": "2.0", "id": 10**6 + n, "method": "specls/stats", "params": {}},
        {
            "jsonrpc": "2.0",
            "method": "textDocument/didOpen",
            "params": {"textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": text}},
        },
        {
            "jsonrpc": "2.0",
            "id": f"m{n}",
            "method": "textDocument/inlineCompletion",
            "params": {
                "textDocument": {"uri": uri},
                "position": {"line": 0, "character": rng.randrange(9)},
                "context": {"triggerKind": 2},
            },
        },
        {"jsonrpc": "2.0", "method": "specls/accepted", "params": {}},
        {"jsonrpc": "2.0", "id": 10**6 + n, "method": "no/such", "params": [1]},
    ]
    return rng.choice(choices)


def _shape(rng: Rng, n: int) -> bytes:
    """A well-framed body that is not a good JSON-RPC message."""
    shapes: list[Any] = [
        {"method": 5},
        {"jsonrpc": "2.0", "id": 10**6 + n, "method": 5},
        {"jsonrpc": "2.0", "id": {"a": n}, "method": "specls/stats"},
        {"jsonrpc": "2.0", "id": [n], "method": "specls/stats"},
        {"jsonrpc": "2.0", "id": 1.5, "method": "specls/stats"},
        {"jsonrpc": "2.0", "id": True, "method": "specls/stats"},
        {"jsonrpc": "2.0", "id": 10**6 + n, "method": "specls/stats", "params": 5},
        {"jsonrpc": "2.0", "id": 10**6 + n, "method": "specls/stats", "params": "x"},
        {"jsonrpc": "1.0", "id": 10**6 + n, "method": "specls/stats"},
        {"id": 10**6 + n, "method": "specls/stats"},
        {"jsonrpc": "2.0", "id": 10**6 + n},
        {"jsonrpc": "2.0"},
        {"jsonrpc": "2.0", "id": 10**6 + n, "result": 1},
        {"jsonrpc": "2.0", "id": 10**6 + n, "error": "x"},
        {
            "jsonrpc": "2.0",
            "id": 10**6 + n,
            "method": "textDocument/didChange",
            "params": {"textDocument": 5},
        },
        {
            "jsonrpc": "2.0",
            "id": 10**6 + n,
            "method": "textDocument/didOpen",
            "params": {
                "textDocument": {"uri": "file:///w.py", "languageId": "python", "version": 1, "text": "a"}
            },
        },
        {
            "jsonrpc": "2.0",
            "id": 10**6 + n,
            "method": "textDocument/inlineCompletion",
            "params": {"textDocument": {"uri": 5}, "position": {"line": -1, "character": "x"}},
        },
        [1, 2],
        "x",
        5,
        None,
        [],
    ]
    raw = [
        b"",
        b"{",
        b"{not json",
        b'"\xff\xfe"',
        b"[" * 100_000 + b"]" * 100_000,
        b'{"jsonrpc": "2.0", "id": ' + b"9" * 5000 + b', "method": "specls/stats"}',
        b"\x00" * 10,
        '{"a": "\ud800"}'.encode("utf-8", "surrogatepass"),
    ]
    if rng.random() < 0.7:
        return json.dumps(rng.choice(shapes)).encode()
    return rng.choice(raw)


def _mutate_body(rng: Rng, body: bytes) -> bytes:
    data = bytearray(body)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(4)
        at = rng.randrange(len(data) + 1)
        if op == 0 and data:
            data[min(at, len(data) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1:
            data[at:at] = rng.randbytes(rng.randint(1, 8))
        elif op == 2:
            del data[at : at + rng.randint(1, 8)]
        else:
            data = data[:at]
    return bytes(data)


def _header(rng: Rng, length: int) -> bytes:
    """A Content-Length header block, often wrong."""
    value: bytes = b"%d" % length
    kind = rng.randrange(16)
    if kind == 0:
        value = b"%d" % max(0, length + rng.randint(-30, 40))  # wrong by up to a header and more
    elif kind == 1:
        value = b"1" * rng.randint(21, 5000)  # absurd digits (int() refuses past 4,300)
    elif kind == 2:
        value = rng.choice([b"-5", b"0x10", b"1e3", b"", b"\xd9\xa3", b"12 34", b"+12", b"1.0"])
    elif kind == 3:
        value = b"%d" % (length + rng.randint(10**8, 10**12))  # over the maximum: refused, discarded
    name = rng.choice([b"Content-Length", b"content-length", b"CONTENT-LENGTH", b"Content-Lenght"])
    sep = rng.choice([b": ", b":", b" : ", b":\t", b" "]) if rng.random() < 0.2 else b": "
    eol = rng.choice([b"\n", b"\r", b""]) if rng.random() < 0.15 else b"\r\n"
    block = name + sep + value + eol
    extra = rng.randrange(8)
    if extra == 0:
        block += b"Content-Length: %d\r\n" % (length + rng.randint(-5, 30))  # a second, maybe different
    elif extra == 1:
        block += b"Content-Type: application/vscode-jsonrpc; charset=utf-8\r\n"
    elif extra == 2:
        block += rng.randbytes(rng.randint(1, 30)) + b"\r\n"  # a line that is no header field
    if rng.random() < 0.85:
        block += b"\r\n"  # else: no blank line
    if rng.random() < 0.05:
        block = block[: rng.randrange(len(block))]  # cut short
    return block


def malformed(rng: Rng, n: int) -> tuple[str, bytes]:
    kind = rng.choice(["random", "header", "body", "shape", "oversized", "pieces"])
    if kind == "random":
        return kind, rng.randbytes(rng.randint(0, 300))
    if kind == "shape":
        body = _shape(rng, n)
        return kind, b"Content-Length: %d\r\n\r\n" % len(body) + body
    body = json.dumps(_template(rng, n)).encode()
    if kind == "header":
        return kind, _header(rng, len(body)) + body
    if kind == "body":
        bad = _mutate_body(rng, body)
        return kind, b"Content-Length: %d\r\n\r\n" % len(bad) + bad
    if kind == "oversized":
        return kind, b"Content-Length: %d\r\n\r\n" % rng.randint(65 << 20, 10**15) + body + rng.randbytes(
            4096
        )
    # pieces: garbage, a header start, garbage
    head = b"Content-Length: %d\r\n\r\n" % len(body)
    return kind, rng.randbytes(rng.randint(0, 20)) + head[: rng.randrange(1, len(head))] + body[
        : rng.randrange(len(body))
    ]


def valid(rng: Rng, i: int) -> dict[str, Any]:
    if rng.random() < 0.5:
        return {"jsonrpc": "2.0", "id": f"v{i}", "method": "specls/stats"}
    return {
        "jsonrpc": "2.0",
        "id": f"v{i}",
        "method": "textDocument/inlineCompletion",
        "params": {
            "textDocument": {"uri": "file:///valid.py"},
            "position": {"line": 1, "character": 0},
            "context": {"triggerKind": 2},
        },
    }


def _write_in_pieces(rng: Rng, write: Callable[[bytes], None], data: bytes) -> None:
    while data:
        cut = rng.randint(1, len(data)) if rng.random() < 0.3 else len(data)
        write(data[:cut])
        data = data[cut:]


def test_fuzzed_stdio_stream_no_crash_no_hang_no_swallowed_request():
    rng = random.Random(SEED)
    peer = StdioPeer(python_cmd(FAKE_SERVER), fake_env())
    kinds: Counter[str] = Counter()
    try:
        peer.send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"capabilities": {}}})
        peer.response(0)
        peer.send({"jsonrpc": "2.0", "method": "initialized", "params": {}})
        doc = {"uri": "file:///valid.py", "languageId": "python", "version": 1, "text": "def f():\n\n"}
        peer.send({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": doc}})
        for i in range(MALFORMED):
            kind, bad = malformed(rng, i)
            kinds[kind] += 1
            request = valid(rng, i)
            _write_in_pieces(rng, peer.write, bad + encode(request))
            answer = peer.response(request["id"], timeout=60)  # bounded wait: a hang fails here
            assert "result" in answer, (i, kind, bad[:200], answer)  # not swallowed, not mangled
            assert peer.proc.poll() is None, (i, kind)  # no crash
        errors = peer.errors()
        shown = json.dumps(errors)
        for fragment in SERVER_PATHS:
            assert fragment not in shown, fragment
        assert peer.close() == 0
    finally:
        peer.kill()
    assert sum(kinds.values()) == MALFORMED and len(kinds) == 6
    assert len(errors) > MALFORMED // 4  # the malformed input was seen and answered, not silently lost
    assert "Traceback" not in peer.stderr
