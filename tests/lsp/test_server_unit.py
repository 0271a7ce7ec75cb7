from __future__ import annotations

import pytest
from lsprotocol import types
from specls.lsp.counters import percentiles
from specls.lsp.documents import Document
from specls.lsp.postprocess import Completion
from specls.lsp.server import (
    EngineHost,
    SpeclsServer,
    _completion_range,
    _insert_text,
    create_server,
)
from specls.lsp.settings import ServerSettings

from .fake_server import FakeEngine


def doc(text: str) -> Document:
    return Document(uri="file:///x.py", language_id="python", version=1, text=text)


def test_insert_text_keeps_crlf_buffers_crlf():
    d = doc("def f():\r\n    x = 1\r\n")
    assert _insert_text(d, 8, "\n    return x") == "\r\n    return x"  # not a bare \n in a CRLF file
    d2 = doc("def f():\n    x = 1\n")
    assert _insert_text(d2, 8, "\n    return x") == "\n    return x"


@pytest.mark.parametrize(
    ("text", "line", "completion", "want"),
    [
        # the cursor at the end of line 0, then at the end of the last line (which has no ending)
        ("def f():\n    x = 1", 0, "\n    y", "\n    y"),
        ("def f():\n    x = 1", 1, "\n    y", "\n    y"),
        ("def f():\r\n    x = 1", 0, "\n    y", "\r\n    y"),
        ("def f():\r\n    x = 1", 1, "\n    y", "\r\n    y"),  # not "\n": the last line has no ending
        ("def f():\r    x = 1", 0, "\n    y", "\r    y"),  # not "\n" in a lone-CR (old Mac) file
        ("def f():\r    x = 1", 1, "\n    y", "\r    y"),
        ("def f():\r\n    x = 1\r\n", 2, "\n    y", "\r\n    y"),  # an empty last line
        ("x = ", 0, "1\n", "1\n"),  # one line, no ending anywhere: \n
        # whatever the model wrote (it continues the prompt's line endings) becomes the buffer's
        ("a\nb", 1, "1\r\n2\r3", "1\n2\n3"),  # not a \r\n or a lone \r in an LF file
        ("a\r\nb", 1, "1\r\n2\r3\n4", "1\r\n2\r\n3\r\n4"),  # not "\r\r\n" from a blind replace
        ("a\r\nb", 1, "no break", "no break"),
    ],
)
def test_insert_text_follows_the_documents_line_ending(text, line, completion, want):
    d = doc(text)
    offset = d.line_end(line)
    assert _insert_text(d, offset, completion) == want


def test_range_replaces_to_end_of_line_in_utf16():
    d = doc('print("\U0001f600")\n')
    offset = 8  # after the emoji: code point 8 = UTF-16 column 9
    r = _completion_range(d, offset, Completion(text='"):', replace=2))
    assert r == types.Range(
        start=types.Position(line=0, character=9), end=types.Position(line=0, character=11)
    )
    r0 = _completion_range(d, offset, Completion(text="x", replace=0))
    assert r0.start == r0.end


def test_percentiles():
    assert percentiles([]) == {"n": 0, "p50": 0.0, "p95": 0.0}
    p = percentiles([float(i) for i in range(1, 101)])
    assert p["n"] == 100 and 50 <= p["p50"] <= 51 and 94 <= p["p95"] <= 96


def _session_with_loaded_engine():
    engine = FakeEngine()
    host = EngineHost(engine)
    host.start_load().result(30)
    server = create_server(ServerSettings(), engine, host=host)
    assert isinstance(server, SpeclsServer)
    return server.session, engine, host


def _open(session, uri: str, text: str) -> None:
    item = types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)
    session.did_open(types.DidOpenTextDocumentParams(text_document=item))


def test_unauthenticated_team_client_documents_never_reach_the_engine():
    """Issue 13 item 5: a TCP client that never sent a (valid) initialize must not index documents in
    the shared engine (RSS and the index grew with every didOpen)."""
    session, engine, host = _session_with_loaded_engine()
    try:
        host.team = (
            object()
        )  # team mode: a session is authenticated only once team.open() gave it an engine view
        _open(session, "file:///big.py", "x = 1\n" * 1000)
        host.submit(lambda: None).result(30)  # the engine thread has run everything queued before
        assert engine.counts["updates"] == 0 and engine.docs == {}
        host.team = None  # the same path without team mode: the document is sent
        _open(session, "file:///small.py", "y = 2\n")
        host.submit(lambda: None).result(30)
        assert engine.counts["updates"] == 1
    finally:
        host.close()


def test_counters_snapshot_reads_the_results() -> None:
    from specls.decoder.api import DecodeResult
    from specls.lsp.counters import Counters

    from specls.api import CompletionResult

    c = Counters()
    c.results.add(
        CompletionResult("x", tokens=4, decode=DecodeResult(tokens=[1, 2, 3, 4], prefill_tokens=10))
    )
    c.results.add(CompletionResult("y", tokens=2, prefix_reused_tokens=30, cache_hit=True))
    s = c.snapshot()
    assert (s["engine_calls"], s["tokens_generated"], s["prefill_tokens"], s["cache_hits"]) == (2, 6, 10, 1)
    assert s["prefill_tokens_per_call"] == 5.0 and s["prefix_reuse_rate"] == 0.75  # 30 of 40 prompt tokens
    assert "results" not in s  # flat, as before
