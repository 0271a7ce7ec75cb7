"""Our own document store: full text per open buffer, LSP (UTF-16) positions, incremental sync.

LSP positions count UTF-16 code units within a line; lines end at ``\\r\\n``, ``\\r`` or ``\\n``. Python
strings index code points, so a character outside the BMP (emoji) is one index but two units.

- ``offset_at`` (cursor positions) is exact: a line past the end, a character past the line's end or
  one that splits a surrogate pair gives None (the server answers empty).
- ``apply_change`` (edit ranges) clamps like the spec says: a character past the line end means the
  line end, a line past the end means the end of the document.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

logger = logging.getLogger(__name__)

_NEWLINE = re.compile(r"\r\n|\r|\n")
# A buffer larger than this is kept (edits must still apply) but only a window of it reaches the engine.
ENGINE_DOC_CHARS = 1_000_000
# Every open and every change gets a fresh revision, unique across documents and sessions: a client's
# version numbers may repeat (a buggy client, a close and reopen), revisions never do.
_revisions = itertools.count(1)


class LspPosition(Protocol):
    @property
    def line(self) -> int: ...

    @property
    def character(self) -> int: ...


class LspRange(Protocol):
    @property
    def start(self) -> LspPosition: ...

    @property
    def end(self) -> LspPosition: ...


def line_starts(text: str) -> list[int]:
    """Code point offset where each line starts (at least [0])."""
    return [0, *(m.end() for m in _NEWLINE.finditer(text))]


def _utf16_len(s: str) -> int:
    if s.isascii():
        return len(s)
    return len(s.encode("utf-16-le", "surrogatepass")) // 2


def _utf16_to_index(line: str, col: int, clamp: bool) -> int | None:
    """Index into ``line`` (no line ending) of UTF-16 column ``col``. Exact mode: None when past the
    end or inside a surrogate pair. Clamp mode: past the end -> end, inside a pair -> before it."""
    if col < 0:
        return 0 if clamp else None
    if line.isascii():
        if col <= len(line):
            return col
        return len(line) if clamp else None
    data = line.encode("utf-16-le", "surrogatepass")
    units = len(data) // 2
    if col > units:
        return len(line) if clamp else None
    if col > 0 and col < units:
        prev = int.from_bytes(data[2 * col - 2 : 2 * col], "little")
        nxt = int.from_bytes(data[2 * col : 2 * col + 2], "little")
        if 0xD800 <= prev <= 0xDBFF and 0xDC00 <= nxt <= 0xDFFF:  # splits a pair
            if not clamp:
                return None
            col -= 1
    return len(data[: 2 * col].decode("utf-16-le", "surrogatepass"))


def line_bounds(text: str, starts: Sequence[int], line: int) -> tuple[int, int]:
    """[start, end) code point offsets of ``line`` of ``text`` (its ``line_starts``) without its line
    ending."""
    start = starts[line]
    if line + 1 < len(starts):
        end = starts[line + 1]
        end -= 2 if text.startswith("\r\n", end - 2) and end - 2 >= start else 1
    else:
        end = len(text)
    return start, end


def lsp_offset(text: str, starts: Sequence[int], line: int, character: int, clamp: bool) -> int | None:
    r"""Code point offset in ``text`` (its ``line_starts``) of an LSP position: exact (None when it is
    not in the text) or clamped as ``didChange`` ranges are (see the module's docstring).

    >>> text = "a\U0001f600b\nc"  # the emoji is two UTF-16 units
    >>> [lsp_offset(text, line_starts(text), 0, ch, clamp=False) for ch in (3, 2, 9)]
    [2, None, None]
    >>> [lsp_offset(text, line_starts(text), 0, ch, clamp=True) for ch in (2, 9)]
    [1, 3]
    """
    if line < 0 or character < 0:
        return 0 if clamp else None
    if line >= len(starts):
        return len(text) if clamp else None
    start, end = line_bounds(text, starts, line)
    col = _utf16_to_index(text[start:end], character, clamp)
    return None if col is None else start + col


@dataclass
class Document:
    uri: str
    language_id: str
    version: int
    text: str
    last_edit: int = 0  # code point offset of the latest edit (where the user is typing)
    changed_at: float = field(default_factory=time.monotonic)  # monotonic time of the latest change
    revision: int = field(default_factory=lambda: next(_revisions))  # see _revisions
    _starts: list[int] | None = field(default=None, repr=False)

    def snapshot(self) -> Document:
        """A copy of this document as it is now (the text and line table are shared, not copied: both
        are replaced, never mutated, by a change). The store's own document changes in place; a
        snapshot never does."""
        return dataclasses.replace(self, _starts=self.starts)

    @property
    def starts(self) -> list[int]:
        if self._starts is None:
            self._starts = line_starts(self.text)
        return self._starts

    @property
    def line_count(self) -> int:
        return len(self.starts)

    def line_bounds(self, line: int) -> tuple[int, int]:
        """[start, end) code point offsets of ``line`` without its line ending."""
        return line_bounds(self.text, self.starts, line)

    def _offset(self, line: int, character: int, clamp: bool) -> int | None:
        return lsp_offset(self.text, self.starts, line, character, clamp)

    def offset_at(self, line: int, character: int) -> int | None:
        """Exact code point offset of an LSP position, or None when it is not in the document."""
        return self._offset(line, character, clamp=False)

    def position_at(self, offset: int) -> tuple[int, int]:
        """LSP (line, UTF-16 character) of a code point offset (clamped into the document)."""
        offset = max(0, min(offset, len(self.text)))
        line = bisect.bisect_right(self.starts, offset) - 1
        start, end = self.line_bounds(line)
        offset = min(offset, end)  # an offset inside a \r\n belongs to the line end
        return line, _utf16_len(self.text[start:offset])

    def line_end(self, line: int) -> int:
        return self.line_bounds(line)[1]

    def line_ending(self, line: int) -> str:
        """The line ending text inserted on ``line`` should use: that line's own ending, for the last
        line (which has none) the ending of the line above it, "\\n" in a one-line document.

        Example: in ``"a\\r\\nb"`` both line 0 and line 1 give ``"\\r\\n"`` (not ``"\\n"`` on the
        last line); in ``"a\\rb\\r"`` every line gives ``"\\r"``."""
        starts = self.starts
        for after in (line + 1, line):  # the break that ends ``line``, else the one that ends line - 1
            if 0 < after < len(starts):
                end = self.line_bounds(after - 1)[1]
                return self.text[end : starts[after]]
        return "\n"

    def apply_change(self, new_text: str, rng: LspRange | None) -> None:
        """One content change: the whole text (``rng`` None) or a UTF-16 range replaced."""
        if rng is None:
            self.text = new_text
            self.last_edit = len(new_text)
        else:
            start = self._offset(rng.start.line, rng.start.character, clamp=True)
            end = self._offset(rng.end.line, rng.end.character, clamp=True)
            assert start is not None and end is not None  # clamp mode always gives an offset
            if end < start:
                start, end = end, start
            self.text = self.text[:start] + new_text + self.text[end:]
            self.last_edit = start + len(new_text)
        self._starts = None

    def engine_text(self) -> str:
        """What the engine gets for cross-buffer lookup: the whole text, or for a huge buffer a window
        around the latest edit."""
        return window(self.text, self.last_edit, ENGINE_DOC_CHARS)


def window(text: str, center: int, size: int) -> str:
    if len(text) <= size:
        return text
    start = max(0, min(center - size // 2, len(text) - size))
    return text[start : start + size]


def sanitize(text: str) -> str:
    """Text safe to encode as UTF-8: lone surrogates (invalid JSON \\ud800 escapes) become '?'
    one for one, so offsets stay valid."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")


class ContentChange(Protocol):
    @property
    def text(self) -> str: ...


class DocumentStore:
    """The open buffers of one session, keyed by uri."""

    def __init__(self) -> None:
        self._docs: dict[str, Document] = {}

    def __len__(self) -> int:
        return len(self._docs)

    def __contains__(self, uri: str) -> bool:
        return uri in self._docs

    def open(self, uri: str, language_id: str, version: int, text: str) -> Document:
        doc = Document(uri=uri, language_id=language_id, version=version, text=text, last_edit=len(text))
        self._docs[uri] = doc
        return doc

    def change(self, uri: str, version: int, changes: Sequence[ContentChange]) -> Document | None:
        doc = self._docs.get(uri)
        if doc is None:
            logger.warning("didChange for a document that is not open: %s", uri)
            return None
        for change in changes:
            doc.apply_change(change.text, getattr(change, "range", None))
        doc.version = version
        doc.changed_at = time.monotonic()
        doc.revision = next(_revisions)
        return doc

    def close(self, uri: str) -> Document | None:
        return self._docs.pop(uri, None)

    def get(self, uri: str) -> Document | None:
        return self._docs.get(uri)

    def uris(self) -> list[str]:
        return list(self._docs)

    def others(self, uri: str, limit: int) -> list[Document]:
        """Other open buffers, most recently changed first."""
        docs = sorted((d for u, d in self._docs.items() if u != uri), key=lambda d: -d.changed_at)
        return docs[:limit]
