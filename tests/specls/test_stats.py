"""The one percentile definition (nearest rank)."""

from __future__ import annotations

import math

import pytest

from specls.stats import percentile


@pytest.mark.parametrize(
    ("values", "q", "want"),
    [
        ([4, 1, 3, 2], 50, 3.0),  # position 1.5 rounds up. Not 2.5: no interpolation
        ([4, 1, 3, 2], 95, 4.0),
        ([4, 1, 3, 2], 0, 1.0),
        ([7], 95, 7.0),
        (range(1, 101), 50, 51.0),  # position 49.5 -> 50
        (range(1, 101), 95, 95.0),  # position 94.05 -> 94
        ([], 50, 0.0),
    ],
)
def test_percentile(values: list[float], q: float, want: float) -> None:
    assert percentile(values, q) == want


def test_percentile_of_nothing_can_say_so() -> None:
    assert math.isnan(percentile([], 95, float("nan")))
