from __future__ import annotations

import pytest
from specls.lsp.postprocess import Completion, finalize, first_line_point, make_context, stop_point

# (prefix, suffix, raw completion, expected finalize result); comment = the wrong answer it guards against
CASES = [
    # suffix duplication
    ("print(", ")\n", '"hi")', Completion('"hi"', 0)),  # not '"hi")' -> print("hi"))
    ('print("hel', '")\n', 'lo")', Completion("lo", 0)),  # not 'lo")' -> print("hello"")")
    ("foo(", ", y)\n", "a, y)", Completion("a", 0)),  # not "a, y)" repeating the existing ", y)"
    ("x = ", "y\n", "return y", Completion("return ", 0)),  # not "return" -> "returny"
    # the completion rewrites the closing brackets: replace to end of line
    ("print(", ")\n", '"hi"):', Completion('"hi"):', 1)),  # not an insert -> print("hi"):)
    ('print("hel', '")\n', 'lo"):', Completion('lo"):', 2)),
    # outer closers that do not cover the rest of the line: cut before them
    ("if foo(", "):\n", "x)", Completion("x", 0)),  # not replace -> "if foo(x)" losing ":"
    ("foo(bar(", "))\n", "x)", Completion("x", 0)),  # not replace -> foo(bar(x) losing a paren
    ("foo(", ", y)\n", "a)", Completion("a", 0)),
    # closing the bracket the cursor sat in ends the statement at that line end (not: more lines)
    ("print(", ")\n", '"hi")\nprint("more")', Completion('"hi"', 0)),
    ("x = f(", "\n", "a,\n      b)\ny = 2", Completion("a,\n      b)", 0)),
    # unmatched closers end the completion
    ("x = ", "\n", "1)", Completion("1", 0)),  # not "1)" with no "(" anywhere
    ("x = [1, ", "\n", "2]]", Completion("2]", 0)),  # the first ] closes the open [, the second has none
    # multi-line: block end and blank lines
    ("def f():", "\n", "\n    return 1\n\ndef g():\n    pass", Completion("\n    return 1", 0)),
    ("def f():\n    x = 1", "\n", "\n    y = 2\nz = 3", Completion("\n    y = 2", 0)),  # not past the dedent
    # repeating the next line already in the file
    ("def f():\n    x = 1", "\n    return x\n", "\n    y = 2\n    return x\n", Completion("\n    y = 2", 0)),
    # single-line mode mid-line before real text
    ("x = ", " + offset\n", "base\nmore", Completion("base", 0)),  # not "base\nmore" splitting the line
    # empty / whitespace only results are None
    ("x = 1", "\n", "   \n\n", None),
    ("foo(", ")\n", ")", None),  # only the duplicate of the suffix
    # brackets and quotes inside strings and comments do not count
    ("x = ", "\n", "f(')') + 1", Completion("f(')') + 1", 0)),
    ("x = 1", "\n", "  # (not closed", Completion("  # (not closed", 0)),
    # tabs: dedent measured with tabs expanded
    ("if a:\n\tx = 1", "\n", "\n\ty = 2\nz", Completion("\n\ty = 2", 0)),
]


@pytest.mark.parametrize(("prefix", "suffix", "raw", "want"), CASES)
def test_finalize_table(prefix, suffix, raw, want):
    ctx = make_context(prefix, suffix)
    assert finalize(ctx, raw) == want


@pytest.mark.parametrize(
    ("prefix", "suffix", "multi"),
    [
        ("x = ", "\n", True),  # end of line
        ("print(", ")\n", True),  # only closers after the cursor
        ("x = ", " + 1\n", False),  # real text after the cursor
        ("foo(", ", y)\n", False),
        ("    ", "\n", True),
    ],
)
def test_mode(prefix, suffix, multi):
    assert make_context(prefix, suffix).multiline is multi


def test_multiline_setting_overrides():
    assert make_context("x = ", " + 1\n", multiline="always").multiline
    assert not make_context("x = ", "\n", multiline="never").multiline


def test_stop_is_streaming_and_idempotent():
    ctx = make_context("def f():", "\n")
    text = "\n    return 1\n\ndef g"
    stops = [stop_point(ctx, text[:n]) for n in range(len(text) + 1)]
    first = next(i for i, s in enumerate(stops) if s is not None)
    # it fires as soon as the blank line is complete, not before
    assert text[:first].endswith("\n\n")
    keep = stops[first]
    assert keep is not None and text[:keep] == "\n    return 1"
    assert stop_point(ctx, text[:keep]) is None  # applying it again changes nothing


def test_single_line_stops_at_newline():
    ctx = make_context("x = ", " + 1\n")
    assert stop_point(ctx, "abc") is None
    assert stop_point(ctx, "abc\ndef") == 3


def test_truncated_multiline_drops_partial_last_line_and_unclosed_brackets():
    ctx = make_context("def f():", "\n")
    raw = "\n    x = 1\n    y = call(a,\n        b"
    out = finalize(ctx, raw, truncated=True)
    assert out == Completion("\n    x = 1", 0)  # not the half call "y = call(a," left open


def test_crlf_prefix_line_detection():
    ctx = make_context("a = 1\r\nb = ", "\r\n")
    assert ctx.line_prefix == "b = " and ctx.line_suffix == ""


@pytest.mark.parametrize(
    ("prefix", "suffix", "raw", "want"),
    [
        # single line cut off inside a call it opened: back to before the call (not a dangling "(")
        ("out = f", '"x"\n', ".append(self.path, self.path", Completion(".append", 0)),
        ("x = ", "\n", "compute(a) + g(b, c", Completion("compute(a) + g", 0)),
        # nothing of its own left open: kept whole
        ("x = ", "\n", "compute(a) + b", Completion("compute(a) + b", 0)),
        # a string opened by the completion does not count as a bracket
        ("x = ", "\n", "'(' + name", Completion("'(' + name", 0)),
    ],
)
def test_truncated_trims_unclosed_brackets(prefix, suffix, raw, want):
    assert finalize(make_context(prefix, suffix), raw, truncated=True) == want


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("self.path.path.path.path.path", "self.path"),  # not the whole loop
        ("x = [0, 0, 0, 0, 0]", None),  # data, not a loop (no letter in the unit)
        ("        return x", None),  # indentation is not a loop
        ("# ----------", None),
        ("ab", None),
    ],
)
def test_repetition_cut(text, want):
    from specls.lsp.postprocess import repetition_cut

    cut = repetition_cut(text)
    assert (None if cut is None else text[:cut]) == want


@pytest.mark.parametrize(
    ("raw", "keep"),
    [
        ("return x\x14y", "return x"),  # Not the whole text: a model that writes \x14 has gone astray
        ("a = 1\x00", "a = 1"),
        ("s = '\x7f'", "s = '"),
        ("\tx = 1", None),  # a tab is code
        ("x = 1\x0cy = 2", None),  # a form feed stands in old source files
    ],
)
def test_a_control_character_ends_the_completion(raw, keep):
    stop = stop_point(make_context("def f():\n    ", "\n"), raw)
    assert (None if stop is None else raw[:stop]) == keep


DOCSTRING = 'def f(x):\n    """Return x.\n\n    See g (the helper.\n    Don\'t call it twice.\n    """\n'


@pytest.mark.parametrize(
    ("prefix", "brackets", "quote"),
    [
        # a multi-line docstring's "(" and "'" are text, not an open bracket or string
        (DOCSTRING + "    return g(", "(", ""),  # Not "((": the docstring's "(" does not count
        (DOCSTRING + "    y = [", "[", ""),
        ('def f():\n    """Return (the', "", '"""'),  # cursor inside the docstring
        ("def f():\n    '''Return (the", "", "'''"),
        ('x = "" + (', "(", ""),  # an empty string, not the start of a triple-quoted one
        ('x = """a "quoted" (word)""" + (', "(", ""),  # quotes inside a triple-quoted string
        ('s = """a\\"""" + [', "[", ""),  # an escaped quote does not count towards the closing three
        ('x = "(" + (', "(", ""),
    ],
)
def test_prefix_state_with_triple_quoted_strings(prefix: str, brackets: str, quote: str) -> None:
    ctx = make_context(prefix, "\n")
    assert (ctx.open_brackets, ctx.open_quote) == (brackets, quote)


@pytest.mark.parametrize(
    "raw",
    [
        '    """Area of a circle.\n    r: radius) in metres.\n    """\n    return 3.14159 * r * r\n',  # Not cut at ")"
        '    """Area of a circle.\n    r: radius (in metres.\n    """\n    return 3.14159 * r * r\n',
    ],
)
@pytest.mark.parametrize("truncated", [False, True])
def test_completion_with_a_docstring_keeps_its_unbalanced_text(raw: str, truncated: bool) -> None:
    """A docstring's stray bracket is text: the completion is neither cut there nor trimmed back as if
    the bracket were still open."""
    got = finalize(make_context("def area(r):\n", "\n"), raw, truncated=truncated)
    assert got is not None and got.text == raw.rstrip("\n")


EOLS = {"lf": "\n", "crlf": "\r\n", "cr": "\r"}


@pytest.mark.parametrize("eol", list(EOLS.values()), ids=list(EOLS))
@pytest.mark.parametrize(("prefix", "suffix", "raw", "want"), CASES)
def test_finalize_table_in_every_line_ending(prefix, suffix, raw, want, eol):
    """The same cases in a CRLF and a lone-CR document, with the model writing that document's line
    ending: the same answer, with \\n line breaks. Wrong answers guarded: a lone \\r not taken for a line
    break (a "single-line" completion spanning lines, a dedent or blank line missed), a \\r left
    dangling at a cut."""

    def eols(text: str) -> str:
        return text.replace("\n", eol)

    assert finalize(make_context(eols(prefix), eols(suffix)), eols(raw)) == want


@pytest.mark.parametrize(
    ("prefix", "suffix", "raw", "keep"),
    [
        ("x = ", " + 1\n", "y\nz", 1),  # single-line mode cuts at the break
        ("x = ", " + 1\r\n", "y\r\nz", 1),  # before the whole \r\n: not 2, leaving "y\r"
        ("x = ", " + 1\r", "y\rz", 1),  # a lone \r is a break: not None (a 2-line "single-line" answer)
        ("print(", ")\r\n", '"hi")\r\nprint(1)', 5),  # the closed bracket ends the line: before "\r\n"
        ("def f():", "\r", "\r    return 1\r\rdef g", 13),  # blank line in a lone-CR file: not None
        ("def f():\r    x = 1", "\r", "\r    y = 2\rz = 3", 10),  # dedent in a lone-CR file: not None
    ],
)
def test_stop_point_sees_every_line_break(prefix, suffix, raw, keep):
    ctx = make_context(prefix, suffix)
    assert stop_point(ctx, raw) == keep
    assert stop_point(ctx, raw[:keep]) is None  # idempotent: nothing dangling to cut again


def test_streamed_crlf_stops_like_the_whole_text():
    """A stream may end between the \\r and the \\n of a break: every prefix's stop gives the same
    final text as the whole completion's."""
    ctx = make_context("def f():", "\r\n")
    text = "\r\n    return 1\r\n\r\ndef g():\r\n"
    want = finalize(ctx, text)
    assert want == Completion("\n    return 1", 0)
    for n in range(len(text) + 1):
        keep = stop_point(ctx, text[:n])
        if keep is not None:
            assert finalize(ctx, text[:keep]) == want, n


@pytest.mark.parametrize(
    ("prefix", "text", "want"),
    [
        ("def f(x):\n", "    return x\n    y", 12),  # after the first line
        ("def f(x):", "\n    return x\n", 13),  # Not 0: the break before it ends the cursor's line
        ("def f(x):\n", "    return x", None),  # the line is not finished yet
        ("x = [\n", "    1,\n    2]\n", 6),  # inside the cursor's own bracket: its lines are lines
        ("def f(x):\n", "    g(a,\n      b)\n", 17),  # Not 8: the call it opened is still open
        ("def f(x):\n", '    """Doc\n    more"""\nx', 22),  # Not 10: inside a docstring
        ("def f(x):\n", "    x = 1  # a (\ny", 16),  # a bracket in a comment opens nothing
        ("def f(x):\n", "  \n\n    y = 1\r\nz", 13),  # blank lines first; \r\n cut before the \r
    ],
)
def test_first_line_point(prefix, text, want):
    ctx = make_context(prefix, "", "always")
    assert first_line_point(ctx, text) == want
