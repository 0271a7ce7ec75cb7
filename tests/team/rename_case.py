"""The next edit the remote-engine tests ask for: ``w`` renamed to ``width`` in ``area``'s signature,
the suggestion the same rename in its body; sent in the sweep layout (the served model's name says
which)."""

from __future__ import annotations

from specls.api import NextEditRequest
from specls.next_edit.edit_diff import diffs_between
from specls.next_edit.layouts import EditLayout, get_layout
from specls.next_edit.request_prompt import RenderedEdit, render_edit
from specls.next_edit.settings import NextEditSettings

BEFORE = "def area(w, h):\n    return w * h\n\n\ndef volume(w, h, d):\n    return w * h * d\n"
AFTER = BEFORE.replace("area(w, h)", "area(width, h)")
NEXT = AFTER.replace("return w * h\n", "return width * h\n", 1)


def rename_request() -> NextEditRequest:
    """The next edit after the rename, the cursor in ``area``'s body."""
    return NextEditRequest("file:///w/app.py", AFTER, 1, 4, tuple(diffs_between("/w/app.py", BEFORE, AFTER)))


def sweep_prompt(request: NextEditRequest) -> tuple[EditLayout, RenderedEdit]:
    """The sweep layout and the prompt it renders for ``request``."""
    layout = get_layout("sweep")
    return layout, render_edit(request, layout, NextEditSettings())
