"""Where a rewrite's output is over (``RewriteEnd``): at its end marker, a run on past an unchanged
region, too many lines; and never early, on every layout."""

from __future__ import annotations

import pytest

from specls.next_edit.layouts import LAYOUTS, get_layout
from specls.next_edit.rewrite_end import RewriteEnd

REGION = "def f(a):\n    return a\n"


def ends(layout: str, added: int = 2, after: str = "") -> RewriteEnd:
    return RewriteEnd.of(get_layout(layout), REGION, after, max_added_lines=added)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_an_output_of_every_layout_ends_at_its_marker_and_reads_back(name: str) -> None:
    layout = get_layout(name)
    end = RewriteEnd.of(layout, REGION, "", max_added_lines=2)
    edited = REGION.replace("return a", "return a + 1")
    for rewrite in (REGION, edited, edited + "x = 1\ny = 2\n"):  # up to two added lines
        output = layout.output_of(rewrite)
        got = end.end(output)
        assert got is not None and got[1] == "end", (name, rewrite)
        rewritten, why = end.read(output, eos=False)
        assert why == "" and rewritten is not None and rewritten.rstrip("\n") == rewrite.rstrip("\n")
        # never over before its end: each prefix of the output is still going
        body = output[: got[0]]
        assert [p for p in range(len(body)) if end.end(body[:p]) is not None] == [], (name, rewrite)


@pytest.mark.parametrize(
    ("output", "want"),
    [
        (REGION + "```", "end"),
        (REGION + "\n\n", None),  # blank lines: wait for what comes
        (REGION + "`", None),  # a marker's start
        (REGION + "``", None),
        (REGION + "def g", "run_on"),  # Not None: the region was copied and the model writes on
        (REGION + "    b = 2", "run_on"),
        (REGION + "    ", "run_on"),  # Not None: an indented line is code (no marker opens with a space)
        (REGION + "\n\t", "run_on"),
        (REGION + "\n\ndef g", "run_on"),
        (REGION.replace("a\n", "b\n") + "def g", None),  # Not run_on: the region changed (a line added)
        (REGION.replace("a\n", "b\n") + "x\ny\nz", "too_long"),  # Not None: a line past the two added
        ("def f(a):\n    return ", None),
    ],
)
def test_chat_outputs(output: str, want: str | None) -> None:
    got = ends("chat-snippet").end(output)
    assert (got[1] if got else None) == want


def test_run_on_into_the_files_next_line_is_an_end_not_a_run_on() -> None:
    after = "def g(b):\n    return b\n"
    end = ends("chat-snippet", after=after)
    edited = REGION.replace("return a", "return a + 1")
    assert end.end(edited + after) == (len(edited), "end")
    assert end.read(edited + after, eos=False) == (edited, "")


def test_too_long_counts_lines_not_tokens() -> None:
    end = ends("sweep", added=0)
    changed = REGION.replace("a\n", "b\n")
    assert end.end(changed) is None
    assert end.end(changed + "<|file") is None  # the end marker coming
    assert end.end(changed + "x") == (len(changed) + 1, "too_long")  # Not None: a third line began
    assert end.read(changed + "x", eos=False) == (None, "too_long")


def test_a_cut_or_eos_output() -> None:
    end = ends("chat-snippet")
    assert end.read("def f(a):\n    ret", eos=False) == (None, "malformed")
    assert end.read(REGION, eos=True) == (REGION, "")  # the chat layouts' turn end ends the code
    assert end.read(REGION + "def g", eos=True) == (None, "run_on")


def test_a_region_without_a_final_newline_never_runs_on() -> None:
    """Text after such a region goes on its last line: an edit of that line, not a run on."""
    end = RewriteEnd.of(get_layout("fim-rewrite"), "x = 1", "", max_added_lines=1)
    assert end.end("x = 10") is None


LONG = "def f(a):\n    b = a + 1\n\n    return b * 2\n\n"


@pytest.mark.parametrize(
    ("output", "want"),
    [
        ("def g(a):\n    b = a + 1\n\n    return b * 2\n```", "end"),
        ("def g(a):\n    b = a + 1\n\n    return b * 2\n\n\n", None),  # blank lines wait
        ("def g(a):\n    b = a + 1\n\n    return b * 2\n\ndef h", "run_on"),  # Not None: the edit, then on
        ("def g(a):\n    b = a + 2\n\n    return b * 2\n\ndef h", None),  # Not run_on: its tail edited
        ("x    b = a + 1\n\n    return b * 2\nmore", None),  # Not run_on: the tail must open a line
    ],
)
def test_the_regions_tail_marks_its_end(output: str, want: str | None) -> None:
    end = RewriteEnd.of(get_layout("chat-snippet"), LONG, "", max_added_lines=4)
    assert end.tail == "    b = a + 1\n\n    return b * 2\n"
    got = end.end(output)
    assert (got[1] if got else None) == want


def test_a_tail_that_recurs_or_is_short_marks_nothing() -> None:
    twice = "    b = a + 1\n    return b * 2\n" * 2
    assert RewriteEnd.of(get_layout("chat-snippet"), twice, "", 4).tail == ""  # Not the first copy's end
    assert RewriteEnd.of(get_layout("chat-snippet"), "x = 1\n)\n", "", 4).tail == ""


@pytest.mark.parametrize("name", sorted(LAYOUTS))
@pytest.mark.parametrize(
    "region", ["a\nb\n", "a\n\n\n", "last line without newline", "", "x = '```'\n", "\n"]
)
def test_an_unchanged_odd_region_is_never_cut_short(name: str, region: str) -> None:
    layout = get_layout(name)
    end = RewriteEnd.of(layout, region, "", max_added_lines=0)
    output = layout.output_of(region)
    assert [p for p in range(len(output) + 1) if (e := end.end(output[:p])) and e[1] != "end"] == []
    rewritten, why = end.read(output, eos=False)
    assert why == "" and rewritten is not None
