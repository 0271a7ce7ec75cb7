"""An incremental n-gram index over the token ids of many documents, for prompt-lookup drafting.

Each document (keyed by id) keeps its tokens and, for every n in [min_n, max_n], a map from n-gram to
the ascending list of positions right after its occurrences (where a continuation starts).
``update(doc_id, tokens)`` diffs against the stored tokens and re-indexes only from the first changed
position to the end (entries after it sit at the tail of every list, so removal is a pop); appending
tokens, the common case while typing at the end or while decoding, costs O(new tokens).

Lookup: for n from max_n down to min_n, the last n tokens of the context are looked up; the first n
with any occurrence that has at least one token after it wins (longest match), and among occurrences
of that n the most recent wins: the latest position in the most recently updated document. Across
several indexes (``lookup(sources, ...)``) the sources are tried in the given order for each n, so the
caller ranks them (the prompt-lookup drafter: the current sequence first, then the suffix after the
cursor, then the open documents).
"""

from __future__ import annotations

import threading
from collections import OrderedDict, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    m = min(len(a), len(b))
    if m == 0:
        return 0
    if a[m - 1] == b[m - 1] and (list(a[:m]) if not isinstance(a, list) else a[:m]) == (
        list(b[:m]) if not isinstance(b, list) else b[:m]
    ):
        return m
    diff = np.flatnonzero(np.asarray(a[:m], dtype=np.int64) != np.asarray(b[:m], dtype=np.int64))
    return int(diff[0]) if diff.size else m


@dataclass(frozen=True)
class LookupMatch:
    """A match of the context's last ``n`` tokens: ``tokens`` follow it at ``position`` of ``doc_id``
    in source ``source`` (the name of the index it came from)."""

    source: str
    doc_id: str
    n: int
    position: int
    tokens: list[int]

    @property
    def guess(self) -> bool:
        """A match of the context's last token alone: right far less often than a longer one."""
        return self.n < 2


def _grams(tokens: list[int], n: int, start: int) -> list[tuple[int, ...]]:
    """The n-grams tokens[p - n : p] for p = start .. len(tokens) (start >= n)."""
    end = len(tokens)
    if start > end:
        return []
    return list(zip(*(tokens[start - n + j : end - n + j + 1] for j in range(n)), strict=True))


class _Doc:
    __slots__ = ("tokens", "grams")

    def __init__(self, n_sizes: int) -> None:
        self.tokens: list[int] = []
        # grams[n - min_n]: n-gram -> ascending positions right after its occurrences
        self.grams: list[defaultdict[tuple[int, ...], list[int]]] = [
            defaultdict(list) for _ in range(n_sizes)
        ]


class NgramIndex:
    """Thread-safe incremental n-gram index over many documents (see the module docstring)."""

    def __init__(self, min_n: int = 2, max_n: int = 4, name: str = "docs") -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.min_n = min_n
        self.max_n = max_n
        self.name = name
        self._docs: OrderedDict[str, _Doc] = OrderedDict()  # least -> most recently updated
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._docs)

    def __contains__(self, doc_id: object) -> bool:
        return doc_id in self._docs

    def tokens(self, doc_id: str) -> list[int]:
        with self._lock:
            doc = self._docs.get(doc_id)
            return list(doc.tokens) if doc is not None else []

    def update(self, doc_id: str, tokens: Sequence[int]) -> int:
        """Set a document's tokens; re-indexes from the first changed position. The document becomes
        the most recently updated one. Returns that first changed position."""
        with self._lock:
            doc = self._docs.get(doc_id)
            if doc is None:
                doc = _Doc(self.max_n - self.min_n + 1)
                self._docs[doc_id] = doc
            self._docs.move_to_end(doc_id)
            old = doc.tokens
            d = common_prefix_len(old, tokens)
            for grams, n in zip(doc.grams, range(self.min_n, self.max_n + 1), strict=True):
                # drop the grams ending after d (p > d), newest first: they are each list's tail
                for key in reversed(_grams(old, n, max(d + 1, n))):
                    positions = grams[key]
                    positions.pop()
                    if not positions:
                        del grams[key]
            del old[d:]
            old.extend(int(t) for t in tokens[d:])
            for grams, n in zip(doc.grams, range(self.min_n, self.max_n + 1), strict=True):
                start = max(d + 1, n)
                for p, key in enumerate(_grams(old, n, start), start):
                    grams[key].append(p)
            return d

    def remove(self, doc_id: str) -> None:
        with self._lock:
            self._docs.pop(doc_id, None)

    def clear(self) -> None:
        with self._lock:
            self._docs.clear()

    def find(self, tail: Sequence[int], k: int) -> LookupMatch | None:
        """The most recent occurrence of exactly ``tail`` (len(tail) in [min_n, max_n]) that has a
        continuation; up to ``k`` continuation tokens."""
        n = len(tail)
        if not self.min_n <= n <= self.max_n or k <= 0:
            return None
        key = tuple(int(t) for t in tail)
        with self._lock:
            for doc_id in reversed(self._docs):
                doc = self._docs[doc_id]
                positions = doc.grams[n - self.min_n].get(key)
                if not positions:
                    continue
                for p in reversed(positions):
                    if p < len(doc.tokens):
                        return LookupMatch(self.name, doc_id, n, p, doc.tokens[p : p + k])
        return None

    def lookup(
        self, context: Sequence[int], k: int, min_n: int = 1, max_n: int = 1 << 30
    ) -> LookupMatch | None:
        return lookup([self], context, k, min_n, max_n)


def lookup(
    sources: Sequence[NgramIndex], context: Sequence[int], k: int, min_n: int = 1, max_n: int = 1 << 30
) -> LookupMatch | None:
    """Longest match of the context's last n tokens (n from max_n down to min_n, each clamped to what
    the sources index); for each n the sources are tried in order, most recent occurrence first."""
    if k <= 0 or not sources:
        return None
    hi = min(max_n, len(context), max(s.max_n for s in sources))
    lo = max(1, min_n, min(s.min_n for s in sources))
    for n in range(hi, lo - 1, -1):
        tail = context[len(context) - n :]
        for source in sources:
            match = source.find(tail, k)
            if match is not None:
                return match
    return None
