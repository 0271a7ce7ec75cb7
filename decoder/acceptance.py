"""Acceptance rules for speculative decoding: pure functions on arrays.

- ``greedy_accept``: temperature 0. Output equals plain greedy decoding of the target, token for token.
- ``rejection_accept``: sampling (Leviathan et al. / Chen et al.). Output is distributed exactly as
  sampling from the processed target distribution p, whatever the drafter proposes.
- ``process_logits``: temperature / top-k / top-p, the same processing for target p and drafter q.
"""

from __future__ import annotations

import numpy as np


def greedy_accept(draft: np.ndarray, target_logits: np.ndarray) -> tuple[int, int]:
    """draft: [k] token ids; target_logits: [k+1, vocab] (row i scores the token after draft[:i]).

    Returns (n_accepted, next_token): draft[:n_accepted] all equal the target's argmax; next_token is the
    argmax at the first mismatch, or the bonus argmax(target_logits[k]) when all k match.
    """
    k = int(len(draft))
    if target_logits.shape[0] < k + 1:
        raise ValueError(f"target_logits has {target_logits.shape[0]} rows, need {k + 1} for {k} drafts")
    return greedy_accept_ids(draft, np.argmax(target_logits[: k + 1], axis=-1))


def greedy_accept_ids(draft: np.ndarray, target_ids: np.ndarray) -> tuple[int, int]:
    """``greedy_accept`` on the target's argmax ids ([k+1], e.g. taken on the device), not its logits.

    Example: draft [5, 7, 9], target ids [5, 7, 2, 4] -> (2, 2): 5 and 7 accepted, 2 replaces 9;
    draft [5, 7], target ids [5, 7, 3] -> (2, 3): all accepted, 3 is the bonus token.
    """
    k = int(len(draft))
    if target_ids.shape[0] < k + 1:
        raise ValueError(f"target ids has {target_ids.shape[0]} entries, need {k + 1} for {k} drafts")
    best = np.asarray(target_ids[: k + 1], dtype=np.int64)  # best: [k+1]
    mismatch = np.flatnonzero(best[:k] != np.asarray(draft, dtype=np.int64))  # [m]
    n = int(mismatch[0]) if mismatch.size else k
    return n, int(best[n])


def process_logits(logits: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0) -> np.ndarray:
    """logits: [..., vocab] -> probs: [..., vocab] float64 (rows sum to 1).

    temperature <= 0 gives the argmax as a point mass. top_k keeps the k highest logits (ties at the
    k-th value are all kept); top_p keeps the smallest set of most likely tokens whose mass reaches
    top_p (the token that crosses it included). Apply the SAME processing to p and q.
    """
    x = np.asarray(logits, dtype=np.float64)
    squeeze = x.ndim == 1
    x = np.atleast_2d(x)  # x: [rows, vocab]
    vocab = x.shape[-1]
    if temperature <= 0.0:
        probs = np.zeros_like(x)
        np.put_along_axis(probs, np.argmax(x, axis=-1)[:, None], 1.0, axis=-1)
        return probs[0] if squeeze else probs
    x = x / temperature
    if 0 < top_k < vocab:
        kth = np.partition(x, vocab - top_k, axis=-1)[:, vocab - top_k : vocab - top_k + 1]  # kth: [rows, 1]
        x = np.where(x >= kth, x, -np.inf)
    x = x - np.max(x, axis=-1, keepdims=True)
    probs = np.exp(x)
    probs /= np.sum(probs, axis=-1, keepdims=True)
    if top_p < 1.0:
        keep = np.stack([_top_p_keep(row, top_p) for row in probs])  # keep: [rows, vocab]
        probs = np.where(keep, probs, 0.0)
        probs /= np.sum(probs, axis=-1, keepdims=True)
    return probs[0] if squeeze else probs


_TOP_P_CANDIDATES = 256


def _top_p_keep(probs: np.ndarray, top_p: float) -> np.ndarray:
    """probs: [vocab] -> keep: [vocab] bool, the smallest most-likely prefix whose mass reaches top_p
    (stable order: ties go to the lower id). Sorts only the few hundred most likely tokens (all that
    tie with the last of them included), eight times more while they hold less than top_p of the mass
    (a flat distribution), every non-zero one at worst. The prefix sums are the same additions as a
    full sort's, so the result is identical."""
    vocab = probs.shape[0]
    cand = np.flatnonzero(probs > 0.0)
    m = _TOP_P_CANDIDATES
    while m < cand.size:
        kth = np.partition(probs, vocab - m)[vocab - m]
        top = np.flatnonzero((probs >= kth) & (probs > 0.0))  # ascending ids: stable ties by id
        if top.size >= cand.size or float(np.sum(probs[top])) >= top_p:
            cand = top
            break
        m *= 8
    order = cand[np.argsort(-probs[cand], kind="stable")]  # order: [m]
    sorted_p = probs[order]
    n_keep = int(np.count_nonzero((np.cumsum(sorted_p) - sorted_p) < top_p))  # mass before it < top_p
    keep = np.zeros(vocab, dtype=bool)
    keep[order[:n_keep]] = True
    return keep


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """probs: [vocab] non-negative (need not be normalised) -> one token id drawn from it."""
    cdf = np.cumsum(probs)  # cdf: [vocab]
    total = float(cdf[-1])
    if not total > 0.0:
        raise ValueError("cannot sample from an all-zero distribution")
    return min(int(np.searchsorted(cdf, rng.random() * total, side="right")), len(cdf) - 1)


def rejection_accept(
    draft: np.ndarray, q: np.ndarray | None, p: np.ndarray, rng: np.random.Generator
) -> tuple[int, int]:
    """Exact speculative sampling.

    draft: [k] token ids; q: [k, vocab] drafter distributions the drafts were sampled from, or None for a
    point mass (deterministic guess); p: [k+1, vocab] processed target distributions.
    Accept draft[i] with probability min(1, p(x)/q(x)) (point mass: p(x)); on the first rejection return
    a sample of norm(max(0, p - q)) (point mass: p with x removed, renormalised); when all k are
    accepted, the bonus token is sampled from p[k]. Returns (n_accepted, next_token).
    """
    k = int(len(draft))
    if p.shape[0] < k + 1:
        raise ValueError(f"p has {p.shape[0]} rows, need {k + 1} for {k} drafts")
    if q is not None and q.shape[0] < k:
        raise ValueError(f"q has {q.shape[0]} rows, need {k}")
    for i in range(k):
        x = int(draft[i])
        px = float(p[i, x])
        qx = 1.0 if q is None else float(q[i, x])
        if qx <= 0.0:  # a proposal its own q cannot produce: treat it as a deterministic guess
            qx, point_mass = 1.0, True
        else:
            point_mass = q is None
        if rng.random() * qx < px:  # u < p(x)/q(x) without dividing
            continue
        if point_mass:
            residual = p[i].copy()  # residual: [vocab]
            residual[x] = 0.0
        else:
            assert q is not None
            residual = np.maximum(p[i] - q[i], 0.0)
        if not float(np.sum(residual)) > 0.0:  # p == q up to rounding: any p sample is exact
            residual = p[i]
        return i, sample(residual, rng)
    return k, sample(p[k], rng)
