"""The drafting policy with a region source (next edits): the region's continuation is offered before
the lookup match and priced by its own acceptance; output is plain greedy whatever the region, and
an unchanged region goes in long passes where the verify costs allow them."""

from __future__ import annotations

import pytest
from specls.decoder.api import DecodeSettings
from specls.decoder.drafters import DraftModelDrafter, PromptLookupDrafter
from specls.decoder.loop import generate
from specls.decoder.planned import PlannedDrafter, PolicyState
from specls.decoder.policy import PassCosts
from specls.decoder.region_drafter import RegionDrafter

from tests.decoder.fakes import FakeLM, FakeLMConfig
from tests.decoder.test_region_drafter import TinyCache, TinyLM, _mutate, random_case

CHEAP = PassCosts(verify=tuple(1.0 + 0.01 * g for g in range(65)), step=0.3, catchup=0.01)
LONG = DecodeSettings(max_new_tokens=160, draft_length=48)


@pytest.mark.parametrize("seed", range(6))
def test_output_is_plain_greedy_with_region_lookup_and_draft_model(seed: int) -> None:
    vocab = 24
    rng, lm, prompt, plain = random_case(seed, vocab, 12, LONG.max_new_tokens)
    draft = FakeLM(FakeLMConfig(vocab=vocab, window=2, seed=seed + 50))
    for region in ([int(t) for t in rng.integers(0, vocab, size=60)], _mutate(plain, rng, vocab, 5), []):
        drafter = PlannedDrafter(
            PromptLookupDrafter(None),
            DraftModelDrafter(draft),
            PolicyState(costs=CHEAP),
            RegionDrafter(region, len(prompt)),
        )
        result = generate(TinyCache(lm), prompt, drafter, LONG, frozenset())
        assert result.tokens == plain, f"seed {seed}, region of {len(region)}"


def test_an_unchanged_region_goes_in_long_passes_priced_by_its_own_table() -> None:
    lm = TinyLM(40, 7)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    plain = lm.greedy(prompt, LONG.max_new_tokens)
    state = PolicyState(costs=CHEAP)
    drafter = PlannedDrafter(PromptLookupDrafter(None), None, state, RegionDrafter(plain, len(prompt)))
    result = generate(TinyCache(lm), prompt, drafter, LONG, frozenset())
    assert result.tokens == plain
    assert len(result.tokens) / result.target_passes >= 10, result.target_passes
    assert result.per_drafter["region"].accepted == result.accepted
    assert state.region.reached and not state.lookup.reached  # the lookup tables learned nothing
    assert state.choices["region"] > 0 and "lookup" not in state.choices
    assert state.region.rate(0) > 0.9


def test_costly_long_passes_keep_a_first_region_proposal_short_and_a_copy_is_drafted_whole() -> None:
    lm = TinyLM(40, 7)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    plain = lm.greedy(prompt, 64)
    steep = PassCosts(verify=tuple(1.0 + 0.5 * g for g in range(65)))  # each drafted row half a pass
    drafter = PlannedDrafter(None, None, PolicyState(costs=steep), RegionDrafter(plain, len(prompt)))
    result = generate(
        TinyCache(lm), prompt, drafter, DecodeSettings(max_new_tokens=64, draft_length=48), frozenset()
    )
    assert result.tokens == plain
    fed = [n for n, _ in result.pass_ms]  # [drafted + 1] per pass
    assert fed[0] - 1 < 48  # Not 48: the verify cost caps the first (cold) proposal
    # once it held whole, the copy is drafted to the region's end (or the pass's cap), whatever it costs
    assert fed[1] - 1 == min(48, 64 - fed[0] - 1), fed


def test_after_a_region_proposal_accepted_whole_the_next_is_priced_by_the_hot_table() -> None:
    lm = TinyLM(40, 7)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    plain = lm.greedy(prompt, LONG.max_new_tokens)
    # a CPU-like curve: each drafted row a twentieth of a pass, so the cold prior alone drafts short
    costs = PassCosts(verify=tuple(1.0 + 0.05 * g for g in range(65)))
    state = PolicyState(costs=costs)
    drafter = PlannedDrafter(None, None, state, RegionDrafter(plain, len(prompt)))
    result = generate(TinyCache(lm), prompt, drafter, LONG, frozenset())
    assert result.tokens == plain
    assert state.region.reached[0] == 1  # only the first proposal was priced cold
    assert state.region_hot.reached  # the rest while copying
    assert len(result.tokens) / result.target_passes >= 10, result.target_passes
    assert len(result.accept_hist) > 20  # long proposals once copying


@pytest.mark.parametrize("seed", range(4))
def test_an_edited_region_with_the_hot_table_is_still_plain_greedy(seed: int) -> None:
    rng, lm, prompt, plain = random_case(seed, 24, 10, LONG.max_new_tokens)
    state = PolicyState(costs=CHEAP)
    for _ in range(2):  # the second request starts from what the first taught both tables
        drafter = PlannedDrafter(
            PromptLookupDrafter(None), None, state, RegionDrafter(_mutate(plain, rng, 24, 6), 10)
        )
        assert generate(TinyCache(lm), prompt, drafter, LONG, frozenset()).tokens == plain
