"""The pieces end to end, as the engine will chain them (the model's output scripted): edit history ->
region -> prompt -> output -> rewritten region -> minimal edits, an undo of the last edit dropped."""

from __future__ import annotations

import pytest
from lsprotocol.types import Position, Range
from specls.lsp.edit_history import EditHistory

from specls.next_edit.edits import (
    LastEdit,
    apply_edits,
    drop_undo,
    minimal_edits,
    region_parts,
    select_region,
)
from specls.next_edit.layouts import LAYOUTS, EditPrompt, get_layout

URI = "file:///w/app.py"
TEXT = "def area(w, h):\n    return w * h\n\n\ndef volume(w, h, d):\n    return w * h * d\n"


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_a_rename_repeated_on_the_next_function(name: str) -> None:
    history = EditHistory()
    history.open(URI, TEXT)
    # the user renames w -> width in area's signature, key by key
    history.change(URI, "", Range(Position(0, 9), Position(0, 10)), now=1)
    for i, ch in enumerate("width"):
        history.change(URI, ch, Range(Position(0, 9 + i), Position(0, 9 + i)), now=2 + i)
    text = history.text(URI)
    assert text is not None and text.startswith("def area(width, h):\n")
    region = select_region(text, cursor_line=0, before=1, after=5)
    prefix, region_text, suffix = region_parts(text, region)
    layout = get_layout(name)
    prompt = layout.render(
        EditPrompt(
            "app.py", prefix, region_text, suffix, cursor=14, history=history.edit_diffs(lambda u: "app.py")
        )
    )
    assert "width" in prompt
    # the model continues the rename in the body and in volume(); scripted here
    rewritten_region = region_text.replace("w * h", "width * h").replace("volume(w,", "volume(width,")
    output = layout.output_of(rewritten_region)
    rewritten = layout.parse(output)
    assert rewritten is not None
    edits = minimal_edits(region_text, rewritten, region.start_line)
    assert [e.text for e in edits] == ["idth", "idth", "idth"]  # Not whole lines: only what differs
    last = history.last(URI)
    assert last is not None
    kept = drop_undo(text, edits, LastEdit(last.start_line, last.old_text, last.new_text))
    assert kept == edits  # none of them undoes the rename
    assert apply_edits(text, kept) == text.replace("w * h", "width * h").replace("volume(w,", "volume(width,")
    # a model that reverts the user's rename: that edit is dropped
    undo = minimal_edits(region_text, region_text.replace("area(width,", "area(w,"), region.start_line)
    assert drop_undo(text, undo, LastEdit(last.start_line, last.old_text, last.new_text)) == []
