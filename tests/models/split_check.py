"""The runtime's exactness contract, asserted on every call: a position's logits are bitwise the same
however its tokens were split into passes (``RuntimeSettings.even_passes``), through every way a cache
is fed (forward, forward_last, append, forward_greedy, truncate and refeed), in every cache kind: host
arrays, in-place host buffers (``SharedKVCache``, when the graph allows it) and device OrtValues."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from specls.models.runtime import BoundKVCache, OnnxCausalLM, OrtKVCache, SharedKVCache

# Pass sizes over the same tokens; the reference is one prefill and then pairs.
SPLITS: tuple[tuple[int, ...], ...] = (
    (1,) * 12,  # plain greedy: one token per pass
    (3, 3, 3, 3),  # odd verify passes
    (5, 1, 6),
    (12,),
    (2, 1, 1, 7, 1),
)


def cache_kinds(lm: OnnxCausalLM) -> dict[str, Callable[[], OrtKVCache]]:
    """New caches of every kind ``lm`` can run: host arrays, device OrtValues, and in-place host
    buffers when its graph reads the past length from the mask (``ModelSpec.shared_kv_buffer``)."""
    kinds: dict[str, Callable[[], OrtKVCache]] = {
        "host": lambda: OrtKVCache(lm),
        "device": lambda: BoundKVCache(lm, "cpu"),
    }
    if lm.spec.shared_kv_buffer:
        kinds["in place"] = lambda: small_steps(SharedKVCache(lm))
    return kinds


def small_steps(cache: SharedKVCache) -> SharedKVCache:
    cache.CAPACITY_STEP = 4  # its buffers grow several times within a test
    return cache


def reference(lm: OnnxCausalLM, prompt: Sequence[int], new: Sequence[int]) -> np.ndarray:
    """logits of ``new`` after ``prompt``: [len(new), vocab], fed as the prompt and then pairs."""
    assert len(new) % 2 == 0
    cache = lm.new_cache()
    cache.append(prompt)
    return np.concatenate([cache.forward(new[i : i + 2]) for i in range(0, len(new), 2)])


def assert_split_invariant(lm: OnnxCausalLM, prompt: Sequence[int], new: Sequence[int]) -> None:
    want = reference(lm, prompt, new)  # [n, vocab]
    assert len(new) == sum(SPLITS[0])
    for kind, new_cache in cache_kinds(lm).items():
        for split in SPLITS:
            cache = new_cache()
            for chunk in (prompt[:7], prompt[7:]):  # an odd prefill, then the rest
                cache.append(chunk)
            at = 0
            for n in split:
                ids = list(new[at : at + n])
                got = cache.forward(ids)  # [n, vocab]
                assert np.array_equal(got, want[at : at + n]), (
                    kind,
                    split,
                    at,
                    _gap(got, want[at : at + n]),
                )
                # a rejected draft: roll back and feed the same tokens again, last row only
                cache.truncate(len(prompt) + at)
                assert np.array_equal(cache.forward_last(ids), want[at + n - 1]), (kind, split, at)
                assert cache.length == len(prompt) + at + n
                at += n
            # the greedy ids of a verify pass on a rolled-back cache: the argmax of the same rows
            cache.truncate(len(prompt) + 3)
            best = cache.forward_greedy(list(new[3:8]))
            assert best.tolist() == np.argmax(want[3:8], axis=-1).tolist(), (kind, split)


def _gap(a: np.ndarray, b: np.ndarray) -> str:
    return f"max |d| {np.abs(a - b).max():.2e}" if a.shape == b.shape else f"shapes {a.shape} {b.shape}"
