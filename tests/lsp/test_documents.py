from __future__ import annotations

from dataclasses import dataclass

import pytest
from specls.lsp.documents import ENGINE_DOC_CHARS, Document, DocumentStore, sanitize

EMOJI = "\U0001f600"  # one code point, two UTF-16 units


@dataclass
class P:
    line: int
    character: int


@dataclass
class R:
    start: P
    end: P


@dataclass
class Change:
    text: str
    range: R | None = None


def doc(text: str) -> Document:
    return Document(uri="file:///t", language_id="python", version=1, text=text)


# (text, line, utf16 char, expected code point offset or None); the comment names the wrong answer
OFFSET_CASES = [
    ("abc", 0, 2, 2),
    (f"a{EMOJI}b", 0, 3, 2),  # not 3: the emoji is 2 units but 1 index
    (f"a{EMOJI}b", 0, 4, 3),
    (f"a{EMOJI}b", 0, 2, None),  # inside the surrogate pair: not 2 (that would split the emoji)
    ("ab\r\ncd", 1, 1, 5),  # not 4: \r\n is one line end of two characters
    ("ab\rcd", 1, 0, 3),  # a lone \r ends a line too (not: one line "ab\rcd")
    ("ab\ncd", 0, 3, None),  # past the end of line 0: not the next line's start
    ("ab\ncd", 0, 2, 2),  # the line end itself is a valid cursor
    ("ab\r\ncd", 0, 3, None),  # not 3 (the \n of the \r\n)
    ("ab", 1, 0, None),  # line past the end
    ("ab\n", 1, 0, 3),  # the empty last line exists
    ("\tx", 0, 1, 1),  # a tab is one unit, not 4 or 8
    ("", 0, 0, 0),
    ("ab", -1, 0, None),
    ("é" * 3 + EMOJI + "z", 0, 5, 4),  # BMP non-ASCII is 1 unit each
]


@pytest.mark.parametrize(("text", "line", "char", "want"), OFFSET_CASES)
def test_offset_at(text, line, char, want):
    assert doc(text).offset_at(line, char) == want


@pytest.mark.parametrize(
    ("text", "offset", "want"),
    [
        (f"a{EMOJI}b", 2, (0, 3)),
        ("ab\r\ncd", 5, (1, 1)),
        ("ab\r\ncd", 3, (0, 2)),  # inside \r\n: the line end, not (0, 3)
        ("ab", 99, (0, 2)),
    ],
)
def test_position_at(text, offset, want):
    assert doc(text).position_at(offset) == want


def test_incremental_edits_in_utf16():
    d = doc(f"x = '{EMOJI}'\ny = 2\n")
    # replace the 2 after the emoji line: line 1 "y = 2" char 4..5
    d.apply_change("42", R(P(1, 4), P(1, 5)))
    assert d.text == f"x = '{EMOJI}'\ny = 42\n"
    # insert after the emoji: units 'x',' ','=',' ',"'" = 5, emoji 2 units -> 7
    d.apply_change("!", R(P(0, 7), P(0, 7)))
    assert d.text == f"x = '{EMOJI}!'\ny = 42\n"
    # delete across the line break
    d.apply_change("", R(P(0, 9), P(1, 0)))
    assert d.text == f"x = '{EMOJI}!'y = 42\n"


def test_edit_ranges_are_clamped_not_rejected():
    d = doc("ab\ncd")
    d.apply_change("Z", R(P(0, 99), P(0, 99)))  # past the line end = at the line end
    assert d.text == "abZ\ncd"
    d.apply_change("!", R(P(9, 0), P(9, 0)))  # past the last line = end of document
    assert d.text == "abZ\ncd!"
    d.apply_change("", R(P(1, 2), P(0, 1)))  # reversed range
    assert d.text == "a!"


def test_edit_inside_surrogate_pair_rounds_down():
    d = doc(f"a{EMOJI}b")
    d.apply_change("X", R(P(0, 2), P(0, 2)))
    assert d.text == f"aX{EMOJI}b"  # not a split emoji


def test_store_versions_and_whole_document_change():
    store = DocumentStore()
    store.open("u", "python", 1, "abc")
    d = store.change("u", 7, [Change("xyz"), Change("!", R(P(0, 3), P(0, 3)))])
    assert d is not None and d.version == 7 and d.text == "xyz!"
    assert store.change("missing", 2, [Change("x")]) is None
    assert store.close("u") is not None and store.get("u") is None


def test_huge_document_is_windowed_for_the_engine():
    big = "x = 1\n" * (ENGINE_DOC_CHARS // 3)
    d = doc(big)
    d.apply_change("# edit\n", R(P(5, 0), P(5, 0)))
    window = d.engine_text()
    assert len(window) == ENGINE_DOC_CHARS
    assert "# edit" in window  # the window is around the latest edit


def test_lone_surrogates_are_sanitized_one_for_one():
    bad = "a\ud800b"
    clean = sanitize(bad)
    assert len(clean) == len(bad)
    clean.encode("utf-8")  # would raise for the original
    assert sanitize("plain") == "plain"


def test_crlf_line_bounds():
    d = doc("a\r\n\r\nb")
    assert d.line_count == 3
    assert d.line_bounds(1) == (3, 3)
    assert d.offset_at(2, 1) == 6


@pytest.mark.parametrize(
    ("text", "line", "want"),
    [
        ("a\nb", 0, "\n"),
        ("a\nb", 1, "\n"),
        ("a\r\nb", 0, "\r\n"),
        ("a\r\nb", 1, "\r\n"),  # the last line has no ending: the one above, not "\n"
        ("a\rb", 1, "\r"),  # not "\n" in a lone-CR file
        ("a\rb\r", 2, "\r"),  # the empty line after a final break
        ("a\nb\r\nc", 0, "\n"),  # a mixed file: the cursor line's own ending
        ("a\nb\r\nc", 2, "\r\n"),
        ("abc", 0, "\n"),  # one line: nothing to follow
        ("", 0, "\n"),
    ],
)
def test_line_ending(text, line, want):
    assert doc(text).line_ending(line) == want


def test_snapshot_does_not_follow_changes_and_revisions_always_move():
    store = DocumentStore()
    live = store.open("file:///s", "python", 1, "a = 1\nb = 2")
    snap = live.snapshot()
    assert snap.text == live.text and snap.revision == live.revision
    changed = store.change("file:///s", 1, [Change("x\n", R(P(0, 0), P(0, 0)))])  # the same version
    assert changed is live
    assert snap.text == "a = 1\nb = 2" and snap.offset_at(1, 5) == 11  # the snapshot's own lines
    assert live.text == "x\na = 1\nb = 2"
    assert live.revision != snap.revision  # not trusted to the client's version number
    before = live.revision
    store.change("file:///s", 2, [])  # no content change: still a new revision
    assert live.revision != before
    reopened = store.open("file:///s", "python", 1, "a = 1\nb = 2")  # same version and text as at first
    assert reopened.revision not in (snap.revision, live.revision)
