"""Drafters: prompt lookup (n-gram index over the current sequence, the suffix and the open buffers)
and a small same-tokenizer draft model with its own KV cache.

Both subclass the ``Drafter`` protocol of ``specls.decoder.api``; the drafting policy
(``specls.decoder.planned.PlannedDrafter``) combines them and picks each pass's length. Stats are keyed
by the sub-drafter that proposed each token ("lookup", "draft").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from specls.decoder.acceptance import process_logits, sample
from specls.decoder.api import CausalLM, DecodeSettings, Drafter, KVCache
from specls.decoder.datastore import StaticSources
from specls.decoder.ngram import LookupMatch, NgramIndex, common_prefix_len, lookup

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DrafterSettings:
    """How the drafters propose."""

    # Shortest context tail that may match. 1: a match of the last token alone is a guess, but a
    # target's one-token pass is padded to two rows anyway (``RuntimeSettings.even_passes``), so a
    # one-token guess rides free, and the policy prices such matches apart (``PolicyState.lookup_guess``).
    lookup_min_n: int = 1
    lookup_max_n: int = 4  # longest context tail tried first
    # Lookup on its own (no policy: ``PromptLookupDrafter.propose``) proposes at most this many tokens
    # of a one-token match: the first rides the pad row free, the rest cost rows and are right less
    # often than not.
    lookup_guess_tokens: int = 1
    draft_sample: bool = True  # sampling mode: the draft model samples (exact q) instead of greedy
    draft_min_confidence: float = 0.0  # greedy: stop drafting when the draft's top prob is below this
    # The draft model sees at most the last this many context tokens (``draft_view_start``; 0 = all).
    # Its proposals only move acceptance, and a fresh prompt's catch-up is what keeps it from paying:
    # a long FIM prompt can cost the draft model more passes to catch up on than a completion saves.
    draft_window: int = 256

    def __post_init__(self) -> None:
        checks = (
            (1 <= self.lookup_min_n <= self.lookup_max_n, "need 1 <= lookup_min_n <= lookup_max_n"),
            (self.lookup_guess_tokens >= 0, "lookup_guess_tokens must not be negative"),
            (0.0 <= self.draft_min_confidence <= 1.0, "draft_min_confidence must be in [0, 1]"),
            (self.draft_window >= 0, "draft_window must not be negative (0 = all)"),
        )
        problems = [why for ok, why in checks if not ok]
        if problems:
            raise ValueError(f"bad drafter settings ({'; '.join(problems)}): {self}")


DEFAULT_DRAFTER_SETTINGS = DrafterSettings()


def draft_view_start(n: int, window: int) -> int:
    """Where the draft model's view of an ``n``-token context starts: 0 while ``n <= window``, then in
    strides of ``window // 2``, the smallest multiple that leaves at most ``window`` tokens. The start
    moves only once per stride of new tokens, so between moves every view extends the one before it
    and the draft's cache stays a prefix of it (a start computed as ``n - window`` would move on
    every token and re-feed the whole view each pass).

    >>> [draft_view_start(n, 256) for n in (100, 256, 257, 384, 385, 700)]
    [0, 0, 128, 128, 256, 512]
    """
    if window <= 0 or n <= window:
        return 0
    stride = max(1, window // 2)
    return -(-(n - window) // stride) * stride


def unplanned_proposal(match: LookupMatch | None, k: int, settings: DrafterSettings) -> list[int]:
    """What a lookup match proposes when lookup drafts on its own, not planned by the policy: up to ``k`` of its tokens, a guess (a
    one-token match) at most ``settings.lookup_guess_tokens``.

    Example, k = 4 and ``lookup_guess_tokens`` 1: a 3-token match continuing [7, 8, 9, 5] proposes
    [7, 8, 9, 5]; a one-token match with the same continuation proposes [7]."""
    if match is None:
        return []
    return list(match.tokens[: min(k, settings.lookup_guess_tokens) if match.guess else k])


class PromptLookupDrafter(Drafter):
    """Proposes the continuation of the longest, most recent match of the context's tail in: the
    current sequence (prompt + generated, most recent of all), then the suffix after the cursor, then
    the shared index of open buffers (most recently updated first). A match in the current sequence
    that runs into its end is continued periodically (a repeating pattern keeps repeating).
    Where those have no match, or only a one-token guess, the ``static`` sources follow (the
    workspace's files not open, then a code datastore: ``specls.decoder.datastore``), their best
    continuation by counts: after the buffers, because what the user has open is the likeliest to
    be copied. Point-mass proposals. Reusable across requests (the sequence index is updated
    incrementally; call ``set_suffix`` per request)."""

    name = "lookup"

    def __init__(
        self,
        index: NgramIndex | None,
        settings: DrafterSettings = DEFAULT_DRAFTER_SETTINGS,
        suffix: Sequence[int] = (),
        static: StaticSources | None = None,
    ) -> None:
        self.settings = settings
        lo, hi = settings.lookup_min_n, settings.lookup_max_n
        self._index = index
        self._static = static
        self._context = NgramIndex(lo, hi, name="context")
        self._suffix = NgramIndex(lo, hi, name="suffix")
        self.set_suffix(suffix)
        self.last_match: LookupMatch | None = None
        self._n = 0

    def set_suffix(self, tokens: Sequence[int]) -> None:
        """The tokens after the cursor (FIM): the continuation often runs into them."""
        self._suffix.update("suffix", tokens)

    def match(self, context: Sequence[int], k: int) -> LookupMatch | None:
        """The best match for this context (also remembered as ``last_match``)."""
        self._context.update("context", context)  # incremental: only the new tail is indexed
        sources = [self._context, self._suffix] + ([self._index] if self._index is not None else [])
        s = self.settings
        m = lookup(sources, context, k, s.lookup_min_n, s.lookup_max_n)
        if (m is None or m.guess) and self._static is not None:
            m = self._static.match(context, k) or m
        if m is not None and m.source == "context" and len(m.tokens) < k:
            # The match runs into the end of the sequence: continue copying with overlap (LZ77 style),
            # the sequence repeating with period len(context) - position.
            period = len(context) - m.position
            tokens = list(m.tokens)
            while len(tokens) < k:
                tokens.append(tokens[len(tokens) - period])
            m = LookupMatch(m.source, m.doc_id, m.n, m.position, tokens)
        self.last_match = m
        return m

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        m = self.match(context, k) if k > 0 and context else None
        tokens = unplanned_proposal(m, k, self.settings)
        self._n = len(tokens)
        return tokens

    def observe(self, n_accepted: int, n_verified: int) -> None:
        pass

    def proposal_probs(self) -> np.ndarray | None:
        return None

    def proposal_sources(self) -> Sequence[str]:
        return [self.name] * self._n


class DraftModelDrafter(Drafter):
    """A small draft model with its own KV cache, synced to the context's tail (``draft_window``) by
    longest common prefix with what it has cached (truncate + feed only the new tokens): it catches up
    on the bonus/correction token after each pass and keeps its prefix across requests. Greedy steps, or sampled steps with
    their distributions q in sampling mode (``begin`` sets the mode)."""

    name = "draft"

    def __init__(
        self,
        model: CausalLM,
        settings: DrafterSettings = DEFAULT_DRAFTER_SETTINGS,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.model = model
        self.settings = settings
        self._clock = clock
        self._cache: KVCache | None = None
        self._tokens: list[int] = []  # what the cache holds, position by position
        self._decode = DecodeSettings()
        self._rng = np.random.default_rng()
        self._q: list[np.ndarray] = []
        self._n = 0
        self.forward_tokens = 0  # tokens fed to the draft model (catch-up + drafting), for stats
        self.feed_ms: list[tuple[int, float]] = []  # this request's feeds: (tokens, ms), for the policy

    @property
    def cached_tokens(self) -> int:
        return len(self._tokens)

    def begin(self, settings: DecodeSettings) -> None:
        self._decode = settings
        self.feed_ms = []
        seed = settings.seed
        self._rng = np.random.default_rng(None if seed is None else [seed, 0x5EED])

    def reset(self) -> None:
        """Drop the cache (frees its memory); the next proposal starts from scratch."""
        self._cache = None
        self._tokens = []

    def _view(self, context: Sequence[int]) -> Sequence[int]:
        """The tail of ``context`` the draft model sees (``DrafterSettings.draft_window``)."""
        return context[draft_view_start(len(context), self.settings.draft_window) :]

    def behind(self, context: Sequence[int]) -> int:
        """Context tokens a proposal would feed before drafting (its catch-up)."""
        view = self._view(context)
        return len(view) - min(common_prefix_len(self._tokens, view), len(view) - 1)

    def _sampling(self) -> bool:
        return self._decode.temperature > 0.0 and self.settings.draft_sample

    def _feed(self, ids: Sequence[int]) -> np.ndarray:
        assert self._cache is not None
        t0 = self._clock()
        if len(ids) > 1:
            last = self._cache.forward_last(ids)  # [vocab]: only the row we need (catch-up)
        else:
            last = self._cache.forward(ids)[-1]  # forward: [len(ids), vocab]
        self.feed_ms.append((len(ids), (self._clock() - t0) * 1e3))
        self._tokens.extend(ids)
        self.forward_tokens += len(ids)
        return np.asarray(last)  # [vocab]

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        self._q = []
        self._n = 0
        if k <= 0 or not context:
            return []
        try:
            return self._propose(context, k)
        except Exception:
            self.reset()  # the cache may hold a partial step: never trust it again
            raise

    def _propose(self, context: Sequence[int], k: int) -> list[int]:
        if self._cache is None:
            self._cache = self.model.new_cache()
            self._tokens = []
        view = self._view(context)
        keep = min(common_prefix_len(self._tokens, view), len(view) - 1)  # re-feed >= 1 token
        if keep < len(self._tokens):
            self._cache.truncate(keep)
            del self._tokens[keep:]
        logits = self._feed([int(t) for t in view[keep:]])  # logits: [vocab]
        sampling = self._sampling()
        d = self._decode
        out: list[int] = []
        for i in range(k):
            if sampling:
                q = process_logits(logits, d.temperature, d.top_k, d.top_p)  # q: [vocab]
                tok = sample(q, self._rng)
                self._q.append(q)
            else:
                tok = int(np.argmax(logits))
                if i > 0 and self.settings.draft_min_confidence > 0.0:
                    z = np.exp(logits - logits[tok])
                    if 1.0 / float(np.sum(z)) < self.settings.draft_min_confidence:
                        break
            out.append(tok)
            if i + 1 < k:
                logits = self._feed([tok])
        self._n = len(out)
        return out

    def observe(self, n_accepted: int, n_verified: int) -> None:
        pass  # the next propose() syncs by common prefix

    def proposal_probs(self) -> np.ndarray | None:
        return np.stack(self._q) if self._q else None  # [n, vocab]

    def proposal_sources(self) -> Sequence[str]:
        return [self.name] * self._n


def point_masses_then(tokens: Sequence[int], n_point: int, model_q: np.ndarray | None) -> np.ndarray | None:
    """q: [len(tokens), vocab] for a proposal whose first ``n_point`` tokens are point masses (lookup:
    one-hot rows give exactly that rule) and whose rest were sampled from ``model_q`` ([>= rest, vocab]);
    None when there is no model part."""
    n_model = len(tokens) - n_point
    if model_q is None or n_model <= 0:
        return None
    q = np.zeros((len(tokens), model_q.shape[-1]), dtype=model_q.dtype)
    q[np.arange(n_point), list(tokens[:n_point])] = 1.0
    q[n_point:] = model_q[:n_model]
    return q
