"""The feature-head drafter: guesses from the target's own hidden state at the last accepted position.

After each verify pass the target has computed the hidden state at the position whose logits gave
the token it just committed (``p = len(context) - 2``). A feature head (``specls.models.feature_head``)
maps it and that token to guesses for the tokens after it, in one small graph run: no draft model, no
KV to keep in step.
Before a request's first pass the hidden state of the prompt's second-to-last position serves the
same way when the prefill kept it; where there is none (the tail rode with the first pass, a
batched pass), there is no proposal. Point masses, verified like every draft.

Token ids only: ``features(position)`` and ``guess(hidden)`` are the caller's (the target cache's
``hidden_at`` and the loaded head).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from specls.decoder.api import Drafter

# position -> that position's hidden state ([d]), or None where the last pass did not compute it
Features = Callable[[int], np.ndarray | None]
# (hidden [d] at p, the token committed from p) -> (token ids [K], their probabilities [K]): the K
# heads' guesses for the tokens after it, in order
Guess = Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]]


def head_proposal(features: Features, guess: Guess, context: Sequence[int], k: int) -> list[int]:
    """The heads' guesses for the tokens after ``context``, at most ``k``.

    >>> rows = {3: np.ones(2)}
    >>> head_proposal(rows.get, lambda h, t: (np.array([t + 1, t + 2, t + 3]), np.ones(3)), [0, 0, 0, 0, 5], 2)
    [6, 7]
    >>> head_proposal(rows.get, lambda h, t: (np.array([7, 8, 9]), np.ones(3)), [0] * 6, 2)   # Not [7, 8]: no row 4
    []
    """
    if k <= 0 or len(context) < 2:
        return []
    hidden = features(len(context) - 2)
    if hidden is None:
        return []
    ids, _ = guess(hidden, int(context[-1]))
    return [int(t) for t in ids[:k]]


class HeadDrafter(Drafter):
    """``Drafter`` over ``head_proposal``; ``bind(features)`` per request (the request's target cache).
    ``cost``: one guess relative to a one-token target pass (what the policy charges for asking)."""

    name = "head"

    def __init__(self, guess: Guess, heads: int, cost: float = 0.0) -> None:
        self.guess = guess
        self.heads = heads
        self.cost = cost
        self._features: Features | None = None

    def bind(self, features: Features | None) -> None:
        self._features = features

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        if self._features is None:
            return []
        return head_proposal(self._features, self.guess, context, min(k, self.heads))

    def observe(self, n_accepted: int, n_verified: int) -> None:
        return None
