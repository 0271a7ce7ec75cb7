"""Drafters: prompt lookup sources, draft-model cache sync, sampling q."""

from __future__ import annotations

import numpy as np
import pytest
from specls.decoder.api import DecodeSettings, Drafter
from specls.decoder.drafters import (
    DrafterSettings,
    DraftModelDrafter,
    PromptLookupDrafter,
    draft_view_start,
    unplanned_proposal,
)
from specls.decoder.ngram import LookupMatch, NgramIndex

from tests.decoder.fakes import FakeLM, FakeLMConfig

LM = FakeLM(FakeLMConfig(vocab=32, window=2, seed=4))


def test_drafters_implement_the_protocol() -> None:
    for drafter in (PromptLookupDrafter(None), DraftModelDrafter(LM)):
        assert isinstance(drafter, Drafter)


def test_lookup_prefers_the_current_sequence_then_suffix_then_documents() -> None:
    index = NgramIndex()
    index.update("other.py", [1, 2, 3, 30, 31])
    drafter = PromptLookupDrafter(index, suffix=[2, 3, 20, 21])
    assert drafter.propose([9, 1, 2, 3], 2) == [30, 31]  # only the document has [1, 2, 3]
    assert drafter.propose([9, 8, 2, 3], 2) == [20, 21]  # [2, 3] in suffix and doc: suffix first
    assert drafter.propose([2, 3, 10, 11, 8, 2, 3], 2) == [10, 11]  # the sequence itself first
    assert drafter.last_match is not None and drafter.last_match.source == "context"
    assert list(drafter.proposal_sources()) == ["lookup", "lookup"]
    assert drafter.proposal_probs() is None
    assert drafter.propose([7, 7, 7, 5], 3) == []  # no match, no proposal
    assert list(drafter.proposal_sources()) == []


def test_lookup_respects_min_n() -> None:
    index = NgramIndex(min_n=1, max_n=4)
    index.update("d", [5, 6, 7])
    loose = PromptLookupDrafter(index, DrafterSettings(lookup_min_n=1, lookup_guess_tokens=2))
    strict = PromptLookupDrafter(index, DrafterSettings(lookup_min_n=2, lookup_guess_tokens=2))
    assert loose.propose([0, 5], 2) == [6, 7]
    assert strict.propose([0, 5], 2) == []  # a 1-token match is below min_n. Not [6, 7]


@pytest.mark.parametrize(
    ("n", "k", "guess_tokens", "want"),
    [
        (3, 4, 1, [7, 8, 9, 5]),  # a longer match proposes what k allows
        (2, 2, 1, [7, 8]),
        (1, 4, 1, [7]),  # a guess proposes one token. Not [7, 8, 9, 5]
        (1, 4, 2, [7, 8]),
        (1, 1, 3, [7]),  # k still bounds it
        (1, 0, 1, []),
    ],
)
def test_unplanned_proposal_caps_a_guess(n: int, k: int, guess_tokens: int, want: list[int]) -> None:
    match = LookupMatch("docs", "d", n, 3, [7, 8, 9, 5])
    assert match.guess == (n == 1)
    assert unplanned_proposal(match, k, DrafterSettings(lookup_guess_tokens=guess_tokens)) == want
    assert unplanned_proposal(None, k, DrafterSettings()) == []


def test_lookup_without_a_policy_proposes_one_token_on_a_one_token_match() -> None:
    index = NgramIndex(min_n=1, max_n=4)
    index.update("d", [5, 6, 7, 8])
    lookup = PromptLookupDrafter(index)  # the defaults: lookup_min_n 1, lookup_guess_tokens 1
    assert lookup.propose([0, 5], 3) == [6]  # Not [6, 7, 8]
    assert list(lookup.proposal_sources()) == ["lookup"]
    assert lookup.propose([0, 5, 6], 3) == [7, 8]  # a 2-token match is not a guess


def test_draft_model_proposes_its_greedy_continuation_and_syncs_by_prefix() -> None:
    drafter = DraftModelDrafter(LM)
    ctx = [3, 4, 5, 6, 7, 8]
    assert drafter.propose(ctx, 4) == LM.greedy(ctx, 4)
    assert drafter.forward_tokens == len(ctx) + 3  # prefill + 3 steps (the last draft is not fed)
    before = drafter.forward_tokens
    ctx2 = ctx + [9, 10]  # two committed tokens later
    assert drafter.propose(ctx2, 3) == LM.greedy(ctx2, 3)
    # caught up on the new tokens only (plus those after a diverged cached draft). Not len(ctx2) + 2
    assert drafter.forward_tokens - before <= 2 + 2
    assert drafter.cached_tokens == len(ctx2) + 2
    edited = [3, 4, 11, 6]  # an edit earlier in the sequence: truncate to the common prefix
    assert drafter.propose(edited, 2) == LM.greedy(edited, 2)
    same = drafter.forward_tokens
    assert drafter.propose(edited, 1) == LM.greedy(edited, 1)
    assert drafter.forward_tokens - same == 1  # the whole context cached: re-feed the last token only


def test_draft_model_min_confidence_shortens_proposals() -> None:
    flat = FakeLM(FakeLMConfig(vocab=32, window=2, seed=4, scale=0.05))  # nearly uniform
    drafter = DraftModelDrafter(flat, DrafterSettings(draft_min_confidence=0.5))
    assert len(drafter.propose([1, 2, 3], 5)) == 1  # always at least one token. Not 5
    assert len(DraftModelDrafter(flat).propose([1, 2, 3], 5)) == 5


def test_draft_model_sampling_returns_q_rows() -> None:
    drafter = DraftModelDrafter(LM)
    drafter.begin(DecodeSettings(temperature=0.7, seed=1))
    tokens = drafter.propose([1, 2, 3], 4)
    q = drafter.proposal_probs()
    assert q is not None and q.shape == (4, LM.vocab_size)
    np.testing.assert_allclose(q.sum(axis=1), 1.0)
    assert all(q[i, t] > 0 for i, t in enumerate(tokens))
    drafter.begin(DecodeSettings())  # greedy again: point mass
    drafter.propose([1, 2, 3], 2)
    assert drafter.proposal_probs() is None


def test_draft_model_resets_its_cache_after_a_failure() -> None:
    class Flaky(FakeLM):
        fail = False

        def new_cache(self):  # type: ignore[no-untyped-def]
            cache = super().new_cache()
            forward = cache.forward

            def flaky(ids):  # type: ignore[no-untyped-def]
                if Flaky.fail:
                    cache.tokens.append(0)  # a half-done step
                    raise RuntimeError("boom")
                return forward(ids)

            cache.forward = flaky  # type: ignore[method-assign]
            return cache

    lm = Flaky(FakeLMConfig(vocab=32, window=2, seed=4))
    drafter = DraftModelDrafter(lm)
    ctx = [3, 4, 5, 6]
    drafter.propose(ctx, 3)
    Flaky.fail = True
    with pytest.raises(RuntimeError):
        drafter.propose(ctx + [1], 3)
    assert drafter.cached_tokens == 0
    Flaky.fail = False
    assert drafter.propose(ctx + [1], 3) == LM.greedy(ctx + [1], 3)  # Not a stale-cache continuation


def test_lookup_continues_a_repeating_pattern_past_the_end_of_the_sequence() -> None:
    drafter = PromptLookupDrafter(None)
    assert drafter.propose([7, 1, 2, 1, 2], 5) == [1, 2, 1, 2, 1]  # Not [1, 2]
    assert drafter.propose([9, 3, 3, 3], 3) == [3, 3, 3]
    index = NgramIndex()
    index.update("d", [4, 5, 6])  # a document match is not extended past the document's end
    assert PromptLookupDrafter(index).propose([0, 4, 5], 4) == [6]


def test_draft_model_catch_up_asks_for_the_last_row_only() -> None:
    """A cache with ``forward_last`` serves the multi-token catch-up (one row of logits, not n); the
    proposals are the same as with plain ``forward``."""
    from collections.abc import Sequence

    from tests.decoder.fakes import FakeCache

    class LastRowCache(FakeCache):
        def __init__(self, model: FakeLM) -> None:
            super().__init__(model)
            self.last_calls: list[int] = []

        def forward_last(self, ids: Sequence[int]) -> np.ndarray:
            self.last_calls.append(len(ids))
            return self.forward(ids)[-1]

    class LastRowLM(FakeLM):
        def new_cache(self) -> LastRowCache:
            return LastRowCache(self)

    lm = LastRowLM(LM.config, LM.tables)
    drafter = DraftModelDrafter(lm)
    ctx = [3, 4, 5, 6, 7, 8]
    assert drafter.propose(ctx, 4) == LM.greedy(ctx, 4)
    cache = drafter._cache
    assert isinstance(cache, LastRowCache) and cache.last_calls == [len(ctx)]  # Not the 1-token steps


@pytest.mark.parametrize(
    ("n", "window", "want"),
    [
        (100, 256, 0),
        (256, 256, 0),  # exactly the window: all of it. Not 128
        (257, 256, 128),  # one past: the first stride. Not 1 (a start that moves every token)
        (384, 256, 128),
        (385, 256, 256),
        (700, 256, 512),  # at most the window: 188 tokens. Not 384 (316 tokens)
        (10_000, 0, 0),  # 0: the whole context
        (5, 1, 4),  # a window of 1: a stride of 1
    ],
)
def test_draft_view_start(n: int, window: int, want: int) -> None:
    start = draft_view_start(n, window)
    assert start == want
    assert window <= 0 or n - start <= max(window, 1)


def test_draft_model_sees_the_context_tail_and_keeps_it_cached() -> None:
    drafter = DraftModelDrafter(LM, DrafterSettings(draft_window=8))
    ctx = list(range(1, 19))  # 18 tokens: the view starts at 12 (stride 4)
    assert drafter.propose(ctx, 3) == LM.greedy(ctx[12:], 3)
    assert drafter.forward_tokens == 6 + 2  # the 6-token view, not the 18-token context, then 2 steps
    assert drafter.behind(ctx + [5]) == 1  # the next token extends the cached view. Not 7
    before = drafter.forward_tokens
    longer = ctx + [5, 6, 7]  # 21 tokens: the start moves to 16 and the new view is fed whole
    assert drafter.propose(longer, 2) == LM.greedy(longer[16:], 2)
    assert drafter.forward_tokens - before == 5 + 1
    assert drafter.behind(ctx) == 6  # a context whose view starts elsewhere: all of its view


@pytest.mark.parametrize(
    ("bad", "named"),
    [
        ({"lookup_min_n": 0}, "lookup_min_n"),  # Not accepted: a match of no tokens matches anything
        ({"lookup_min_n": 3, "lookup_max_n": 2}, "lookup_max_n"),
        ({"lookup_guess_tokens": -1}, "lookup_guess_tokens"),
        ({"draft_min_confidence": 1.5}, "draft_min_confidence"),
        ({"draft_min_confidence": float("nan")}, "draft_min_confidence"),
        ({"draft_window": -1}, "draft_window"),
    ],
)
def test_bad_drafter_settings_are_refused_by_name(bad: dict[str, float], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        DrafterSettings(**bad)  # type: ignore[arg-type]


def test_edge_drafter_settings_are_accepted() -> None:
    DrafterSettings(lookup_min_n=4, lookup_max_n=4, lookup_guess_tokens=0)
    DrafterSettings(draft_min_confidence=1.0, draft_window=0)
