from __future__ import annotations

from lsprotocol import types
from specls.lsp.documents import Document
from specls.lsp.postprocess import Completion
from specls.lsp.server import _completion_range, _insert_text, _percentiles


def doc(text: str) -> Document:
    return Document(uri="file:///x.py", language_id="python", version=1, text=text)


def test_insert_text_keeps_crlf_buffers_crlf():
    d = doc("def f():\r\n    x = 1\r\n")
    assert _insert_text(d, 8, "\n    return x") == "\r\n    return x"  # not a bare \n in a CRLF file
    d2 = doc("def f():\n    x = 1\n")
    assert _insert_text(d2, 8, "\n    return x") == "\n    return x"


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
    assert _percentiles([]) == {"n": 0, "p50": 0.0, "p95": 0.0}
    p = _percentiles([float(i) for i in range(1, 101)])
    assert p["n"] == 100 and 50 <= p["p50"] <= 51 and 94 <= p["p95"] <= 96
