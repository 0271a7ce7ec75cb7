"""The drafting policy: pure functions, table tests."""

from __future__ import annotations

import doctest

import pytest
from specls.decoder import policy
from specls.decoder.policy import (
    AcceptanceByPosition,
    PassCosts,
    Plan,
    best_gamma,
    catchup_pays,
    expected_tokens,
    plan_pass,
)

FLAT = PassCosts(verify=(1.0, 1.0), step=0.0, catchup=0.0)  # a GPU-like verify: every length costs 1 pass
CPU = PassCosts(verify=(1.0, 1.1, 1.2, 1.3, 1.4), step=0.3, catchup=0.01)


def test_docstring_examples() -> None:
    result = doctest.testmod(policy, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 8 and result.failed == 0


@pytest.mark.parametrize(
    ("accept", "g", "want"),
    [
        ([1.0, 1.0, 1.0], 3, 4.0),  # all accepted: g + 1
        ([0.0, 1.0], 2, 1.0),  # first rejected: only the target's token. Not 2.0
        ([0.5], 3, 1.875),  # a short history extends with its last rate: 1 + .5 + .25 + .125
        ([], 2, 1.0),  # no history: nothing expected
        ([0.9, 0.5], 0, 1.0),  # plain pass
    ],
)
def test_expected_tokens(accept: list[float], g: int, want: float) -> None:
    assert expected_tokens(accept, g) == pytest.approx(want)


@pytest.mark.parametrize(
    ("accept", "costs", "step", "g_max", "want_g"),
    [
        ([1.0] * 8, FLAT, 0.0, 8, 8),  # free and always right: draft all
        ([1.0] * 8, CPU, 0.0, 4, 4),  # verify grows slower than tokens: still all
        ([0.05] * 8, CPU, 0.0, 8, 0),  # lookup that is never right: verifying costs, plain wins. Not 1
        ([0.3] * 8, CPU, 0.3, 8, 0),  # a weak draft model at a third of a pass: plain. Not 1
        ([0.8] * 8, CPU, 0.3, 8, 2),  # a good draft model: short drafts. Not 8
        ([0.9] * 8, CPU, 0.0, 0, 0),  # g_max 0
    ],
)
def test_best_gamma(accept: list[float], costs: PassCosts, step: float, g_max: int, want_g: int) -> None:
    g, s = best_gamma(accept, costs, step, g_max)
    assert g == want_g
    assert s >= 1.0  # never below plain


def test_verify_cost_extrapolates_the_last_slope() -> None:
    c = PassCosts(verify=(1.0, 1.2, 1.5))
    assert c.verify_cost(2) == pytest.approx(1.5)
    assert c.verify_cost(4) == pytest.approx(2.1)  # slope 0.3 beyond the table. Not 1.5


@pytest.mark.parametrize(
    ("speedup", "remaining", "behind", "want"),
    [
        (2.0, 64, 300, True),
        (2.0, 4, 300, False),  # a short completion: catch-up costs more than it saves
        (1.0, 1000, 0, False),  # no speedup: never worth starting
        (1.5, 10, 0, True),  # nothing to catch up on
        (2.0, 0, 0, False),
    ],
)
def test_catchup_pays(speedup: float, remaining: int, behind: int, want: bool) -> None:
    assert catchup_pays(speedup, remaining, behind, CPU.catchup) is want


def test_plan_prefers_free_lookup_and_extends_with_a_good_model() -> None:
    plan = plan_pass(3, [0.9] * 3, [0.8] * 8, CPU, g_max=8, remaining=64)
    assert (plan.lookup, plan.model) == (3, 0)  # a model step costs more than it adds here. Not (3, 1)
    assert plan.speedup > best_gamma([0.8] * 8, CPU, CPU.step, 8)[1]  # beats the model alone
    cheap = PassCosts(verify=(1.0, 1.0), step=0.05, catchup=0.0)
    plan = plan_pass(1, [1.0], [0.9] * 8, cheap, g_max=5, remaining=64)
    assert (plan.lookup, plan.model) == (1, 4)  # a cheap, good model extends the short match


def test_plan_uses_the_model_only_when_lookup_has_nothing_and_it_pays() -> None:
    assert plan_pass(0, [0.9], [0.8] * 4, CPU, g_max=4, remaining=64).model > 0
    assert plan_pass(0, [0.9], [0.3] * 4, CPU, g_max=4, remaining=64) == Plan(0, 0, 1.0)  # weak model
    assert plan_pass(0, [0.9], None, CPU, g_max=4, remaining=64) == Plan(0, 0, 1.0)  # no model


def test_plan_never_drafts_past_the_budget() -> None:
    assert plan_pass(8, [1.0] * 8, [1.0] * 8, FLAT, g_max=8, remaining=3).lookup == 2  # 2 + bonus fit
    assert plan_pass(8, [1.0] * 8, [1.0] * 8, FLAT, g_max=8, remaining=1) == Plan(0, 0, 1.0)


def test_acceptance_by_position_learns_from_the_prior() -> None:
    a = AcceptanceByPosition(prior=(0.5,), prior_weight=2.0)
    assert a.rates(2) == [0.5, 0.5]
    for _ in range(8):
        a.observe(drafted=3, n_accepted=1)  # position 0 always right, position 1 always wrong
    assert a.rate(0) == pytest.approx((8 + 1) / 10)
    assert a.rate(1) == pytest.approx((0 + 1) / 10)
    assert a.rate(2) == pytest.approx(0.5)  # never reached (after a rejection). Not 0.1


@pytest.mark.parametrize(
    ("share", "behind", "want_model"),
    [
        (1.0, 300, True),  # every remaining token is the model's to speed up: 64 x (1 - 1/s) > 300 x 0.01
        (0.1, 300, False),  # lookup copies 90% of them: 6 tokens cannot repay 3 passes of catch-up
        (0.1, 1, True),  # caught up (one token to re-feed is a usual step): the share does not matter
        (0.0, 1, True),  # Not plain: a caught-up model drafts whatever lookup did before
    ],
)
def test_the_catch_up_pays_off_only_on_the_tokens_lookup_does_not_copy(
    share: float, behind: int, want_model: bool
) -> None:
    plan = plan_pass(0, [0.9], [0.8] * 8, CPU, g_max=8, remaining=64, model_behind=behind, model_share=share)
    assert (plan.model > 0) is want_model
