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

import numpy as np
from specls.decoder.acceptance import greedy_accept_ids, process_logits, rejection_accept
from specls.decoder.api import (
    CancelCheck,
    DecodeResult,
    DecodeSettings,
    Drafter,
    DrafterStats,
    KVCache,
    Stop,
    never_cancelled,
)
from specls.decoder.gamma import GammaController, GammaPolicy

log = logging.getLogger(__name__)

Clock = Callable[[], float]
DEFAULT_POLICY = GammaPolicy()


def _sources(drafter: Drafter, n: int) -> list[str]:
    names = list(drafter.proposal_sources())
    return names[:n] if len(names) >= n else [drafter.name] * n


def _proposal(
    drafter: Drafter, seq: list[int], gamma: int, sampling: bool
) -> tuple[list[int], np.ndarray | None]:
    """draft: [n <= gamma] ids, q: [n, vocab] or None (point mass); raises on a malformed proposal."""
    draft = [int(t) for t in drafter.propose(seq, gamma)[:gamma]]
    if any(t < 0 for t in draft):
        raise ValueError(f"negative token id in proposal {draft}")
    q = drafter.proposal_probs() if sampling and draft else None
    if q is not None and (q.ndim != 2 or q.shape[0] < len(draft)):
        raise ValueError(f"proposal_probs shape {q.shape} does not cover {len(draft)} drafted tokens")
    return draft, (q[: len(draft)] if q is not None else None)


def _horizon(draft: list[int], out: list[int], eos_ids: frozenset[int], stop: Stop | None) -> int:
    """Draft tokens worth verifying: through the first eos id or the token at which ``stop`` would end
    the decode; the ones after could never be committed, and each verified row costs (on a CPU about
    a fifth of a one-token pass).

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
    policy: GammaPolicy = DEFAULT_POLICY,
) -> DecodeResult:
    """Decode up to ``settings.max_new_tokens`` tokens after ``prompt`` with the target model.

    ``target`` may already hold a prefix of ``prompt`` (the caller guarantees its positions are exactly
    ``prompt[:target.length]``); only the rest is computed. Greedy (temperature 0): tokens equal plain
    greedy decoding of the target, token for token, whatever the drafter proposes. Sampling: exact
    rejection sampling with ``np.random.default_rng(settings.seed)``.

    Stops: an eos id (not included in tokens), max_new_tokens (never exceeded), ``stop(tokens)`` True
    (tokens so far included; no draft token past ``stop.horizon`` or an eos is verified), the
    decode-phase deadline, ``cancelled()`` (checked before every target pass and between prefill runs
    of ``settings.prefill_chunk`` tokens; returns the tokens so far, the cache holding the prompt
    positions computed). ``prefill_tokens`` counts the prompt tokens computed by this call
    (the last one is fed with the first decode pass).
    """
    prompt = [int(t) for t in prompt]
    if not prompt:
        raise ValueError("generate needs a non-empty prompt")
    if not 0 <= target.length <= len(prompt):
        raise ValueError(f"target cache holds {target.length} positions, prompt has {len(prompt)}")
    if settings.temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {settings.temperature}")
    result = DecodeResult(tokens=[])
    if settings.max_new_tokens <= 0:
        return result
    if cancelled():
        result.stop_reason = "cancelled"
        return result

    # Prefill: the cache must hold prompt[:-1]; the last prompt token is fed with the first pass.
    # In runs of prefill_chunk tokens; a cancel between runs keeps the runs done in the cache.
    t0 = clock()
    if target.length == len(prompt):
        target.truncate(len(prompt) - 1)
    held = target.length
    chunk = settings.prefill_chunk if settings.prefill_chunk > 0 else len(prompt)
    fold = len(prompt) - 1 - held <= settings.fold_prefill  # the tail rides with the first pass
    while not fold and target.length < len(prompt) - 1:
        if target.length > held and cancelled():
            result.prefill_tokens = target.length - held
            result.prefill_ms = (clock() - t0) * 1e3
            result.stop_reason = "cancelled"
            return result
        end = min(len(prompt) - 1, target.length + chunk)
        target.append(prompt[target.length : end])  # prompt positions' logits: not needed
    result.prefill_tokens = len(prompt) - held
    result.prefill_ms = (clock() - t0) * 1e3

    sampling = settings.temperature > 0.0
    rng = np.random.default_rng(settings.seed)
    if drafter is not None:
        try:
            drafter.begin(settings)
        except Exception:
            log.warning("drafter %s failed to start; decoding without it", drafter.name, exc_info=True)
            drafter = None
    control = GammaController(settings, policy)
    seq = prompt  # committed tokens; target.length == len(seq) - 1 between passes (after the first)
    out = result.tokens
    t_decode = clock()
    reason = ""
    while not reason:
        if cancelled():
            reason = "cancelled"
            break
        gamma = control.gamma(settings.max_new_tokens - len(out))
        draft: list[int] = []
        q: np.ndarray | None = None
        t_draft = clock()
        if drafter is not None and gamma > 0:
            try:
                draft, q = _proposal(drafter, seq, gamma, sampling)
            except Exception:  # speculation is only an optimisation: go on without the drafter
                log.warning("drafter %s failed; decoding without it", drafter.name, exc_info=True)
                drafter, draft, q = None, [], None
        draft = draft[: _horizon(draft, out, eos_ids, stop)]  # nothing past a stop is verified
        q = q[: len(draft)] if q is not None else None
        t_target = clock()
        base = len(seq) - 1  # the last committed token's position (== target.length but for a tail)
        feed = [*seq[target.length :], *draft]  # [tail..., last committed, *draft]
        tail = len(feed) - len(draft) - 1
        if sampling:
            logits = target.forward(feed)[tail:]  # logits: [n+1, vocab]
            t_done = clock()
            p = process_logits(logits, settings.temperature, settings.top_k, settings.top_p)  # [n+1, vocab]
            if q is not None and q.shape[-1] != p.shape[-1]:
                q = _fit_vocab(q, p.shape[-1])
            n_acc, nxt = rejection_accept(np.asarray(draft, dtype=np.int64), q, p, rng)
        else:  # only the argmax ids come back (on a device cache they are taken there)
            best = target.forward_greedy(feed)[tail:]  # best: [n+1]
            t_done = clock()
            n_acc, nxt = greedy_accept_ids(np.asarray(draft, dtype=np.int64), best)
        result.target_passes += 1
        result.pass_ms.append((len(feed), (t_done - t_target) * 1e3))
        if draft:
            assert drafter is not None
            drafter.observe(n_acc, len(draft))
            _record(result, _sources(drafter, len(draft)), n_acc)
            control.observe(len(draft), n_acc, t_target - t_draft, None if tail else t_done - t_target)
        elif not tail:
            control.observe_plain(t_done - t_target)
        for tok in [*draft[:n_acc], nxt]:  # commit token by token so every stop lands exactly
            if tok in eos_ids:
                reason = "eos"
                break
            out.append(tok)
            seq.append(tok)
            if stop is not None and stop(out):
                reason = "stop"
                break
            if len(out) >= settings.max_new_tokens:
                reason = "max_tokens"
                break
        if result.target_passes == 1:
            result.first_pass_ms, result.first_pass_tokens = (clock() - t_decode) * 1e3, len(out)
        # Valid cache positions: the base, the fed last token, and the accepted drafts, cut to seq.
        target.truncate(min(base + 1 + n_acc, len(seq) - (0 if reason else 1)))
        if not reason and settings.deadline_s is not None and clock() - t_decode >= settings.deadline_s:
            reason = "deadline"
    result.stop_reason = reason
    result.decode_ms = (clock() - t_decode) * 1e3
    log.debug(
        "generate: %d tokens, %d passes, %d/%d accepted, stop=%s",
        len(out),
        result.target_passes,
        result.accepted,
        result.drafted,
        reason,
    )
    return result
