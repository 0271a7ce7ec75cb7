"""One recent edit as the prompt shows it: a file's whole lines before and after.

The edit history (``specls.lsp.edit_history``) hands these to the layouts, which render them as
unified diffs or as original/updated blocks, whichever their model reads.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from specls.next_edit.edits import lines_of

_HEADER = re.compile(r"^@@ -(\d+)(,\d+)? \+(\d+)(,\d+)? @@")


def _shift_header(line: str, shift: int, new_count: bool = True) -> str:
    m = _HEADER.match(line)
    if m is None:
        return line
    old, new = int(m.group(1)) + shift, int(m.group(3)) + shift
    count = (m.group(4) or "") if new_count else ""
    return f"@@ -{old}{m.group(2) or ''} +{new}{count} @@{line[m.end() :]}"


def _lines(text: str) -> list[str]:
    """Whole lines, each ending in a newline (a missing last one added: a diff line needs it)."""
    lines = lines_of(text)
    if lines and not lines[-1].endswith(("\n", "\r")):
        lines[-1] += "\n"
    return lines


@dataclass(frozen=True)
class EditDiff:
    """``old`` (whole lines starting at 0-based line ``start_line`` of ``path``) became ``new``."""

    path: str
    old: str
    new: str
    start_line: int = 0

    def unified(self, context: int = 3, new_count: bool = True) -> str:
        """A unified diff (difflib) with the document's own line numbers; "" when nothing changed.
        ``new_count=False``: hunk headers without the new side's line count, which grows with every
        line the user types into the hunk; a prompt that shows it would change there, and a prompt's
        kept KV is reused only up to its first changed token.

        >>> print(EditDiff("a.py", "x = 1\\ny = 2\\n", "x = 1\\ny = 3\\n", start_line=9).unified(), end="")
        --- a/a.py
        +++ b/a.py
        @@ -10,2 +10,2 @@
         x = 1
        -y = 2
        +y = 3
        """
        if self.old == self.new:
            return ""
        diff = difflib.unified_diff(
            _lines(self.old), _lines(self.new), f"a/{self.path}", f"b/{self.path}", n=context, lineterm="\n"
        )
        # difflib numbers from line 1 of what it was given (an empty side: "-0,0", after line 0), so
        # shifting both sides by start_line gives the file's numbers
        out = [_shift_header(line, self.start_line, new_count) for line in diff]
        return "".join(out)


def diffs_between(path: str, before: str, after: str) -> list[EditDiff]:
    """The edits that turned ``before`` into ``after``, one per changed block of lines (difflib), each
    at its line in ``after`` (what ``specls next-edit --before`` shows as the history).

    >>> [(d.start_line, d.old, d.new) for d in diffs_between("a.py", "a\\nb\\nc\\nd\\n", "a\\nB\\nc\\nd\\ne\\n")]
    [(1, 'b\\n', 'B\\n'), (4, '', 'e\\n')]
    """
    old, new = lines_of(before), lines_of(after)
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    return [
        EditDiff(path, "".join(old[i1:i2]), "".join(new[j1:j2]), j1)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes()
        if tag != "equal"
    ]
