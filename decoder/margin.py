"""The target's top-2 logit margin where a decode left plain greedy: the number that tells a float tie
(~1e-6) from a bug. Taken on plain greedy's own path (the prompt prefilled as ``generate`` does, then
one token per pass), since a graph whose outputs depend on the pass size gives another margin on
another path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from specls.decoder.api import CausalLM, DecodeSettings, KVCache
from specls.decoder.loop import generate

PLAIN = DecodeSettings()  # the prefill shape of a default decode
FLOAT_TIE = 1e-4  # a margin below this is a floating-point tie (they measure ~1e-6); above, a bug


class _LastLogits(KVCache):
    """A cache that keeps the last position's logits of its latest greedy pass."""

    def __init__(self, inner: KVCache) -> None:
        self.inner = inner
        self.last: np.ndarray | None = None

    @property
    def length(self) -> int:
        return self.inner.length

    def forward(self, ids: Sequence[int]) -> np.ndarray:
        return self.inner.forward(ids)

    def truncate(self, n: int) -> None:
        self.inner.truncate(n)

    def append(self, ids: Sequence[int]) -> None:
        self.inner.append(ids)

    def forward_greedy(self, ids: Sequence[int]) -> np.ndarray:
        logits = np.asarray(self.inner.forward(ids), dtype=np.float32)  # [n, vocab]
        self.last = logits[-1]
        return np.asarray(np.argmax(logits, axis=-1), dtype=np.int64)


def first_difference(ref: Sequence[int], got: Sequence[int]) -> int:
    """The first position where two decodes differ (the shorter one's length when it is a prefix of the
    other).

    >>> first_difference([5, 1, 7], [5, 2, 7]), first_difference([5, 1], [5, 1, 7])   # Not (2, 3)
    (1, 2)
    """
    j = 0
    while j < min(len(ref), len(got)) and ref[j] == got[j]:
        j += 1
    return j


def top2_margin(logits: np.ndarray) -> float:
    """logits: [vocab] -> top-1 minus top-2 (0.0 for a tie).

    >>> top2_margin(np.array([0.5, 2.0, 1.5]))
    0.5
    """
    top = np.sort(np.asarray(logits, dtype=np.float64))[-2:]
    return float(top[1] - top[0])


def describe_margin(margin: float) -> str:
    """How a benchmark reports a divergence's margin.

    >>> describe_margin(3e-6), describe_margin(0.046)
    ('top-2 margin 3.00e-06 (float tie)', 'top-2 margin 4.60e-02')
    """
    return f"top-2 margin {margin:.2e}" + (" (float tie)" if margin < FLOAT_TIE else "")


def plain_greedy_margin(
    lm: CausalLM,
    prompt: Sequence[int],
    tokens: Sequence[int],
    j: int,
    settings: DecodeSettings = PLAIN,
) -> float:
    """``lm``'s top-2 margin at generated position ``j`` after ``prompt`` + ``tokens[:j]``, computed as
    plain greedy decoding computes it: ``generate`` with no drafter (``settings``' prefill shape) for
    position 0, then ``tokens[:j]`` fed one per pass. Costs a prefill and j one-token passes."""
    if not 0 <= j <= len(tokens):
        raise ValueError(f"position {j} outside the {len(tokens)} generated tokens")
    cache = _LastLogits(lm.new_cache())
    generate(cache, prompt, None, replace(settings, max_new_tokens=1, draft_length=0), frozenset())
    assert cache.last is not None  # the one pass of a one-token decode
    logits = cache.last
    for t in tokens[:j]:  # the cache holds the prompt: each pass feeds the last committed token
        logits = np.asarray(cache.forward([int(t)]), dtype=np.float32)[-1]  # [vocab]
    return top2_margin(logits)
