"""Edit history: didChange content changes coalesced into hunks, bounded, rendered as unified diffs."""

from __future__ import annotations

import pytest
from lsprotocol.types import Position, Range
from specls.lsp.edit_history import EditHistory, Hunk, uri_to_path

from specls.next_edit.edit_diff import EditDiff

URI = "file:///w/pkg/a.py"
OTHER = "file:///w/pkg/b.py"
TEXT = "def f(a, b):\n    return a + b\n\n\ndef g(a, b):\n    return a * b\n"


def rng(l1: int, c1: int, l2: int | None = None, c2: int | None = None) -> Range:
    return Range(Position(l1, c1), Position(l1 if l2 is None else l2, c1 if c2 is None else c2))


def history(max_hunks: int = 16, max_chars: int = 4000) -> EditHistory:
    h = EditHistory(max_hunks, max_chars)
    h.open(URI, TEXT)
    h.open(OTHER, "x = 1\n")
    return h


def type_word(h: EditHistory, uri: str, line: int, col: int, word: str, t0: float = 0.0) -> None:
    for i, ch in enumerate(word):
        h.change(uri, ch, rng(line, col + i), now=t0 + i)


def test_typing_a_word_key_by_key_is_one_hunk() -> None:
    h = history()
    type_word(h, URI, 5, 16, " + 1")
    (hunk,) = h.hunks()  # Not 4 hunks: adjacent keystrokes coalesce
    assert hunk == Hunk(URI, 5, "    return a * b\n", "    return a * b + 1\n", 3.0)
    assert (hunk.old_lines, hunk.new_lines) == (1, 1)
    assert h.text(URI) == TEXT.replace("a * b\n", "a * b + 1\n")


def test_backspacing_and_retyping_stays_one_hunk() -> None:
    h = history()
    h.change(URI, "", rng(0, 9, 0, 10), now=1)  # delete "b" of "def f(a, b)"
    type_word(h, URI, 0, 9, "cd", t0=2)
    h.change(URI, "", rng(0, 10, 0, 11), now=4)  # backspace "d"
    (hunk,) = h.hunks()
    assert (hunk.old_text, hunk.new_text) == ("def f(a, b):\n", "def f(a, c):\n")


def test_an_editor_replacing_the_whole_line_coalesces_too() -> None:
    h = history()
    h.change(URI, "x", rng(5, 15), now=1)
    h.change(URI, "    return a * bxy\n", rng(5, 0, 6, 0), now=2)  # the line, typed on, sent whole
    (hunk,) = h.hunks()
    assert hunk.new_text == "    return a * bxy\n" and hunk.old_text == "    return a * b\n"


def test_edits_in_two_places_are_two_hunks() -> None:
    h = history()
    type_word(h, URI, 0, 6, "x")  # def f(xa, b)
    type_word(h, URI, 4, 6, "y", t0=5)  # def g(ya, b)
    first, second = h.hunks()  # Not one hunk: the second edit is lines away from the first
    assert (first.start_line, first.new_text) == (0, "def f(xa, b):\n")
    assert (second.start_line, second.new_text) == (4, "def g(ya, b):\n")
    assert h.last(URI) == second


def test_edits_in_other_files_count_and_keep_their_order() -> None:
    h = history()
    type_word(h, URI, 0, 6, "x")
    type_word(h, OTHER, 0, 4, "2", t0=10)  # x = 21
    type_word(h, URI, 0, 7, "z", t0=20)  # back in a.py right after the first: a new hunk all the same
    hunks = h.hunks()
    assert [x.uri for x in hunks] == [URI, OTHER, URI]
    assert h.hunks(OTHER)[0].new_text == "x = 21\n"
    assert h.last(OTHER) == hunks[1]
    h.close(OTHER)  # a closed document's edits are gone
    assert [x.uri for x in h.hunks()] == [URI, URI]
    assert h.last(OTHER) is None


def test_whole_lines_inserted_and_deleted() -> None:
    h = history()
    h.change(URI, "    # note\n", rng(1, 0), now=1)
    h.change(URI, "", rng(3, 0, 4, 0), now=5)  # the empty line 3 (after the insertion)
    ins, dele = h.hunks()
    assert (ins.start_line, ins.old_text, ins.new_text) == (1, "", "    # note\n")
    assert (ins.old_lines, ins.new_lines) == (0, 1)
    assert (dele.start_line, dele.old_text, dele.new_text) == (3, "\n", "")


def test_a_change_that_changes_nothing_is_no_hunk() -> None:
    h = history()
    h.change(URI, "q", rng(0, 3), now=1)
    h.change(URI, "", rng(0, 3, 0, 4), now=2)  # typed and deleted again
    assert h.hunks() == []
    h.change(URI, "", rng(2, 0), now=3)  # an empty change
    assert h.hunks() == []
    h.change("file:///not/open.py", "x", rng(0, 0))  # a document never opened: ignored
    assert h.hunks() == []


def test_whole_text_sync_is_diffed_into_a_hunk() -> None:
    h = history()
    h.change(URI, TEXT.replace("return a + b", "return a - b"), None, now=1)
    h.change(URI, TEXT.replace("return a + b", "return a - bb"), None, now=2)
    (hunk,) = h.hunks()
    assert (hunk.start_line, hunk.old_text, hunk.new_text) == (1, "    return a + b\n", "    return a - bb\n")


def test_utf16_positions() -> None:
    h = EditHistory()
    h.open(URI, "s = '😀'\n")
    h.change(URI, "!", rng(0, 7), now=1)  # after the emoji: 5 + 2 UTF-16 units (Not index 7)
    assert h.text(URI) == "s = '😀!'\n"
    h.change(URI, "?", rng(0, 99), now=2)  # a character past the line's end clamps to it
    assert h.text(URI) == "s = '😀!'?\n"


def test_bounded_in_count() -> None:
    h = history(max_hunks=3)
    for line in (0, 1, 4, 5):
        type_word(h, URI, line, 0, "#", t0=line * 10)
    hunks = h.hunks()
    assert len(hunks) == 3  # Not 4: the oldest went
    assert [x.start_line for x in hunks] == [1, 4, 5]


def test_bounded_in_characters() -> None:
    h = history(max_chars=60)
    for line in (0, 1, 4, 5):
        type_word(h, URI, line, 0, "#", t0=line * 10)
    hunks = h.hunks()
    assert sum(x.chars for x in hunks) <= 60
    assert hunks[-1].start_line == 5  # the newest stays
    assert len(hunks) < 4
    # a hunk larger than the bound alone (a paste) is never shown
    h.change(URI, "y" * 100, rng(2, 0), now=99)
    assert all(x.chars <= 60 for x in h.hunks())
    with pytest.raises(ValueError):
        EditHistory(max_hunks=0)


def test_rendered_as_unified_diffs() -> None:
    h = history()
    type_word(h, URI, 0, 9, "c")  # def f(a, cb)
    type_word(h, OTHER, 0, 5, "0", t0=9)  # x = 10
    text = h.unified(path_of=lambda uri: uri.rsplit("/", 1)[-1])
    assert text == (
        "--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-def f(a, b):\n+def f(a, cb):\n"
        "--- a/b.py\n+++ b/b.py\n@@ -1 +1 @@\n-x = 1\n+x = 10\n"
    )
    assert h.edit_diffs()[0] == EditDiff("/w/pkg/a.py", "def f(a, b):\n", "def f(a, cb):\n", 0)
    assert uri_to_path("file:///w/a%20b.py") == "/w/a b.py"
    assert uri_to_path("untitled:1") == "untitled:1"
