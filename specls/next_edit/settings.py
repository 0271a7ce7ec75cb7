"""``NextEditSettings``: how the engine's next-edit path picks its region, builds its prompt and drafts."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NextEditSettings:
    """The edit path's knobs (``specls.next_edit.engine_path``); docs/next-edit.md says why each.

    The region: whole lines from ``lines_before`` above the cursor's line to ``lines_after`` below
    it: 10 lines, most of them below the cursor where the next edit mostly is. The region is what
    each request re-prefills and decodes, so its size is latency (``specls bench edit
    --lines-before/--lines-after`` measures quality against it; bench/README.md, "Next edits").
    Around it the prompt shows up to ``window_before``/``window_after`` lines of the file (a view
    kept across requests), the newest ``history`` edits and ``context_files`` other open files (each
    cut to ``context_chars``), shrunk until the prompt fits ``prompt_tokens`` plus the rewrite's
    budget.
    """

    lines_before: int = 3
    # 6, not 8: the same edits right on the mined tasks, and each request prefills and copies two
    # lines fewer (bench/README.md, "Next edits")
    lines_after: int = 6
    window_before: int = 24
    window_after: int = 12
    history: int = 4
    context_files: int = 1
    context_chars: int = 2_000
    prompt_tokens: int = 1_536
    # the layout's name (specls.next_edit.layouts); None: the model's (specls.json ``next_edit_layout``,
    # else layout_for_model of its source)
    layout: str | None = None
    # draft the region's continuation (RegionDrafter) under the drafting policy; False leaves lookup
    # and the draft model (the benchmark's "lookup" arm)
    region: bool = True
    # the most tokens one pass drafts: a 10-to-12-line region's whole copy, since the rewrite copies the
    # region but for the edit (a copy in progress is drafted to the region's end; the drafting policy
    # sizes the other passes by the measured verify costs)
    draft_length: int = 128
    # an output with more lines than the region and these is over (``rewrite_end``): it has left the
    # region, and new code costs a pass every few tokens, about half a second a line on a CPU; few
    # real next edits add more (docs/next-edit.md, "When an output is over")
    max_added_lines: int = 3
    min_match: int = 3  # RegionDrafter's realignment match (decoder/region_drafter.py)
    # the target's confidence on an edit's changed tokens (specls.next_edit.confidence), one short
    # pass over them after a decode that suggests edits; an edit whose least sure changed token's
    # top-1/top-2 logit margin is below ``min_margin`` is not shown (None: every edit is shown). The
    # bar is where a zero-shot model's guesses stop being shown: none of the 1.5B Instruct's shown
    # edits on the mined tasks was right at any bar, and this one holds back most of them
    # (bench/README.md, "Next edits"); a model that edits well is sure of its edits and clears it
    confidence: bool = True
    min_margin: float | None = 2.0
    kv_documents: int = 2  # documents whose edit-prompt KV is kept (beside the completions')
    # requests that show one file view (``request_prompt.FileView``) before it is taken again: the
    # view is the prompt's long stable part, so keeping it spares its prefill; retaking it now and
    # then lets the edits shown after it stay few (1: a fresh view every request)
    view_uses: int = 12
