"""Acceptance rules: greedy cases, logits processing, and the exactness of rejection sampling."""

from __future__ import annotations

import numpy as np
import pytest
from specls.decoder.acceptance import (
    greedy_accept,
    greedy_accept_ids,
    process_logits,
    rejection_accept,
    sample,
)


def _logits_for(best: list[int], vocab: int = 6) -> np.ndarray:
    """Logits rows whose argmax is best[i]."""
    out = np.zeros((len(best), vocab), dtype=np.float32)
    for i, b in enumerate(best):
        out[i, b] = 1.0
    return out


@pytest.mark.parametrize(
    ("draft", "best", "expected"),
    [
        ([1, 2, 3], [1, 2, 3, 4], (3, 4)),  # all accepted -> bonus argmax(logits[k]). Not (3, 3)
        ([1, 2, 3], [5, 2, 3, 4], (0, 5)),  # mismatch at 0 -> target's token there. Not (1, 2)
        ([1, 2, 3], [1, 0, 3, 4], (1, 0)),  # mismatch at 1; later matches do not count. Not (2, 4)
        ([1, 2, 3], [1, 2, 0, 4], (2, 0)),  # mismatch at the last draft. Not (3, 4)
        ([], [4], (0, 4)),  # k = 0: a plain step. Not (0, 0)
    ],
)
def test_greedy_accept(draft: list[int], best: list[int], expected: tuple[int, int]) -> None:
    assert greedy_accept(np.asarray(draft, dtype=np.int64), _logits_for(best)) == expected


def test_greedy_accept_needs_k_plus_one_rows() -> None:
    with pytest.raises(ValueError):
        greedy_accept(np.asarray([1, 2]), _logits_for([1, 2]))


def test_process_logits_temperature_zero_is_argmax_point_mass() -> None:
    probs = process_logits(np.array([[0.1, 3.0, -1.0], [2.0, 0.0, 1.0]]), 0.0)
    np.testing.assert_array_equal(probs, [[0, 1, 0], [1, 0, 0]])


def test_process_logits_top_k_and_top_p() -> None:
    logits = np.log(np.array([0.4, 0.3, 0.2, 0.1]))
    np.testing.assert_allclose(process_logits(logits, 1.0), [0.4, 0.3, 0.2, 0.1])
    np.testing.assert_allclose(process_logits(logits, 1.0, top_k=2), [4 / 7, 3 / 7, 0, 0])
    # top_p 0.6: 0.4 < 0.6 so the next token (which crosses 0.6) is kept too. Not [1, 0, 0, 0]
    np.testing.assert_allclose(process_logits(logits, 1.0, top_p=0.6), [4 / 7, 3 / 7, 0, 0])
    np.testing.assert_allclose(process_logits(logits, 1.0, top_p=0.4), [1, 0, 0, 0])
    hot = process_logits(logits, 0.5)  # temperature < 1 sharpens: p ~ p0^2
    np.testing.assert_allclose(hot, np.array([16, 9, 4, 1]) / 30)


def test_sample_never_draws_zero_mass() -> None:
    rng = np.random.default_rng(0)
    draws = {sample(np.array([0.0, 0.5, 0.0, 0.5]), rng) for _ in range(2000)}
    assert draws == {1, 3}


VOCAB = 8
DRAWS = 100_000


def _toy_pair(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    target = rng.standard_normal((2, VOCAB)) * 1.5  # [k+1, vocab] with k = 1
    draft = target[:1] + rng.standard_normal((1, VOCAB))  # [k, vocab], related but different
    return target, draft


def _first_token_stats(
    p: np.ndarray, q: np.ndarray | None, point: int | None, seed: int
) -> tuple[np.ndarray, float]:
    """Empirical distribution of the first emitted token and the acceptance rate of draft[0]."""
    rng = np.random.default_rng(seed)
    counts = np.zeros(VOCAB)
    accepted = 0
    for _ in range(DRAWS):
        x = point if point is not None else sample(q[0], rng)  # type: ignore[index]
        n, nxt = rejection_accept(np.array([x]), q, p, rng)
        counts[x if n == 1 else nxt] += 1
        accepted += n
    return counts / DRAWS, accepted / DRAWS


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    [(1.0, 0, 1.0), (0.7, 4, 1.0), (1.3, 0, 0.8)],
)
def test_rejection_sampling_is_exact_with_draft_distribution(
    temperature: float, top_k: int, top_p: float
) -> None:
    target, draft = _toy_pair(seed=1)
    p = process_logits(target, temperature, top_k, top_p)  # [2, vocab]
    q = process_logits(draft, temperature, top_k, top_p)  # [1, vocab]
    dist, rate = _first_token_stats(p, q, None, seed=2)
    assert 0.5 * np.abs(dist - p[0]).sum() < 0.01  # output ~ p, not ~ q
    assert abs(rate - np.minimum(p[0], q[0]).sum()) < 0.01
    assert 0.5 * np.abs(p[0] - q[0]).sum() > 0.05  # the pair really differs, so the test can fail


@pytest.mark.parametrize("point", [0, 3])
def test_rejection_sampling_is_exact_with_point_mass(point: int) -> None:
    target, _ = _toy_pair(seed=3)
    p = process_logits(target, 1.0, 0, 0.95)
    dist, rate = _first_token_stats(p, None, point, seed=4)
    assert 0.5 * np.abs(dist - p[0]).sum() < 0.01
    assert abs(rate - p[0, point]) < 0.01  # acceptance of a point-mass guess is p(x)


def test_rejection_second_position_and_bonus() -> None:
    """Two drafts from q: the joint of the first two emitted tokens matches p(t1) p(t2 | t1)."""
    vocab = 4
    rng = np.random.default_rng(5)
    # target depends on the previous token: p2[t1] is the distribution after t1
    p1 = process_logits(rng.standard_normal(vocab), 1.0)
    p2 = process_logits(rng.standard_normal((vocab, vocab)), 1.0)
    q1 = process_logits(rng.standard_normal(vocab), 1.0)
    q2 = process_logits(rng.standard_normal(vocab), 1.0)  # draft ignores t1
    exact = p1[:, None] * p2  # [vocab, vocab]
    counts = np.zeros((vocab, vocab))
    n_draws = 60_000
    for _ in range(n_draws):
        x1, x2 = sample(q1, rng), sample(q2, rng)
        p = np.stack([p1, p2[x1], p2[x2]])  # rows after prompt, after x1, after x2
        n, nxt = rejection_accept(np.array([x1, x2]), np.stack([q1, q2]), p, rng)
        if n == 0:
            t1, t2 = nxt, sample(p2[nxt], rng)  # the loop would draw t2 in the next pass
        elif n == 1:
            t1, t2 = x1, nxt
        else:
            t1, t2 = x1, x2
        counts[t1, t2] += 1
    assert 0.5 * np.abs(counts / n_draws - exact).sum() < 0.015


def _full_sort_reference(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """process_logits the slow obvious way: a full stable sort of every row."""
    x = np.atleast_2d(np.asarray(logits, dtype=np.float64)) / temperature
    vocab = x.shape[-1]
    if 0 < top_k < vocab:
        kth = np.sort(x, axis=-1)[:, vocab - top_k : vocab - top_k + 1]
        x = np.where(x >= kth, x, -np.inf)
    p = np.exp(x - x.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    order = np.argsort(-p, axis=-1, kind="stable")
    sorted_p = np.take_along_axis(p, order, axis=-1)
    keep_sorted = (np.cumsum(sorted_p, axis=-1) - sorted_p) < top_p
    keep = np.zeros_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=-1)
    p = np.where(keep, p, 0.0)
    return p / p.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("vocab", [8, 5000, 49152])
@pytest.mark.parametrize("scale", [0.1, 3.0, 20.0])  # flat (top_p needs most of the vocab) .. peaky
@pytest.mark.parametrize(("top_k", "top_p"), [(0, 0.5), (0, 0.95), (40, 0.9)])
def test_partial_top_p_equals_a_full_sort(vocab: int, scale: float, top_k: int, top_p: float) -> None:
    rng = np.random.default_rng(vocab)
    logits = rng.standard_normal((3, vocab)) * scale
    logits[0, : vocab // 2] = logits[0, 0]  # a row with many ties
    got = process_logits(logits, 0.8, top_k, top_p)
    np.testing.assert_array_equal(got, _full_sort_reference(logits, 0.8, top_k, top_p))


@pytest.mark.parametrize(
    ("draft", "ids", "want"),
    [
        ([5, 7, 9], [5, 7, 2, 4], (2, 2)),  # 9 rejected: the target's 2 replaces it. Not (3, 4)
        ([5, 7], [5, 7, 3], (2, 3)),  # all accepted, 3 is the bonus token
        ([], [8], (0, 8)),  # a plain step
        ([1], [2, 1], (0, 2)),  # a later match does not count. Not (1, 1)
    ],
)
def test_greedy_accept_ids_table(draft: list[int], ids: list[int], want: tuple[int, int]) -> None:
    got = greedy_accept_ids(np.asarray(draft, dtype=np.int64), np.asarray(ids, dtype=np.int64))
    assert got == want
    logits = np.zeros((len(ids), 10), dtype=np.float32)
    logits[np.arange(len(ids)), ids] = 1.0
    assert greedy_accept(np.asarray(draft, dtype=np.int64), logits) == want  # the same rule on logits


def test_greedy_accept_ids_needs_k_plus_one() -> None:
    with pytest.raises(ValueError):
        greedy_accept_ids(np.asarray([1, 2]), np.asarray([1, 2]))
