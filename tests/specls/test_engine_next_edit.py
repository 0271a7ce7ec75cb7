"""The engine's next-edit path with fake models: output identical to plain greedy decoding whatever
drafts (the core invariant, on the divergence the target's top-2 margin), a scripted rewrite turned
into its edits in long accepted passes, the edit prompt's KV kept, and what is never shown (no edit,
an undo, a cut output)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
from specls.decoder.margin import describe_margin, first_difference, plain_greedy_margin

from specls.api import EngineError, NextEditRequest
from specls.engine import EngineSettings, LoadedModels, OnnxEngine
from specls.next_edit.edit_diff import diffs_between
from specls.next_edit.edits import apply_edits
from specls.next_edit.layouts import LAYOUTS, get_layout
from specls.next_edit.settings import NextEditSettings
from tests.specls.fakes import SOURCE, fake_models
from tests.specls.next_edit.script_lm import script_models, script_rewrite

# room for the few-shot layout's worked example at one token a character
SMALL = NextEditSettings(
    lines_before=3, lines_after=4, window_before=6, window_after=4, history=2, prompt_tokens=4096
)
BEFORE = SOURCE
# the user renamed walk's parameter root -> top; the next edit renames its use in the body
AFTER = SOURCE.replace("def walk(root):", "def walk(top):")
NEXT = AFTER.replace("os.walk(root)", "os.walk(top)")
DOC = "file:///w/tool.py"

CONFIGS = {
    "region": EngineSettings(lookup=False, draft_model=False),
    "lookup": EngineSettings(draft_model=False),
    "draft": EngineSettings(lookup=False),
    "policy": EngineSettings(),
}


def request(text: str = AFTER, before: str = BEFORE, line: int = 4, **kw: object) -> NextEditRequest:
    history = tuple(diffs_between("/w/tool.py", before, text))
    return NextEditRequest(DOC, text, line, 12, history, **kw)  # type: ignore[arg-type]


def diverged(models: LoadedModels, prompt: list[int], ref: list[int], got: list[int]) -> str:
    j = first_difference(ref, got)
    return f"diverged at token {j}: {describe_margin(plain_greedy_margin(models.target, prompt, ref, j))}"


def run(
    models: LoadedModels, settings: EngineSettings, edit: NextEditSettings, req: NextEditRequest
) -> OnnxEngine:
    engine = OnnxEngine(replace(settings, costs_cache=False), models, edit)
    engine.next_edit(req)
    return engine


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("region_drafts", [True, False])
def test_speculative_equals_plain_greedy_on_random_models(name: str, region_drafts: bool) -> None:
    models = fake_models(seed=5, allow_eos=False)
    edit = replace(SMALL, layout="fim-rewrite", region=region_drafts)
    req = request(max_tokens=80)
    plain = run(models, EngineSettings(speculation=False), edit, req).edits
    spec = run(models, CONFIGS[name], edit, req).edits
    assert plain is not None and spec is not None
    assert spec.last_prompt == plain.last_prompt
    assert spec.last_tokens == plain.last_tokens, diverged(
        models, plain.last_prompt, plain.last_tokens, spec.last_tokens
    )
    assert len(plain.last_tokens) == 80


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_scripted_rewrite_comes_back_as_its_edits_in_long_passes(layout: str) -> None:
    models, lm = script_models()
    edit = replace(SMALL, layout=layout)
    req = request()
    job_region = NEXT.splitlines(keepends=True)[1:9]  # lines 1..8: the region around line 4
    rewrite = "".join(job_region)
    script_rewrite(models, lm, req, get_layout(layout), edit, rewrite)
    engine = OnnxEngine(EngineSettings(lookup=False, draft_model=False, costs_cache=False), models, edit)
    result = engine.next_edit(req)
    assert (result.region.start_line, result.region.end_line) == (1, 9)
    assert result.dropped == "" and result.rewritten == rewrite
    assert [e.text for e in result.edits] == ["top"]  # Not the whole line: only what differs
    assert apply_edits(AFTER, result.edits) == NEXT
    assert result.tokens / result.target_passes >= 8  # the region is the draft
    # the edit's confidence comes with it: the scripted target is sure of its tokens
    assert engine.edits is not None and engine.edits.last_confidence is not None
    assert result.confidence == engine.edits.last_confidence.min_margin > 0
    plain = OnnxEngine(EngineSettings(speculation=False), models, edit)
    assert plain.next_edit(req).edits == result.edits
    assert plain.edits is not None and engine.edits is not None
    assert plain.edits.last_tokens == engine.edits.last_tokens


def test_the_next_request_of_a_document_prefills_only_what_changed() -> None:
    models, lm = script_models()
    edit = replace(SMALL, layout="sweep", context_files=1, prompt_tokens=4000)
    engine = OnnxEngine(EngineSettings(costs_cache=False), models, edit)
    other = (("file:///w/util.py", SOURCE * 3),)  # an open file: the prompt's first, stable part
    first = engine.next_edit(request(context_docs=other, max_tokens=16))
    typed = AFTER.replace("def walk(top):", "def walk(top):  # walk")
    second = engine.next_edit(request(typed, line=5, context_docs=other, max_tokens=16))
    assert first.prefix_reused_tokens == 0
    assert second.prefix_reused_tokens > len(SOURCE) * 2  # Not 0: the other file's KV is kept
    assert engine.edits is not None
    assert second.prefill_tokens <= len(engine.edits.last_prompt) - second.prefix_reused_tokens


def test_typing_in_the_region_keeps_the_file_view_and_its_kv() -> None:
    """The chat layouts show a kept view of the file first: a request after typing in the region
    re-prefills from the region on, and its output is still plain greedy's of its prompt."""
    models = fake_models(seed=5, allow_eos=False)
    edit = replace(SMALL, layout="chat-snippet")
    engine = OnnxEngine(EngineSettings(costs_cache=False), models, edit)
    engine.next_edit(request(max_tokens=12))
    typed = AFTER.replace("    for name in filenames:", "    for name in sorted(filenames):")
    second = engine.next_edit(request(typed, line=6, max_tokens=12))
    assert engine.edits is not None
    prompt = models.tokenizer.decode(engine.edits.last_prompt)
    # the view still shows the file as it was when the first request took it
    view = prompt[: prompt.index("Recent edits")]
    assert "for name in filenames:" in view and "sorted(" not in view
    assert second.prefix_reused_tokens >= len(view) - 1  # Not ~0: the view's KV is kept
    plain = OnnxEngine(EngineSettings(speculation=False, costs_cache=False), models, edit)
    plain.next_edit(request(max_tokens=12))
    plain.next_edit(request(typed, line=6, max_tokens=12))
    assert plain.edits is not None
    assert plain.edits.last_prompt == engine.edits.last_prompt
    assert plain.edits.last_tokens == engine.edits.last_tokens


def test_nothing_is_shown_for_an_unchanged_region_an_undo_or_a_cut_output() -> None:
    models, lm = script_models()
    edit = replace(SMALL, layout="sweep")
    req = request()
    region = "".join(AFTER.splitlines(keepends=True)[1:9])
    engine = OnnxEngine(EngineSettings(costs_cache=False), models, edit)
    script_rewrite(models, lm, req, get_layout("sweep"), edit, region)
    unchanged = engine.next_edit(req)
    assert unchanged.edits == () and unchanged.dropped == "unchanged"
    assert unchanged.rewritten == region
    # the model puts back what the user just changed: dropped as an undo
    models, lm = script_models()
    engine = OnnxEngine(EngineSettings(costs_cache=False), models, edit)
    script_rewrite(models, lm, req, get_layout("sweep"), edit, region.replace("walk(top)", "walk(root)"))
    undo = engine.next_edit(req)
    assert undo.edits == () and undo.dropped == "undo" and undo.undone == 1
    # a budget that cuts the rewrite: malformed, nothing shown
    cut = engine.next_edit(replace(req, max_tokens=10))
    assert cut.edits == () and cut.dropped == "malformed" and cut.tokens == 10


@pytest.mark.parametrize(
    ("edit_of", "why", "lines"),
    [
        (lambda r: r, "run_on", 0),  # the region copied, then written on
        (lambda r: r.replace("walk(top)", "walk(top)  # x"), "run_on", 0),  # an edit, the region's end
        (lambda r: r.replace("dirpath, name)", "dirpath, name))"), "too_long", 2),  # its end edited
    ],
)
def test_an_output_past_the_region_stops_early_and_shows_nothing(
    edit_of: Callable[[str], str], why: str, lines: int
) -> None:
    """A model that writes on past the region is stopped a line in (rewrite_end) or once past the
    lines it may add, not at the token budget, with speculation as without."""
    edit = replace(SMALL, layout="sweep", max_added_lines=2)
    req = request()
    region = "".join(AFTER.splitlines(keepends=True)[1:9])
    rewrite, extra = edit_of(region), "    more()\n" * 30
    got = {}
    for name, settings in (("plain", EngineSettings(speculation=False)), ("spec", EngineSettings())):
        models, lm = script_models()
        prompt = script_rewrite(models, lm, req, get_layout("sweep"), edit, rewrite)
        lm.scripts[-1] = (prompt, models.tokenizer.encode(rewrite + extra))  # no end marker: writes on
        engine = OnnxEngine(replace(settings, costs_cache=False), models, edit)
        result = engine.next_edit(replace(req, max_tokens=len(rewrite) + len(extra)))
        assert result.edits == () and result.dropped == why and result.stop_reason == "stop"
        # a line in past the region's end, or past the lines it may add
        assert len(rewrite) < result.tokens <= len(rewrite) + len("    more()\n") * (lines + 1)
        assert engine.edits is not None
        got[name] = engine.edits.last_tokens
    assert got["spec"] == got["plain"]


def test_a_cancelled_request_and_an_unknown_layout() -> None:
    models = fake_models()
    engine = OnnxEngine(EngineSettings(costs_cache=False), models, SMALL)
    assert engine.next_edit(request(), cancelled=lambda: True).cancelled
    with pytest.raises(
        EngineError, match="unknown next-edit layout 'nope'; known: chat-blocks, chat-fewshot, chat-rewrite"
    ):
        engine.next_edit(request(layout="nope"))


def test_stats_count_next_edits() -> None:
    engine = OnnxEngine(EngineSettings(costs_cache=False), fake_models(allow_eos=False), SMALL)
    engine.next_edit(request(max_tokens=8))
    stats = engine.stats()["next_edit"]
    assert isinstance(stats, dict) and stats["requests"] == 1 and stats["tokens"] == 8


@pytest.fixture(scope="module")
def bundled() -> OnnxEngine:
    engine = OnnxEngine(EngineSettings(threads=1, costs_cache=False))
    engine.load()
    return engine


def bundled_requests() -> list[NextEditRequest]:
    """Renames in this package's own sources, the cursor on the renamed line and further down."""
    from pathlib import Path

    import specls.next_edit.edits as edits_module

    text = Path(edits_module.__file__).read_text(encoding="utf-8")
    out = []
    for old, new in (
        ("def _utf16_len(s: str)", "def _utf16_len(text: str)"),
        ("def _trimmed(old", "def _trimmed(before"),
    ):
        after = text.replace(old, new)
        line = after[: after.index(new)].count("\n")
        history = tuple(diffs_between("specls/next_edit/edits.py", text, after))
        out += [
            NextEditRequest("file:///b/edits.py", after, n, 4, history, max_tokens=48)
            for n in (line, line + 3)
        ]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_speculative_equals_plain_greedy_on_bundled(bundled: OnnxEngine, name: str) -> None:
    plain = bundled.with_settings(EngineSettings(threads=1, speculation=False, costs_cache=False))
    spec = bundled.with_settings(replace(CONFIGS[name], threads=1, costs_cache=False))
    for layout in ("fim-rewrite", "sweep"):
        for req in bundled_requests():
            want = plain.next_edit(replace(req, layout=layout))
            got = spec.next_edit(replace(req, layout=layout))
            assert plain.edits is not None and spec.edits is not None
            ref, out = plain.edits.last_tokens, spec.edits.last_tokens
            assert out == ref, diverged(bundled.models, plain.edits.last_prompt, ref, out)
            assert (got.edits, got.dropped) == (want.edits, want.dropped)
