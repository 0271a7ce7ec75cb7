"""Latency percentiles, one definition for the engine, the language server and the benchmarks."""

from __future__ import annotations

from collections.abc import Iterable


def percentile(values: Iterable[float], q: float, empty: float = 0.0) -> float:
    """The ``q``-th percentile (q in 0..100) by nearest rank: the sorted value at position
    q/100 * (n - 1), rounded half up; ``empty`` when there are no values.

    Example: ``percentile([4, 1, 3, 2], 50) == 3.0`` (position 1.5 rounds to 2),
    ``percentile([4, 1, 3, 2], 95) == 4.0``, ``percentile([], 50) == 0.0``."""
    ordered = sorted(values)
    if not ordered:
        return empty
    return float(ordered[min(len(ordered) - 1, int(q / 100 * (len(ordered) - 1) + 0.5))])
