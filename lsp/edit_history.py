"""The recent edits of the open documents, coalesced into hunks: the context a next-edit model reads.

Fed from ``didOpen``/``didChange``/``didClose`` (one content change at a time: a UTF-16 range and its
new text, or the whole text). Consecutive changes that touch the span the latest hunk covers or lie
on its lines (typing a word key by key, backspacing over it, an editor's whole-line replacement of
the line being typed, a second change further along the same line) grow that hunk; a change anywhere
else, in this document or another, starts a new one. A hunk is
whole lines: the document's lines around the change before it and after it.

Bounded: at most ``max_hunks`` hunks, oldest dropped first, and at most ``max_chars`` characters of
old and new text together (a hunk larger than that alone, a big paste, is never shown). Closing a
document drops its hunks. Pure Python; the server owns when to call it.
"""

from __future__ import annotations

import logging
import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import unquote, urlparse

from specls.lsp.documents import LspRange, line_starts, lsp_offset

from specls.next_edit.edit_diff import EditDiff

log = logging.getLogger(__name__)

_NEWLINE = re.compile(r"\r\n|\r|\n")


def uri_to_path(uri: str) -> str:
    """A ``file:`` uri's path (other uris as they are), for the prompt's file names."""
    parsed = urlparse(uri)
    return unquote(parsed.path) if parsed.scheme == "file" else uri


@dataclass(frozen=True)
class Hunk:
    """``old_text`` (whole lines from 0-based line ``start_line``) of ``uri`` became ``new_text``, the
    last keystroke of it at ``time``. Lines [start_line, start_line + old_lines) before it, [start_line,
    start_line + new_lines) after it (the lines above are the same on both sides)."""

    uri: str
    start_line: int
    old_text: str
    new_text: str
    time: float

    @property
    def old_lines(self) -> int:
        return len(_NEWLINE.findall(self.old_text)) + (0 if _ends_line(self.old_text) else 1)

    @property
    def new_lines(self) -> int:
        return len(_NEWLINE.findall(self.new_text)) + (0 if _ends_line(self.new_text) else 1)

    @property
    def chars(self) -> int:
        return len(self.old_text) + len(self.new_text)

    def edit_diff(self, path_of: Callable[[str], str] = uri_to_path) -> EditDiff:
        return EditDiff(path_of(self.uri), self.old_text, self.new_text, self.start_line)

    def unified(self, path_of: Callable[[str], str] = uri_to_path, context: int = 3) -> str:
        """This hunk as a unified diff (difflib), the document's line numbers."""
        return self.edit_diff(path_of).unified(context)


def _ends_line(s: str) -> bool:
    return s == "" or s.endswith(("\n", "\r"))


def _range_offsets(text: str, rng: LspRange) -> tuple[int, int]:
    """[a, b) code point span of a ``didChange`` range, clamped as the document store clamps it."""
    starts = line_starts(text)
    a = lsp_offset(text, starts, rng.start.line, rng.start.character, clamp=True)
    b = lsp_offset(text, starts, rng.end.line, rng.end.character, clamp=True)
    assert a is not None and b is not None  # clamp mode always gives an offset
    return min(a, b), max(a, b)


@dataclass
class _Typing:
    """The hunk being typed: ``old`` was the text of span [start, end) of the current text."""

    uri: str
    start: int
    end: int
    old: str
    time: float


class EditHistory:
    """Recent edits across the open documents, coalesced into hunks and bounded."""

    def __init__(
        self, max_hunks: int = 16, max_chars: int = 4000, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if max_hunks < 1 or max_chars < 1:
            raise ValueError(f"max_hunks and max_chars must be positive, got {max_hunks}, {max_chars}")
        self.max_hunks = max_hunks
        self.max_chars = max_chars
        self._clock = clock
        self._texts: dict[str, str] = {}
        self._done: deque[Hunk] = deque()  # closed hunks, oldest first
        self._typing: _Typing | None = None

    def open(self, uri: str, text: str) -> None:
        self._texts[uri] = text

    def close(self, uri: str) -> None:
        """The document is gone: its text and its hunks (the history is of open documents)."""
        self._texts.pop(uri, None)
        self._done = deque(h for h in self._done if h.uri != uri)
        if self._typing is not None and self._typing.uri == uri:
            self._typing = None

    def text(self, uri: str) -> str | None:
        return self._texts.get(uri)

    def change(self, uri: str, new_text: str, rng: LspRange | None, now: float | None = None) -> None:
        """One content change of ``didChange``: ``rng`` (UTF-16, clamped) replaced by ``new_text``, or
        the whole text when ``rng`` is None."""
        text = self._texts.get(uri)
        if text is None:
            log.debug("edit history: change to a document that is not open: %s", uri)
            return
        if rng is None:  # whole-text sync: the change is what differs between the two texts
            p, m = 0, min(len(text), len(new_text))
            while p < m and text[p] == new_text[p]:
                p += 1
            s = 0
            while s < m - p and text[len(text) - 1 - s] == new_text[len(new_text) - 1 - s]:
                s += 1
            a, b, new = p, len(text) - s, new_text[p : len(new_text) - s]
        else:
            a, b = _range_offsets(text, rng)
            new = new_text
        if a == b and not new:
            return
        t = self._clock() if now is None else now
        typing = self._typing
        if typing is not None and typing.uri == uri and self._joins(typing, a, b):
            # next to the hunk being typed or on its lines: it grows to cover this change too
            old = text[a : typing.start] + typing.old + text[typing.end : b]
            start, end = min(a, typing.start), max(b, typing.end)
            self._typing = _Typing(uri, start, end + len(new) - (b - a), old, t)
        else:
            self._close_typing()
            self._typing = _Typing(uri, a, a + len(new), text[a:b], t)
        self._texts[uri] = text[:a] + new + text[b:]
        self._bound()

    def _joins(self, typing: _Typing, a: int, b: int) -> bool:
        """Whether a change of [a, b) belongs to the hunk being typed: it touches the typed span, or it
        lies on the lines the hunk covers (two edits on one line are one hunk of that line)."""
        if a <= typing.end and b >= typing.start:
            return True
        ls, le, _, _ = self._block(typing)
        return a < le and b > ls

    def _block(self, typing: _Typing) -> tuple[int, int, str, str]:
        """(start, end, old lines, new lines): the whole lines of the document now that hold the typed
        span, and what they were before it."""
        text = self._texts[typing.uri]
        start, end, old = typing.start, typing.end, typing.old
        ls = max(text.rfind("\n", 0, start), text.rfind("\r", 0, start)) + 1
        le = end
        while True:
            new_block = text[ls:le]
            old_block = text[ls:start] + old + text[end:le]
            if le >= len(text) or (_ends_line(new_block) and _ends_line(old_block)):
                return ls, le, old_block, new_block
            m = _NEWLINE.search(text, le)
            le = m.end() if m else len(text)

    def _hunk_of(self, typing: _Typing) -> Hunk | None:
        """The typed span as a hunk of whole lines; None when it changed nothing."""
        ls, _, old_block, new_block = self._block(typing)
        if old_block == new_block:
            return None
        text = self._texts[typing.uri]
        # lines above: str.count runs in C, a keystroke in a large file must not walk it in Python
        line = text.count("\n", 0, ls) + text.count("\r", 0, ls) - text.count("\r\n", 0, ls)
        return Hunk(typing.uri, line, old_block, new_block, typing.time)

    def _close_typing(self) -> None:
        if self._typing is not None:
            hunk = self._hunk_of(self._typing)
            if hunk is not None:
                self._done.append(hunk)
            self._typing = None

    def _bound(self) -> None:
        """Drop the oldest closed hunks past ``max_hunks`` or ``max_chars`` (the typed one counts)."""
        typing = self._hunk_of(self._typing) if self._typing is not None else None
        extra = (1, typing.chars) if typing is not None else (0, 0)
        total = sum(h.chars for h in self._done) + extra[1]
        while self._done and (len(self._done) + extra[0] > self.max_hunks or total > self.max_chars):
            total -= self._done.popleft().chars

    def hunks(self, uri: str | None = None) -> list[Hunk]:
        """The recent hunks, oldest first (of ``uri`` only, if given); none larger than
        ``max_chars`` alone."""
        out = list(self._done)
        if self._typing is not None:
            typing = self._hunk_of(self._typing)
            if typing is not None:
                out.append(typing)
        return [h for h in out if h.chars <= self.max_chars and (uri is None or h.uri == uri)]

    def last(self, uri: str) -> Hunk | None:
        """The document's newest hunk: the edit a suggestion must not undo."""
        mine = self.hunks(uri)
        return mine[-1] if mine else None

    def edit_diffs(self, path_of: Callable[[str], str] = uri_to_path) -> list[EditDiff]:
        """The hunks as the layouts take them, oldest first."""
        return [h.edit_diff(path_of) for h in self.hunks()]

    def unified(self, path_of: Callable[[str], str] = uri_to_path, context: int = 0) -> str:
        """Every recent hunk as a unified diff, oldest first (difflib)."""
        return "".join(h.unified(path_of, context) for h in self.hunks())
