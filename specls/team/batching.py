"""Micro-benchmark: does one batched target pass over B sequences cost much less than B passes?

Batching concurrent requests' target passes only pays if one ``OnnxCausalLM.forward_batch`` over B
caches (the dynamic-batch graph, padding, assembling the batch from per-sequence KV and splitting it
back) costs well below B single-sequence ``forward`` calls on the model's main graph (the fused,
batch-1 one for the bundled pair) -- the real alternative. This times exactly those two code paths
on caches holding ``past_len`` positions of synthetic KV (timing does not depend on the values)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np


@dataclass(frozen=True)
class BatchBenchSettings:
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    new_tokens: tuple[int, ...] = (1, 6)  # 1 = plain decode step, 6 = a verify pass with gamma 5
    past_len: int = 256
    repeats: int = 8
    seed: int = 0


@dataclass(frozen=True)
class BatchTiming:
    batch: int
    new_tokens: int
    single_ms: float  # one forward over one sequence on the main graph (median)
    batched_ms: float  # one forward_batch over `batch` sequences, assembly included (median)

    @property
    def sequential_ms(self) -> float:
        return self.single_ms * self.batch

    @property
    def speedup(self) -> float:
        """Sequential time / batched time: > 1 means batching pays."""
        return self.sequential_ms / max(1e-9, self.batched_ms)


def _median_ms(fn: Callable[[], object], reset: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up (allocations, ORT's first-run work)
    reset()
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
        reset()
    return statistics.median(times)


def measure_batching(lm: Any, settings: BatchBenchSettings) -> list[BatchTiming]:
    """``lm``: a CPU ``specls.models.runtime.OnnxCausalLM``."""
    if not lm.enable_batching():
        raise ValueError(
            f"{lm.model_dir}: no dynamic-batch graph (export with --batch-graph, or --ort-fusions none)"
        )
    spec = lm.spec
    rng = np.random.default_rng(settings.seed)
    p = settings.past_len

    def cache_with_past() -> Any:
        c = lm.new_cache()
        shape = (1, spec.num_kv_heads, p, spec.head_dim)
        c._load_kv([rng.standard_normal(shape).astype(lm.kv_dtype) for _ in range(2 * spec.num_layers)])
        return c

    out: list[BatchTiming] = []
    for n in settings.new_tokens:
        ids = [int(t) for t in rng.integers(0, spec.vocab_size, size=n)]
        one = cache_with_past()
        single = _median_ms(partial(one.forward, ids), partial(one.truncate, p), settings.repeats)
        for b in settings.batch_sizes:
            caches: Sequence[Any] = [cache_with_past() for _ in range(b)]

            def reset(caches: Sequence[Any] = caches) -> None:
                for c in caches:
                    c.truncate(p)

            batched = _median_ms(partial(lm.forward_batch, caches, [ids] * b), reset, settings.repeats)
            out.append(BatchTiming(b, n, single, batched))
    return out


def format_table(rows: Sequence[BatchTiming]) -> str:
    lines = [f"{'batch':>5} {'new':>4} {'1 seq ms':>9} {'B x 1 seq':>10} {'batched':>8} {'speedup':>8}"]
    for r in rows:
        lines.append(
            f"{r.batch:>5} {r.new_tokens:>4} {r.single_ms:>9.2f} {r.sequential_ms:>10.2f} "
            f"{r.batched_ms:>8.2f} {r.speedup:>7.2f}x"
        )
    return "\n".join(lines)
