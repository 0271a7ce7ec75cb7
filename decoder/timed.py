"""A drafter wrapper that measures drafting time (the engine's ``draft_ms``)."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
from specls.decoder.api import DecodeSettings, Drafter


class TimedDrafter(Drafter):
    """Adds the time spent in ``propose``/``observe`` to ``ms``; forwards everything else."""

    def __init__(self, inner: Drafter) -> None:
        self._inner = inner
        self.name = inner.name
        self.ms = 0.0

    def begin(self, settings: DecodeSettings) -> None:
        self._inner.begin(settings)

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        t0 = time.perf_counter()
        try:
            return self._inner.propose(context, k)
        finally:
            self.ms += (time.perf_counter() - t0) * 1e3

    def observe(self, n_accepted: int, n_verified: int) -> None:
        t0 = time.perf_counter()
        self._inner.observe(n_accepted, n_verified)
        self.ms += (time.perf_counter() - t0) * 1e3

    def proposal_probs(self) -> np.ndarray | None:
        return self._inner.proposal_probs()

    def proposal_sources(self) -> Sequence[str]:
        return self._inner.proposal_sources()
