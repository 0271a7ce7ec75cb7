"""``auto_threads``: what ``threads = 0`` means (the CPUs this process may use less one, 1 to 4)."""

from __future__ import annotations

import os

import pytest
from specls.models.runtime import auto_threads


@pytest.mark.parametrize(
    ("cpus", "want"),
    [
        (1, 1),
        (2, 1),  # Not 2: the editor and its language servers keep a core (bench/README.md)
        (3, 2),
        (4, 3),
        (5, 4),
        (64, 4),  # Not 63: a pass is bound by memory bandwidth
        (0, 1),  # Not 0 (ONNX Runtime's own default): an affinity mask of none still runs
    ],
)
def test_auto_threads_leaves_one_cpu_free(cpus: int, want: int) -> None:
    assert auto_threads(cpus) == want


def test_auto_threads_counts_the_cpus_this_process_may_use(monkeypatch: pytest.MonkeyPatch) -> None:
    """A container or ``taskset`` narrows the affinity mask below ``os.cpu_count()``: the mask counts."""
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    assert auto_threads() == 2  # Not 4 (from 64)
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)  # macOS, Windows
    assert auto_threads() == 4
