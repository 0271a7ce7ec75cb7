"""Where a rewrite's output is over, and what it says then.

An output ends at the layout's end marker, or where it runs on into the file's text after the region
(``EditLayout.body_end``). Two more ends spare decoding what no suggestion can use:

- ``run_on``: the output reached the region's end and then wrote more than an end marker: it copied
  the region whole, or it wrote the region's last two non-blank lines (when they are telling: 16
  characters or more, found once in the region) at a line's start. The model is writing on past the
  region (new code, a completion's work), not editing it: no edit, and nothing more to decode.
  Lost: an edit that only adds lines after the region's last line.
- ``too_long``: the output has more lines than the region and ``max_added_lines``: the rewrite has
  left the region (a budget cut in lines rather than tokens; malformed, as a token budget cut is).

Both are pure functions of the output text, so plain and speculative decoding stop at the same token
(the core invariant).
"""

from __future__ import annotations

from dataclasses import dataclass

from specls.next_edit.layouts import TELLING, EditLayout


def _lines(text: str) -> int:
    """Lines of ``text``, a last one without its line end counted.

    >>> _lines("a\\nb\\n"), _lines("a\\nb"), _lines("")
    (2, 2, 0)
    """
    return text.count("\n") + int(bool(text) and not text.endswith("\n"))


def _tail(copy: str) -> str:
    """The region's last two non-blank lines through the second's line end, when they are telling
    and found once in it, else "".

    >>> _tail("a = 1\\nreturn_value = a\\n\\nprint(return_value)\\n\\n")
    'return_value = a\\n\\nprint(return_value)\\n'
    >>> _tail("x\\n)\\n")   # too short to be telling
    ''
    """
    lines = copy.splitlines(keepends=True)
    filled = [i for i, line in enumerate(lines) if line.strip()]
    if len(filled) < 2 or not lines[filled[-1]].endswith("\n"):
        return ""
    tail = "".join(lines[filled[-2] : filled[-1] + 1])
    return tail if len(tail.strip()) >= TELLING and copy.count(tail) == 1 else ""


@dataclass(frozen=True)
class RewriteEnd:
    """The ends of one request's output (module docstring). ``copy``: the layout's output for the
    unchanged region, up to its end marker; ``max_lines``: the most lines an output may hold (a last
    line without its line end counts).

    >>> from specls.next_edit.layouts import get_layout
    >>> end = RewriteEnd.of(get_layout("chat-rewrite"), "x = 1\\ny = 2\\n", after="", max_added_lines=1)
    >>> end.end("x = 1\\ny = 3\\n```"), end.end("x = 1\\ny = 2\\n    z"), end.end("x = 1\\ny = 2\\n``")
    ((12, 'end'), (17, 'run_on'), None)
    >>> end.end("x = 0\\ny = 2\\nz = 3\\n"), end.end("x = 0\\ny = 2\\nz = 3\\nw")   # Not run_on: x changed
    (None, (19, 'too_long'))
    >>> end.read("x = 1\\ny = 3\\n```", eos=False), end.read("x = 1\\ny = 2\\n    z", eos=False)
    (('x = 1\\ny = 3\\n', ''), (None, 'run_on'))
    >>> region = "def f(a):\\n    b = a + 1\\n    return b * 2\\n"
    >>> edited = RewriteEnd.of(get_layout("chat-rewrite"), region, "", 4)
    >>> edited.tail, edited.end("def g(a):\\n    b = a + 1\\n    return b * 2\\n\\ndef h")  # Not None: an edit, then on
    ('    b = a + 1\\n    return b * 2\\n', (47, 'run_on'))
    """

    layout: EditLayout
    copy: str
    after: str
    max_lines: int
    tail: str = ""  # the region's last two non-blank lines, when telling ("": none)

    @classmethod
    def of(cls, layout: EditLayout, region_text: str, after: str, max_added_lines: int) -> RewriteEnd:
        unchanged = layout.output_of(region_text)
        at = layout.body_end(unchanged)
        copy = unchanged if at is None else unchanged[:at]
        return cls(layout, copy, after, _lines(copy) + max(0, max_added_lines), _tail(copy))

    def _runs_on(self, output: str) -> bool:
        """The region's end reached (the region copied whole, or its tail at a line's start), then
        text no end marker starts with (blank lines wait)."""
        if self.copy.endswith("\n") and output.startswith(self.copy):
            return self._more(output[len(self.copy) :])
        if not self.tail:
            return False
        at = output.find(self.tail)
        while at >= 0:
            if (at == 0 or output[at - 1] == "\n") and self._more(output[at + len(self.tail) :]):
                return True
            at = output.find(self.tail, at + 1)
        return False

    def _more(self, rest: str) -> bool:
        """``rest`` holds text no end marker starts with (blank lines wait). A line's indentation
        counts: an end marker opens its line, so a line that starts with a space or a tab is code
        (or a whitespace line, as good as none), and the pass that wrote it needs no next one.

        >>> from specls.next_edit.layouts import get_layout
        >>> end = RewriteEnd.of(get_layout("chat-rewrite"), "x = 1\\n", after="", max_added_lines=1)
        >>> end._more("\\n"), end._more("\\n``"), end._more("\\n    "), end._more("y")
        (False, False, True, True)
        """
        rest = rest.lstrip("\r\n")
        if rest[:1] in (" ", "\t"):
            return True
        return bool(rest) and not any(m.startswith(rest[: len(m)]) for m in self.layout.end_markers)

    def _too_long(self, output: str) -> bool:
        """A line past ``max_lines`` started, and it is not an end marker."""
        lines = output.count("\n")
        return lines > self.max_lines or (lines == self.max_lines and self._more(output.rsplit("\n", 1)[-1]))

    def end(self, output: str) -> tuple[int, str] | None:
        """(the length of ``output`` that counts, why it is over: "end" | "run_on" | "too_long"), or
        None while it is not over."""
        at = self.layout.body_end(output, self.after)
        if at is not None:
            return at, "end"
        if self._runs_on(output):
            return len(output), "run_on"
        if self._too_long(output):
            return len(output), "too_long"
        return None

    def stop(self, output: str) -> int | None:
        """The decode's text stop (``specls.decoder.text.TextStop``): the output is over."""
        return len(output) if self.end(output) is not None else None

    def read(self, output: str, eos: bool) -> tuple[str | None, str]:
        """(the rewritten region from a finished output, "") or (None, why there is none: "run_on",
        "too_long" or "malformed": no end, as a token budget's cut). ``eos``: the model's
        end-of-text token ended it, an end where the layout says so."""
        over = self.end(output)
        if over is not None and over[1] != "end":
            return None, over[1]
        rewritten = self.layout.parse(output, eos=eos, after=self.after)
        return rewritten, "" if rewritten is not None else "malformed"
