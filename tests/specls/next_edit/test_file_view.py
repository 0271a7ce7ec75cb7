"""The file view a document's edit prompts keep (``request_prompt.FileView``): shown again while the
cursor's region stays in it, taken again when the region leaves it, the lines above moved, the
window changed or it served ``view_uses`` requests."""

from __future__ import annotations

from dataclasses import replace

from specls.api import NextEditRequest
from specls.next_edit.layouts import get_layout
from specls.next_edit.request_prompt import render_edit
from specls.next_edit.settings import NextEditSettings

TEXT = "".join(f"line_{i} = {i}\n" for i in range(60))
S = NextEditSettings(lines_before=2, lines_after=3, window_before=10, window_after=5, view_uses=3)
LAYOUT = get_layout("chat-snippet")


def ask(text: str, line: int, view=None, s: NextEditSettings = S):  # type: ignore[no-untyped-def]
    return render_edit(NextEditRequest("file:///w/a.py", text, line, 0), LAYOUT, s, view)


def test_a_view_is_kept_while_the_region_stays_in_it() -> None:
    first = ask(TEXT, 30)
    assert first.view is not None and first.view.line == 18 and first.view.uses == 1
    typed = TEXT.replace("line_30 = 30\n", "line_30 = 30  # typed\nline_30b = 0\n")
    second = ask(typed, 31, first.view)
    assert second.view is not None and second.view.text == first.view.text and second.view.uses == 2
    # the prompts share everything before the block to edit; the block shows the file now
    cut = first.prompt.index("The cursor is on line")
    assert second.prompt[:cut] == first.prompt[:cut]
    assert "line_30b = 0" in second.prompt[cut:] and "line_30b" not in second.prompt[:cut]


def test_a_view_is_taken_again() -> None:
    first = ask(TEXT, 30)
    assert first.view is not None
    far = ask(TEXT, 50, first.view)  # the region left the view
    assert far.view is not None and far.view.line != first.view.line and far.view.uses == 1
    moved = ask("new_line = 1\n" + TEXT, 31, first.view)  # a line added above: line numbers moved
    assert moved.view is not None and moved.view.uses == 1 and moved.view.line == 19
    resized = ask(TEXT, 30, first.view, replace(S, window_before=4))
    assert resized.view is not None and resized.view.uses == 1
    other = render_edit(NextEditRequest("file:///w/b.py", TEXT, 30, 0), LAYOUT, S, first.view)
    assert other.view is not None and other.view.path == "/w/b.py" and other.view.uses == 1
    view = first.view
    for uses in (2, 3, 1):  # served view_uses requests: taken again
        r = ask(TEXT, 30, view)
        assert r.view is not None and r.view.uses == uses
        view = r.view
