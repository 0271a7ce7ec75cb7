"""The region drafter: pointer alignment, realignment after an edit, and the loop's invariant with it
(output == plain greedy, whatever the region)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from specls.decoder.api import DecodeSettings, Drafter, KVCache
from specls.decoder.loop import generate
from specls.decoder.region_drafter import RegionDrafter, propose_from_region

REGION = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]

# (generated, pointer_hint, k, min_match) -> (proposal, new pointer)
CASES = [
    # the start: the region from its first token
    (([], 0, 4, 3), ([10, 11, 12, 13], 0)),
    # Not [10, ...]: the output followed the region to 3, the hint says so
    (([10, 11, 12], 3, 4, 3), ([13, 14, 15, 16], 3)),
    # k caps the proposal; the region's end caps it too
    (([10, 11, 12], 3, 2, 3), ([13, 14], 3)),
    ((REGION[:8], 8, 5, 3), ([18, 19], 8)),
    # the whole region was output: nothing left to propose
    ((REGION, 10, 5, 3), ([], 10)),
    # Not [13, 14, ...]: the output diverged at 3 (99 for 13) and no 3-token match exists yet
    (([10, 11, 12, 99], 3, 4, 3), ([], 3)),
    # Not [15, ...]: the tail [99, 14, 15] is no match; [14, 15] is too short for min_match 3
    (([10, 11, 12, 99, 14, 15], 3, 4, 3), ([], 3)),
    # a substitution (99 for 13): the output took up the region again at 14; realigned after 16
    (([10, 11, 12, 99, 14, 15, 16], 3, 4, 3), ([17, 18, 19], 7)),
    # an insertion (98, 99 before 13): the output goes on with 13, 14, 15; realigned at 6
    (([10, 11, 12, 98, 99, 13, 14, 15], 3, 3, 3), ([16, 17, 18], 6)),
    # a deletion (13, 14, 15 dropped): the output goes on with 16, 17, 18
    (([10, 11, 12, 16, 17, 18], 3, 4, 3), ([19], 9)),
    # Not [13, ...] (the nearest before the divergence): a match at or after the hint wins
    (([1, 2, 3], 4, 2, 3), ([], 4)),
]


@pytest.mark.parametrize("args, expected", CASES)
def test_propose_from_region(args: tuple[list[int], int, int, int], expected: tuple[list[int], int]) -> None:
    generated, hint, k, min_match = args
    assert propose_from_region(REGION, generated, hint, k, min_match) == expected


def test_realignment_prefers_the_nearest_match_after_the_pointer() -> None:
    region = [7, 8, 9, 1, 7, 8, 9, 2, 7, 8, 9, 3]
    # Not [1, ...] (the first occurrence) nor [3] (the last): [7, 8, 9] nearest at or after 4 ends at 7
    assert propose_from_region(region, [5, 7, 8, 9], 4, 2, 3) == ([2, 7], 7)
    # nothing starts at or after 9: the nearest before it (a duplicated line copies earlier tokens);
    # Not [1, 7] (the first occurrence)
    assert propose_from_region(region, [5, 7, 8, 9], 9, 2, 3) == ([3], 11)
    # Not the hint's region tokens: a tail shorter than min_match cannot realign
    assert propose_from_region(region, [7, 8], 9, 2, 3) == ([], 9)


def test_nothing_to_propose_from_nothing() -> None:
    assert propose_from_region([], [1, 2, 3], 0, 8, 3) == ([], 0)
    assert propose_from_region(REGION, [], 0, 0, 3) == ([], 0)


def test_the_drafter_follows_the_output_through_an_edit() -> None:
    prompt = [1, 2]
    d = RegionDrafter(REGION, prompt_len=len(prompt))
    assert isinstance(d, Drafter)
    d.begin(DecodeSettings())
    assert d.propose(prompt, 4) == [10, 11, 12, 13]
    assert list(d.proposal_sources()) == ["region"] * 4
    # 10, 11, 12 accepted, then the target's 99 instead of 13: diverged, no match yet
    assert d.propose([*prompt, 10, 11, 12, 99], 4) == []
    assert list(d.proposal_sources()) == []
    d.observe(0, 0)
    assert d.propose([*prompt, 10, 11, 12, 99, 14], 4) == []
    assert d.propose([*prompt, 10, 11, 12, 99, 14, 15], 4) == []
    # Not []: [14, 15, 16] is the region again (the hint stayed at the divergence, 3)
    assert d.propose([*prompt, 10, 11, 12, 99, 14, 15, 16], 4) == [17, 18, 19]
    assert d.realignments == 1
    assert d.proposal_probs() is None
    d.begin(DecodeSettings())  # a new generation starts at the region's start again
    assert d.propose(prompt, 2) == [10, 11]
    with pytest.raises(ValueError):
        RegionDrafter(REGION, prompt_len=0, min_match=0)


# ---- the loop with a fake target -----------------------------------------------------------------


class TinyLM:
    """Deterministic logits from the last two tokens: a seeded table per position back."""

    def __init__(self, vocab: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.vocab = vocab
        self.tables = rng.standard_normal((2, vocab, vocab))

    def row(self, tokens: Sequence[int], pos: int) -> np.ndarray:
        out = self.tables[0, tokens[pos]].copy()
        if pos >= 1:
            out += self.tables[1, tokens[pos - 1]]
        return out

    def greedy(self, prompt: Sequence[int], n: int) -> list[int]:
        seq = list(prompt)
        for _ in range(n):
            seq.append(int(np.argmax(self.row(seq, len(seq) - 1))))
        return seq[len(prompt) :]


class TinyCache(KVCache):
    """An exact cache: the "KV" is the token list."""

    def __init__(self, lm: TinyLM) -> None:
        self.lm = lm
        self.tokens: list[int] = []
        self.passes = 0

    @property
    def length(self) -> int:
        return len(self.tokens)

    def forward(self, ids: Sequence[int]) -> np.ndarray:
        start = len(self.tokens)
        self.tokens.extend(int(t) for t in ids)
        self.passes += 1
        return np.stack([self.lm.row(self.tokens, start + i) for i in range(len(ids))]).astype(np.float32)

    def truncate(self, n: int) -> None:
        del self.tokens[n:]


def _long(max_new_tokens: int, k: int) -> DecodeSettings:
    """Settings that let every pass draft ``k`` tokens."""
    return DecodeSettings(max_new_tokens=max_new_tokens, draft_length=k)


LONG = _long(120, 48)


def random_case(
    seed: int, vocab: int, prompt_len: int, n: int
) -> tuple[np.random.Generator, TinyLM, list[int], list[int]]:
    """A seeded TinyLM, a random prompt of ``prompt_len`` tokens and its ``n`` tokens of plain greedy
    output; the generator that drew the prompt goes on for the test's own draws."""
    rng = np.random.default_rng(seed)
    lm = TinyLM(vocab, seed)
    prompt = [int(t) for t in rng.integers(0, vocab, size=prompt_len)]
    return rng, lm, prompt, lm.greedy(prompt, n)


def _mutate(tokens: list[int], rng: np.random.Generator, vocab: int, n_edits: int) -> list[int]:
    """The tokens with a few substitutions, insertions and deletions."""
    out = list(tokens)
    for _ in range(n_edits):
        i = int(rng.integers(0, max(1, len(out))))
        kind = int(rng.integers(0, 3))
        if kind == 0 and out:
            out[i] = int(rng.integers(0, vocab))
        elif kind == 1:
            out[i:i] = [int(t) for t in rng.integers(0, vocab, size=int(rng.integers(1, 4)))]
        elif out:
            del out[i : i + int(rng.integers(1, 4))]
    return out


@pytest.mark.parametrize("seed", range(12))
def test_output_is_plain_greedy_whatever_the_region(seed: int) -> None:
    vocab = 24
    rng, lm, prompt, plain = random_case(seed, vocab, 12, LONG.max_new_tokens)
    regions = [
        [int(t) for t in rng.integers(0, vocab, size=80)],  # unrelated
        _mutate(plain, rng, vocab, 4),  # the output with a few edits
        plain[:40],  # the output cut short
        [],
    ]
    for region in regions:
        cache = TinyCache(lm)
        drafter = RegionDrafter(region, prompt_len=len(prompt))
        result = generate(cache, prompt, drafter, LONG, frozenset())
        assert result.tokens == plain, f"seed {seed}, region of {len(region)}"
        assert result.accepted <= result.drafted


def test_an_unchanged_region_is_accepted_in_a_few_passes() -> None:
    vocab = 40
    lm = TinyLM(vocab, 7)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    settings = _long(240, 64)
    plain = lm.greedy(prompt, settings.max_new_tokens)
    drafter = RegionDrafter(plain, prompt_len=len(prompt))
    result = generate(TinyCache(lm), prompt, drafter, settings, frozenset())
    assert result.tokens == plain
    # Not ~1 token per pass: each pass takes a whole long proposal plus the bonus token
    assert len(result.tokens) / result.target_passes >= 10, result.target_passes
    assert result.per_drafter["region"].accepted == result.accepted


def test_an_edited_region_still_drafts_long_runs() -> None:
    vocab = 40
    lm = TinyLM(vocab, 11)
    prompt = [2, 7, 1, 8, 2, 8]
    plain = lm.greedy(prompt, LONG.max_new_tokens)
    region = list(plain)
    region[30] = (region[30] + 1) % vocab  # the output differs from the region at one token
    result = generate(TinyCache(lm), prompt, RegionDrafter(region, len(prompt)), LONG, frozenset())
    assert result.tokens == plain
    # Not one pass per token after the edit: the drafter realigns a few tokens later
    assert len(result.tokens) / result.target_passes >= 8, result.target_passes


def test_continued_says_whether_the_proposal_went_on_where_the_output_followed() -> None:
    d = RegionDrafter([1, 2, 3, 4, 5, 6, 7, 8], prompt_len=0, min_match=2)
    d.propose([], 2)
    assert not d.continued  # the first proposal: nothing followed yet
    d.propose([1, 2, 3], 2)
    assert d.continued
    d.propose([1, 2, 3, 9, 5, 6], 2)  # diverged, realigned at 6
    assert not d.continued and d.realignments == 1
    assert d.propose([1, 2, 3, 9, 5, 6, 7, 8], 2) == [] and not d.continued  # the region's end: no proposal
