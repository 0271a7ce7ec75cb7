"""Next-edit prompt layouts: rendering, the unchanged output, parsing (and refusing) model output."""

from __future__ import annotations

from dataclasses import replace

import pytest

from specls.next_edit.edit_diff import EditDiff
from specls.next_edit.edits import minimal_edits, normalize_rewrite
from specls.next_edit.layouts import (
    CHAT,
    CURSOR,
    FIM,
    LAYOUTS,
    SNIPPET,
    SWEEP,
    SWEEP_FILE,
    ZERO_SHOT,
    EditPrompt,
    get_layout,
    run_on_text,
)

HISTORY = [
    EditDiff("pkg/a.py", "def f(a, b):\n", "def f(x, b):\n", start_line=3),
    EditDiff("pkg/a.py", "    return a + b\n", "    return x + b\n", start_line=4),
]
PROMPT = EditPrompt(
    path="pkg/a.py",
    prefix="import os\n\n\n",
    region="def f(x, b):\n    return x + b\n\ndef g(a, b):\n",
    suffix="    return a * b\n",
    cursor=5,
    history=HISTORY,
    region_before="def f(a, b):\n    return a + b\n\ndef g(a, b):\n",
    context_files=[("pkg/util.py", "X = 1\n")],
)
REGIONS = ["a\nb\n", "a\n\n\n", "last line without newline", "", "x = '```'\n", "\n"]


def test_layouts_are_named_and_selectable() -> None:
    assert set(LAYOUTS) == {
        "sweep",
        "sweep-file",
        "chat-rewrite",
        "chat-snippet",
        "chat-fewshot",
        "chat-blocks",
        "fim-rewrite",
    }
    assert set(ZERO_SHOT) <= set(LAYOUTS)
    for name, layout in LAYOUTS.items():
        assert get_layout(name) is layout and layout.name == name
    with pytest.raises(ValueError, match="chat-rewrite"):  # the message names the known layouts
        get_layout("zeta")


@pytest.mark.parametrize("name", sorted(LAYOUTS))
@pytest.mark.parametrize("region", REGIONS)
def test_the_unchanged_output_parses_back_to_the_region(name: str, region: str) -> None:
    layout = get_layout(name)
    rewritten = layout.parse(layout.output_of(region))
    assert rewritten is not None
    # Not an edit: the layout's own unchanged output must give no edit at all
    assert normalize_rewrite(region, rewritten) == region
    assert minimal_edits(region, rewritten, 0) == []


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_output_cut_before_its_end_is_malformed(name: str) -> None:
    layout = get_layout(name)
    full = layout.output_of("def g(x, b):\n")
    cut = full[: full.index("g(") + 4]
    assert layout.parse(cut) is None  # Not "def g(": a budget cut is no rewrite
    # the model's end-of-text token ends the output only where the layout says so
    assert (layout.parse("def g(x, b):\n", eos=True) is not None) == layout.eos_ends


def test_the_text_after_the_end_marker_is_ignored() -> None:
    assert SWEEP.parse("a\n<|file_sep|>original/b.py\nmore") == "a\n"
    assert SWEEP.parse("a\n</s>junk") == "a\n"
    assert CHAT.parse("a\n```\nSome explanation.") == "a\n"
    assert FIM.parse("a\n<|file_sep|>b.py\n") == "a\n"


def test_sweep_layout() -> None:
    text = SWEEP.render(PROMPT)
    # other files first, then the edits as original/updated blocks, then original/current/updated
    order = [
        "<|file_sep|>pkg/util.py\nX = 1\n",
        "<|file_sep|>pkg/a.py.diff\noriginal:\ndef f(a, b):\nupdated:\ndef f(x, b):\n",
        "<|file_sep|>pkg/a.py.diff\noriginal:\n    return a + b\nupdated:\n    return x + b\n",
        "<|file_sep|>original/pkg/a.py\ndef f(a, b):\n    return a + b\n\ndef g(a, b):\n",
        "<|file_sep|>current/pkg/a.py\ndef f(x, b):\n    return x + b\n\ndef g(a, b):\n",
    ]
    at = [text.index(block) for block in order]
    assert at == sorted(at)
    assert text.endswith("<|file_sep|>updated/pkg/a.py\n")
    assert "@@" not in text  # Not unified diffs: Sweep's models read original/updated blocks
    assert CURSOR not in text
    assert "import os" not in text  # the 1.5B clients' layout has no file block
    assert "<|file_sep|>pkg/a.py\nimport os\n\n\ndef f(x, b):" in SWEEP_FILE.render(PROMPT)
    # without recent edits: no .diff block, original/ is the region itself
    plain = SWEEP.render(EditPrompt("a.py", "", "x\n", ""))
    assert plain == "<|file_sep|>original/a.py\nx\n<|file_sep|>current/a.py\nx\n<|file_sep|>updated/a.py\n"
    # the unchanged output continues the prompt as the current/ block shows the region
    assert SWEEP.output_of(PROMPT.region).startswith(PROMPT.region)


def test_chat_layout() -> None:
    text = CHAT.render(PROMPT)
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith("<|im_start|>assistant\n```\n")  # the reply is started: its output is the region
    assert "@@ -4 +4 @@\n-def f(a, b):\n+def f(x, b):\n" in text  # unified diffs, the file's line numbers
    assert "<region>\ndef f" + CURSOR + "(x, b):\n" in text  # the cursor at its offset in the region
    assert "</region>\n    return a * b\n```" in text
    assert CHAT.parse("def f(x, b):\n    return x + b\n```") == "def f(x, b):\n    return x + b\n"
    assert CHAT.parse(f"def f({CURSOR}x, c):\n```") == "def f(x, c):\n"  # a copied marker is dropped
    assert CHAT.parse("s = '```'\n```\n") == "s = '```'\n"  # a fence inside a line is code
    assert "No recent edits." in CHAT.render(EditPrompt("a.py", "", "x\n", ""))


def test_fim_layout() -> None:
    text = FIM.render(PROMPT)
    assert text.startswith("<|file_sep|>pkg/util.py\nX = 1\n<|file_sep|>pkg/a.py\nimport os\n")
    assert "<|file_sep|>pkg/a.py.diff\n--- a/pkg/a.py\n+++ b/pkg/a.py\n@@ -4 +4 @@" in text
    assert text.endswith(
        "<|file_sep|>pkg/a.py\n<|fim_prefix|>import os\n\n\n<|fim_suffix|>    return a * b\n<|fim_middle|>"
    )


def test_chat_snippet_layout() -> None:
    text = SNIPPET.render(PROMPT)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n```\n")
    assert "@@ -4 +4 @@\n-def f(a, b):\n+def f(x, b):\n" in text
    # the file, then the edits, the cursor's line and the region alone as the block to return (its
    # file lines) right before the reply
    assert "lines 1-8:\n```\nimport os\n\n\ndef f(x, b):\n" in text
    block = "(lines 4-7 as it is now):\n```\ndef f(x, b):\n    return x + b\n\ndef g(a, b):\n```"
    assert block in text
    assert text.index(block) > text.index("    return a * b\n")  # after the whole file
    assert "<region>" not in text and CURSOR not in text
    assert "The cursor is on line 4. The code block" in text
    # the stable part first: the instruction (system prompt), the file; then the edits (one diff:
    # the file's header once), the block and a short reminder of the instruction
    assert (
        text.index("Apply to")
        < text.index("    return a * b\n")
        < text.index("@@ -4 +4 @@")
        < text.index(block)
        < text.rindex("Reply with the whole block, the next edit applied.")
    )
    assert text.count("--- a/pkg/a.py\n+++ b/pkg/a.py\n") == 1 and text.count("@@ -") == 2
    assert SNIPPET.parse("def f(x, c):\n```") == "def f(x, c):\n"
    assert SNIPPET.parse("def f(x, c):\n", eos=True) == "def f(x, c):\n"  # the turn ended without a fence
    assert SNIPPET.parse("def f(x, c):\n") is None  # Not a rewrite: cut by the budget


def test_a_hunk_typed_on_keeps_the_prompt_through_its_lines_so_far() -> None:
    # the user types a second line into the hunk: the next prompt changes after its first line only,
    # so the kept KV covers it (Not at the hunk's header, whose new side's count would change)
    one = replace(PROMPT, history=[EditDiff("pkg/a.py", "", "    y = 1\n", start_line=4)])
    two = replace(PROMPT, history=[EditDiff("pkg/a.py", "", "    y = 1\n    z = 2\n", start_line=4)])
    a, b = SNIPPET.render(one), SNIPPET.render(two)
    kept = a.index("    y = 1\n") + len("    y = 1\n")
    assert b[:kept] == a[:kept] and "@@ -4,0 +5 @@\n+    y = 1\n+    z = 2\n" in b


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_an_output_that_runs_on_into_the_file_after_the_region_ends_there(name: str) -> None:
    layout = get_layout(name)
    region, suffix = "def g(a, b):\n    return a\n", "\n\ndef h():\n    pass\n\nX = 1\n"
    after = run_on_text(region, suffix)
    assert after == "\n\ndef h():\n    pass\n"
    out = "def g(x, b):\n    return x\n\n\ndef h():\n    pass\n\nX"  # no end marker: it copies the file on
    assert layout.body_end(out, after) == len("def g(x, b):\n    return x\n")
    assert layout.parse(out, after=after) == "def g(x, b):\n    return x\n"
    assert layout.parse(out) is None  # Not without the file's text: no end marker came
    assert layout.body_end(out[:-12], after) is None  # only part of that text: not yet over
    # the region's own unchanged output does not run on
    assert layout.parse(layout.output_of(region), after=after) == region


def test_run_on_text_is_off_where_it_would_not_tell() -> None:
    assert run_on_text("x\n", "") == ""  # the end of the file
    assert run_on_text("x\n", "    return a\n") == ""  # one line
    assert run_on_text("a\n\ndef h():\n    pass\n", "def h():\n    pass\n") == ""  # the region holds it
    assert run_on_text("x\n", "  )\n  ]\n") == ""  # too short to be telling
