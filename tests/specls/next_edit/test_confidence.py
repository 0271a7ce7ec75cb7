"""The show rule's confidence: the target's margin on the changed tokens of an edit, measured after
the decode on the document's edit KV (which stays consistent for the next request), and edits held
back below the bar."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from specls.engine import EngineSettings, OnnxEngine
from specls.next_edit.confidence import changed_positions, confidence_of
from specls.next_edit.layouts import get_layout
from tests.specls.next_edit.script_lm import script_models, script_rewrite
from tests.specls.test_engine_next_edit import NEXT, SMALL, request

REWRITE = "".join(NEXT.splitlines(keepends=True)[1:9])


def test_changed_positions_cover_replacements_insertions_and_deletions() -> None:
    assert changed_positions([1, 7, 8, 2, 3], [1, 2, 3]) == [1, 2]  # inserted
    assert changed_positions([1, 3], [1, 2, 3]) == [1]  # deleted: the token in its place
    assert changed_positions([1, 2], [1, 2, 3]) == []  # deleted at the end: no token took its place
    assert changed_positions([], []) == []


def test_confidence_of_is_the_margin_and_probability_of_the_chosen_tokens() -> None:
    logits = np.log(np.array([[0.7, 0.2, 0.1], [0.5, 0.5, 1e-9]]))
    c = confidence_of(logits, [0, 1])
    assert abs(c.min_prob - 0.5) < 1e-6 and abs(c.mean_prob - 0.6) < 1e-6
    assert abs(c.min_margin) < 1e-6  # a tie: margin 0
    assert abs(c.mean_margin - np.log(3.5) / 2) < 1e-6
    assert c.tokens == 2 and set(c.to_dict()) == {
        "min_margin",
        "mean_margin",
        "min_prob",
        "mean_prob",
        "tokens",
    }


def test_an_edit_comes_with_its_confidence_and_the_kv_stays_right_for_the_next_request() -> None:
    models, lm = script_models()
    edit = replace(SMALL, layout="chat-snippet")
    req = request()
    script_rewrite(models, lm, req, get_layout("chat-snippet"), edit, REWRITE)
    engine = OnnxEngine(EngineSettings(costs_cache=False), models, edit)
    first = engine.next_edit(req)
    assert first.edits and engine.edits is not None
    c = engine.edits.last_confidence
    assert c is not None and c.tokens >= 1 and c.min_margin > 50  # the script's +100 on its tokens
    tokens = list(engine.edits.last_tokens)
    again = engine.next_edit(req)  # on the KV the confidence pass left
    assert again.edits == first.edits and engine.edits.last_tokens == tokens
    assert again.prefix_reused_tokens > 0
    plain = OnnxEngine(EngineSettings(speculation=False), models, replace(edit, confidence=False))
    assert plain.next_edit(req).edits == first.edits
    assert (
        plain.edits is not None and plain.edits.last_tokens == tokens and plain.edits.last_confidence is None
    )


def test_an_edit_below_the_bar_is_not_shown() -> None:
    models, lm = script_models()
    edit = replace(SMALL, layout="chat-snippet", min_margin=1e6)
    req = request()
    script_rewrite(models, lm, req, get_layout("chat-snippet"), edit, REWRITE)
    engine = OnnxEngine(EngineSettings(costs_cache=False), models, edit)
    result = engine.next_edit(req)
    assert result.edits == () and result.dropped == "unsure" and result.rewritten == REWRITE
    assert engine.edits is not None and engine.edits.snapshot()["shown"] == 0
    shown = OnnxEngine(EngineSettings(costs_cache=False), models, replace(edit, min_margin=1.0))
    assert shown.next_edit(req).edits
