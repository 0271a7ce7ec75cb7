"""How sure the model was of a next edit: its confidence on the tokens it changed.

Most of a rewrite copies the region, which the model is sure of whatever the edit; what tells a good
edit from a guess is the target's distribution where its output left the region's tokens (the
changed tokens: replaced or inserted ones, and the token that took a deleted run's place). Per
changed token: the top-1 minus top-2 logit margin and the top-1 probability; an edit is as sure as
its least sure changed token (``min_margin``), the rule that decides whether it is shown
(``NextEditSettings.min_margin``; ``specls bench edit`` measures precision against coverage).
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class EditConfidence:
    """The target's confidence on an edit's changed tokens (``tokens`` of them)."""

    min_margin: float
    mean_margin: float
    min_prob: float
    mean_prob: float
    tokens: int

    def to_dict(self) -> dict[str, float]:
        return {k: round(float(getattr(self, k)), 4) for k in self.__dataclass_fields__}


def changed_positions(output: Sequence[int], unchanged: Sequence[int]) -> list[int]:
    """The output positions where it left ``unchanged`` (the region's own output): replaced and
    inserted tokens, and for a deletion the token that came in its place.

    >>> changed_positions([1, 2, 9, 4, 5], [1, 2, 3, 4, 5])     # a replacement
    [2]
    >>> changed_positions([1, 2, 4, 5], [1, 2, 3, 4, 5])        # a deletion: the token after it
    [2]
    >>> changed_positions([1, 2, 3, 4, 5], [1, 2, 3, 4, 5])
    []
    """
    ops = difflib.SequenceMatcher(None, list(unchanged), list(output), autojunk=False).get_opcodes()
    out: set[int] = set()
    for tag, _, _, j1, j2 in ops:
        if tag == "equal":
            continue
        out.update(range(j1, j2) if j2 > j1 else ([j1] if j1 < len(output) else []))
    return sorted(out)


def confidence_of(logits: np.ndarray, chosen: Sequence[int]) -> EditConfidence:
    """``logits`` [n, vocab]: the distributions that chose ``chosen`` [n] (the changed tokens).

    >>> c = confidence_of(np.array([[0.0, 2.0, 1.0], [0.0, 0.0, 5.0]]), [1, 2])
    >>> round(c.min_margin, 3), round(c.mean_margin, 3), c.tokens
    (1.0, 3.0, 2)
    """
    x = np.asarray(logits, dtype=np.float64)
    ids = np.asarray(chosen, dtype=np.int64)
    rows = np.arange(len(ids))
    top = x[rows, ids]
    rest = x.copy()
    rest[rows, ids] = -np.inf
    margin = top - rest.max(axis=-1)
    z = x - x.max(axis=-1, keepdims=True)
    prob = np.exp(top - x.max(axis=-1)) / np.exp(z).sum(axis=-1)
    return EditConfidence(
        float(margin.min()), float(margin.mean()), float(prob.min()), float(prob.mean()), len(ids)
    )
