"""Region selection, rewritten region -> minimal LSP edits, and dropping an undo of the last edit."""

from __future__ import annotations

import random

import pytest

from specls.next_edit.edits import (
    LastEdit,
    Position,
    Region,
    TextEdit,
    apply_edits,
    drop_undo,
    minimal_edits,
    normalize_rewrite,
    region_parts,
    select_region,
)

DOC = "0\n1\n2\n3\n4\n5\n"  # 7 lines as an editor shows them (the last one empty)


@pytest.mark.parametrize(
    "line, before, after, expected",
    [
        (3, 1, 1, Region(2, 5)),
        (0, 2, 2, Region(0, 3)),  # Not Region(-2, 3): clipped at the top
        (5, 1, 3, Region(4, 7)),  # Not Region(4, 9): clipped at the end
        (40, 1, 1, Region(5, 7)),  # a cursor past the end is on the last line
        (2, 0, 0, Region(2, 3)),  # the cursor's line alone
    ],
)
def test_select_region(line: int, before: int, after: int, expected: Region) -> None:
    assert select_region(DOC, line, before, after) == expected


def test_region_parts_cover_the_document() -> None:
    prefix, region, suffix = region_parts(DOC, Region(2, 4))
    assert (prefix, region, suffix) == ("0\n1\n", "2\n3\n", "4\n5\n")
    assert region_parts("a\nb", Region(1, 2)) == ("a\n", "b", "")
    with pytest.raises(ValueError):
        select_region(DOC, 1, -1, 0)


def _e(l1: int, c1: int, l2: int, c2: int, text: str) -> TextEdit:
    return TextEdit(Position(l1, c1), Position(l2, c2), text)


# (region, rewritten, start_line) -> edits
EDIT_CASES = [
    # nothing changed: no edit
    (("a = 1\nb = 2\n", "a = 1\nb = 2\n", 0), []),
    # Not an edit: a rewrite without the final newline is the same region
    (("a = 1\nb = 2\n", "a = 1\nb = 2", 0), []),
    # Not [0:0 -> 1:0 "a = 1\n"]: only the characters that differ, in the document's lines
    (("a = 1\nb = 2\n", "a = 1\nb = 3\n", 10), [_e(11, 4, 11, 5, "3")]),
    # a line inserted: an insertion at the next line's start
    (("a\nc\n", "a\nb\nc\n", 5), [_e(6, 0, 6, 0, "b\n")]),
    # a line deleted
    (("a\nb\nc\n", "a\nc\n", 5), [_e(6, 0, 7, 0, "")]),
    # two separate blocks: two edits, in order
    (("a1\nx\nx\nx\na2\n", "b1\nx\nx\nx\nb2\n", 0), [_e(0, 0, 0, 1, "b"), _e(4, 0, 4, 1, "b")]),
    # Not one edit from line 0 to line 1: lines replaced one for one give one edit per line
    (("a1\nb1\n", "a2\nb2\n", 0), [_e(0, 1, 0, 2, "2"), _e(1, 1, 1, 2, "2")]),
    # UTF-16: the emoji counts two units (Not character 3)
    (("s = '😀x'\n", "s = '😀y'\n", 0), [_e(0, 7, 0, 8, "y")]),
    # CRLF region, LF rewrite: the rewrite takes the region's endings (Not every line changed)
    (("a\r\nb\r\n", "a\nc\n", 2), [_e(3, 0, 3, 1, "c")]),
    # a region at the end of a document without a final newline: the rewrite's extra one is dropped
    (("x = 1", "x = 2\n", 3), [_e(3, 4, 3, 5, "2")]),
    # the whole region removed
    (("a\nb\n", "", 0), [_e(0, 0, 2, 0, "")]),
]


@pytest.mark.parametrize("args, expected", EDIT_CASES)
def test_minimal_edits(args: tuple[str, str, int], expected: list[TextEdit]) -> None:
    region, rewritten, start = args
    assert minimal_edits(region, rewritten, start) == expected


def test_edits_as_lsp_json() -> None:
    (edit,) = minimal_edits("a\n", "b\n", 7)
    assert edit.to_json() == {
        "range": {"start": {"line": 7, "character": 0}, "end": {"line": 7, "character": 1}},
        "text": "b",
    }


def test_applying_the_edits_gives_the_rewrite() -> None:
    rng = random.Random(5)
    words = ["a", "bb", "ccc", "😀", "é", " ", "\t"]
    for _ in range(300):
        lines = ["".join(rng.choices(words, k=rng.randint(0, 4))) + "\n" for _ in range(rng.randint(1, 8))]
        region = "".join(lines)
        new = list(lines)
        for _ in range(rng.randint(0, 3)):
            i = rng.randrange(len(new) + 1)
            op = rng.randrange(3)
            if op == 0 and i < len(new):
                new[i] = "".join(rng.choices(words, k=rng.randint(0, 4))) + "\n"
            elif op == 1:
                new.insert(i, "".join(rng.choices(words, k=2)) + "\n")
            elif i < len(new):
                del new[i]
        rewritten = "".join(new)
        doc = "top\n" * 3 + region + "tail\n"
        edits = minimal_edits(region, rewritten, 3)
        expected = "top\n" * 3 + normalize_rewrite(region, rewritten) + "tail\n"
        assert apply_edits(doc, edits) == expected, (region, rewritten, edits)
        assert (edits == []) == (normalize_rewrite(region, rewritten) == region)


# ---- dropping an undo of the user's last edit ------------------------------------------------------

# the user just renamed b -> c on line 1
TEXT = "def f(a, c):\n    return a\n"
LAST = LastEdit(start_line=0, old="def f(a, b):\n", new="def f(a, c):\n")


def test_an_edit_that_undoes_the_last_edit_is_dropped() -> None:
    undo = minimal_edits("def f(a, c):\n", "def f(a, b):\n", 0)
    other = minimal_edits("    return a\n", "    return a + c\n", 1)
    assert drop_undo(TEXT, undo + other, LAST) == other  # Not undo + other: the undo would revert the user


def test_edits_that_do_not_undo_are_kept() -> None:
    forward = minimal_edits("def f(a, c):\n", "def f(a, cc):\n", 0)
    assert drop_undo(TEXT, forward, LAST) == forward
    assert drop_undo(TEXT, forward, None) == forward
    # the document no longer holds the hunk's lines where it says: nothing to compare, kept
    moved = LastEdit(start_line=1, old=LAST.old, new=LAST.new)
    undo = minimal_edits("def f(a, c):\n", "def f(a, b):\n", 0)
    assert drop_undo(TEXT, undo, moved) == undo


def test_edits_that_undo_together_are_dropped_together() -> None:
    text = "x = a + a\n"
    last = LastEdit(0, "x = b + b\n", "x = a + a\n")
    together = [_e(0, 4, 0, 5, "b"), _e(0, 8, 0, 9, "b")]
    assert drop_undo(text, together, last) == []
