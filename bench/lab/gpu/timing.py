"""Pass timing: T(N) at a past length L (median of interleaved rounds), with its cache truncate, and the
``phase`` timer for the run's phases."""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from specls.decoder.api import CausalLM

from bench.lab.gpu.shapes import BenchError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PassTimes:
    """Medians at one past length: ms per forward of N new tokens, ms per truncate back to L."""

    forward_ms: dict[int, float]
    truncate_ms: float


def time_passes(
    lm: CausalLM, past_length: int, ns: Sequence[int], warmup: int, repeats: int, seed: int
) -> PassTimes:
    """Median ms of one forward over N new tokens on a cache holding ``past_length`` positions, for each
    N, and of the truncate back to ``past_length`` that follows every call. Rounds interleave the sizes
    (N=1, 2, ..., then again) so slow drifts of the machine hit every N alike; ``warmup`` rounds first."""
    rng = np.random.default_rng(seed)
    vocab = lm.vocab_size
    ids = rng.integers(0, vocab, size=past_length + max(ns)).tolist()
    cache = lm.new_cache()
    for start in range(0, past_length, 512):  # chunked prefill keeps the attention matrices small
        cache.forward(ids[start : min(start + 512, past_length)])
    if cache.length != past_length:
        raise BenchError(f"cache holds {cache.length} positions after a {past_length}-token prefill")
    samples: dict[int, list[float]] = {n: [] for n in ns}
    trunc: list[float] = []
    for i in range(warmup + repeats):
        for n in ns:
            t0 = time.perf_counter()
            logits = cache.forward(ids[past_length : past_length + n])  # logits: [n, vocab]
            t1 = time.perf_counter()
            cache.truncate(past_length)
            t2 = time.perf_counter()
            if logits.shape[0] != n:
                raise BenchError(f"forward of {n} tokens returned {logits.shape[0]} rows")
            if i >= warmup:
                samples[n].append((t1 - t0) * 1e3)
                trunc.append((t2 - t1) * 1e3)
    return PassTimes({n: statistics.median(v) for n, v in samples.items()}, statistics.median(trunc))


class BatchKVCache(Protocol):
    """B equal-length sequences in one cache (batch dim B)."""

    @property
    def length(self) -> int: ...

    def prefill(self, ids: Sequence[Sequence[int]], chunk: int = 512) -> None: ...

    def forward(self, ids: Sequence[Sequence[int]]) -> np.ndarray:
        """ids: [B][n] -> logits: [B, n, vocab]."""
        ...

    def truncate(self, n: int) -> None: ...


class BatchCausalLM(Protocol):
    """A model that runs one forward over B sequences (the torch backend)."""

    @property
    def vocab_size(self) -> int: ...

    def new_batch_cache(self, batch: int) -> BatchKVCache: ...


def time_batched_passes(
    lm: BatchCausalLM,
    past_length: int,
    batch_sizes: Sequence[int],
    ns: Sequence[int],
    warmup: int,
    repeats: int,
    seed: int,
) -> dict[int, dict[int, float]]:
    """B -> N -> median ms of ONE forward over N new tokens of each of B sequences (batch dim B), every
    sequence with ``past_length`` cached positions; the cache is truncated back after each call (not
    timed). One cache per B, prefilled first; rounds interleave every (B, N) as ``time_passes`` does."""
    rng = np.random.default_rng(seed)
    vocab = lm.vocab_size
    width = past_length + max(ns)
    caches: dict[int, tuple[BatchKVCache, list[list[int]]]] = {}
    for b in batch_sizes:
        ids = rng.integers(0, vocab, size=(b, width)).tolist()  # [B, L + max N]
        cache = lm.new_batch_cache(b)
        cache.prefill([row[:past_length] for row in ids])
        if cache.length != past_length:
            raise BenchError(
                f"batch cache holds {cache.length} positions after a {past_length}-token prefill"
            )
        caches[b] = (cache, ids)
    samples: dict[int, dict[int, list[float]]] = {b: {n: [] for n in ns} for b in batch_sizes}
    for i in range(warmup + repeats):
        for b, (cache, ids) in caches.items():
            for n in ns:
                new = [row[past_length : past_length + n] for row in ids]  # [B, n]
                t0 = time.perf_counter()
                logits = cache.forward(new)  # logits: [B, n, vocab]
                t1 = time.perf_counter()
                cache.truncate(past_length)
                if logits.shape[:2] != (b, n):
                    raise BenchError(f"batched forward of {b}x{n} tokens returned {logits.shape[:2]}")
                if i >= warmup:
                    samples[b][n].append((t1 - t0) * 1e3)
    return {b: {n: statistics.median(v) for n, v in row.items()} for b, row in samples.items()}


@contextmanager
def phase(phases: dict[str, float], name: str) -> Iterator[None]:
    t0 = time.perf_counter()
    log.info("phase %s ...", name)
    try:
        yield
    finally:
        phases[name] = round(phases.get(name, 0.0) + time.perf_counter() - t0, 2)
        log.info("phase %s: %.1f s", name, phases[name])
