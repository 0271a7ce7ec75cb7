"""The speculative decode loop: the one entry point ``generate``.

Invariant between passes: the target cache holds every committed token except the last one
(``target.length == len(seq) - 1``); each pass feeds [last committed] + draft, so the prompt's last
token rides along with the first pass instead of costing a separate prefill step (as does a short
uncached prompt tail, ``DecodeSettings.fold_prefill``: that first pass feeds [tail, last] + draft).

On return the target cache holds exactly the first ``target.length`` tokens of ``prompt + tokens``
(never a rejected draft token), so the caller can reuse it as a prefix for the next request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from functools import partial

import numpy as np
from specls.decoder.acceptance import greedy_accept_ids, process_logits, rejection_accept
from specls.decoder.api import (
    CancelCheck,
    DecodeResult,
    DecodeSettings,
    Drafter,
    DrafterStats,
    KVCache,
    PassInterrupted,
    Stop,
    never_cancelled,
    unless_stopped,
)

log = logging.getLogger(__name__)

Clock = Callable[[], float]


def _sources(drafter: Drafter, n: int) -> list[str]:
    names = list(drafter.proposal_sources())
    return names[:n] if len(names) >= n else [drafter.name] * n


def _proposal(
    drafter: Drafter, seq: list[int], k: int, sampling: bool
) -> tuple[list[int], np.ndarray | None]:
    """draft: [n <= k] ids, q: [n, vocab] or None (point mass); raises on a malformed proposal."""
    draft = [int(t) for t in drafter.propose(seq, k)[:k]]
    if any(t < 0 for t in draft):
        raise ValueError(f"negative token id in proposal {draft}")
    q = drafter.proposal_probs() if sampling and draft else None
    if q is not None and (q.ndim != 2 or q.shape[0] < len(draft)):
        raise ValueError(f"proposal_probs shape {q.shape} does not cover {len(draft)} drafted tokens")
    return draft, (q[: len(draft)] if q is not None else None)


def _horizon(draft: list[int], out: list[int], eos_ids: frozenset[int], stop: Stop | None) -> int:
    """Draft tokens worth verifying: through the first eos id or the token at which ``stop`` would end
    the decode; the ones after could never be committed, and on a CPU each verified row costs.

    >>> _horizon([4, 2, 5, 6], [], frozenset({2}), None)   # Not 4: 5 and 6 would follow an eos
    2
    """
    n = next((i + 1 for i, t in enumerate(draft) if t in eos_ids), len(draft))
    return stop.horizon(out, draft[:n]) if stop is not None and n else n


def _fit_vocab(q: np.ndarray, vocab: int) -> np.ndarray:
    """q: [n, vocab_q] -> [n, vocab] (a draft model with a padded or shorter embedding table)."""
    if q.shape[-1] > vocab:
        return q[:, :vocab]
    return np.pad(q, ((0, 0), (0, vocab - q.shape[-1])))


def _record(result: DecodeResult, sources: list[str], n_accepted: int) -> None:
    """Per-drafter stats (keyed by the proposing sub-drafter) and the accept histogram by position."""
    result.drafted += len(sources)
    result.accepted += n_accepted
    for name in dict.fromkeys(sources):
        result.per_drafter.setdefault(name, DrafterStats()).proposals += 1
    for i, name in enumerate(sources):
        stats = result.per_drafter[name]
        stats.drafted += 1
        stats.accepted += int(i < n_accepted)
    if len(result.accept_hist) < len(sources):
        result.accept_hist.extend([0] * (len(sources) - len(result.accept_hist)))
    for i in range(n_accepted):
        result.accept_hist[i] += 1


def _check(target: KVCache, prompt: list[int], settings: DecodeSettings) -> None:
    if not prompt:
        raise ValueError("generate needs a non-empty prompt")
    if not 0 <= target.length <= len(prompt):
        raise ValueError(f"target cache holds {target.length} positions, prompt has {len(prompt)}")
    if settings.temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {settings.temperature}")


def _prefill(
    target: KVCache,
    prompt: list[int],
    settings: DecodeSettings,
    cancelled: CancelCheck,
    clock: Clock,
    result: DecodeResult,
) -> bool:
    """Bring the cache to prompt[:-1] (the last prompt token is fed with the first pass), in runs of
    ``prefill_chunk`` tokens; a short uncached tail (``fold_prefill``) is left to ride with the first
    pass instead. False: cancelled between runs, the runs done kept in the cache."""
    t0 = clock()
    if target.length == len(prompt):
        target.truncate(len(prompt) - 1)
    held = target.length
    chunk = settings.prefill_chunk if settings.prefill_chunk > 0 else len(prompt)
    fold = len(prompt) - 1 - held <= settings.fold_prefill
    done = True
    while not fold and target.length < len(prompt) - 1:
        if target.length > held and cancelled():
            done = False
            break
        end = min(len(prompt) - 1, target.length + chunk)
        try:
            target.append(prompt[target.length : end])  # prompt positions' logits: not needed
        except PassInterrupted:  # nothing of the run kept: stop, or run it again
            if cancelled():
                done = False
                break
    result.prefill_tokens = (len(prompt) if done else target.length) - held
    result.prefill_ms = (clock() - t0) * 1e3
    return done


def _begin(drafter: Drafter | None, settings: DecodeSettings) -> Drafter | None:
    if drafter is None:
        return None
    try:
        drafter.begin(settings)
    except Exception:
        log.warning("drafter %s failed to start; decoding without it", drafter.name, exc_info=True)
        return None
    return drafter


def _draft(
    drafter: Drafter | None,
    seq: list[int],
    out: list[int],
    k: int,
    sampling: bool,
    eos_ids: frozenset[int],
    stop: Stop | None,
) -> tuple[Drafter | None, list[int], np.ndarray | None]:
    """This pass's draft (at most ``k`` tokens, none past a stop or an eos) and its q; a drafter that
    fails comes back None and is not asked again: speculation is only an optimisation."""
    if drafter is None or k <= 0:
        return drafter, [], None
    try:
        draft, q = _proposal(drafter, seq, k, sampling)
    except Exception:
        log.warning("drafter %s failed; decoding without it", drafter.name, exc_info=True)
        return None, [], None
    draft = draft[: _horizon(draft, out, eos_ids, stop)]
    return drafter, draft, (q[: len(draft)] if q is not None else None)


def _verify(
    target: KVCache,
    seq: list[int],
    draft: list[int],
    q: np.ndarray | None,
    settings: DecodeSettings,
    rng: np.random.Generator,
    clock: Clock,
    result: DecodeResult,
) -> tuple[int, int]:
    """One target pass over [uncached prompt tail..., last committed, *draft]: the drafted tokens
    accepted and the target's own next token. The pass is counted and timed in ``result``."""
    feed = [*seq[target.length :], *draft]
    tail = len(feed) - len(draft) - 1
    ids = np.asarray(draft, dtype=np.int64)
    t0 = clock()
    if settings.temperature > 0.0:
        logits = target.forward(feed)[tail:]  # logits: [n+1, vocab]
        t1 = clock()
        p = process_logits(logits, settings.temperature, settings.top_k, settings.top_p)  # [n+1, vocab]
        if q is not None and q.shape[-1] != p.shape[-1]:
            q = _fit_vocab(q, p.shape[-1])
        n_acc, nxt = rejection_accept(ids, q, p, rng)
    else:  # only the argmax ids come back (on a device cache they are taken there)
        best = target.forward_greedy(feed)[tail:]  # best: [n+1]
        t1 = clock()
        n_acc, nxt = greedy_accept_ids(ids, best)
    result.target_passes += 1
    result.pass_ms.append((len(feed), (t1 - t0) * 1e3))
    return n_acc, nxt


def _observe(drafter: Drafter | None, draft: list[int], n_acc: int, result: DecodeResult) -> None:
    """The drafter learns how its proposal fared; the result counts it by sub-drafter."""
    if draft and drafter is not None:
        drafter.observe(n_acc, len(draft))
        _record(result, _sources(drafter, len(draft)), n_acc)


def _commit(
    tokens: list[int], seq: list[int], out: list[int], eos_ids: frozenset[int], stop: Stop | None, limit: int
) -> str:
    """Commit ``tokens`` one by one, so that every stop lands exactly: "" or why the decode ends."""
    for tok in tokens:
        if tok in eos_ids:
            return "eos"
        out.append(tok)
        seq.append(tok)
        if stop is not None and stop(out):
            return "stop"
        if len(out) >= limit:
            return "max_tokens"
    return ""


def generate(
    target: KVCache,
    prompt: Sequence[int],
    drafter: Drafter | None,
    settings: DecodeSettings,
    eos_ids: frozenset[int],
    cancelled: CancelCheck = never_cancelled,
    stop: Stop | None = None,
    *,
    clock: Clock = time.perf_counter,
) -> DecodeResult:
    """Decode up to ``settings.max_new_tokens`` tokens after ``prompt`` with the target model.

    ``target`` may already hold a prefix of ``prompt`` (the caller guarantees its positions are exactly
    ``prompt[:target.length]``); only the rest is computed. Greedy (temperature 0): tokens equal plain
    greedy decoding of the target, token for token, whatever the drafter proposes. Sampling: exact
    rejection sampling with ``np.random.default_rng(settings.seed)``. The drafter is offered
    ``settings.draft_length`` tokens a pass (fewer near ``max_new_tokens``) and picks how many to draft.

    Stops: an eos id (not included in tokens), max_new_tokens (never exceeded), ``stop(tokens)`` True
    (tokens so far included; no draft token past ``stop.horizon`` or an eos is verified), the
    decode-phase deadline, ``cancelled()`` (checked before every target pass and between prefill runs
    of ``settings.prefill_chunk`` tokens, and after a pass stopped midway, ``PassInterrupted``, which
    runs again when not cancelled; returns the tokens so far, the cache holding the prompt
    positions computed). ``prefill_tokens`` counts the prompt tokens computed by this call
    (the last one is fed with the first decode pass).
    """
    prompt = [int(t) for t in prompt]
    _check(target, prompt, settings)
    result = DecodeResult(tokens=[])
    if settings.max_new_tokens <= 0:
        return result
    if cancelled() or not _prefill(target, prompt, settings, cancelled, clock, result):
        result.stop_reason = "cancelled"
        return result
    drafter = _begin(drafter, settings)
    sampling = settings.temperature > 0.0
    rng = np.random.default_rng(settings.seed)
    seq = prompt  # committed tokens; target.length == len(seq) - 1 between passes (after the first)
    out = result.tokens
    t_decode = clock()
    reason = ""
    while not reason:
        if cancelled():
            reason = "cancelled"
            break
        # the accepted tokens and the target's own one must fit in what is left
        k = min(settings.draft_length, settings.max_new_tokens - len(out) - 1)
        drafter, draft, q = _draft(drafter, seq, out, k, sampling, eos_ids, stop)
        base = len(seq) - 1  # the last committed token's position (== target.length but for a tail)
        run = partial(_verify, target, seq, draft, q, settings, rng, clock, result)
        verified = unless_stopped(run, cancelled)
        if verified is None:
            reason = "cancelled"
            break
        n_acc, nxt = verified
        _observe(drafter, draft, n_acc, result)
        reason = _commit([*draft[:n_acc], nxt], seq, out, eos_ids, stop, settings.max_new_tokens)
        if result.target_passes == 1:
            result.first_pass_ms, result.first_pass_tokens = (clock() - t_decode) * 1e3, len(out)
        # Valid cache positions: the base, the fed last token, and the accepted drafts, cut to seq.
        target.truncate(min(base + 1 + n_acc, len(seq) - (0 if reason else 1)))
        if not reason and settings.deadline_s is not None and clock() - t_decode >= settings.deadline_s:
            reason = "deadline"
    result.stop_reason = reason
    result.decode_ms = (clock() - t_decode) * 1e3
    log.debug("generate: %d tokens, %d passes, stop=%s", len(out), result.target_passes, reason)
    return result
