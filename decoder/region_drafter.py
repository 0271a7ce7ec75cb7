"""The region drafter: for a next edit, the region being rewritten is the draft.

A next edit rewrites a region of which most lines stay as they are, so the model's output copies long
runs of the region. The drafter keeps a pointer into the region's token ids: while the output follows
the region it proposes the region's continuation from the pointer; once the output diverges (the
edit itself) it waits until the last ``min_match`` generated tokens occur in the region again, moves
the pointer there (the nearest match at or after the point of divergence; failing that, the nearest
before it: a duplicated line copies earlier tokens) and proposes again. Proposals are as long as the
loop asks: an unchanged region is accepted in a few passes.

``propose_from_region`` is the whole policy as a pure function; ``RegionDrafter`` is the ``Drafter``
that carries its pointer between passes. Token ids only: which text the region is (the output the
layout expects when nothing changes, end marker included) is the caller's.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
from specls.decoder.api import DecodeSettings, Drafter
from specls.decoder.ngram import common_prefix_len

log = logging.getLogger(__name__)

# Three tokens: a match of one or two tokens (an indent, ")\n") occurs all over a region and would
# realign to the wrong place; three rarely does.
DEFAULT_MIN_MATCH = 3


def _aligned(region: Sequence[int], generated: Sequence[int], pointer: int, min_match: int) -> bool:
    """Whether the output's tail is the region's tokens just before ``pointer``."""
    if not generated:
        return True
    m = min(min_match, pointer, len(generated))
    return m >= 1 and list(generated[-m:]) == list(region[pointer - m : pointer])


def _realign(region: Sequence[int], generated: Sequence[int], anchor: int, min_match: int) -> int | None:
    """Where the region continues the output: the end of the match of the output's last ``min_match``
    tokens that starts nearest at or after ``anchor``, else the nearest one before it; None when the
    tail occurs nowhere in the region."""
    if min_match < 1 or len(generated) < min_match or len(region) < min_match:
        return None
    tail = list(generated[-min_match:])
    ids = np.asarray(region, dtype=np.int64)
    # starts where the first tail token occurs, then the rest of the tail checked there
    starts = np.flatnonzero(ids[: len(ids) - min_match + 1] == tail[0]).tolist()
    hits = [s for s in starts if list(region[s : s + min_match]) == tail]
    if not hits:
        return None
    after = [s for s in hits if s >= anchor]
    start = after[0] if after else hits[-1]
    return start + min_match


def propose_from_region(
    region: Sequence[int],
    generated: Sequence[int],
    pointer_hint: int,
    k: int,
    min_match: int = DEFAULT_MIN_MATCH,
) -> tuple[list[int], int]:
    """Up to ``k`` region tokens to propose after ``generated``, and the pointer they start at.

    ``pointer_hint``: the region position the output has reached as far as it followed the region
    (0 at the start; the point of divergence after an edit). While the output's tail equals the
    region's tokens before the hint, the proposal is ``region[hint : hint + k]``. Otherwise the last
    ``min_match`` generated tokens are looked up in the region: the match nearest at or after the
    hint (else the nearest before it) moves the pointer to the match's end. No match: no proposal,
    and the hint comes back unchanged (the divergence point stays the anchor of the next look-up).

    Worked example, region [1, 2, 3, 4, 5, 6, 7, 8], min_match 2:

    >>> region = [1, 2, 3, 4, 5, 6, 7, 8]
    >>> propose_from_region(region, [], 0, 4, 2)            # the start: the region itself
    ([1, 2, 3, 4], 0)
    >>> propose_from_region(region, [1, 2, 3], 3, 4, 2)     # output followed the region to 3
    ([4, 5, 6, 7], 3)
    >>> propose_from_region(region, [1, 2, 3, 9], 3, 4, 2)  # diverged (9 for 4): no 2-token match yet
    ([], 3)
    >>> propose_from_region(region, [1, 2, 3, 9, 5], 3, 4, 2)  # Not [4, 5, ...]: [9, 5] is no match either
    ([], 3)
    >>> propose_from_region(region, [1, 2, 3, 9, 5, 6], 3, 4, 2)  # [5, 6] matches at 4: realigned
    ([7, 8], 6)
    """
    if k <= 0 or not region:
        return [], pointer_hint
    pointer = min(max(pointer_hint, 0), len(region))
    if not _aligned(region, generated, pointer, min_match):
        found = _realign(region, generated, pointer, min_match)
        if found is None:
            return [], pointer_hint
        pointer = found
    return [int(t) for t in region[pointer : pointer + k]], pointer


class RegionDrafter(Drafter):
    """Proposes the rewritten region's continuation from the current region (``propose_from_region``).

    ``region``: the token ids the model outputs when it leaves the region unchanged; ``prompt_len``:
    how many tokens of the loop's context are the prompt (what comes after is the output). Between
    proposals the pointer advances by how far the new output followed the region, so the hint given
    to ``propose_from_region`` is the point of divergence after an edit. Point-mass proposals;
    ``reset`` for each request (``begin`` rewinds the pointer to the region's start).

    >>> d = RegionDrafter([5, 6, 7, 8, 9], prompt_len=2)
    >>> d.propose([0, 1], 3)
    [5, 6, 7]
    >>> d.propose([0, 1, 5, 6, 7, 8], 3)   # all accepted, and the bonus token was the region's next
    [9]
    """

    name = "region"

    def __init__(self, region: Sequence[int], prompt_len: int, min_match: int = DEFAULT_MIN_MATCH) -> None:
        if min_match < 1:
            raise ValueError(f"min_match must be at least 1, got {min_match}")
        self.min_match = min_match
        self.reset(region, prompt_len)

    def reset(self, region: Sequence[int], prompt_len: int) -> None:
        """A new request: its region and where its output starts in the loop's context."""
        if prompt_len < 0:
            raise ValueError(f"prompt_len must not be negative, got {prompt_len}")
        self.region = [int(t) for t in region]
        self.prompt_len = prompt_len
        self._rewind()

    def _rewind(self) -> None:
        self.pointer = 0  # where the last proposal started in the region
        self._seen = 0  # output tokens when it was made
        self._n = 0
        self.realignments = 0  # proposals made after a divergence (for stats and tests)
        self.continued = False  # the last proposal went on where the output followed the region

    def begin(self, settings: DecodeSettings) -> None:
        self._rewind()

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        generated = context[self.prompt_len :]
        new = generated[self._seen :]
        # how far the output since the last proposal followed the region from its pointer
        hint = self.pointer + common_prefix_len(new, self.region[self.pointer : self.pointer + len(new)])
        aligned = hint - self.pointer == len(new)
        tokens, pointer = propose_from_region(self.region, generated, hint, k, self.min_match)
        if tokens and not aligned and pointer != hint:
            self.realignments += 1
        self.continued = bool(tokens) and aligned and bool(new)
        self.pointer, self._seen, self._n = pointer, len(generated), len(tokens)
        return tokens

    def observe(self, n_accepted: int, n_verified: int) -> None:
        pass  # the next context says what was committed; the pointer follows it there

    def proposal_probs(self) -> np.ndarray | None:
        return None

    def proposal_sources(self) -> Sequence[str]:
        return [self.name] * self._n
