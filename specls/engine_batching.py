"""The engine's one boundary to batching: joining concurrent requests' target passes into batched passes
(``specls.decoder.batching``). Off by default (``EngineSettings.batching.max_batch`` 1): on a small
CPU it served fewer completions than one request at a time (docs/team.md); a team server on a bigger
machine turns it on with ``--batch``.

With it on, completes of different documents run concurrently (one at a time per document), each
decode loop's target cache is wrapped so its passes go through a shared ``PassBatcher``, and the model
gives back what batched passes kept once no request runs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from specls.decoder.api import CausalLM, KVCache
from specls.decoder.batching import BatchSettings, PassBatcher

logger = logging.getLogger(__name__)


class KeyedLocks:
    """One lock per key, created on first use and dropped when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, tuple[threading.Lock, int]] = {}

    @contextmanager
    def hold(self, key: str) -> Iterator[None]:
        with self._guard:
            lock, users = self._locks.get(key, (threading.Lock(), 0))
            self._locks[key] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._guard:
                lock, users = self._locks[key]
                if users <= 1:
                    del self._locks[key]
                else:
                    self._locks[key] = (lock, users - 1)

    def __len__(self) -> int:
        with self._guard:
            return len(self._locks)


class EngineBatching:
    """Batching for one engine's target (see the module docstring); ``start`` says whether it can."""

    def __init__(self, target: CausalLM, batcher: PassBatcher) -> None:
        self._target = target
        self.batcher = batcher
        self._doc_locks = KeyedLocks()

    @classmethod
    def start(cls, target: CausalLM, settings: BatchSettings) -> EngineBatching | None:
        """Batching over ``target`` when asked for (``max_batch`` > 1) and the target can batch; None
        (logged, completions then run one at a time) otherwise."""
        if settings.max_batch <= 1:
            return None
        try:
            ok = bool(target.enable_batching())
        except Exception as exc:  # a broken batch graph: serve unbatched, say why
            logger.warning("batching off: the target's batch graph cannot be loaded (%s)", exc)
            return None
        if not ok:
            logger.warning(
                "batching off: the target has no dynamic-batch graph (export with --batch-graph or "
                "--ort-fusions none)"
            )
            return None
        logger.info("batching target passes of up to %d requests", settings.max_batch)
        return cls(target, PassBatcher(target.forward_batch, settings))

    @contextmanager
    def request(self, doc_id: str) -> Iterator[None]:
        """Around one complete: one at a time per document, taking part in the batches."""
        try:
            with self._doc_locks.hold(doc_id), self.batcher.participant():
                yield
        finally:
            if self.batcher.active == 0:  # the last concurrent request: give memory back
                self._target.release_memory()

    @contextmanager
    def cache(self, cache: KVCache) -> Iterator[KVCache]:
        """``cache`` as the decode loop's target: its passes join batches; afterwards the document
        keeps its own KV, not views into a batch."""
        wrapped = self.batcher.wrap(cache)
        try:
            yield wrapped
        finally:
            wrapped.release()

    def snapshot(self) -> dict[str, object]:
        return {"enabled": True, **self.batcher.snapshot()}
