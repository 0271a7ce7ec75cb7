"""From a rewritten region to the edits a client applies, and the region around the cursor.

- ``select_region``: whole lines around the cursor, clipped to the document.
- ``minimal_edits``: a line diff (difflib) of the region against its rewrite, each changed line (or
  block of lines) trimmed to the characters that differ, as LSP ranges (line, UTF-16 character) in the document.
  Nothing when the rewrite equals the region.
- ``drop_undo``: leaves out edits that would put back what the user just changed (the last hunk).
"""

from __future__ import annotations

import bisect
import difflib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# LSP's line endings; str.splitlines would also split at \f, \v, \x1c-\x1e, \x85, \u2028, \u2029
_NEWLINE = re.compile(r"\r\n|\r|\n")


def lines_of(text: str) -> list[str]:
    """``text``'s lines with their endings, split only where LSP ends a line (no empty last line).

    >>> lines_of("a\\fb\\r\\nc")   # Not ['a\\x0c', 'b\\r\\n', 'c']: a form feed ends no line
    ['a\\x0cb\\r\\n', 'c']
    """
    out, at = [], 0
    for m in _NEWLINE.finditer(text):
        out.append(text[at : m.end()])
        at = m.end()
    if at < len(text):
        out.append(text[at:])
    return out


def _utf16_len(s: str) -> int:
    return len(s) if s.isascii() else len(s.encode("utf-16-le", "surrogatepass")) // 2


@dataclass(frozen=True, order=True)
class Position:
    """An LSP position: 0-based line, UTF-16 code units into it."""

    line: int
    character: int

    def to_json(self) -> dict[str, int]:
        return {"line": self.line, "character": self.character}


@dataclass(frozen=True)
class TextEdit:
    """Replace [start, end) of the document with ``text`` (LSP ``TextEdit``)."""

    start: Position
    end: Position
    text: str

    def to_json(self) -> dict[str, Any]:
        return {"range": {"start": self.start.to_json(), "end": self.end.to_json()}, "text": self.text}


@dataclass(frozen=True)
class Region:
    """Lines [start_line, end_line) of a document (0-based, end exclusive)."""

    start_line: int
    end_line: int


def split_lines(text: str) -> list[str]:
    """The document's lines with their endings (\\n, \\r\\n or \\r); a document ending in a newline
    has an empty last line, as an editor shows it.

    >>> split_lines("a\\r\\nb\\n")
    ['a\\r\\n', 'b\\n', '']
    """
    lines = lines_of(text)
    if not lines or lines[-1].endswith(("\n", "\r")):
        lines.append("")
    return lines


def select_region(text: str, cursor_line: int, before: int, after: int) -> Region:
    """Whole lines from ``before`` lines above the cursor's line to ``after`` lines below it, clipped
    to the document (a cursor line past the end counts as the last line).

    >>> select_region("0\\n1\\n2\\n3\\n4\\n", 1, 2, 2)   # Not Region(-1, 4): clipped at the top
    Region(start_line=0, end_line=4)
    """
    if before < 0 or after < 0:
        raise ValueError(f"before/after must not be negative, got {before}/{after}")
    n = len(split_lines(text))
    line = min(max(cursor_line, 0), n - 1)
    return Region(max(0, line - before), min(n, line + after + 1))


def region_parts(text: str, region: Region) -> tuple[str, str, str]:
    """(text before the region, the region's text, text after it)."""
    lines = split_lines(text)
    a, b = max(0, region.start_line), min(len(lines), region.end_line)
    return "".join(lines[:a]), "".join(lines[a:b]), "".join(lines[b:])


def _newline_of(text: str) -> str:
    for line in lines_of(text):
        if line.endswith("\r\n"):
            return "\r\n"
        if line.endswith(("\n", "\r")):
            return line[-1]
    return "\n"


def normalize_rewrite(region: str, rewritten: str) -> str:
    """The rewrite in the region's own terms: its line endings, and its final newline kept or left
    out as the region's (a model drops or adds the last one freely; no edit should come of that).

    >>> normalize_rewrite("a\\r\\nb\\r\\n", "a\\nc")
    'a\\r\\nc\\r\\n'
    """
    nl = _newline_of(region)
    body = nl.join(line.rstrip("\r\n") for line in lines_of(rewritten))  # the last newline left out
    if region.endswith(("\n", "\r")) and (body or not region.strip()):
        body += nl
    return body


def _trimmed(old: str, new: str) -> tuple[int, int, str]:
    """(start, end, text): old[start:end] -> text is the change, common prefix and suffix left out."""
    p = 0
    m = min(len(old), len(new))
    while p < m and old[p] == new[p]:
        p += 1
    s = 0
    while s < m - p and old[len(old) - 1 - s] == new[len(new) - 1 - s]:
        s += 1
    return p, len(old) - s, new[p : len(new) - s]


def _positions(text: str) -> Callable[[int], Position]:
    """Code point offset into ``text`` -> its position (lines relative to the text's first)."""
    lines = lines_of(text)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def at(offset: int) -> Position:
        k = bisect.bisect_right(starts, offset) - 1
        if k >= len(lines):
            if not lines or lines[-1].endswith(("\n", "\r")):
                return Position(len(lines), 0)  # after the last newline: the next line's start
            k = len(lines) - 1
        return Position(k, _utf16_len(lines[k][: offset - starts[k]]))

    return at


def minimal_edits(region: str, rewritten: str, start_line: int) -> list[TextEdit]:
    """The edits that turn ``region`` (whole lines from document line ``start_line``) into
    ``rewritten``: one per changed line where lines were replaced one for one, else one per changed
    block of lines, each trimmed to the characters that differ; positions
    in the document (line, UTF-16 character). [] when they are equal after ``normalize_rewrite``.

    >>> [e.to_json() for e in minimal_edits("def f(a, b):\\n    return a\\n", "def f(a, c):\\n    return a\\n", 4)]
    [{'range': {'start': {'line': 4, 'character': 9}, 'end': {'line': 4, 'character': 10}}, 'text': 'c'}]
    """
    new_text = normalize_rewrite(region, rewritten)
    if new_text == region:
        return []
    old_lines = lines_of(region)
    new_lines = lines_of(new_text)
    position = _positions(region)
    edits = []
    matcher = difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False)
    blocks: list[tuple[int, int, int, int]] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "replace" and i2 - i1 == j2 - j1:  # line for line: one edit per changed line
            blocks += [(i, i + 1, j, j + 1) for i, j in zip(range(i1, i2), range(j1, j2), strict=True)]
        elif tag != "equal":
            blocks.append((i1, i2, j1, j2))
    for i1, i2, j1, j2 in blocks:
        old_block, new_block = "".join(old_lines[i1:i2]), "".join(new_lines[j1:j2])
        if old_block == new_block:
            continue
        at = sum(len(line) for line in old_lines[:i1])
        a, b, text = _trimmed(old_block, new_block)
        start, end = position(at + a), position(at + b)
        edits.append(
            TextEdit(
                Position(start.line + start_line, start.character),
                Position(end.line + start_line, end.character),
                text,
            )
        )
    return edits


def apply_edits(text: str, edits: Sequence[TextEdit]) -> str:
    """``text`` with non-overlapping ``edits`` applied (document coordinates), as a client would."""
    lines = split_lines(text)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def offset(p: Position) -> int:
        if p.line >= len(lines):
            return len(text)
        line = lines[p.line]
        units, i = 0, 0
        while i < len(line) and units < p.character and line[i] not in "\r\n":
            units += _utf16_len(line[i])
            i += 1
        return starts[p.line] + i

    out = text
    for e in sorted(edits, key=lambda e: e.start, reverse=True):
        out = out[: offset(e.start)] + e.text + out[offset(e.end) :]
    return out


@dataclass(frozen=True)
class LastEdit:
    """The user's last change, as whole lines: ``old`` became ``new`` at line ``start_line`` of the
    current document (``specls.lsp.edit_history``'s newest hunk)."""

    start_line: int
    old: str
    new: str


def drop_undo(text: str, edits: Sequence[TextEdit], last: LastEdit | None) -> list[TextEdit]:
    """``edits`` without those that put back what the user just changed: edits inside the last
    hunk's lines that, alone or all together, turn its ``new`` lines back into its ``old`` ones.
    Kept as they are when the document no longer holds the hunk's ``new`` lines where it says.
    """
    if last is None or last.old == last.new:
        return list(edits)
    lines = split_lines(text)
    n_new = len(lines_of(last.new))
    if "".join(lines[last.start_line : last.start_line + n_new]) != last.new:
        return list(edits)
    first, end = Position(last.start_line, 0), Position(last.start_line + n_new, 0)
    inside = [e for e in edits if first <= e.start and e.end <= end]

    def undoes(group: Sequence[TextEdit]) -> bool:
        shifted = [
            TextEdit(
                Position(e.start.line - last.start_line, e.start.character),
                Position(e.end.line - last.start_line, e.end.character),
                e.text,
            )
            for e in group
        ]
        return bool(group) and apply_edits(last.new, shifted) == last.old

    if undoes(inside):
        return [e for e in edits if e not in inside]
    return [e for e in edits if not (e in inside and undoes([e]))]


def suggested_edits(
    text: str, region: Region, region_text: str, rewritten: str, last: LastEdit | None
) -> tuple[list[TextEdit], str, int]:
    """What a rewrite of ``region`` suggests: (edits, why none are shown or "", edits left out as
    undos of ``last``). Nothing for a rewrite equal to the region ("unchanged") or one that only
    undoes ("undo").

    >>> suggested_edits("a = 1\\n", Region(0, 1), "a = 1\\n", "a = 1\\n", None)
    ([], 'unchanged', 0)
    """
    edits = minimal_edits(region_text, rewritten, region.start_line)
    if not edits:
        return [], "unchanged", 0
    kept = drop_undo(text, edits, last)
    return kept, "" if kept else "undo", len(edits) - len(kept)
