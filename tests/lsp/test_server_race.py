"""Issue 13 item 2: a completion request and a didChange in the same write.

The request is for the document as the client had it when it sent the request; the didChange that
follows it in the same write inserts a line above the cursor. An answer computed on the newer text at
the old position lands one line off in the client's buffer. The server must answer such a request
empty (or for the old text, and only if nothing changed before the answer is sent): never an answer
positioned against a different version.

Deterministic: each pair is one ``write`` of less than PIPE_BUF bytes to the server's stdin pipe, so
the server reads both messages in one chunk and dispatches them back to back; no sleeps.
"""

from __future__ import annotations

import json
import subprocess
import threading
from typing import Any

import pytest
from lsprotocol import types

from .fake_server import fake_completion
from .lsp_helpers import FAKE_SERVER, ROOT, RawConnection, fake_env, python_cmd, raw_stdio

URI = "file:///work/race.py"
PAIRS = 12
PIPE_BUF = 4096  # POSIX: a pipe write of at most this many bytes is atomic (one read gets all of it)


def frame(message: dict[str, Any]) -> bytes:
    body = json.dumps(message).encode()
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


def request(msg_id: int, method: str, line: int, character: int) -> dict[str, Any]:
    params: dict[str, Any] = {
        "textDocument": {"uri": URI},
        "position": {"line": line, "character": character},
    }
    if method == types.TEXT_DOCUMENT_INLINE_COMPLETION:
        params["context"] = {"triggerKind": 2}  # automatic
    return {"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params}


def insert_line_above(version: int, text: str) -> dict[str, Any]:
    start = {"line": 0, "character": 0}
    return {
        "jsonrpc": "2.0",
        "method": "textDocument/didChange",
        "params": {
            "textDocument": {"uri": URI, "version": version},
            "contentChanges": [{"range": {"start": start, "end": start}, "text": text}],
        },
    }


def answer_texts(method: str, result: Any) -> list[str]:
    """The inserted texts of an inline completion list or a completion list."""
    if result is None:
        return []
    items = result if isinstance(result, list) else result.get("items", [])
    if method == types.TEXT_DOCUMENT_INLINE_COMPLETION:
        return [item["insertText"] for item in items]
    return [item["textEdit"]["newText"] for item in items]


def initialize(conn: RawConnection) -> None:
    conn.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"capabilities": {}}})
    assert "result" in conn.response(1)
    conn.send({"jsonrpc": "2.0", "method": "initialized", "params": {}})
    for msg_id in range(2, 10_000):  # the fake engine loads at once; stats says when it is ready
        conn.send({"jsonrpc": "2.0", "id": msg_id, "method": "specls/stats", "params": {}})
        if conn.response(msg_id)["result"]["server"]["state"] == "ready":
            return
    raise AssertionError("the engine never became ready")


def race(conn: RawConnection, method: str, pairs: int) -> tuple[int, list[str]]:
    """``pairs`` request + didChange writes; returns (stale answers, what each stale answer was)."""
    # every line as long as the cursor line: the old position is valid in the newer text too
    lines = ["a = 0", "b = 1"]
    conn.send(
        {
            "jsonrpc": "2.0",
            "method": "textDocument/didOpen",
            "params": {
                "textDocument": {"uri": URI, "languageId": "python", "version": 1, "text": "\n".join(lines)}
            },
        }
    )
    version = 1
    stale: list[str] = []
    for k in range(pairs):
        line, col = len(lines) - 1, len(lines[-1])  # the cursor at the end of the last line
        sent_for = "\n".join(lines)  # the text the client has when it sends the request
        msg_id = 100 + 2 * k
        version += 1
        added = f"c = {k % 10}\n"
        data = frame(request(msg_id, method, line, col)) + frame(insert_line_above(version, added))
        assert len(data) <= PIPE_BUF
        conn.write(data)  # both messages in one write
        lines.insert(0, added[:-1])
        texts = answer_texts(method, conn.response(msg_id)["result"])
        if texts:  # any answer: the client's buffer changed before it arrived (one line off, or worse)
            wrong_text = texts[0] != fake_completion(sent_for)
            stale.append(f"pair {k}: {texts[0]!r}{' (computed on the newer text)' if wrong_text else ''}")
        # control: a request on its own, for the current text, is answered for exactly that text
        line, col = len(lines) - 1, len(lines[-1])
        conn.send(request(msg_id + 1, method, line, col))
        current = answer_texts(method, conn.response(msg_id + 1)["result"])
        assert current == [fake_completion("\n".join(lines))], f"pair {k}: the control request"
    return len(stale), stale


@pytest.mark.parametrize("method", [types.TEXT_DOCUMENT_INLINE_COMPLETION, types.TEXT_DOCUMENT_COMPLETION])
def test_request_and_change_in_one_write_never_answers_stale(method: str) -> None:
    proc = subprocess.Popen(
        python_cmd(FAKE_SERVER), env=fake_env(), cwd=str(ROOT), stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    watchdog = threading.Timer(120, proc.kill)  # a hung server ends the reads (EOFError), not the run
    watchdog.start()
    try:
        conn = raw_stdio(proc)
        initialize(conn)
        count, stale = race(conn, method, PAIRS)
        print(f"{method}: {count}/{PAIRS} stale")
        assert count == 0, f"{count}/{PAIRS} stale: " + "; ".join(stale)
        conn.send({"jsonrpc": "2.0", "id": 9001, "method": "specls/stats", "params": {}})
        server = conn.response(9001)["result"]["server"]
        assert server["answered"] == PAIRS  # the controls, and nothing else
        conn.send({"jsonrpc": "2.0", "id": 9002, "method": "shutdown"})
        conn.response(9002)
        conn.send({"jsonrpc": "2.0", "method": "exit"})
        assert proc.wait(30) == 0
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _open(uri: str, text: str, version: int = 1) -> dict[str, Any]:
    item = {"uri": uri, "languageId": "python", "version": version, "text": text}
    return {"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": item}}


def _change(uri: str, version: int, text: str, at: tuple[int, int] | None) -> dict[str, Any]:
    change: dict[str, Any] = {"text": text}
    if at is not None:
        pos = {"line": at[0], "character": at[1]}
        change["range"] = {"start": pos, "end": pos}
    return {
        "jsonrpc": "2.0",
        "method": "textDocument/didChange",
        "params": {"textDocument": {"uri": uri, "version": version}, "contentChanges": [change]},
    }


def _inline(msg_id: int, uri: str, line: int, character: int) -> dict[str, Any]:
    message = request(msg_id, types.TEXT_DOCUMENT_INLINE_COMPLETION, line, character)
    message["params"]["textDocument"]["uri"] = uri
    return message


OLD = "a = 0\nb = 1"  # the cursor at (1, 5), the end of "b = 1"
# (name, messages after the request in the same write, the answer wanted: None = empty)
FOLLOWERS: list[tuple[str, list[Any], str | None]] = [
    # a whole-text replace: not an answer for the new text at the old position
    ("full text", [lambda u: _change(u, 2, "c = 2\nd = 3", None)], None),
    # the same version number again (a buggy client): still a change, not "the same version"
    ("same version", [lambda u: _change(u, 1, "c = 2\n", (0, 0))], None),
    # closed and reopened with the very version and a different text
    (
        "close and reopen",
        [
            lambda u: {
                "jsonrpc": "2.0",
                "method": "textDocument/didClose",
                "params": {"textDocument": {"uri": u}},
            },
            lambda u: _open(u, "c = 2\nd = 3"),
        ],
        None,
    ),
    # nothing changes: the request is answered, for the text it was sent for
    ("nothing", [], fake_completion(OLD)),
    # a change to another document does not make this one stale
    ("other document", [lambda u: _change(u + ".other", 2, "zz\n", (0, 0))], fake_completion(OLD)),
]


@pytest.mark.parametrize(("name", "followers", "want"), FOLLOWERS, ids=[f[0] for f in FOLLOWERS])
def test_what_follows_a_request_in_the_same_write(name: str, followers: list[Any], want: str | None) -> None:
    proc = subprocess.Popen(
        python_cmd(FAKE_SERVER), env=fake_env(), cwd=str(ROOT), stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    watchdog = threading.Timer(120, proc.kill)
    watchdog.start()
    try:
        conn = raw_stdio(proc)
        initialize(conn)
        uri = "file:///work/follow.py"
        conn.send(_open(uri, OLD))
        conn.send(_open(uri + ".other", "y = 1"))
        data = frame(_inline(50, uri, 1, 5)) + b"".join(frame(f(uri)) for f in followers)
        assert len(data) <= PIPE_BUF
        conn.write(data)
        texts = answer_texts(types.TEXT_DOCUMENT_INLINE_COMPLETION, conn.response(50)["result"])
        assert texts == ([] if want is None else [want])
        conn.send({"jsonrpc": "2.0", "id": 51, "method": "specls/stats", "params": {}})
        assert conn.response(51)["result"]["session"]["in_flight"] == 0
    finally:
        watchdog.cancel()
        proc.kill()
        proc.wait()


def test_cancelled_and_superseded_requests_in_one_write() -> None:
    """A request cancelled before its handler ran leaves no job behind; of two requests in one write
    only the newer is answered; a change before a request in the same write is seen by it."""
    proc = subprocess.Popen(
        python_cmd(FAKE_SERVER), env=fake_env(), cwd=str(ROOT), stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    watchdog = threading.Timer(120, proc.kill)
    watchdog.start()
    try:
        conn = raw_stdio(proc)
        initialize(conn)
        uri = "file:///work/cancel.py"
        conn.send(_open(uri, OLD))
        cancel = {"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": 60}}
        conn.write(frame(_inline(60, uri, 1, 5)) + frame(cancel))
        assert conn.response(60)["error"]["code"] == -32800  # RequestCancelled
        conn.send({"jsonrpc": "2.0", "id": 61, "method": "specls/stats", "params": {}})
        assert conn.response(61)["result"]["session"]["in_flight"] == 0  # not a leaked job
        # two requests in one write: the older one is superseded before it starts
        conn.write(frame(_inline(62, uri, 1, 5)) + frame(_inline(63, uri, 1, 3)))
        assert answer_texts(types.TEXT_DOCUMENT_INLINE_COMPLETION, conn.response(62)["result"]) == []
        assert answer_texts(types.TEXT_DOCUMENT_INLINE_COMPLETION, conn.response(63)["result"]) == [
            fake_completion("a = 0\nb =")
        ]
        # a change and then a request in one write: the request is for the changed text
        conn.write(frame(_change(uri, 2, "c = 2\n", (0, 0))) + frame(_inline(64, uri, 2, 5)))
        assert answer_texts(types.TEXT_DOCUMENT_INLINE_COMPLETION, conn.response(64)["result"]) == [
            fake_completion("c = 2\n" + OLD)
        ]
        # a client that reuses a request id around a change: the older request is not run at its own
        # position on the newer snapshot (the id is the same, the request is not)
        text = "c = 2\n" + OLD
        conn.write(
            frame(_inline(65, uri, 2, 5))
            + frame(_change(uri, 3, "d = 3\n", (0, 0)))
            + frame(_inline(65, uri, 3, 3))
        )
        answers = sorted(
            (
                answer_texts(types.TEXT_DOCUMENT_INLINE_COMPLETION, conn.response(65)["result"])
                for _ in range(2)
            ),
            key=len,
        )
        assert answers == [[], [fake_completion("d = 3\n" + text[: text.index("b = 1") + 3])]]
    finally:
        watchdog.cancel()
        proc.kill()
        proc.wait()
