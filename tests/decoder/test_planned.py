"""The planned drafter: exact output whatever the plan, lazy draft model, calibration."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pytest
from specls.decoder.api import CausalLM, DecodeSettings, Drafter
from specls.decoder.drafters import DraftModelDrafter, PromptLookupDrafter, point_masses_then
from specls.decoder.loop import generate
from specls.decoder.ngram import NgramIndex
from specls.decoder.planned import PlannedDrafter, PolicyState, calibrate
from specls.decoder.policy import AcceptanceByPosition, PassCosts

from tests.decoder.fakes import FakeCache, FakeLM, FakeLMConfig

TARGET = FakeLM(FakeLMConfig(vocab=48, window=2, seed=11))
GOOD_DRAFT = FakeLM.perturbed(TARGET, noise=0.05, seed=3)
BAD_DRAFT = FakeLM(FakeLMConfig(vocab=48, window=2, seed=99))
PROMPT = [5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 1, 2, 3]
CHEAP = PassCosts(verify=(1.0, 1.02, 1.04, 1.06, 1.08, 1.1, 1.12, 1.14, 1.16), step=0.05, catchup=0.001)
DEAR = PassCosts(verify=(1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8), step=0.6, catchup=0.05)
SETTINGS = DecodeSettings(max_new_tokens=40, draft_length=8)


def _drafter(draft: FakeLM | None, costs: PassCosts, **state: object) -> tuple[PlannedDrafter, PolicyState]:
    index = NgramIndex()
    index.update("other.py", TARGET.greedy(PROMPT, 12))  # a buffer holding the start of the answer
    st = PolicyState(costs=costs, **state)  # type: ignore[arg-type]
    model = DraftModelDrafter(draft) if draft is not None else None
    return PlannedDrafter(PromptLookupDrafter(index), model, st), st


def test_planned_drafter_implements_the_protocol() -> None:
    assert isinstance(_drafter(GOOD_DRAFT, CHEAP)[0], Drafter)


@pytest.mark.parametrize("draft", [GOOD_DRAFT, BAD_DRAFT, None])
@pytest.mark.parametrize("costs", [CHEAP, DEAR])
def test_output_equals_plain_greedy_whatever_the_plan(draft: FakeLM | None, costs: PassCosts) -> None:
    drafter, state = _drafter(draft, costs)
    want = TARGET.greedy(PROMPT, SETTINGS.max_new_tokens)
    for _ in range(3):  # the state learns across requests; output never changes
        result = generate(TARGET.new_cache(), PROMPT, drafter, SETTINGS, frozenset())
        drafter.end()
        assert result.tokens == want
    assert sum(state.choices.values()) > 0


def test_a_cheap_good_draft_model_is_used_and_saves_passes() -> None:
    drafter, state = _drafter(GOOD_DRAFT, CHEAP, length=40.0)
    result = generate(TARGET.new_cache(), PROMPT, drafter, SETTINGS, frozenset())
    assert state.choices["model"] + state.choices["lookup+model"] > 0
    assert result.target_passes < SETTINGS.max_new_tokens // 2  # Not 40: plain decoding


def test_an_expensive_weak_draft_model_is_never_started() -> None:
    weak = AcceptanceByPosition(prior=(0.1,), prior_weight=100.0)  # learned: it is seldom right
    drafter, state = _drafter(BAD_DRAFT, DEAR, model=weak)
    assert drafter.model is not None
    generate(TARGET.new_cache(), PROMPT, drafter, SETTINGS, frozenset())
    assert drafter.model.forward_tokens == 0  # lazy: no catch-up, no step. Not len(PROMPT) + ...
    assert state.choices["model"] == 0 and state.choices["lookup+model"] == 0


def test_a_short_completion_does_not_pay_for_the_catch_up() -> None:
    long_prompt = PROMPT * 30  # a draft model behind by ~390 tokens
    costs = PassCosts(verify=CHEAP.verify, step=0.1, catchup=0.02)
    drafter, state = _drafter(GOOD_DRAFT, costs, length=3.0)  # completions here are ~3 tokens
    assert drafter.model is not None
    generate(
        TARGET.new_cache(),
        long_prompt,
        drafter,
        DecodeSettings(max_new_tokens=3, draft_length=8),
        frozenset(),
    )
    assert drafter.model.forward_tokens == 0  # catching up on 390 tokens to save < 3 passes: no
    drafter, _ = _drafter(GOOD_DRAFT, costs, length=64.0)  # the same pair on long completions
    assert drafter.model is not None
    generate(
        TARGET.new_cache(),
        long_prompt,
        drafter,
        DecodeSettings(max_new_tokens=64, draft_length=8),
        frozenset(),
    )
    assert drafter.model.forward_tokens > 0


def test_requests_that_end_at_a_stop_learn_their_own_length() -> None:
    """Long open completions must not make a request that ends at the end of its line start the draft
    model (Not one moving average for both: after 64-token requests, a line guessed ~64 tokens)."""
    long_prompt = PROMPT * 30  # the draft model's view: 256 tokens behind, 2.6 passes of catch-up
    costs = PassCosts(verify=CHEAP.verify, step=0.1, catchup=0.01)
    settings = DecodeSettings(max_new_tokens=8, draft_length=8)
    drafter, state = _drafter(GOOD_DRAFT, costs, length=64.0, stop_length=3.0)
    assert drafter.model is not None
    drafter.stopped = True
    generate(TARGET.new_cache(), long_prompt, drafter, settings, frozenset())
    assert drafter.model.forward_tokens == 0  # a usual 3-token line cannot repay the catch-up
    drafter.end()
    assert state.length == 64.0 and 3.0 < state.stop_length <= 0.8 * 3.0 + 0.2 * 8  # its own average moved
    drafter.stopped = False  # the same request as an open one: 8 tokens to come, so the model starts
    generate(TARGET.new_cache(), long_prompt, drafter, settings, frozenset())
    assert drafter.model.forward_tokens > 0
    stop_length = state.stop_length
    drafter.end()
    assert state.length < 64.0 and state.stop_length == stop_length


def test_sampling_q_rows_cover_the_proposal() -> None:
    q_model = np.full((2, 4), 0.25)
    q = point_masses_then([3, 1, 2, 0], 2, q_model)
    assert q is not None and q.shape == (4, 4)
    assert q[0, 3] == 1.0 and q[1, 1] == 1.0 and q[0].sum() == 1.0  # lookup rows: point masses
    assert np.allclose(q[2:], 0.25)
    assert point_masses_then([3, 1], 2, None) is None  # all lookup: a point mass. Not zeros


class _Clocked(CausalLM):
    """A FakeLM whose passes advance a fake clock by (fixed + per_token * rows) * slowdown(pass number),
    rows = n rounded up to a multiple of ``granularity``; ``fed`` logs each pass's n. ``slowdown``
    (shared by the models of one host) is a busy host: 1.0 by default."""

    def __init__(
        self,
        lm: FakeLM,
        clock: list[float],
        fixed: float,
        per_token: float,
        granularity: int = 1,
        slowdown: Callable[[], float] = lambda: 1.0,
    ) -> None:
        self.lm, self.clock, self.fixed, self.per_token = lm, clock, fixed, per_token
        self.granularity, self.slowdown = granularity, slowdown
        self.fed: list[int] = []

    @property
    def vocab_size(self) -> int:
        return self.lm.vocab_size

    @property
    def pass_granularity(self) -> int:
        return self.granularity

    def new_cache(self) -> _ClockedCache:
        return _ClockedCache(self)


class _ClockedCache(FakeCache):
    def __init__(self, owner: _Clocked) -> None:
        super().__init__(owner.lm)
        self.owner = owner

    def forward(self, ids: Sequence[int]) -> np.ndarray:
        o = self.owner
        o.fed.append(len(ids))
        o.clock[0] += (o.fixed + o.per_token * (-(-len(ids) // o.granularity) * o.granularity)) * o.slowdown()
        return super().forward(ids)


def test_calibrate_recovers_the_cost_model() -> None:
    clock = [0.0]
    target = _Clocked(TARGET, clock, fixed=0.10, per_token=0.01)
    draft = _Clocked(GOOD_DRAFT, clock, fixed=0.03, per_token=0.001)
    costs = calibrate(target, draft, lambda: clock[0], prefix=32, points=(1, 2, 4, 8), rounds=3)
    one = 0.11
    assert costs.verify[0] == 1.0
    assert costs.verify[4] == pytest.approx((0.10 + 0.05) / one)  # measured at g = 4
    assert costs.verify[3] == pytest.approx((0.10 + 0.04) / one)  # interpolated between 2 and 4
    assert costs.step == pytest.approx(0.031 / one)
    assert costs.catchup == pytest.approx((0.03 + 0.016) / 16 / one)  # a 16-token feed
    alone = calibrate(target, None, lambda: clock[0], prefix=8)
    assert alone.step == 0.0 and len(alone.verify) == 9


def test_calibrate_measures_a_padding_target_by_its_rows() -> None:
    """A target that pads odd passes (granularity 2): g = 1 is as cheap as a one-token pass and g = 2
    costs what g = 3 costs; it is measured only at even sizes, so no interpolation hides the step."""
    clock = [0.0]
    target = _Clocked(TARGET, clock, fixed=0.10, per_token=0.01, granularity=2)
    costs = calibrate(target, None, lambda: clock[0], prefix=32)
    one = 0.12  # a one-token pass computes 2 rows
    assert costs.verify[0] == costs.verify[1] == 1.0
    assert costs.verify[2] == costs.verify[3] == pytest.approx(0.14 / one)  # Not halfway to 1.0
    assert costs.verify[8] == pytest.approx(0.20 / one)  # 9 tokens: 10 rows
    assert costs.verify[6] == costs.verify[7] == pytest.approx(0.18 / one)  # 8 rows, between 4 and 10
    assert all(n % 2 == 0 for n in target.fed[1:])  # after the prefix: even passes only (2, 4, 10)


def test_calibrate_throws_the_warm_up_round_away() -> None:
    """The first pass of each new shape is slow (ORT allocates for it): the warm-up round takes it."""
    clock = [0.0]
    target = _Clocked(TARGET, clock, fixed=0.10, per_token=0.01)
    seen: set[int] = set()
    inner = target.new_cache

    def cold_first(self: _Clocked = target) -> _ClockedCache:
        cache = inner()
        forward = cache.forward

        def slow_once(ids: Sequence[int]) -> np.ndarray:
            if len(ids) not in seen:
                seen.add(len(ids))
                clock[0] += 1.0  # a cold shape
            return forward(ids)

        cache.forward = slow_once  # type: ignore[method-assign]
        return cache

    target.new_cache = cold_first  # type: ignore[method-assign]
    costs = calibrate(target, None, lambda: clock[0], prefix=8, rounds=2)
    assert costs.verify[3] == pytest.approx(0.14 / 0.11)  # Not (0.14 + 1.0) / (0.11 + 1.0): warm-up


def _busy_host(passes: list[int], slow: set[int], factor: float) -> Callable[[], float]:
    """A host that runs passes number ``slow`` (0-based, both models counted) ``factor`` times slower."""

    def slowdown() -> float:
        passes[0] += 1
        return factor if passes[0] - 1 in slow else 1.0

    return slowdown


@pytest.mark.parametrize(
    "slow",
    [
        set(range(17, 100)),  # the host halves its speed in round 2 (at its 4th shape) and stays slow
        {8},  # one pass of round 1 (its one-token target pass) disturbed
        {15, 16},  # two passes of round 2
        {8, 15, 22},  # one pass in every round, each time of another shape
    ],
)
def test_calibrate_is_immune_to_a_host_that_changes_speed(slow: set[int]) -> None:
    """A shared CPU changes speed between passes: the rounds interleave the shapes and each shape's
    fastest round counts, so what a busy host adds drops out wherever one round saw every shape at
    full speed. Passes: 2 prefixes, a warm-up round of 6 shapes (4 target rows, draft step and
    catch-up), then 3 rounds of 6."""
    clock, passes = [0.0], [0]
    host = _busy_host(passes, slow, factor=2.0)
    target = _Clocked(TARGET, clock, fixed=0.10, per_token=0.01, slowdown=host)
    draft = _Clocked(GOOD_DRAFT, clock, fixed=0.03, per_token=0.001, slowdown=host)
    costs = calibrate(target, draft, lambda: clock[0], prefix=32, points=(1, 3, 8), rounds=3)
    assert passes[0] == 2 + 6 * 4
    one = 0.11
    assert costs.verify[3] == pytest.approx(0.14 / one)  # Not 0.28 / 0.11: a slow pass of that shape
    assert costs.verify[8] == pytest.approx(0.19 / one)
    assert costs.step == pytest.approx(0.031 / one)  # Not 0.031 / 0.22 (the slow one-token pass)
    assert costs.catchup == pytest.approx((0.03 + 0.016) / 16 / one)


def _copying(costs: PassCosts, **state: object) -> tuple[PlannedDrafter, PolicyState]:
    """Lookup only, over a buffer that holds the prompt's end and then the answer (a copy)."""
    index = NgramIndex()
    index.update("copy.py", [*PROMPT[-3:], *TARGET.greedy(PROMPT, 12)])
    st = PolicyState(costs=costs, **state)  # type: ignore[arg-type]
    return PlannedDrafter(PromptLookupDrafter(index), None, st), st


def test_lookup_after_a_whole_accepted_proposal_is_learned_apart() -> None:
    """Copying: a lookup proposal accepted whole makes the next one use (and teach) the "after a hit"
    table; a rejected lookup token sends the request back to the first-match table."""
    drafter, state = _copying(CHEAP)
    ref = TARGET.greedy(PROMPT, 12)
    drafter.begin(SETTINGS)
    first = drafter.propose(PROMPT, 4)
    assert first and first == ref[: len(first)]  # the buffer holds the answer: lookup proposes it
    drafter.observe(len(first), len(first))  # accepted whole
    assert sum(state.lookup.reached) == len(first) and not state.lookup_hot.reached
    context = [*PROMPT, *ref[: len(first) + 1]]
    second = drafter.propose(context, 4)
    assert second
    drafter.observe(0, len(second))  # its first token rejected
    assert state.lookup_hot.reached[0] == 1 and state.lookup_hot.accepted[0] == 0  # Not the cold table
    assert sum(state.lookup.reached) == len(first)
    third = drafter.propose(context, 4)
    drafter.observe(0, len(third))
    assert state.lookup_hot.reached[0] == 1  # after the miss: the first-match table again


def _one_token_match(costs: PassCosts, **state: object) -> tuple[PlannedDrafter, PolicyState]:
    """Lookup only; the suffix [5, 6, 7, 8] holds the context's last token 5 but not its last two."""
    st = PolicyState(costs=costs, **state)  # type: ignore[arg-type]
    return PlannedDrafter(PromptLookupDrafter(None, suffix=[5, 6, 7, 8]), None, st), st


def test_a_one_token_match_is_learned_as_a_guess() -> None:
    drafter, state = _one_token_match(CHEAP)
    drafter.begin(SETTINGS)
    got = drafter.propose([1, 2, 5], 4)
    assert drafter.lookup is not None and drafter.lookup.last_match is not None
    assert drafter.lookup.last_match.n == 1
    assert got and got == [6, 7, 8][: len(got)]
    drafter.observe(0, len(got))
    assert state.lookup_guess.reached[0] == 1 and state.lookup_guess.accepted[0] == 0
    assert not state.lookup.reached  # Not the table of longer matches
    assert drafter.propose([1, 2, 5, 6, 7], 4) == [8]  # a two-token match: the other table
    drafter.observe(1, 1)
    assert state.lookup.accepted == [1.0] and sum(state.lookup_guess.reached) == 1.0


def test_a_one_token_match_is_priced_by_its_own_table() -> None:
    """A one-token match that is seldom right is not drafted where rows cost; a longer match is."""
    guess = AcceptanceByPosition(prior=(0.1,), prior_weight=100.0)
    cold = AcceptanceByPosition(prior=(0.9,), prior_weight=100.0)
    steep = PassCosts(verify=(1.0, 1.3, 1.6, 1.9, 2.2), step=0.3, catchup=0.01)
    drafter, state = _one_token_match(steep, lookup_guess=guess, lookup=cold)
    drafter.begin(SETTINGS)
    assert drafter.propose([1, 2, 5], 4) == []  # Not [6, ...]: priced as a longer match
    assert drafter.propose([1, 2, 5, 6], 4) == [7, 8]
    assert state.choices == {"plain": 1, "lookup": 1}


def test_tokens_past_a_stop_teach_nothing() -> None:
    """The loop verified 1 of the proposal's tokens (the rest lay past a stop) and it was right."""
    drafter, state = _copying(CHEAP)
    drafter.begin(SETTINGS)
    first = drafter.propose(PROMPT, 4)
    assert len(first) >= 2
    drafter.observe(1, 1)
    # Not reached [1, 1, ...]: position 1 was never verified, so it is no rejection
    assert sum(state.lookup.reached) == 1.0 and state.lookup.accepted == [1.0]


def test_a_hot_copy_proposes_longer_than_a_cold_match() -> None:
    cold = AcceptanceByPosition(prior=(0.5, 0.1), prior_weight=100.0)  # worth 1 token, not 2
    hot = AcceptanceByPosition(prior=(0.95,), prior_weight=100.0)
    costs = PassCosts(verify=(1.0, 1.3, 1.6, 1.9, 2.2), step=0.3, catchup=0.01)  # a CPU's steep verify
    drafter, _ = _copying(costs, lookup=cold, lookup_hot=hot)
    drafter.begin(SETTINGS)
    ref = TARGET.greedy(PROMPT, 12)
    n_cold = len(drafter.propose(PROMPT, 4))
    drafter.observe(n_cold, n_cold)
    n_hot = len(drafter.propose([*PROMPT, *ref[: n_cold + 1]], 4))
    assert n_cold == 1 < n_hot  # Not the same length: the copy is trusted once it has been right


def test_the_policy_learns_the_share_of_a_completion_that_lookup_does_not_copy() -> None:
    """What a draft model's catch-up can pay off on (``PolicyState.unmatched``), per request class."""
    settings = DecodeSettings(max_new_tokens=12, draft_length=8)
    drafter, state = _drafter(GOOD_DRAFT, CHEAP)  # a buffer holds the whole answer: lookup copies it
    out = generate(TARGET.new_cache(), PROMPT, drafter, settings, frozenset())
    drafter.end()
    copied = out.per_drafter["lookup"].accepted
    assert copied > 0
    assert state.unmatched == pytest.approx(0.8 * 0.5 + 0.2 * (12 - copied) / 12)  # Not the prior 0.5
    assert state.stop_unmatched == 0.5  # the other class is untouched
    alone = PlannedDrafter(None, DraftModelDrafter(GOOD_DRAFT), state)  # nothing to copy from
    alone.stopped = True
    generate(TARGET.new_cache(), PROMPT, alone, settings, frozenset())
    alone.end()
    assert state.stop_unmatched == pytest.approx(0.8 * 0.5 + 0.2 * 1.0)  # every token was not lookup's
