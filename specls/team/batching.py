"""Micro-benchmark: does one ONNX Runtime pass over B sequences cost much less than B passes?

Batching concurrent requests' target passes only pays if (time of one batched pass + the cost of
assembling the batch from per-sequence KV caches and splitting the presents back) is well below B
single-sequence passes. This measures exactly those three numbers on the exported target model with
synthetic KV of a given length (timing does not depend on the values), so the decision to batch rests
on a measurement on this machine and not on folklore."""

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
    single_ms: float  # one pass over one sequence (median)
    batched_ms: float  # one pass over `batch` sequences (median)
    assemble_ms: float  # concatenating per-sequence pasts + splitting presents back (median)

    @property
    def sequential_ms(self) -> float:
        return self.single_ms * self.batch

    @property
    def speedup(self) -> float:
        """Sequential time / batched time (including assembly): > 1 means batching pays."""
        return self.sequential_ms / max(1e-9, self.batched_ms + self.assemble_ms)


def _median_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up (allocations, ORT's first-run work)
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def measure_batching(lm: Any, settings: BatchBenchSettings) -> list[BatchTiming]:
    """``lm``: a ``specls.models.runtime.OnnxCausalLM`` (uses its session and spec)."""
    spec = lm.spec
    rng = np.random.default_rng(settings.seed)
    sess = lm.session
    batch_dim = sess.get_inputs()[0].shape[0]
    if isinstance(batch_dim, int) and max(settings.batch_sizes) > batch_dim:
        raise ValueError(
            f"the exported graph has a static batch dimension of {batch_dim}: it cannot run a pass over "
            "several sequences (re-export with a dynamic batch axis to measure batching)"
        )
    kv, hd, layers = spec.num_kv_heads, spec.head_dim, spec.num_layers
    p = settings.past_len
    out: list[BatchTiming] = []

    def feed(b: int, n: int, pasts: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        f: dict[str, np.ndarray] = {
            "input_ids": rng.integers(0, spec.vocab_size, size=(b, n), dtype=np.int64),  # [b, n]
            "attention_mask": np.ones((b, p + n), dtype=np.int64),  # [b, p+n]
        }
        if spec.uses_position_ids:
            f["position_ids"] = np.tile(np.arange(p, p + n, dtype=np.int64), (b, 1))  # [b, n]
        for name, arr in zip(lm.past_names, pasts, strict=True):
            f[name] = arr
        return f

    for n in settings.new_tokens:
        # per-sequence pasts: [1, kv, p, hd] x 2*layers, as the runtime keeps them
        one = [rng.standard_normal((1, kv, p, hd)).astype(lm.kv_dtype) for _ in range(2 * layers)]
        single_feed = feed(1, n, one)
        single = _median_ms(partial(sess.run, lm.output_names, single_feed), settings.repeats)
        for b in settings.batch_sizes:
            seqs = [
                [rng.standard_normal((1, kv, p, hd)).astype(lm.kv_dtype) for _ in range(2 * layers)]
                for _ in range(b)
            ]
            stacked = [np.concatenate([s[i] for s in seqs], axis=0) for i in range(2 * layers)]  # [b,kv,p,hd]
            batch_feed = feed(b, n, stacked)
            outs = sess.run(lm.output_names, batch_feed)
            presents = outs[1:]  # each [b, kv, p+n, hd]

            def assemble(seqs: list[list[np.ndarray]] = seqs, presents: list[Any] = presents) -> None:
                _ = [np.concatenate([s[i] for s in seqs], axis=0) for i in range(2 * layers)]
                _ = [[np.ascontiguousarray(pr[j : j + 1]) for pr in presents] for j in range(len(seqs))]

            batched = _median_ms(partial(sess.run, lm.output_names, batch_feed), settings.repeats)
            assembly = _median_ms(assemble, settings.repeats) if b > 1 else 0.0
            out.append(BatchTiming(b, n, single, batched, assembly))
    return out


def format_table(rows: Sequence[BatchTiming]) -> str:
    lines = [
        f"{'batch':>5} {'new':>4} {'1 seq ms':>9} {'B seq ms':>9} {'batched':>8} {'assemble':>9} {'speedup':>8}"
    ]
    for r in rows:
        lines.append(
            f"{r.batch:>5} {r.new_tokens:>4} {r.single_ms:>9.2f} {r.sequential_ms:>9.2f} "
            f"{r.batched_ms:>8.2f} {r.assemble_ms:>9.2f} {r.speedup:>7.2f}x"
        )
    return "\n".join(lines)
