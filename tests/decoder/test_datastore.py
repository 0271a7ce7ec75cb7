"""The static lookup datastore: its suffix array and lookups against brute force, saving and loading,
the static sources' order, and that drafting from it never changes the output (the loop's cache
invariants, with fakes)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from specls.decoder.api import DecodeSettings
from specls.decoder.datastore import (
    SEPARATOR,
    Datastore,
    StaticLookup,
    StaticSources,
    concatenate,
    suffix_array,
)
from specls.decoder.drafters import PromptLookupDrafter
from specls.decoder.loop import generate
from specls.decoder.ngram import LookupMatch, NgramIndex
from specls.decoder.planned import PlannedDrafter, PolicyState

from tests.decoder.test_loop import FULL, LENGTHS, PROMPT, REF, TARGET, CheckedCache


def _brute_sorted(tokens: np.ndarray, depth: int) -> list[tuple[int, ...]]:
    """Every position's next ``depth`` tokens, cut at a separator (inclusive), sorted."""
    keys = []
    for i in range(len(tokens)):
        key = tokens[i : i + depth].tolist()
        keys.append(tuple(key))
    return sorted(keys)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("depth", [1, 3, 8])
def test_suffix_array_sorts_every_position_by_its_next_depth_tokens(seed: int, depth: int) -> None:
    rng = random.Random(seed)
    docs = [[rng.randrange(4) for _ in range(rng.randrange(0, 30))] for _ in range(rng.randrange(1, 6))]
    tokens, n_docs = concatenate(docs)
    assert n_docs == len(docs)
    sa = suffix_array(tokens, depth)
    assert sorted(sa.tolist()) == list(range(len(tokens)))  # a permutation
    got = [tuple(tokens[i : i + depth].tolist()) for i in sa.tolist()]
    assert got == _brute_sorted(tokens, depth)


def _m(match: LookupMatch | None) -> LookupMatch:
    assert match is not None
    return match


def _brute_occurrences(docs: list[list[int]], tail: list[int]) -> list[int | None]:
    """The tokens right after each occurrence of ``tail`` inside a document (None past its end)."""
    out = []
    for doc in docs:
        for i in range(len(doc) - len(tail) + 1):
            if doc[i : i + len(tail)] == tail:
                out.append(doc[i + len(tail)] if i + len(tail) < len(doc) else None)
    return out


@pytest.mark.parametrize("seed", range(8))
def test_occurrences_and_the_first_candidate_agree_with_brute_force(seed: int) -> None:
    rng = random.Random(100 + seed)
    docs = [[rng.randrange(5) for _ in range(rng.randrange(5, 60))] for _ in range(4)]
    ds = Datastore.build(docs, depth=6)
    for _ in range(30):
        doc = rng.choice(docs)
        n = rng.randrange(1, 6)
        start = rng.randrange(0, len(doc) - n + 1)
        tail = doc[start : start + n]
        lo, hi = ds.occurrences(tail)
        nexts = _brute_occurrences(docs, tail)
        assert hi - lo == len(nexts)
        found = [t for t in nexts if t is not None]
        cands = ds.candidates(tail, k=1, m=10, lookup=StaticLookup(min_n=n, max_n=n))
        if not found:
            assert cands == []
            continue
        counts = {t: found.count(t) for t in set(found)}
        assert [c.tokens[0] for c in cands] == sorted(counts, key=lambda t: (-counts[t], t))
        assert [c.count for c in cands] == sorted(counts.values(), reverse=True)


def test_the_longest_tail_wins_and_a_one_token_tail_is_not_a_match() -> None:
    ds = Datastore.build([[7, 1, 2, 3, 4, 5], [9, 2, 3, 8, 8]], depth=8)
    assert _m(ds.match([0, 1, 2, 3], 2)).tokens == [4, 5]  # "1 2 3", not "2 3" (two continuations)
    assert _m(ds.match([0, 0, 2, 3], 1)).tokens in ([4], [8])
    assert ds.match([0, 0, 0, 3], 3) is None  # min_n 2: a one-token tail matches too much
    assert ds.match([0, 0, 0, 6], 3) is None


def test_no_match_or_continuation_crosses_a_document_boundary() -> None:
    ds = Datastore.build([[1, 2, 3], [4, 5, 6]], depth=8)
    assert ds.match([1, 2, 3], 4) is None  # "2 3" ends its document: nothing follows
    assert ds.match([2, 3, 4], 4) is None  # "3 4" only spans the boundary
    m = ds.match([8, 1, 2], 4)
    assert m is not None and m.tokens == [3]
    assert SEPARATOR not in m.tokens


def test_the_walk_stops_where_the_continuations_disagree() -> None:
    docs = [[1, 2, 3, 10 + i] for i in range(3)] + [[1, 2, 3, 10]]
    ds = Datastore.build(docs, depth=8)
    assert _m(ds.match([1, 2], 4)).tokens == [3, 10]  # 10 has 2 of 4: at the share
    strict = StaticLookup(min_share=0.6)
    assert _m(ds.match([1, 2], 4, strict)).tokens == [3]
    # a first token with too small a share is no proposal at all
    ds2 = Datastore.build([[1, 2, 5], [1, 2, 6], [1, 2, 7]], depth=4)
    assert ds2.match([1, 2], 3) is None
    assert [c.count for c in ds2.candidates([1, 2], 3)] == [1, 1, 1]


def test_max_tokens_leaves_whole_documents_out() -> None:
    ds = Datastore.build([[1, 2, 3], [4, 5, 6], [7, 8, 9]], max_tokens=8)
    assert ds.documents == 2 and len(ds) == 8
    assert ds.match([5, 6], 1) is None and _m(ds.match([4, 5], 1)).tokens == [6]


def test_save_and_load_memory_mapped(tmp_path: Path) -> None:
    ds = Datastore.build([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 3, 4]], depth=4, name="lib")
    ds.save(tmp_path / "store", {"tokenizer": "abc"})
    back = Datastore.load(tmp_path / "store")
    assert isinstance(back.tokens, np.memmap)
    assert back.name == "lib" and back.depth == 4 and back.documents == 3
    assert back.match([1, 2, 3], 2) == ds.match([1, 2, 3], 2)
    assert back.stats().tokens == ds.stats().tokens
    with pytest.raises(ValueError, match="not a datastore"):
        Datastore.load(tmp_path / "missing")


def test_static_sources_are_consulted_in_order() -> None:
    sources = StaticSources()
    assert sources.match([1, 2], 3) is None
    sources.set("workspace", Datastore.build([[1, 2, 3]], name="workspace"))
    sources.set("datastore", Datastore.build([[1, 2, 4], [5, 6, 7]], name="datastore"))
    assert _m(sources.match([1, 2], 3)).source == "workspace"
    assert _m(sources.match([5, 6], 3)).source == "datastore"
    sources.set("workspace", None)
    assert _m(sources.match([1, 2], 3)).source == "datastore"
    assert set(sources.stats()) == {"datastore"}
    ordered = StaticSources(order=("workspace", "datastore"))
    ordered.set("datastore", Datastore.build([[1, 2, 4]], name="datastore"))
    ordered.set("workspace", Datastore.build([[1, 2, 3]], name="workspace"))  # arrives later, still first
    assert _m(ordered.match([1, 2], 3)).source == "workspace"


def test_lookup_consults_static_sources_after_the_buffers() -> None:
    buffers = NgramIndex()
    buffers.update("open.py", [1, 2, 30, 31])
    static = StaticSources()
    static.set("datastore", Datastore.build([[1, 2, 40, 41], [7, 8, 50, 51]], name="datastore"))
    drafter = PromptLookupDrafter(buffers, static=static)
    assert _m(drafter.match([9, 1, 2], 2)).tokens == [30, 31]  # the open buffer first
    m = _m(drafter.match([9, 7, 8], 2))
    assert (m.source, m.tokens) == ("datastore", [50, 51])  # nothing open has it


def _static_with_reference() -> StaticSources:
    """A datastore holding pieces of the reference continuation, some corrupted (wrong proposals)."""
    docs = [REF[3:20], REF[10:30] + [60, 61, 62], [1, 2] + REF[25:40], REF[30:34] + [63] + REF[35:48]]
    static = StaticSources()
    static.set("datastore", Datastore.build(docs, depth=8, name="datastore"))
    return static


@pytest.mark.parametrize("length", list(LENGTHS))
@pytest.mark.parametrize("planned", [False, True])
def test_drafting_from_a_datastore_equals_plain_greedy(length: str, planned: bool) -> None:
    lookup = PromptLookupDrafter(NgramIndex(), static=_static_with_reference())
    drafter = PlannedDrafter(lookup, None, PolicyState()) if planned else lookup
    cache = CheckedCache(TARGET.new_cache(), FULL)
    result = generate(cache, PROMPT, drafter, LENGTHS[length], frozenset())
    assert result.tokens == REF
    assert cache.inner.tokens == FULL[: cache.length]
    assert result.accepted > 0  # it did draft from the datastore
    assert result.accepted + result.target_passes == len(REF)


def test_a_datastore_that_is_always_wrong_costs_passes_but_not_output() -> None:
    wrong = [
        [t for t in FULL[i : i + 6]] + [(FULL[i + 6] + 1) % 64] for i in range(len(PROMPT), len(FULL) - 7)
    ]
    static = StaticSources(StaticLookup(min_share=0.0))
    static.set("datastore", Datastore.build(wrong, depth=8))
    cache = CheckedCache(TARGET.new_cache(), FULL)
    result = generate(
        cache,
        PROMPT,
        PromptLookupDrafter(None, static=static),
        DecodeSettings(max_new_tokens=48),
        frozenset(),
    )
    assert result.tokens == REF
