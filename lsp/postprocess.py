"""Pure text functions that shape a raw model completion into what the editor shows.

- ``make_context(prefix, suffix, ...)``: what the cursor sits in (line text around it, the indentation
  of the cursor line, brackets left open before the cursor, single- or multi-line mode).
- ``stop_point(ctx, text)``: where a completion is finished, usable while generating
  (``CompletionRequest.stop``) so the engine stops as soon as the text is done.
- ``finalize(ctx, text, truncated)``: the text to insert and how much of the line after the cursor it
  replaces, or None when nothing useful is left (never empty or whitespace-only).

Rules: single-line when the cursor sits mid-line before non-trivial text (anything but closing brackets,
quotes and ``;:,``), multi-line otherwise. A multi-line completion ends before a line indented less than
the cursor line (end of the enclosing block), before a blank line, before a line that repeats the
next non-blank line already after the cursor, and at the end of the line where it closes the bracket
the cursor sat in, and before a control character (other than tab, line breaks and form feed). A
closing bracket with no opener (in the completion or
left open before the cursor) ends the completion. Text that duplicates the rest of the cursor line is
trimmed, or, when the completion legitimately rewrites the closing brackets, the completion replaces the
rest of the line.

Line breaks: a document, and so the model's text, may use ``\\n``, ``\\r\\n`` or a lone ``\\r``; every
rule sees all three (``stop_point`` cuts before the whole break), and ``finalize`` returns ``\\n`` line
breaks, which the server writes in the document's own line ending.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

OPENERS = "([{"
CLOSERS = ")]}"
_MATCH = {")": "(", "]": "[", "}": "{"}
TRIVIAL_SUFFIX_CHARS = frozenset(")]}\"'`;:,")
_HASH_COMMENT_LANGUAGES = frozenset(
    {
        "python",
        "shellscript",
        "sh",
        "bash",
        "ruby",
        "perl",
        "r",
        "yaml",
        "toml",
        "makefile",
        "dockerfile",
        "cmake",
        "elixir",
        "julia",
        "nim",
        "coffeescript",
        "powershell",
    }
)
PREFIX_SCAN_CHARS = 8000  # how far back open brackets are looked for
TAB_WIDTH = 4


@dataclass(frozen=True)
class CursorContext:
    line_prefix: str  # cursor line before the cursor
    line_suffix: str  # cursor line after the cursor (no line ending)
    next_line: str  # first non-blank line after the cursor line, stripped ("" if none)
    indent: int  # indentation width of the cursor line
    open_brackets: str  # brackets open before the cursor, innermost last
    open_quote: str  # the delimiter of a string open at the cursor (one quote or three), "" if none
    comment: str  # line comment marker of the language ("#" or "//")
    multiline: bool


@dataclass(frozen=True)
class Completion:
    text: str  # what to insert at the cursor
    replace: int  # how many characters after the cursor it replaces (0 = pure insert; within the line)


def indent_width(line: str) -> int:
    width = 0
    for ch in line:
        if ch == " ":
            width += 1
        elif ch == "\t":
            width += TAB_WIDTH - width % TAB_WIDTH
        else:
            break
    return width


def is_trivial_suffix(line_suffix: str) -> bool:
    return all(ch.isspace() or ch in TRIVIAL_SUFFIX_CHARS for ch in line_suffix)


_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_LONE_CR = re.compile(r"\r(?!\n)")


def lf_breaks(text: str) -> str:
    """``text`` with every line break made ``\\n``: ``lf_breaks("a\\r\\nb\\rc") == "a\\nb\\nc"``."""
    return _LINE_BREAK.sub("\n", text) if "\r" in text else text


def _first_line_end(text: str) -> int:
    ends = [i for i in (text.find("\n"), text.find("\r")) if i >= 0]
    return min(ends) if ends else len(text)


class _Scanner:
    """Tracks brackets, strings and line comments character by character (a rough lexer that is
    right for ordinary code and harmless when it is not). Triple-quoted strings (Python docstrings,
    also Kotlin/Swift/Java text blocks) span lines; other strings end at a line end."""

    def __init__(self, stack: str = "", quote: str = "", comment: str = "#") -> None:
        self.stack = list(stack)
        self.base = len(self.stack)  # openers that came from before the cursor
        self.quote = quote if len(quote) == 1 else ""  # the open one-line string's quote
        self.triple = quote[0] if len(quote) == 3 else ""  # the open triple-quoted string's quote
        self.outer_quote = bool(quote)  # the open string started before the cursor
        self.comment = comment
        self.in_comment = False
        self.escape = False
        self.prev = ""
        self._quote_len = 0  # characters inside the open one-line string so far
        self._pair = ""  # an empty string "" just closed: a third quote makes it a triple
        self._run = 0  # closing quotes seen in a row inside a triple-quoted string

    @property
    def in_string(self) -> bool:
        return bool(self.quote or self.triple)

    @property
    def open_quote(self) -> str:
        """The open string's delimiter: one quote, three for a triple-quoted string, "" if none."""
        return self.triple * 3 if self.triple else self.quote

    @property
    def depth(self) -> int:
        """Brackets opened by the scanned text and not closed yet."""
        return len(self.stack) - self.base

    def feed(self, ch: str) -> str:
        """Returns "unmatched" (a closer with no opener), "outer" (closes a bracket or string opened
        before the cursor) or ""."""
        prev, self.prev = self.prev, ch
        if self.triple:
            return self._feed_triple(ch)
        if ch in "\r\n":
            self._end_line()
            return ""
        if self.in_comment:
            return ""
        if self.quote:
            return self._feed_quoted(ch)
        return self._feed_code(ch, prev)

    def _feed_triple(self, ch: str) -> str:
        """Inside a triple-quoted string: only three closing quotes in a row end it."""
        if self.escape:
            self.escape, self._run = False, 0
        elif ch == "\\":
            self.escape, self._run = True, 0
        elif ch == self.triple:
            self._run += 1
            if self._run == 3:
                self.triple, self._run = "", 0
                return self._close_outer_quote()
        else:
            self._run = 0
        return ""

    def _end_line(self) -> None:
        """A line end closes line comments and one-line strings."""
        self.in_comment = False
        self.quote = ""
        self.outer_quote = False
        self.escape = False
        self._pair = ""

    def _feed_quoted(self, ch: str) -> str:
        """Inside a one-line string."""
        if self.escape:
            self.escape = False
            self._quote_len += 1
        elif ch == "\\":
            self.escape = True
            self._quote_len += 1
        elif ch == self.quote:
            self.quote = ""
            if self.outer_quote:
                self.outer_quote = False
                return "outer"
            if self._quote_len == 0:
                self._pair = ch  # "" so far: maybe the start of """
        else:
            self._quote_len += 1
        return ""

    def _close_outer_quote(self) -> str:
        """A string just closed: "outer" when it was open before the cursor."""
        if self.outer_quote:
            self.outer_quote = False
            return "outer"
        return ""

    def _feed_code(self, ch: str, prev: str) -> str:
        """Outside strings and comments: brackets, and the start of a string or comment."""
        pair, self._pair = self._pair, ""
        if pair and ch == pair:
            self.triple, self._run = ch, 0
            return ""
        if (self.comment == "#" and ch == "#") or (self.comment == "//" and ch == "/" and prev == "/"):
            self.in_comment = True
            return ""
        if ch in "\"'`":
            self.quote, self._quote_len = ch, 0
            return ""
        if ch in OPENERS:
            self.stack.append(ch)
            return ""
        if ch in CLOSERS:
            return self._close_bracket(ch)
        return ""

    def _close_bracket(self, ch: str) -> str:
        if not self.stack or self.stack[-1] != _MATCH[ch]:
            return "unmatched"
        self.stack.pop()
        if len(self.stack) < self.base:
            self.base = len(self.stack)
            return "outer"
        return ""


def _prefix_state(prefix: str, comment: str) -> tuple[str, str]:
    tail = prefix[-PREFIX_SCAN_CHARS:]
    if len(prefix) > PREFIX_SCAN_CHARS:  # start at a line start
        cut = _first_line_end(tail)
        tail = tail[cut:] if cut < len(tail) else tail
    scan = _Scanner(comment=comment)
    for ch in tail:
        if scan.feed(ch) == "unmatched":
            continue  # a stray closer before the cursor: ignore it
    return "".join(scan.stack), scan.open_quote


def make_context(
    prefix: str, suffix: str, multiline: str = "auto", language: str = "python"
) -> CursorContext:
    """``multiline``: "auto" | "always" | "never"."""
    last_nl = max(prefix.rfind("\n"), prefix.rfind("\r"))
    line_prefix = prefix[last_nl + 1 :]
    end = _first_line_end(suffix)
    line_suffix = suffix[:end]
    next_line = ""
    for line in suffix[end:][:4000].splitlines():
        if line.strip():
            next_line = line.strip()
            break
    full_line = line_prefix + line_suffix
    indent = indent_width(full_line) if full_line.strip() else indent_width(line_prefix)
    comment = "#" if language.lower() in _HASH_COMMENT_LANGUAGES else "//"
    stack, quote = _prefix_state(prefix, comment)
    if multiline == "always":
        is_multi = True
    elif multiline == "never":
        is_multi = False
    else:
        is_multi = is_trivial_suffix(line_suffix)
    return CursorContext(
        line_prefix=line_prefix,
        line_suffix=line_suffix,
        next_line=next_line,
        indent=indent,
        open_brackets=stack,
        open_quote=quote,
        comment=comment,
        multiline=is_multi,
    )


def stop_point(ctx: CursorContext, text: str) -> int | None:
    """Length of ``text`` to keep when the completion is finished, or None to keep generating. A cut
    at a line break is before all of it: ``"x\\r\\ny"`` in single-line mode keeps 1 (not 2, which would
    leave a dangling ``\\r``); a lone ``\\r`` ends a line like ``\\n`` does."""
    if "\r" in text:
        text = _LONE_CR.sub("\n", text)  # same length: the rules below find every break at a \n
    stop = _stop_point(ctx, text)
    if stop is not None and 0 < stop < len(text) and text[stop] == "\n" and text[stop - 1] == "\r":
        stop -= 1
    return stop


def _stop_point(ctx: CursorContext, text: str) -> int | None:
    stops: list[int] = []
    scan = _Scanner(ctx.open_brackets, ctx.open_quote, ctx.comment)
    closed_outer = False
    for i, ch in enumerate(text):
        event = scan.feed(ch)
        if event == "unmatched":
            stops.append(i)
            break
        if event == "outer" and ch in CLOSERS:
            closed_outer = True  # the bracket the cursor sat in is closed: the statement ends this line
        elif ch == "\n" and closed_outer:
            stops.append(i)
            break
    loop = repetition_cut(text)
    if loop is not None:
        stops.append(loop)
    control = _CONTROL.search(text)
    if control is not None:
        stops.append(control.start())
    if not ctx.multiline:
        nl = text.find("\n")
        if nl >= 0:
            stops.append(nl)
    else:
        line_rule = _line_rules(ctx, text)
        if line_rule is not None:
            stops.append(line_rule)
    return min(stops) if stops else None


def first_line_point(ctx: CursorContext, text: str) -> int | None:
    """Where a line-first answer ends (``ServerSettings.line_first``): at the first line break after
    a line with code on it where the completion's own brackets and strings are closed; None until
    then. ``"\\n    return x\\n"`` -> 13 (the line break after ``return x``; the one before it ends
    the cursor's line); ``"f(a,\\n  b)\\n"`` -> 9, not 4 (the call is still open at the first break)."""
    scan = _Scanner(ctx.open_brackets, ctx.open_quote, ctx.comment)
    content = False
    for i, ch in enumerate(text):
        if ch in "\r\n":
            if content and scan.depth <= 0 and not scan.in_string:
                return i
            scan.feed(ch)
            continue
        scan.feed(ch)
        content = content or not ch.isspace()
    return None


# control characters other than tab, line breaks and form feed: source code does not hold them, a
# model that writes one has gone off the rails, and an editor would show or insert them as they are
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f-\x9f]")
_LOOP = re.compile(r"([^\r\n]{2,24}?)\1{3}")  # a unit of 2-24 characters, then 3 more copies of it


def repetition_cut(text: str) -> int | None:
    """A small model can fall into a loop (``self.path.path.path.path``): where the first unit with
    a letter in it (``0, 0, 0, 0`` is data) repeats 4 times in a row, keep one copy."""
    pos = 0
    while (m := _LOOP.search(text, pos)) is not None:
        if any(ch.isalpha() for ch in m.group(1)):
            return m.start() + len(m.group(1))
        pos = m.start() + 1
    return None


def _line_rules(ctx: CursorContext, text: str) -> int | None:
    """Multi-line rules on every line after the first (which continues the cursor line): a finished
    blank line, a line indented less than the cursor line, or a finished line repeating the suffix's
    next line ends the completion just before that line's newline."""
    pos = text.find("\n")
    while pos >= 0:
        start = pos + 1
        nl = text.find("\n", start)
        line = (text[start:] if nl < 0 else text[start:nl]).rstrip("\r")
        stripped = line.strip()
        if stripped:
            if indent_width(line) < ctx.indent:
                return pos
            if nl >= 0 and ctx.next_line and stripped == ctx.next_line:
                return pos
        elif nl >= 0:
            return pos
        pos = nl
    return None


def _is_subsequence(needle: str, hay: str) -> bool:
    it = iter(hay)
    return all(ch in it for ch in needle)


def finalize(ctx: CursorContext, text: str, truncated: bool = False) -> Completion | None:
    """The completion to show for raw model ``text`` (``truncated``: generation hit its token limit,
    so the last line may be cut off), with ``\\n`` line breaks whatever ``text`` used."""
    text = lf_breaks(text)
    cut = stop_point(ctx, text)
    if cut is not None:
        text = text[:cut]
        truncated = False
    if truncated:
        text = _trim_truncated(ctx, text)
    text = text.rstrip()
    if not text.strip():
        return None
    rest = ctx.line_suffix.strip()
    replace = 0
    if rest:
        if text.endswith(rest):
            # the completion re-types what already follows the cursor: keep the editor's copy
            text = text[: len(text) - len(rest)]
        else:
            outer = _first_outer(ctx, text)
            if outer is not None:
                if _is_subsequence(rest.replace(" ", ""), text[outer:].replace(" ", "")):
                    replace = len(ctx.line_suffix)  # the completion rewrites the rest of the line
                else:
                    text = text[:outer]  # let the editor's closers close the brackets
    if not text.strip():
        return None
    return Completion(text=text, replace=replace)


def _first_outer(ctx: CursorContext, text: str) -> int | None:
    scan = _Scanner(ctx.open_brackets, ctx.open_quote, ctx.comment)
    for i, ch in enumerate(text):
        if scan.feed(ch) == "outer":
            return i  # index of the closing bracket or quote
    return None


def _trim_truncated(ctx: CursorContext, text: str) -> str:
    """A completion cut off by the token limit: in multi-line mode drop the (probably partial) last
    line and back off to a line end where the completion's own brackets are all closed; then, if a
    bracket it opened is still open, cut before the outermost such bracket."""
    if ctx.multiline and "\n" in text:
        text = text[: text.rfind("\n")]
        scan = _Scanner(ctx.open_brackets, ctx.open_quote, ctx.comment)
        balanced_end = -1
        for i, ch in enumerate(text):
            scan.feed(ch)
            if ch == "\n" and scan.depth <= 0:
                balanced_end = i
        if scan.depth > 0 and balanced_end > 0:
            text = text[:balanced_end]
    scan = _Scanner(ctx.open_brackets, ctx.open_quote, ctx.comment)
    opened: list[int] = []  # indices of the completion's own unclosed openers
    for i, ch in enumerate(text):
        in_code = not scan.in_string and not scan.in_comment
        before = scan.depth
        scan.feed(ch)
        if in_code and ch in OPENERS and scan.depth > before:
            opened.append(i)
        elif in_code and ch in CLOSERS and opened and scan.depth < before:
            opened.pop()
    if opened:
        text = text[: opened[0]]
    return text
