"""Adaptive gamma and the "speculation pays" check."""

from __future__ import annotations

import pytest
from specls.decoder.api import DecodeSettings
from specls.decoder.gamma import GammaController, GammaPolicy, adapt_gamma


@pytest.mark.parametrize(
    ("gamma", "drafted", "accepted", "want"),
    [
        (4, 4, 4, 5),  # full acceptance of a full proposal grows. Not 4
        (8, 8, 8, 8),  # clamped at hi. Not 9
        (4, 2, 2, 4),  # a short proposal fully accepted says nothing about a longer one. Not 5
        (4, 4, 1, 3),  # fewer than half accepted shrinks. Not 4
        (1, 4, 0, 1),  # clamped at lo. Not 0
        (4, 4, 2, 4),  # exactly half is not fewer than half. Not 3
        (4, 0, 0, 4),  # nothing drafted, nothing learned. Not 3
    ],
)
def test_adapt_gamma_rule(gamma: int, drafted: int, accepted: int, want: int) -> None:
    assert adapt_gamma(gamma, drafted, accepted, 1, 8) == want


def test_gamma_grows_on_full_acceptance_and_shrinks_on_early_rejection() -> None:
    c = GammaController(DecodeSettings(gamma=3, gamma_min=2, gamma_max=5))
    assert c.gamma(100) == 3
    c.observe(3, 3, 0.0, 1.0)
    assert c.current == 4  # Not 3
    c.observe(4, 4, 0.0, 1.0)
    c.observe(5, 5, 0.0, 1.0)
    assert c.current == 5  # clamped at gamma_max. Not 6
    c.observe(5, 0, 0.0, 1.0)
    assert c.current == 4
    for _ in range(5):
        c.observe(4, 0, 0.0, 1.0)
    assert c.current == 2  # clamped at gamma_min. Not 0
    c.observe(2, 1, 0.0, 1.0)  # half accepted: unchanged
    assert c.current == 2


def test_short_full_proposal_does_not_grow_and_remaining_clips() -> None:
    c = GammaController(DecodeSettings(gamma=4, gamma_max=8))
    c.observe(2, 2, 0.0, 1.0)  # a lookup proposal shorter than gamma, all accepted
    assert c.current == 4  # Not 5
    assert c.gamma(3) == 2  # accepted + bonus must fit in 3 tokens
    assert c.gamma(1) == 0


def test_fixed_gamma_when_not_adaptive() -> None:
    c = GammaController(DecodeSettings(gamma=3, adaptive_gamma=False))
    for _ in range(4):
        c.observe(3, 3, 0.0, 1.0)
    assert c.current == 3


def test_pays_check_with_a_given_cost_ratio() -> None:
    policy = GammaPolicy(warmup_passes=3, backoff_min=4, backoff_max=16)
    c = GammaController(
        DecodeSettings(gamma=2, adaptive_gamma=False, draft_cost_ratio=0.5, min_speedup=1.0), policy
    )
    for _ in range(3):
        assert c.gamma(100) == 2
        c.observe(2, 0, 0.0, 1.0)  # nothing accepted, drafting costs 1.0 of a pass: speedup 0.5
    assert c.speedup() is not None and c.speedup() < 1.0  # type: ignore[operator]
    assert [c.gamma(100) for _ in range(4)] == [0, 0, 0, 0]  # off for backoff_min passes
    assert c.gamma(100) == 2  # probe
    c.observe(2, 0, 0.0, 1.0)
    assert [c.gamma(100) for _ in range(8)] == [0] * 8  # backoff doubled
    assert c.disabled_passes == 12


def test_pays_check_keeps_a_good_drafter_on() -> None:
    c = GammaController(DecodeSettings(gamma=3, adaptive_gamma=False, draft_cost_ratio=0.2, min_speedup=1.0))
    for _ in range(20):
        assert c.gamma(100) == 3
        c.observe(3, 3, 0.0, 1.0)  # tau 4 at cost 1.6: speedup 2.5
    assert c.disabled_passes == 0


def test_pays_check_with_measured_times() -> None:
    c = GammaController(DecodeSettings(gamma=3, adaptive_gamma=False, min_speedup=1.0))
    for _ in range(3):
        c.observe(3, 1, 0.02, 0.01)  # drafting twice the target pass time for 2 tokens/pass
    assert c.gamma(100) == 0  # 2 / 3 < 1: off
    cheap = GammaController(DecodeSettings(gamma=3, adaptive_gamma=False, min_speedup=1.0))
    for _ in range(3):
        cheap.observe(3, 1, 0.001, 0.01)  # near-free drafting (prompt lookup)
    assert cheap.gamma(100) == 3


def test_min_speedup_zero_never_turns_off() -> None:  # 0 is the default
    c = GammaController(DecodeSettings(gamma=3, draft_cost_ratio=5.0))
    for _ in range(10):
        c.observe(3, 0, 0.0, 1.0)
    assert c.gamma(100) > 0


def test_measured_cost_uses_the_plain_pass_time_as_baseline() -> None:
    c = GammaController(DecodeSettings(gamma=3, adaptive_gamma=False, min_speedup=1.0))
    c.observe_plain(0.010)
    for _ in range(3):
        # 2 tokens per pass, no drafting time, but verifying 4 positions costs 2.5x a plain pass
        c.observe(3, 1, 0.0, 0.025)
    assert c.speedup() is not None and abs(c.speedup() - 2 / 2.5) < 1e-9  # type: ignore[operator]
    assert c.gamma(100) == 0  # Not 3: without the baseline the verify cost would look free
