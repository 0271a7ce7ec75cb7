"""The top-2 margin at a divergence, on plain greedy's own path."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from specls.decoder.api import DecodeSettings
from specls.decoder.margin import describe_margin, first_difference, plain_greedy_margin, top2_margin

from tests.decoder.fakes import FakeCache, FakeLM, FakeLMConfig

LM = FakeLM(FakeLMConfig(vocab=32, window=2, seed=5))
PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]
REF = LM.greedy(PROMPT, 10)


class PassSized(FakeCache):
    """A pass-size-dependent graph: logit i of a pass over n tokens is off by 0.01 * (n - 1) * i."""

    def forward(self, ids: Sequence[int]) -> np.ndarray:
        logits = super().forward(ids)
        logits += 0.01 * (len(ids) - 1) * np.arange(logits.shape[-1], dtype=np.float32)
        return logits


class PassSizedLM(FakeLM):
    def new_cache(self) -> FakeCache:
        return PassSized(self)


@pytest.mark.parametrize(
    "ref, got, j",
    [
        ([5, 1, 7], [5, 2, 7], 1),
        ([5, 1, 7], [5, 1, 7], 3),  # identical: past the end
        ([5, 1], [5, 1, 7], 2),  # Not 3: a prefix differs where it ends
        ([], [4], 0),
        ([4, 4], [3], 0),
    ],
)
def test_first_difference(ref: list[int], got: list[int], j: int) -> None:
    assert first_difference(ref, got) == j == first_difference(got, ref)


@pytest.mark.parametrize(
    "logits, margin",
    [
        ([0.5, 2.0, 1.5], 0.5),
        ([1.0, 1.0], 0.0),  # a tie
        ([-3.0, 7.0, -1.0, 6.75], 0.25),  # Not 10: top-1 minus top-2, not minus the lowest
    ],
)
def test_top2_margin(logits: list[float], margin: float) -> None:
    assert top2_margin(np.array(logits)) == pytest.approx(margin)


@pytest.mark.parametrize("j", [0, 1, 4, len(REF)])
def test_margin_is_the_logits_at_that_position(j: int) -> None:
    want = top2_margin(LM.logits_at([*PROMPT, *REF[:j]], len(PROMPT) + j - 1))
    assert plain_greedy_margin(LM, PROMPT, REF, j) == pytest.approx(want, abs=1e-4)


def test_margin_follows_plain_greedys_passes() -> None:
    """On a pass-size-dependent graph the margin is the one-token pass's, as plain greedy saw it."""
    lm = PassSizedLM(LM.config, LM.tables)
    j = 3
    row = LM.logits_at([*PROMPT, *REF[:j]], len(PROMPT) + j - 1).astype(np.float32)
    assert plain_greedy_margin(lm, PROMPT, REF, j) == pytest.approx(top2_margin(row), abs=1e-5)
    one_pass = np.asarray(lm.new_cache().forward([*PROMPT, *REF[:j]]))[-1]
    assert top2_margin(one_pass) != pytest.approx(top2_margin(row), abs=1e-5)  # Not the one-pass margin


def test_margin_after_a_prompt_prefilled_in_runs() -> None:
    settings = DecodeSettings(prefill_chunk=3, fold_prefill=0)
    want = top2_margin(LM.logits_at([*PROMPT, *REF[:2]], len(PROMPT) + 1))
    assert plain_greedy_margin(LM, PROMPT, REF, 2, settings) == pytest.approx(want, abs=1e-4)


def test_margin_position_out_of_range() -> None:
    with pytest.raises(ValueError, match="outside"):
        plain_greedy_margin(LM, PROMPT, REF, len(REF) + 1)


@pytest.mark.parametrize(
    "margin, text",
    [
        (3e-6, "top-2 margin 3.00e-06 (float tie)"),
        (0.046, "top-2 margin 4.60e-02"),  # Not a tie: the level-4 pass-size near-tie
        (1e-4, "top-2 margin 1.00e-04"),  # the bound itself is no tie
    ],
)
def test_describe_margin(margin: float, text: str) -> None:
    assert describe_margin(margin) == text
