"""The in-process engine's counters: what its requests cost and how often each kind of reuse paid."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

from specls.decoder.api import DecodeResult, DrafterStats
from specls.stats import percentile

LATENCY_WINDOW = 2000  # latency samples kept for the percentiles


def merge_drafter_stats(into: dict[str, DrafterStats], new: dict[str, DrafterStats]) -> None:
    for name, s in new.items():
        t = into.setdefault(name, DrafterStats())
        t.drafted += s.drafted
        t.accepted += s.accepted
        t.proposals += s.proposals


@dataclass
class _Totals:
    requests: int = 0
    cancelled: int = 0
    empty: int = 0
    errors: int = 0
    tokens: int = 0
    target_passes: int = 0
    drafted: int = 0
    accepted: int = 0
    prompt_tokens: int = 0
    prefill_tokens: int = 0
    prefix_reused_tokens: int = 0
    prefix_reuse_hits: int = 0
    completion_reuse_hits: int = 0
    cache_hits: int = 0
    type_ahead_hits: int = 0
    draft_ms: float = 0.0
    per_drafter: dict[str, DrafterStats] = field(default_factory=dict)


class EngineCounters:
    """Thread-safe totals over the engine's requests; ``snapshot()`` is the counters part of
    ``OnnxEngine.stats()``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._t = _Totals()
        self._latency_ms: deque[float] = deque(maxlen=LATENCY_WINDOW)

    def error(self) -> None:
        with self._lock:
            self._t.errors += 1

    def request(self, cancelled: bool, empty: bool, ms: float) -> None:
        """A finished request (answered from the cache or decoded); cancelled ones have no latency."""
        with self._lock:
            t = self._t
            t.requests += 1
            t.cancelled += int(cancelled)
            t.empty += int(empty)
            if not cancelled:
                self._latency_ms.append(ms)

    def cache_hit(self, prompt_tokens: int) -> None:
        with self._lock:
            self._t.cache_hits += 1
            self._t.prompt_tokens += prompt_tokens

    def type_ahead(self) -> None:
        with self._lock:
            self._t.type_ahead_hits += 1

    def decoded(
        self, out: DecodeResult, prompt_tokens: int, reused: int, completion_reuse: bool, draft_ms: float
    ) -> None:
        """One decode: ``reused`` prompt tokens came from the document's KV cache."""
        with self._lock:
            t = self._t
            t.tokens += len(out.tokens)
            t.target_passes += out.target_passes
            t.drafted += out.drafted
            t.accepted += out.accepted
            t.prompt_tokens += prompt_tokens
            t.prefill_tokens += out.prefill_tokens
            t.prefix_reused_tokens += reused
            t.prefix_reuse_hits += int(reused > 0)
            t.completion_reuse_hits += int(completion_reuse)
            t.draft_ms += draft_ms
            merge_drafter_stats(t.per_drafter, out.per_drafter)

    def snapshot(self) -> dict[str, object]:
        with self._lock:
            c = self._t
            lat = list(self._latency_ms)
            computed = max(1, c.requests - c.cache_hits - c.type_ahead_hits)
            return {
                "requests": c.requests,
                "cancelled": c.cancelled,
                "empty": c.empty,
                "errors": c.errors,
                "tokens_generated": c.tokens,
                "target_passes": c.target_passes,
                "tokens_per_pass": c.tokens / c.target_passes if c.target_passes else 0.0,
                "drafted": c.drafted,
                "accepted": c.accepted,
                "acceptance": c.accepted / c.drafted if c.drafted else 0.0,
                "per_drafter": {
                    name: {"drafted": d.drafted, "accepted": d.accepted, "proposals": d.proposals}
                    for name, d in c.per_drafter.items()
                },
                "draft_ms": round(c.draft_ms, 3),
                "prompt_tokens": c.prompt_tokens,
                "prefill_tokens": c.prefill_tokens,
                "prefix_reused_tokens": c.prefix_reused_tokens,
                "prefix_reuse_hit_rate": c.prefix_reuse_hits / computed,
                "completion_reuse_hits": c.completion_reuse_hits,
                "completion_reuse_hit_rate": c.completion_reuse_hits / computed,
                "cache_hits": c.cache_hits,
                "cache_hit_rate": c.cache_hits / c.requests if c.requests else 0.0,
                "type_ahead_hits": c.type_ahead_hits,
                "type_ahead_rate": c.type_ahead_hits / c.requests if c.requests else 0.0,
                "latency_ms_p50": percentile(lat, 50),
                "latency_ms_p95": percentile(lat, 95),
            }
