"""The incremental n-gram index: longest and most recent match, across buffers, updates, removal."""

from __future__ import annotations

import numpy as np
import pytest
from specls.decoder.ngram import NgramIndex, common_prefix_len, lookup


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ([], [1], 0),
        ([1, 2, 3], [1, 2, 3], 3),
        ([1, 2, 3], [1, 2], 2),
        ([1, 2, 3], [1, 9, 3], 1),
        ([4], [5], 0),
    ],
)
def test_common_prefix_len(a: list[int], b: list[int], expected: int) -> None:
    assert common_prefix_len(a, b) == expected


def test_longest_match_wins() -> None:
    index = NgramIndex(min_n=1, max_n=4)
    # [1, 2, 3] -> 9 early; [2, 3] -> 8 later (more recent but shorter)
    index.update("a", [1, 2, 3, 9, 9, 0, 2, 3, 8, 8])
    match = index.lookup([7, 1, 2, 3], k=2)
    assert match is not None
    assert match.tokens == [9, 9]  # Not [8, 8]
    assert match.n == 3


def test_most_recent_occurrence_wins_within_a_document() -> None:
    index = NgramIndex(min_n=2, max_n=3)
    index.update("a", [1, 2, 5, 5, 1, 2, 6, 6, 4])
    match = index.lookup([0, 1, 2], k=3)
    assert match is not None and match.tokens == [6, 6, 4]  # Not [5, 5, 1]


def test_occurrence_without_continuation_is_skipped() -> None:
    index = NgramIndex(min_n=2, max_n=2)
    index.update("a", [1, 2, 7, 1, 2])  # the last [1, 2] has nothing after it
    match = index.lookup([1, 2], k=4)
    assert match is not None and match.tokens == [7, 1, 2]  # Not None


def test_most_recently_updated_document_wins() -> None:
    index = NgramIndex(min_n=2, max_n=2)
    index.update("a", [1, 2, 7])
    index.update("b", [1, 2, 8])
    assert index.lookup([1, 2], k=1).tokens == [8]  # type: ignore[union-attr]  # Not [7]
    index.update("a", [1, 2, 7])  # touched again: now the most recent
    match = index.lookup([1, 2], k=1)
    assert match is not None and match.tokens == [7] and match.doc_id == "a"


def test_sources_are_ranked_per_length() -> None:
    context = NgramIndex(min_n=1, max_n=3, name="context")
    suffix = NgramIndex(min_n=1, max_n=3, name="suffix")
    docs = NgramIndex(min_n=1, max_n=3)
    context.update("ctx", [4, 3, 6, 4, 3])
    suffix.update("suffix", [4, 3, 7])
    docs.update("d", [5, 4, 3, 9])
    # length 3 ([5, 4, 3]) only in docs: the longest match wins over source order
    m = lookup([context, suffix, docs], [5, 4, 3], k=1)
    assert m is not None and (m.source, m.tokens) == ("docs", [9])  # Not ("context", [6])
    # length 2 everywhere: the first source wins
    m = lookup([context, suffix, docs], [0, 4, 3], k=1)
    assert m is not None and (m.source, m.tokens) == ("context", [6])
    m = lookup([suffix, docs], [0, 4, 3], k=1)
    assert m is not None and (m.source, m.tokens) == ("suffix", [7])


def test_remove_drops_the_documents_matches() -> None:
    index = NgramIndex(min_n=2, max_n=2)
    index.update("a", [1, 2, 7])
    index.update("b", [1, 2, 8])
    index.remove("b")
    assert index.lookup([1, 2], k=1).tokens == [7]  # type: ignore[union-attr]  # Not [8]
    index.remove("a")
    assert index.lookup([1, 2], k=1) is None
    index.remove("never-added")  # no error
    assert len(index) == 0


def _grams(index: NgramIndex, doc_id: str) -> list[dict[tuple[int, ...], list[int]]]:
    return [dict(g) for g in index._docs[doc_id].grams]  # internal structure, vs a rebuilt index


def test_incremental_updates_equal_a_rebuilt_index() -> None:
    rng = np.random.default_rng(0)
    index = NgramIndex(min_n=1, max_n=4)
    tokens = list(rng.integers(0, 12, 200))
    index.update("doc", tokens)
    for step in range(60):
        kind = step % 4
        pos = int(rng.integers(0, len(tokens) + 1))
        new_part = list(rng.integers(0, 12, int(rng.integers(0, 6))))
        if kind == 0:  # insert
            tokens = tokens[:pos] + new_part + tokens[pos:]
        elif kind == 1:  # delete
            tokens = tokens[:pos] + tokens[pos + 5 :]
        elif kind == 2:  # append (typing at the end)
            tokens = tokens + new_part
        else:  # replace
            tokens = tokens[:pos] + new_part + tokens[pos + len(new_part) :]
        first_changed = index.update("doc", tokens)
        rebuilt = NgramIndex(min_n=1, max_n=4)
        rebuilt.update("doc", tokens)
        assert _grams(index, "doc") == _grams(rebuilt, "doc")
        assert index.tokens("doc") == [int(t) for t in tokens]
        assert first_changed <= len(tokens)
        for _ in range(5):
            end = int(rng.integers(1, len(tokens) + 1))
            ctx = tokens[max(0, end - 6) : end]
            assert index.lookup(ctx, 4) == rebuilt.lookup(ctx, 4)


def test_append_reindexes_only_the_tail() -> None:
    index = NgramIndex(min_n=2, max_n=3)
    tokens = list(range(100))
    index.update("doc", tokens)
    assert index.update("doc", tokens + [5, 6]) == 100  # diff starts at the old end. Not 0
    assert index.update("doc", tokens[:50] + [7] + tokens[51:]) == 50


def test_bad_configuration_is_rejected() -> None:
    with pytest.raises(ValueError):
        NgramIndex(min_n=3, max_n=2)
    index = NgramIndex()
    assert index.lookup([], 4) is None
    assert index.lookup([1, 2, 3], 0) is None
