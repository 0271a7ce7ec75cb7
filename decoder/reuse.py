"""Completion reuse: when the user types the beginning of the suggestion they were shown, the rest of
it is the draft (typing through a suggestion costs about one target pass).

- ``PreviousCompletion``: a document's last completion (the cursor text it answered, its tokens and
  text) and ``typed(prefix, suffix)``: how far the new cursor has typed into it.
- ``CompletionReuseDrafter``: proposes the rest of it, a deterministic guess (point mass).
- ``ReuseFirstDrafter``: that proposal first, the regular drafter once it has nothing left.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from specls.decoder.api import DecodeSettings, Drafter
from specls.decoder.text import REPLACEMENT, Detokenizer, IncrementalText, visible_offsets

REUSE = "reuse"  # per_drafter key of the completion-reuse drafter


class TokenCodec(Detokenizer, Protocol):
    """Text both ways (the proposal re-tokenises the rest of a token the user typed into)."""

    def encode(self, text: str) -> list[int]: ...


@dataclass
class PreviousCompletion:
    """A document's last completion: the cursor it answered (``prefix``/``suffix``), everything it
    generated (``tokens``, before any stop cut), their visible ``text``, and why it ended
    (``stop_reason`` of its decode: "eos", "stop", "max_tokens", "cancelled", ...)."""

    prefix: str
    suffix: str
    text: str
    tokens: list[int]
    tokenizer: TokenCodec
    stop_reason: str = ""
    _offsets: list[int] | None = field(default=None, repr=False)

    def offsets(self) -> list[int]:
        """offsets[i] = characters of visible text made by tokens[:i]; offsets[-1] == len(text)."""
        if self._offsets is None:
            self._offsets = visible_offsets(self.tokenizer, self.tokens, self.text)
        return self._offsets

    def typed(self, prefix: str, suffix: str) -> int | None:
        """How many characters of this completion the user has typed when the cursor now sits after
        ``prefix`` with ``suffix`` after it, or None when the new cursor does not continue it (a
        different suffix, an edit before the old cursor, other text typed, or all of it typed)."""
        if not self.text or suffix != self.suffix or not prefix.startswith(self.prefix):
            return None
        typed = prefix[len(self.prefix) :]
        if not self.text.startswith(typed) or len(typed) >= len(self.text):
            return None
        return len(typed)


class CompletionReuseDrafter(Drafter):
    """Proposes the rest of the previous completion (a deterministic guess, point mass).

    The previous completion is kept as its generated tokens and their text; the user has typed its
    first ``typed_len`` characters since. At each proposal the text generated so far must continue
    that text; the proposal is then the old completion's own tokens from the current text position
    (the model tends to repeat its own segmentation, which re-tokenising the text would not give),
    with the characters up to the next old token boundary tokenised afresh when the position falls
    inside an old token."""

    name = REUSE

    def __init__(self, prompt_len: int, last: PreviousCompletion, typed_len: int, max_draft: int) -> None:
        self._tok = last.tokenizer
        self._prompt_len = prompt_len
        self._tokens = last.tokens
        self._text = last.text
        self._offsets = last.offsets()
        self._typed = typed_len
        self._max = max_draft
        self._generated = IncrementalText(last.tokenizer)  # the text generated so far, decoded as it grows
        self._cache: tuple[int, list[int]] | None = None  # (generated count, proposal tokens)
        self._dead = False

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        if self._dead or k <= 0:
            return []
        generated = list(context[self._prompt_len :])
        if self._cache is not None and self._cache[0] == len(generated):
            return self._cache[1][:k]
        self._cache = (len(generated), self._proposal(generated))
        return self._cache[1][:k]

    def _proposal(self, generated: list[int]) -> list[int]:
        text = self._generated.update(generated) if generated else ""
        pos = self._typed + len(text)
        # (a U+FFFD inside the visible text: the model made bytes the old text does not have)
        if REPLACEMENT in text or not self._text.startswith(text, self._typed) or pos >= len(self._text):
            self._dead = True
            return []
        j = next(i for i, off in enumerate(self._offsets) if off >= pos)  # offsets[-1] == len(text)
        head = self._tok.encode(self._text[pos : self._offsets[j]]) if self._offsets[j] > pos else []
        return [*head, *self._tokens[j:]][: self._max]

    def observe(self, n_accepted: int, n_verified: int) -> None:
        pass  # the next propose re-checks the generated text; a wrong guess stops the proposals


class ReuseFirstDrafter(Drafter):
    """Completion reuse first, then the regular drafter (``inner``, may be None). The loop offers
    enough tokens for the reuse proposal; the regular drafter is offered at most ``draft_length`` of
    them, its own cap, and picks its length within it as it would without reuse."""

    def __init__(self, reuse: CompletionReuseDrafter, inner: Drafter | None, draft_length: int) -> None:
        self.name = REUSE if inner is None else f"{REUSE}+{inner.name}"
        self._reuse = reuse
        self._inner = inner
        self._inner_k = max(1, draft_length)
        self._from_reuse = False
        self._n = 0

    def begin(self, settings: DecodeSettings) -> None:
        if self._inner is not None:
            self._inner.begin(settings)

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        out = self._reuse.propose(context, k)
        self._from_reuse = bool(out)
        if not out and self._inner is not None:
            out = self._inner.propose(context, min(k, self._inner_k))
        self._n = len(out)
        return out

    def observe(self, n_accepted: int, n_verified: int) -> None:
        if self._from_reuse:
            self._reuse.observe(n_accepted, n_verified)
        elif self._inner is not None:
            self._inner.observe(n_accepted, n_verified)

    def proposal_probs(self) -> np.ndarray | None:
        if self._from_reuse or self._inner is None:
            return None
        return self._inner.proposal_probs()

    def proposal_sources(self) -> Sequence[str]:
        if self._from_reuse or self._inner is None:
            return [REUSE] * self._n
        names = list(self._inner.proposal_sources())
        return names if len(names) >= self._n else [self._inner.name] * self._n
