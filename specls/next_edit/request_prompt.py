"""One next-edit request's prompt: the region around the cursor, the prompt in the model's layout as
token ids, the tokens the region drafter drafts (the layout's output for an unchanged region) and
the rewrite's token budget, the prompt shrunk until both fit.

The layouts put the stable parts first (other files, the file, the instructions), and the file is a
view of it kept across a document's requests (``FileView``), so successive requests share a long
token prefix and its KV (``specls.next_edit.engine_path``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from urllib.parse import unquote, urlparse

from specls.api import NextEditRequest
from specls.next_edit.edits import LastEdit, Region, lines_of, region_parts, select_region, split_lines
from specls.next_edit.layouts import EditLayout, EditPrompt, run_on_text
from specls.next_edit.settings import NextEditSettings
from specls.prompt import TextTokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EditJob:
    """What the decode needs: ``prompt`` ids, ``unchanged`` (the region drafter's ids), ``max_new``."""

    region: Region
    region_text: str
    layout: EditLayout
    prompt: list[int]
    unchanged: list[int]
    max_new: int
    last_edit: LastEdit | None
    # the file's text right after the region: an output that runs on into it is over
    # (``EditLayout.body_end``); "" for none
    after: str = ""
    view: FileView | None = None  # the file view the prompt showed: the document's for its next request


def doc_path(request: NextEditRequest) -> str:
    """The file's name in the prompt: ``request.path``, else a ``file:`` uri's path, else the id.

    >>> doc_path(NextEditRequest("file:///w/a%20b.py", "", 0, 0))
    '/w/a b.py'
    """
    if request.path:
        return request.path
    parsed = urlparse(request.doc_id)
    return unquote(parsed.path) if parsed.scheme == "file" else request.doc_id


def last_edit_of(request: NextEditRequest, path: str) -> LastEdit | None:
    """The edit a suggestion must not undo: the request's, else its history's newest on ``path``."""
    if request.last_edit is not None:
        return request.last_edit
    for d in reversed(request.history):
        if d.path == path and d.old != d.new:
            return LastEdit(d.start_line, d.old, d.new)
    return None


def cursor_offset(region_text: str, line_in_region: int, character: int) -> int:
    """The code point offset of (line, UTF-16 character) in the region, clipped to its line.

    >>> cursor_offset("ab\\n😀x\\n", 1, 2)   # Not 5: the emoji is two UTF-16 units
    4
    """
    lines = split_lines(region_text)
    n = min(max(line_in_region, 0), len(lines) - 1)
    at = sum(len(s) for s in lines[:n])
    units = 0
    for ch in lines[n].rstrip("\r\n"):
        if units >= character:
            break
        units += 2 if ord(ch) > 0xFFFF else 1
        at += 1
    return at


def region_before(region_text: str, region: Region, last: LastEdit | None) -> str | None:
    """The region as it was before the last edit (Sweep's ``original/`` block), when that edit lies
    inside it; None (the region as it is) otherwise."""
    if last is None:
        return None
    lines = split_lines(region_text)
    start = last.start_line - region.start_line
    n = len(lines_of(last.new))
    if start < 0 or start + n > len(lines) or "".join(lines[start : start + n]) != last.new:
        return None
    return "".join(lines[:start]) + last.old + "".join(lines[start + n :])


def _window(text: str, region: Region, before: int, after: int) -> tuple[str, str, str]:
    """(prefix, region, suffix) with ``before``/``after`` lines of the file around the region."""
    prefix, region_text, suffix = region_parts(text, region)
    pre = split_lines(prefix)[:-1] if prefix else []  # whole lines: the last element is ""
    post = split_lines(suffix)
    pre = pre[max(0, len(pre) - before) :]
    return "".join(pre), region_text, "".join(post[:after])


VIEW_HEAD_LINES = 3  # a kept view's first lines must still be the document's there


@dataclass(frozen=True)
class FileView:
    """The file window a document's edit prompts show, kept across its requests: its text as it was
    when the view was taken, from 0-based line ``line``. Successive prompts that show the same view
    share their token prefix up to the region, so the document's edit KV spares re-prefilling it
    (docs/next-edit.md, "The prompt's KV"). Retaken after ``NextEditSettings.view_uses`` requests,
    when the region leaves it, when the lines at its top moved (lines added or removed above) or
    when the window's size changed. The recent edits and the region, which come after it, say what
    changed since."""

    path: str
    line: int
    text: str
    size: tuple[int, int]  # (window_before, window_after) it was cut with
    uses: int = 1

    def fits(self, text: str, path: str, region: Region, s: NextEditSettings) -> bool:
        """Whether a request on ``text`` (its region ``region``) can show this view still.

        >>> s = NextEditSettings()
        >>> v = FileView("a.py", 1, "b\\nc\\nd\\n", (s.window_before, s.window_after))
        >>> v.fits("a\\nb\\nc\\nd\\n", "a.py", Region(2, 3), s), v.fits("b\\nc\\nd\\n", "a.py", Region(1, 2), s)
        (True, False)
        """
        if path != self.path or self.size != (s.window_before, s.window_after) or self.uses >= s.view_uses:
            return False
        view_lines = split_lines(self.text)
        end = self.line + len(view_lines) - 1
        if region.start_line < self.line or region.end_line > end:
            return False
        head = "".join(view_lines[:VIEW_HEAD_LINES])
        return "".join(split_lines(text)[self.line : self.line + VIEW_HEAD_LINES]) == head


def _context_files(request: NextEditRequest, s: NextEditSettings) -> tuple[tuple[str, str], ...]:
    out = []
    for uri, text in request.context_docs[: s.context_files]:
        path = doc_path(NextEditRequest(uri, "", 0, 0))
        out.append((path, text[: s.context_chars]))
    return tuple(out)


def _shrunk(s: NextEditSettings) -> NextEditSettings | None:
    """The next smaller prompt: no other files, then the newest edit only, then half the window."""
    if s.context_files:
        return replace(s, context_files=0)
    if s.history > 1:
        return replace(s, history=1)
    if s.window_before or s.window_after:
        return replace(s, window_before=s.window_before // 2, window_after=s.window_after // 2)
    return None


@dataclass(frozen=True)
class RenderedEdit:
    """A request's region and its prompt text in a layout, at one prompt size, and the file view it
    showed (the one to keep for the document's next request)."""

    region: Region
    region_text: str
    prompt: str
    last_edit: LastEdit | None
    after: str = ""
    view: FileView | None = None


def render_edit(
    request: NextEditRequest, layout: EditLayout, s: NextEditSettings, view: FileView | None = None
) -> RenderedEdit:
    """The request's region and prompt text with the window, history and other files of ``s``
    (no token budget: ``build_job`` fits it; a remote back end tokenizes it itself). ``view``: the
    document's kept file view, shown while it fits (``FileView.fits``), else one taken now."""
    text, path = request.text, doc_path(request)
    region = select_region(text, request.line, s.lines_before, s.lines_after)
    last = last_edit_of(request, path)
    prefix, region_text, suffix = _window(text, region, s.window_before, s.window_after)
    first_line = region.start_line - prefix.count("\n")
    if view is not None and view.fits(text, path, region, s):
        view = replace(view, uses=view.uses + 1)
    else:
        view = FileView(path, first_line, prefix + region_text + suffix, (s.window_before, s.window_after))
    cursor = cursor_offset(region_text, request.line - region.start_line, request.character)
    history = request.history[len(request.history) - s.history :] if s.history > 0 else ()
    before = region_before(region_text, region, last)
    prompt = layout.render(
        EditPrompt(
            path,
            prefix,
            region_text,
            suffix,
            cursor,
            history,
            before,
            _context_files(request, s),
            first_line=first_line,
            view=view.text,
            view_line=view.line,
        )
    )
    after = run_on_text(region_text, region_parts(text, region)[2])
    return RenderedEdit(region, region_text, prompt, last, after, view)


def build_job(
    request: NextEditRequest,
    layout: EditLayout,
    tokenizer: TextTokenizer,
    settings: NextEditSettings,
    max_positions: int,
    view: FileView | None = None,
) -> EditJob | None:
    """The request's prompt and budget; None when even the smallest prompt leaves no room. ``view``:
    the document's kept file view (``render_edit``); the job's ``view`` is the one to keep."""
    rendered = render_edit(request, layout, settings)
    unchanged = tokenizer.encode(layout.output_of(rendered.region_text))
    wanted = request.max_tokens if request.max_tokens is not None else len(unchanged) * 3 // 2 + 32
    s: NextEditSettings | None = settings
    while s is not None:
        rendered = render_edit(request, layout, s, view)
        prompt = tokenizer.encode(rendered.prompt)
        room = min(max_positions, s.prompt_tokens + wanted) - len(prompt)
        if prompt and room >= min(wanted, len(unchanged) + 1):
            r = rendered
            return EditJob(
                r.region,
                r.region_text,
                layout,
                prompt,
                unchanged,
                min(wanted, room),
                r.last_edit,
                r.after,
                r.view,
            )
        s = _shrunk(s)
    log.info("next edit: no prompt of %s fits %d positions", doc_path(request), max_positions)
    return None
