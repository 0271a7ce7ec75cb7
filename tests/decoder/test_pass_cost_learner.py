"""PassCostLearner: pass costs learned from the decode's own passes, starting from the calibration."""

from __future__ import annotations

import math

import numpy as np
import pytest
from specls.decoder.pass_cost_learner import PassCostLearner, monotone, pass_rows
from specls.decoder.policy import PassCosts

PRIOR = PassCosts(verify=(1.0, 1.2, 1.4, 1.6, 1.8), step=0.3, catchup=0.02)


def checked(learner: PassCostLearner) -> PassCosts:
    """``learner.costs()`` with what every price must satisfy asserted on it."""
    costs = learner.costs()
    assert len(costs.verify) == len(learner.prior.verify)
    assert costs.verify[0] == 1.0  # a one-token pass is the unit
    assert all(
        b >= a for a, b in zip(costs.verify, costs.verify[1:], strict=False)
    )  # more rows never cheaper
    assert all(math.isfinite(v) and v > 0 for v in costs.verify)
    assert (
        math.isfinite(costs.step) and costs.step >= 0 and math.isfinite(costs.catchup) and costs.catchup >= 0
    )
    return costs


def test_the_docstring_example() -> None:
    learner = PassCostLearner(PassCosts(verify=(1.0, 1.2)), granularity=1, prior_weight=1.0, decay=1.0)
    learner.observe([(1, 10.0), (2, 15.0)] * 3)
    assert checked(learner).verify[1] == pytest.approx(1.425)  # Not 1.5: the calibration weighs 1 pass


@pytest.mark.parametrize(
    ("tokens", "granularity", "rows"),
    [
        (1, 1, 1),
        (1, 2, 2),  # a one-token pass on a padding target computes two rows
        (3, 2, 4),  # Not 3
        (4, 2, 4),
        (5, 1, 5),
        (0, 2, 2),  # a pass always computes at least one row's worth
    ],
)
def test_pass_rows(tokens: int, granularity: int, rows: int) -> None:
    assert pass_rows(tokens, granularity) == rows


def test_without_a_one_token_pass_the_calibration_stands() -> None:
    learner = PassCostLearner(PRIOR, granularity=1)
    learner.observe([(4, 50.0), (6, 70.0)] * 20)  # nothing to relate them to
    assert checked(learner) == PRIOR


def test_a_size_never_seen_keeps_its_calibrated_ratio() -> None:
    learner = PassCostLearner(PRIOR, granularity=1, decay=1.0)
    learner.observe([(1, 10.0), (3, 30.0)] * 50)  # 3 tokens = 2 drafted: priced 3.0 one-token passes
    costs = checked(learner)
    assert costs.verify[1] == PRIOR.verify[1]  # 2 tokens: never seen
    # 4 and 5 tokens, never seen, would cost less than 3: the three are pooled, the measured one
    # weighing most (Not 1.6 and 1.8, nor the 3-token estimate 2.78 for all)
    seen = (50 * 3.0 + 8 * 1.4) / 58
    assert costs.verify[2] == costs.verify[3] == costs.verify[4]
    assert costs.verify[2] == pytest.approx((seen * 58 + 1.6 * 8 + 1.8 * 8) / 74)


def test_a_padding_target_prices_by_rows() -> None:
    prior = PassCosts(verify=(1.0, 1.0, 1.3, 1.3, 1.6))  # calibrate's table for granularity 2
    learner = PassCostLearner(prior, granularity=2, decay=1.0)
    learner.observe([(1, 10.0), (2, 10.0), (3, 14.0), (4, 14.0)] * 40)
    costs = checked(learner)
    assert costs.verify[1] == pytest.approx(1.0)  # 2 tokens: the one-token pass's two rows
    assert costs.verify[2] == costs.verify[3] == pytest.approx((80 * 1.4 + 8 * 1.3) / 88)  # both 4 rows


def test_the_learner_follows_a_host_that_changes_speed() -> None:
    learner = PassCostLearner(PRIOR, granularity=1, prior_weight=1.0)  # the default decay
    for _ in range(200):
        learner.observe([(1, 10.0), (4, 12.0)])
    # 4 tokens well measured at 1.2; 3 tokens unseen (prior 1.4) is pooled down with it, not 4 up
    assert checked(learner).verify[3] == pytest.approx(1.2, abs=0.03)
    for _ in range(200):  # the 4-token pass gets slower, the one-token pass faster
        learner.observe([(1, 8.0), (4, 14.0)])
    assert checked(learner).verify[3] == pytest.approx(14.0 / 8.0, abs=0.05)  # Not the mean of both modes


@pytest.mark.parametrize(
    ("values", "weights", "expected"),
    [
        ([1.0, 1.2, 1.4], [1, 1, 1], [1.0, 1.2, 1.4]),  # already monotone: unchanged
        ([1.2, 1.1, 1.5], [1, 3, 1], [1.125, 1.125, 1.5]),  # Not [1.2, 1.2, 1.5]
        ([2.0, 1.0, 1.0], [1, 1, 2], [1.25, 1.25, 1.25]),  # a violation two back pools three
        ([], [], []),
    ],
)
def test_monotone(values: list[float], weights: list[float], expected: list[float]) -> None:
    assert monotone(values, weights) == pytest.approx(expected)


def test_draft_steps_and_catch_up_relative_to_a_one_token_target_pass() -> None:
    learner = PassCostLearner(PRIOR, granularity=1, prior_weight=0.0, decay=1.0)
    learner.observe([(1, 20.0)], [(1, 5.0), (1, 7.0), (32, 64.0)])
    costs = checked(learner)
    assert costs.step == pytest.approx(6.0 / 20.0)
    assert costs.catchup == pytest.approx(2.0 / 20.0)  # per token of the feed


@pytest.mark.parametrize("bad", [(0, 10.0), (-3, 10.0), (1, 0.0), (1, -5.0), (1, float("nan"))])
def test_a_pass_that_measured_nothing_is_ignored(bad: tuple[int, float]) -> None:
    learner = PassCostLearner(PRIOR, granularity=1)
    learner.observe([bad], [bad])
    assert learner.passes == 0 and learner.base_ms() is None and checked(learner) == PRIOR


def test_prices_stay_sane_on_any_pass_stream() -> None:
    rng = np.random.default_rng(7)
    for granularity in (1, 2):
        learner = PassCostLearner(PRIOR, granularity=granularity)
        for _ in range(300):
            n = int(rng.integers(1, 16))
            learner.observe(
                [(n, float(rng.exponential(30.0)))], [(int(rng.integers(1, 40)), float(rng.exponential(8.0)))]
            )
            checked(learner)
