"""The feature-head drafter under the drafting policy: output is plain greedy whatever the head guesses
(right, wrong, random), the head's guesses are read at the right position and priced by their own
table, and a cache without hidden states gives no proposal."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from specls.decoder.api import DecodeSettings
from specls.decoder.drafters import PromptLookupDrafter
from specls.decoder.head_drafter import HeadDrafter, head_proposal
from specls.decoder.loop import generate
from specls.decoder.planned import PlannedDrafter, PolicyState
from specls.decoder.policy import PassCosts

from tests.decoder.fakes import FakeCache, FakeLM, FakeLMConfig

CHEAP = PassCosts(verify=tuple(1.0 + 0.02 * g for g in range(33)), step=0.3, catchup=0.01)
SETTINGS = DecodeSettings(max_new_tokens=48, draft_length=8)
HEADS = 4


class HiddenCache(FakeCache):
    """A FakeCache whose "hidden state" at a position is the window of tokens the logits there read,
    kept only for the positions its last forward computed (as the ONNX cache keeps them), and checked:
    every read is of a position the cache still holds."""

    def __init__(self, model: FakeLM) -> None:
        super().__init__(model)
        self.rows: tuple[int, int] = (0, 0)  # [start, end) of the last forward
        self.reads: list[int] = []

    def forward(self, ids: Sequence[int]) -> np.ndarray:
        start = len(self.tokens)
        out = super().forward(ids)
        self.rows = (start, len(self.tokens))
        return out

    def hidden_at(self, position: int) -> np.ndarray | None:
        self.reads.append(position)
        start, end = self.rows
        if not start <= position < min(end, self.length):
            return None
        w = self._model.config.window
        return np.array(self.tokens[max(0, position - w + 1) : position + 1], dtype=np.float64)


def oracle(lm: FakeLM, wrong_every: int = 0, seed: int = 0) -> tuple[object, list[int]]:
    """A head that knows the target: from the window at p it runs the target's greedy past the token
    the target commits from p; ``wrong_every``: every so many guesses one is off."""
    rng = np.random.default_rng(seed)
    calls: list[int] = []

    def guess(hidden: np.ndarray, token: int) -> tuple[np.ndarray, np.ndarray]:
        calls.append(1)
        window = [int(t) for t in hidden]
        assert lm.greedy(window, 1) == [token]  # the token the target committed from there
        ids = np.array(lm.greedy([*window, token], HEADS), dtype=np.int64)
        if wrong_every and len(calls) % wrong_every == 0:
            ids[rng.integers(0, len(ids))] += 1
            ids %= lm.vocab_size
        return ids, np.ones(len(ids), dtype=np.float32)

    return guess, calls


def _case(seed: int) -> tuple[FakeLM, list[int], list[int]]:
    lm = FakeLM(FakeLMConfig(vocab=48, window=3, seed=seed))
    prompt = [int(t) for t in np.random.default_rng(seed).integers(0, 48, size=10)]
    return lm, prompt, lm.greedy(prompt, SETTINGS.max_new_tokens)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("wrong_every", [0, 2, 1])
def test_output_is_plain_greedy_whatever_the_head_guesses(seed: int, wrong_every: int) -> None:
    lm, prompt, plain = _case(seed)
    for lookup in (None, PromptLookupDrafter(None)):
        cache = HiddenCache(lm)
        guess, _ = oracle(lm, wrong_every, seed)
        head = HeadDrafter(guess, HEADS)  # type: ignore[arg-type]
        head.bind(cache.hidden_at)
        drafter = PlannedDrafter(lookup, None, PolicyState(costs=CHEAP), feature_head=head)
        result = generate(cache, prompt, drafter, SETTINGS, frozenset())
        assert result.tokens == plain, f"seed {seed}, wrong every {wrong_every}, lookup {lookup}"
        assert all(0 <= p < len(cache.tokens) for p in cache.reads)


def test_a_right_head_commits_several_tokens_a_pass_and_teaches_its_own_table() -> None:
    lm, prompt, plain = _case(7)
    cache = HiddenCache(lm)
    guess, calls = oracle(lm)
    head = HeadDrafter(guess, HEADS)  # type: ignore[arg-type]
    head.bind(cache.hidden_at)
    state = PolicyState(costs=CHEAP)
    result = generate(
        cache, prompt, PlannedDrafter(None, None, state, feature_head=head), SETTINGS, frozenset()
    )
    assert result.tokens == plain
    assert result.per_drafter["head"].accepted == result.accepted > 0
    assert len(result.tokens) / result.target_passes > 3  # Not ~1: each pass takes the guesses
    assert state.head.accepted[0] == state.head.reached[0] >= 5 and state.choices["head"] > 0
    assert state.head.rate(0) > 0.8  # Not the prior 0.5: it learned
    assert not state.lookup.reached  # the lookup tables learned nothing from head tokens
    assert len(calls) <= result.target_passes + 1


def test_no_hidden_state_no_proposal() -> None:
    lm, prompt, plain = _case(3)
    guess, calls = oracle(lm)
    head = HeadDrafter(guess, HEADS)  # type: ignore[arg-type]
    head.bind(None)  # a cache that keeps no hidden states (a batched pass, another runtime)
    result = generate(
        FakeCache(lm),
        prompt,
        PlannedDrafter(None, None, PolicyState(costs=CHEAP), feature_head=head),
        SETTINGS,
        frozenset(),
    )
    assert result.tokens == plain and result.drafted == 0 and calls == []


def test_the_head_reads_the_position_whose_logits_gave_the_last_token() -> None:
    rows = {4: np.zeros(1)}
    seen: list[int] = []

    def features(p: int) -> np.ndarray | None:
        seen.append(p)
        return rows.get(p)

    tokens: list[int] = []

    def guess(h: np.ndarray, token: int) -> tuple[np.ndarray, np.ndarray]:
        tokens.append(token)
        return np.arange(3), np.ones(3)

    assert head_proposal(features, guess, [9, 9, 9, 9, 9, 4], 8) == [0, 1, 2]
    assert seen == [4]  # Not 5: position 5 holds the token the target committed from position 4
    assert tokens == [4]  # and that token goes with it
    assert head_proposal(features, guess, [9, 9, 9, 9, 9, 4], 0) == []


def test_a_head_whose_guess_costs_more_than_it_saves_is_not_asked() -> None:
    lm, prompt, plain = _case(5)
    for cost, used in ((0.0, True), (1.0, False)):  # 1.0: at most 1.85 tokens for 2.08 passes (prior)
        cache = HiddenCache(lm)
        guess, calls = oracle(lm)
        head = HeadDrafter(guess, HEADS, cost)  # type: ignore[arg-type]
        head.bind(cache.hidden_at)
        state = PolicyState(costs=CHEAP)
        result = generate(
            cache, prompt, PlannedDrafter(None, None, state, feature_head=head), SETTINGS, frozenset()
        )
        assert result.tokens == plain
        assert bool(calls) == used and (result.drafted > 0) == used, cost
