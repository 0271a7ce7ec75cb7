"""Deterministic numpy stand-ins for models and drafters, for the tests.

``FakeLM``: a CausalLM whose logits at a position are a sum of seeded random tables indexed by the last
``window`` tokens (so greedy output is non-trivial but exactly reproducible), with exact KV caches that
record their tokens and count forward calls. ``FakeLM.perturbed`` makes a draft model that agrees with
a target most of the time. ``ScriptedDrafter`` proposes from a reference continuation: always right,
always wrong, or wrong at one position.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from specls.decoder.api import CausalLM, Drafter, KVCache


@dataclass(frozen=True)
class FakeLMConfig:
    vocab: int = 64
    window: int = 3  # how many previous tokens the logits depend on
    seed: int = 0
    scale: float = 4.0  # logit scale (higher = peakier distributions)


@dataclass
class ForwardCounter:
    calls: int = 0
    tokens: int = 0


class FakeCache(KVCache):
    """An exact KV cache over a FakeLM: the "KV" is the token list itself."""

    def __init__(self, model: FakeLM) -> None:
        self._model = model
        self.tokens: list[int] = []
        self.counter = ForwardCounter()

    @property
    def length(self) -> int:
        return len(self.tokens)

    def forward(self, ids: Sequence[int]) -> np.ndarray:
        """ids: [n] -> logits: [n, vocab] float32."""
        ids = [int(t) for t in ids]
        if not ids:
            raise ValueError("forward needs at least one token")
        vocab = self._model.vocab_size
        if any(not 0 <= t < vocab for t in ids):
            raise ValueError(f"token id out of range [0, {vocab})")
        start = len(self.tokens)
        self.tokens.extend(ids)
        rows = [self._model.logits_at(self.tokens, start + i) for i in range(len(ids))]
        self.counter.calls += 1
        self.counter.tokens += len(ids)
        self._model.counter.calls += 1
        self._model.counter.tokens += len(ids)
        return np.stack(rows).astype(np.float32)  # [n, vocab]

    def truncate(self, n: int) -> None:
        if not 0 <= n <= len(self.tokens):
            raise ValueError(f"truncate({n}) on a cache of length {len(self.tokens)}")
        del self.tokens[n:]


class FakeLM(CausalLM):
    """A deterministic CausalLM: logits(pos) = scale * sum_j tables[j][tokens[pos - j]]."""

    def __init__(self, config: FakeLMConfig = FakeLMConfig(), tables: np.ndarray | None = None) -> None:
        self.config = config
        rng = np.random.default_rng(config.seed)
        # tables: [window, vocab, vocab]; table j scores the next token from the token j places back
        self.tables = (
            tables if tables is not None else rng.standard_normal((config.window, config.vocab, config.vocab))
        )
        self.counter = ForwardCounter()

    @classmethod
    def perturbed(cls, base: FakeLM, noise: float, seed: int) -> FakeLM:
        """A model that agrees with ``base`` often: its tables plus ``noise``-scaled fresh noise."""
        rng = np.random.default_rng(seed)
        tables = base.tables + noise * rng.standard_normal(base.tables.shape)
        return cls(FakeLMConfig(base.config.vocab, base.config.window, seed, base.config.scale), tables)

    @property
    def vocab_size(self) -> int:
        return self.config.vocab

    def new_cache(self) -> FakeCache:
        return FakeCache(self)

    def logits_at(self, tokens: Sequence[int], pos: int) -> np.ndarray:
        """Logits for the token after tokens[pos]: [vocab] float64."""
        row = np.zeros(self.config.vocab)
        for j in range(min(self.config.window, pos + 1)):
            row += self.tables[j, tokens[pos - j]]
        return self.config.scale * row

    def greedy(self, prompt: Sequence[int], n: int, eos_ids: frozenset[int] = frozenset()) -> list[int]:
        """Plain greedy decoding without any cache tricks: the reference output."""
        seq = [int(t) for t in prompt]
        out: list[int] = []
        for _ in range(n):
            tok = int(np.argmax(self.logits_at(seq, len(seq) - 1)))
            if tok in eos_ids:
                break
            out.append(tok)
            seq.append(tok)
        return out


class ScriptedDrafter(Drafter):
    """Proposes from a reference continuation of ``prompt``.

    mode "right": the next reference tokens; "wrong": every token off by one; "wrong_at": right except
    position ``j`` of each proposal. Point-mass proposals (proposal_probs() is None).
    """

    def __init__(
        self, prompt: Sequence[int], reference: Sequence[int], vocab: int, mode: str = "right", j: int = 0
    ) -> None:
        if mode not in ("right", "wrong", "wrong_at"):
            raise ValueError(f"unknown mode {mode!r}")
        self.name = f"scripted-{mode}"
        self._full = [int(t) for t in prompt] + [int(t) for t in reference]
        self._vocab = vocab
        self._mode = mode
        self._j = j
        self.observed: list[int] = []
        self.verified: list[int] = []

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        n = len(context)
        if list(context) != self._full[:n]:
            return []  # off script
        right = self._full[n : n + k]
        if self._mode == "right":
            return right
        if self._mode == "wrong":
            return [(t + 1) % self._vocab for t in right]
        return [(t + 1) % self._vocab if i == self._j else t for i, t in enumerate(right)]

    def observe(self, n_accepted: int, n_verified: int) -> None:
        self.observed.append(n_accepted)
        self.verified.append(n_verified)

    def proposal_probs(self) -> np.ndarray | None:
        return None
