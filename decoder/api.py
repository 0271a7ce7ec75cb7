"""The decoder's contracts (token ids in, token ids out).

- ``KVCache`` / ``CausalLM``: what the decode loop needs from a model (ONNX in ``specls.models``,
  numpy fakes in the tests).
- ``Drafter``: one protocol for every drafter (prompt lookup, draft model, completion reuse, ...).
- ``DecodeSettings`` / ``DecodeResult``: one generation's knobs and outcome.

The text-level contract a language server codes against (``Engine``) is ``specls.api``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar, runtime_checkable

import numpy as np

# A cancellation check: returns True when the caller no longer wants the result.
CancelCheck = Callable[[], bool]


def never_cancelled() -> bool:
    return False


T = TypeVar("T")


class PassInterrupted(Exception):
    """A target pass stopped midway from another thread (``OnnxCausalLM.interrupt``): it committed
    nothing, the cache is as it was before it. The decode that ran it stops when it is cancelled and
    runs the pass again when not (an interrupt meant for work that had just ended)."""


def unless_stopped(run: Callable[[], T], cancelled: CancelCheck) -> T | None:
    """``run()``, run again while its pass is stopped midway (``PassInterrupted``: nothing of it kept)
    and the request is not cancelled; None once it is.

    >>> stops = [PassInterrupted(), None]
    >>> def run():
    ...     if stops.pop(0): raise PassInterrupted()
    ...     return "done"
    >>> unless_stopped(run, lambda: False)   # Not None: a stray interrupt, the pass ran again
    'done'
    >>> stops = [PassInterrupted()]
    >>> print(unless_stopped(run, lambda: True))
    None
    """
    while True:
        try:
            return run()
        except PassInterrupted:
            if cancelled():
                return None


@runtime_checkable
class KVCache(Protocol):
    """One sequence's KV cache, owned by that sequence.

    ``forward`` appends ``ids`` after the ``length`` cached positions and returns the logits of every
    new position; ``truncate(n)`` rolls the cache back to its first ``n`` positions (exact: a slice on
    the sequence axis). ``append`` (a prefill: logits nobody reads), ``forward_last`` (a catch-up:
    only the last position's logits) and ``forward_greedy`` (a greedy verify pass: only the argmax
    ids) let a model skip the vocabulary projection of the other positions or keep them on its device; ``compact`` lets a cache give back memory it shares after a
    batched pass. The bodies here are what a cache without such tricks does (subclass to get them).
    """

    @property
    def length(self) -> int: ...

    def forward(self, ids: Sequence[int]) -> np.ndarray:
        """ids: [n] -> logits: [n, vocab] float32. Cache grows by n."""
        ...

    def truncate(self, n: int) -> None: ...

    def append(self, ids: Sequence[int]) -> None:
        """``forward`` whose logits nobody needs (a prefill). Cache grows by len(ids)."""
        self.forward(ids)

    def forward_last(self, ids: Sequence[int]) -> np.ndarray:
        """ids: [n] -> the last position's logits: [vocab]. Cache grows by n."""
        return self.forward(ids)[-1]

    def forward_greedy(self, ids: Sequence[int]) -> np.ndarray:
        """ids: [n] -> each position's argmax: [n] int64 (ties: the lowest id, as ``np.argmax``), for
        greedy verification; a device cache takes it there and copies n ids, not [n, vocab] logits.
        Cache grows by n."""
        return np.asarray(np.argmax(self.forward(ids), axis=-1), dtype=np.int64)

    def compact(self) -> None:
        """Own the KV again after passes that shared it (a batched pass); nothing to do by default."""
        return None


# (caches, ids) -> logits per cache: [n_i, vocab] each; advances every cache by its ids
BatchForward = Callable[[Sequence[KVCache], Sequence[Sequence[int]]], list[np.ndarray]]


@runtime_checkable
class CausalLM(Protocol):
    """A loaded model that can open per-sequence caches.

    ``pass_granularity``: see its docstring; what the drafting policy's calibration measures.

    Batching (joining concurrent sequences' passes, off by default): ``enable_batching()`` loads what
    ``forward_batch`` needs and says whether it can; ``release_memory()`` gives back what batched
    passes kept once no request runs. The bodies here are a model that cannot batch.
    """

    @property
    def vocab_size(self) -> int: ...

    def new_cache(self) -> KVCache: ...

    @property
    def pass_granularity(self) -> int:
        """A pass over n tokens computes n rounded up to a multiple of this many rows, and costs that
        (2 for a runtime that pads odd passes for exactness: ``RuntimeSettings.even_passes``)."""
        return 1

    def enable_batching(self) -> bool:
        return False

    def forward_batch(self, caches: Sequence[KVCache], ids: Sequence[Sequence[int]]) -> list[np.ndarray]:
        raise TypeError(f"{type(self).__name__} cannot batch passes (enable_batching() is False)")

    def release_memory(self) -> None:
        return None


@runtime_checkable
class Drafter(Protocol):
    """Proposes tokens to verify. The decode loop never asks which drafter it has.

    ``begin(settings)``: once at the start of each generation (sampling parameters, seed, per-request
    state). ``propose(context, k)``: up to ``k`` token ids continuing ``context`` (the full committed
    token sequence, prompt included); ``[]`` means no proposal. ``observe(n_accepted, n_verified)``:
    the target verified the first ``n_verified`` tokens of the last proposal (all of them, unless the
    rest lay past a stop or an eos, where the loop does not verify) and accepted the first
    ``n_accepted`` of those. ``proposal_probs()``: for sampling mode, the
    drafter's distributions q for the last proposal ([len(proposal), vocab]), or None for a point mass
    (a deterministic guess such as prompt lookup). ``proposal_sources()``: one name per token of the
    last proposal, the sub-drafter that proposed it (a composite drafter reports e.g.
    "lookup"/"draft"; stats in ``DecodeResult.per_drafter`` are keyed by it); fewer names than tokens
    means all of them are ``name``'s. The bodies here are a point-mass drafter without per-request
    state (subclass to get them; ``propose`` and ``observe`` are each drafter's own).
    """

    name: str

    def begin(self, settings: DecodeSettings) -> None:
        return None

    def propose(self, context: Sequence[int], k: int) -> list[int]: ...

    def observe(self, n_accepted: int, n_verified: int) -> None: ...

    def proposal_probs(self) -> np.ndarray | None:
        return None

    def proposal_sources(self) -> Sequence[str]:
        return ()


@runtime_checkable
class Stop(Protocol):
    """Ends a decode before its budget (an end of line, a closing bracket...).

    ``stop(tokens)``: asked after every committed token (``tokens``: all generated so far, a list that
    only grows within one decode); True ends the decode there, that token kept. ``horizon(tokens,
    draft)``: without side effects, how many of ``draft``'s tokens, committed after ``tokens``, would
    come before the stop ends the decode, the token that ends it included (``len(draft)`` when none
    does). The loop verifies no draft token past it: such a token could never be committed.
    """

    def __call__(self, tokens: list[int]) -> bool: ...

    def horizon(self, tokens: Sequence[int], draft: Sequence[int]) -> int: ...


class StopWhen(Stop):
    """A ``Stop`` from a pure predicate on the generated tokens.

    >>> s = StopWhen(lambda toks: toks[-1] == 0)
    >>> s([3, 0]), s.horizon([3], [4, 0, 5, 0])   # Not 4: the 5 and the last 0 are never committed
    (True, 2)
    """

    def __init__(self, predicate: Callable[[list[int]], bool]) -> None:
        self._predicate = predicate

    def __call__(self, tokens: list[int]) -> bool:
        return self._predicate(tokens)

    def horizon(self, tokens: Sequence[int], draft: Sequence[int]) -> int:
        grown = [int(t) for t in tokens]
        for i, t in enumerate(draft):
            grown.append(int(t))
            if self._predicate(grown):
                return i + 1
        return len(draft)


@dataclass(frozen=True)
class DecodeSettings:
    """How one generation runs. Passed whole to the decode loop."""

    max_new_tokens: int = 64
    # The most tokens one pass drafts (0 = none); the drafter picks each pass's length up to it.
    draft_length: int = 12
    temperature: float = 0.0  # 0 = greedy (deterministic, == plain greedy decoding)
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    seed: int | None = None
    deadline_s: float | None = None  # wall-clock budget for the decode phase, None = none
    # The prompt is prefilled in runs of at most this many tokens, ``cancelled`` checked between them:
    # a keystroke's tail stays one run, while a cold prompt of hundreds of tokens (seconds on a CPU)
    # stops within one run of a cancel and keeps the runs done, which the next keystroke's prompt
    # shares. 0 = one run.
    prefill_chunk: int = 128
    # An uncached prompt part this short (a keystroke's typed tokens plus a PSM suffix window) is fed
    # with the first pass instead of a run of its own: on a CPU a pass over a few more tokens costs far
    # less than another pass (weights are read once per run). A cold prompt keeps its own prefill (and
    # its prefill_ms). 0 = never.
    fold_prefill: int = 64


@dataclass
class DrafterStats:
    drafted: int = 0
    accepted: int = 0
    proposals: int = 0


@dataclass
class DecodeResult:
    """What one generation produced, and what it cost."""

    tokens: list[int]
    text: str = ""
    stop_reason: str = "max_tokens"  # "eos" | "max_tokens" | "deadline" | "cancelled" | "stop"
    target_passes: int = 0
    drafted: int = 0
    accepted: int = 0
    per_drafter: dict[str, DrafterStats] = field(default_factory=dict)
    # accept_hist[i] = number of verify passes whose drafted token at position i was accepted
    accept_hist: list[int] = field(default_factory=list)
    prefill_tokens: int = 0
    prefill_ms: float = 0.0
    decode_ms: float = 0.0
    # the first pass (it ends the prompt): ms from the decode's start to its last commit, and tokens it
    # committed. A server that samples the first token from its prefill (llama.cpp) counts that pass
    # as prompt time: decode_ms - first_pass_ms is the like-for-like decode time (specls bench real).
    first_pass_ms: float = 0.0
    first_pass_tokens: int = 0
    # (tokens fed, ms) of each decode pass of the target, what the drafting policy learns its pass
    # costs from (decoder/pass_cost_learner.py)
    pass_ms: list[tuple[int, float]] = field(default_factory=list)
