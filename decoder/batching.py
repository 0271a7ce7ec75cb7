"""Batching target passes of concurrent decode loops.

Each request decodes in its own thread with the unchanged loop (``generate``); its target cache is
wrapped in a ``BatchedCache`` whose ``forward`` hands the pass to a shared ``PassBatcher`` and blocks.
The batcher runs the waiting passes as one batched pass when every active request is waiting (or the
oldest has waited ``max_wait_ms``, or ``max_batch`` are waiting): the thread that finds the batch ready
runs it, so there is no extra thread. A lone pass runs through the cache's own ``forward`` (a model's
fastest, batch-1 graph); a pass of more than ``max_tokens`` new tokens (a prefill) never waits.
``max_wait_ms`` is measured on an injected ``clock`` (``time.monotonic``; tests freeze it so a batch
forms only when every participant waits, whatever the scheduler does).

Greedy equivalence: a batched pass computes each sequence's logits as its own pass does, up to float
rounding (tests compare against single passes), so output stays plain greedy decoding of the target.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
from specls.decoder.api import BatchForward, KVCache

log = logging.getLogger(__name__)

Clock = Callable[[], float]  # seconds, monotonic


@dataclass(frozen=True)
class BatchSettings:
    max_batch: int = 8  # sequences in one pass; 1 = batching off
    max_tokens: int = 16  # a pass of more new tokens (a prefill) runs alone, at once
    max_wait_ms: float = 3.0  # the oldest waiting pass runs after this even if others are not ready


@dataclass
class _Pass:
    cache: KVCache
    ids: list[int]
    queued: float
    logits: np.ndarray | None = None
    error: BaseException | None = None
    done: bool = False


@dataclass
class BatchStats:
    passes: int = 0  # target passes run through the batcher (batched or lone)
    sequences: int = 0  # sequence-passes in them (sequences / passes = mean batch size)
    batched_passes: int = 0  # passes over >= 2 sequences
    solo_prefills: int = 0  # passes of > max_tokens tokens, run without waiting
    fallbacks: int = 0  # batched passes that failed and were rerun one by one
    sizes: dict[int, int] = field(default_factory=dict)  # batch size -> passes


class PassBatcher:
    """Collects concurrent target passes into batched passes (see the module docstring).

    A request takes part with ``with batcher.participant():`` around its decode and
    ``batcher.wrap(cache)`` as its target cache; requests outside a participant block are never waited
    for."""

    def __init__(
        self,
        forward_batch: BatchForward,
        settings: BatchSettings = BatchSettings(),
        clock: Clock = time.monotonic,
    ) -> None:
        if settings.max_batch < 1 or settings.max_tokens < 1 or settings.max_wait_ms < 0:
            raise ValueError(f"bad batch settings: {settings}")
        self.settings = settings
        self._clock = clock
        self._forward_batch = forward_batch
        self._cv = threading.Condition()
        self._pending: list[_Pass] = []
        self._active = 0  # participants (requests inside a decode)
        self._running = False  # one pass at a time through the batcher
        self.stats = BatchStats()

    @contextmanager
    def participant(self) -> Iterator[None]:
        with self._cv:
            self._active += 1
        try:
            yield
        finally:
            with self._cv:
                self._active -= 1
                self._cv.notify_all()  # waiters may now be everyone

    def note_solo_prefill(self) -> None:
        with self._cv:
            self.stats.solo_prefills += 1

    def wrap(self, cache: KVCache) -> BatchedCache:
        return BatchedCache(cache, self)

    @property
    def active(self) -> int:
        with self._cv:
            return self._active

    def snapshot(self) -> dict[str, object]:
        with self._cv:
            s = self.stats
            return {
                "max_batch": self.settings.max_batch,
                "passes": s.passes,
                "batched_passes": s.batched_passes,
                "mean_batch": s.sequences / s.passes if s.passes else 0.0,
                "solo_prefills": s.solo_prefills,
                "fallbacks": s.fallbacks,
                "sizes": dict(sorted(s.sizes.items())),
            }

    # -- the pass ---------------------------------------------------------------------------------

    def forward(self, cache: KVCache, ids: Sequence[int]) -> np.ndarray:
        """Run ``cache``'s pass over ``ids``, batched with others that are waiting; logits: [n, vocab]."""
        ids = [int(t) for t in ids]
        if len(ids) > self.settings.max_tokens or self.settings.max_batch <= 1:
            with self._cv:
                self.stats.solo_prefills += int(len(ids) > self.settings.max_tokens)
            return cache.forward(ids)
        job = _Pass(cache, ids, self._clock())
        with self._cv:
            self._pending.append(job)
            self._cv.notify_all()
            while not job.done:
                batch = self._take_if_ready()
                if batch is None:
                    self._cv.wait(self._wait_s())
                    continue
                self._running = True
                self._cv.release()
                try:
                    self._run(batch)
                finally:
                    self._cv.acquire()
                    self._running = False
                    self._cv.notify_all()
        if job.error is not None:
            raise job.error
        assert job.logits is not None
        return job.logits

    def _take_if_ready(self) -> list[_Pass] | None:
        # caller holds the lock
        if self._running or not self._pending:
            return None
        n = len(self._pending)
        waited = self._clock() - self._pending[0].queued
        if n < self._active and n < self.settings.max_batch and waited * 1e3 < self.settings.max_wait_ms:
            return None
        batch = self._pending[: self.settings.max_batch]  # oldest first
        del self._pending[: len(batch)]
        s = self.stats
        s.passes += 1
        s.sequences += len(batch)
        s.batched_passes += int(len(batch) > 1)
        s.sizes[len(batch)] = s.sizes.get(len(batch), 0) + 1
        return batch

    def _wait_s(self) -> float | None:
        if not self._pending or self._running:
            return None  # woken by notify
        left = self.settings.max_wait_ms / 1e3 - (self._clock() - self._pending[0].queued)
        return max(left, 1e-4)

    def _run(self, batch: list[_Pass]) -> None:
        """Outside the lock. Sets every pass's logits or error."""
        if len(batch) > 1:
            try:
                logits = self._forward_batch([p.cache for p in batch], [p.ids for p in batch])
                for p, lg in zip(batch, logits, strict=True):  # lg: [n_i, vocab]
                    p.logits = lg
                    p.done = True
                return
            except Exception:
                # forward_batch checks all inputs before running: rerun one by one so only a bad
                # pass (e.g. one past the context) fails, with its own error
                log.warning("batched pass over %d sequences failed; running them one by one", len(batch))
                with self._cv:
                    self.stats.fallbacks += 1
        for p in batch:
            if p.done:
                continue
            try:
                p.logits = p.cache.forward(p.ids)
            except BaseException as exc:  # delivered to the waiting request's own thread
                p.error = exc
            p.done = True


class BatchedCache(KVCache):
    """A ``KVCache`` whose passes go through a ``PassBatcher``; length and truncate are the inner
    cache's own."""

    def __init__(self, inner: KVCache, batcher: PassBatcher) -> None:
        self.inner = inner
        self._batcher = batcher

    @property
    def length(self) -> int:
        return self.inner.length

    def forward(self, ids: Sequence[int]) -> np.ndarray:
        """ids: [n] -> logits: [n, vocab]."""
        return self._batcher.forward(self.inner, ids)

    def truncate(self, n: int) -> None:
        self.inner.truncate(n)

    def append(self, ids: Sequence[int]) -> None:
        """A prefill (logits not needed): a long one runs alone through the inner cache's own
        ``append``; a short one joins a batch like any pass."""
        if len(ids) > self._batcher.settings.max_tokens:
            self._batcher.note_solo_prefill()
            self.inner.append(ids)
        else:
            self.forward(ids)

    def compact(self) -> None:
        self.inner.compact()

    def release(self) -> None:
        """The request is done: let the inner cache drop what batched passes shared (``compact``)."""
        self.inner.compact()
