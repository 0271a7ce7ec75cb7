"""A static lookup datastore: a large, fixed corpus of token ids (a workspace, the standard library,
installed packages) that prompt lookup consults after the open buffers, for code with nothing to copy
from them (retrieval drafting, as REST does from a code datastore).

Compact and built once: the corpus's documents are concatenated into one ``int32`` array, each
followed by a separator (-1), and a suffix array (``int32`` positions) sorts every position by its
next ``depth`` tokens: 8 bytes a token, no per-n-gram Python objects (an ``NgramIndex`` costs far more
per token; it suits a few open buffers, not a workspace). Built by prefix doubling in numpy
(``log2(depth)`` sorts); saved as two ``.npy`` files that load memory-mapped, so opening one costs
next to nothing and its pages are read as lookups touch them.

Lookup (``match``): the longest tail of the context (``min_n`` .. ``max_n`` tokens, at most ``depth``)
that occurs with a continuation, found by binary search in the suffix array. A tail of n tokens
occurs only where its last n - 1 tokens do, so the longest length that occurs is found by bisection
over n (a few range searches, not one per length). All occurrences of the tail are its continuations; the proposal
walks them by counts: the most frequent next token, then the most frequent next token among the
occurrences that continued with it, and so on, stopping where the most frequent token's share of the
occurrences left falls below ``min_share`` (several continuations disagree: a proposal there is a
guess) or the corpus's document ends. ``candidates`` gives the several continuations with their
counts, best first. Proposals are point masses; the decode loop verifies them, so a datastore never
changes the output, only how many target passes it takes.

>>> ds = Datastore.build([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 3, 4, 6]], depth=4)
>>> m = ds.match([9, 1, 2, 3], k=3)
>>> (m.n, m.tokens)  # "1 2 3" occurs three times, continued by 4 twice: 4 wins; then 6 ends it
(3, [4, 6])
>>> [(c.tokens, c.count) for c in ds.candidates([9, 1, 2, 3], k=3, m=2)]
[([4, 6], 2), ([5], 1)]
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from specls.decoder.ngram import LookupMatch

log = logging.getLogger(__name__)

SEPARATOR = -1  # between documents: no match or continuation crosses it
FORMAT = 1  # bumped when the saved layout changes (an old datastore is then rebuilt, not misread)
_TOKENS_FILE = "tokens.npy"
_SUFFIXES_FILE = "suffixes.npy"
_META_FILE = "datastore.json"


@dataclass(frozen=True)
class StaticLookup:
    """How a datastore proposes."""

    min_n: int = 2  # a one-token tail matches almost anywhere in a large corpus: no proposal
    max_n: int = 16  # (at most the datastore's depth)
    # stop the continuation where its most frequent next token has less than this share of the
    # occurrences left: there the continuations disagree and the proposal would be a guess
    min_share: float = 0.5
    # occurrences a proposal is counted over (a very common tail: an even sample of them)
    max_occurrences: int = 4096


DEFAULT_STATIC_LOOKUP = StaticLookup()


@dataclass(frozen=True)
class Candidate:
    """One continuation of the matched tail: its tokens, and how many occurrences of the tail went on
    with its first token (``count``) out of ``total``."""

    n: int
    position: int  # in the datastore's token array: where one supporting occurrence continues
    tokens: list[int]
    count: int
    total: int


@dataclass(frozen=True)
class DatastoreStats:
    """What a datastore holds and costs (``--stats``, ``specls datastore build``)."""

    name: str
    documents: int
    tokens: int
    nbytes: int
    depth: int
    build_s: float

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "documents": self.documents,
            "tokens": self.tokens,
            "mib": round(self.nbytes / 2**20, 1),
            "depth": self.depth,
            "build_s": round(self.build_s, 2),
        }


def concatenate(
    docs: Iterable[Sequence[int] | np.ndarray], max_tokens: int | None = None
) -> tuple[np.ndarray, int]:
    """The documents' tokens, each followed by ``SEPARATOR``, as one int32 array, and how many
    documents it holds; documents past ``max_tokens`` tokens in all are left out."""
    parts: list[np.ndarray] = []
    total = 0
    for doc in docs:
        arr = np.asarray(doc, dtype=np.int32)
        if max_tokens is not None and total + arr.size + 1 > max_tokens:
            break
        parts.append(np.append(arr, np.int32(SEPARATOR)))
        total += arr.size + 1
    if not parts:
        return np.zeros(0, dtype=np.int32), 0
    return np.concatenate(parts), len(parts)


def suffix_array(tokens: np.ndarray, depth: int) -> np.ndarray:
    """Positions of ``tokens`` sorted by their next ``depth`` tokens (a shorter suffix, or one that
    reaches a separator, sorts before its extensions, as Python compares tuples). Prefix doubling:
    each round sorts by twice as many tokens as the last.

    >>> suffix_array(np.array([3, 1, 3, 1, -1], dtype=np.int32), 4).tolist()
    [4, 3, 1, 2, 0]
    """
    n = int(tokens.size)
    if n == 0:
        return np.zeros(0, dtype=np.int32)
    rank = tokens.astype(np.int64) + 2  # a separator ranks 1, past the end 0: both before any token
    order = np.argsort(rank, kind="stable")
    h = 1
    while h < depth:
        second = np.zeros(n, dtype=np.int64)
        second[: n - h] = rank[h:]
        key = rank * (int(rank.max()) + 1) + second
        order = np.argsort(key, kind="stable")
        sorted_key = key[order]
        change = np.ones(n, dtype=bool)
        change[1:] = sorted_key[1:] != sorted_key[:-1]
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.cumsum(change)
        h *= 2
        if int(rank.max()) == n:  # every suffix already apart
            break
    dtype = np.int32 if n < 2**31 else np.int64
    return order.astype(dtype)


class Datastore:
    """A corpus of token ids with its suffix array (see the module docstring). Immutable and safe to
    read from any thread."""

    def __init__(
        self,
        tokens: np.ndarray,
        suffixes: np.ndarray,
        depth: int,
        name: str = "datastore",
        documents: int = 0,
        build_s: float = 0.0,
    ) -> None:
        if tokens.shape != suffixes.shape:
            raise ValueError(f"tokens {tokens.shape} and suffixes {suffixes.shape} differ in length")
        self.tokens = tokens
        self.suffixes = suffixes
        self.depth = depth
        self.name = name
        self.documents = documents
        self.build_s = build_s

    @classmethod
    def build(
        cls,
        docs: Iterable[Sequence[int] | np.ndarray],
        depth: int = 16,
        name: str = "datastore",
        max_tokens: int | None = None,
    ) -> Datastore:
        """A datastore over ``docs`` (token id lists), sorted to ``depth`` tokens; documents past
        ``max_tokens`` tokens in all are left out."""
        if depth < 1:
            raise ValueError(f"depth must be at least 1, not {depth}")
        t0 = time.perf_counter()
        tokens, documents = concatenate(docs, max_tokens)
        suffixes = suffix_array(tokens, depth)
        return cls(tokens, suffixes, depth, name, documents, time.perf_counter() - t0)

    def __len__(self) -> int:
        return int(self.tokens.size)

    @property
    def nbytes(self) -> int:
        return int(self.tokens.nbytes + self.suffixes.nbytes)

    def stats(self) -> DatastoreStats:
        return DatastoreStats(self.name, self.documents, len(self), self.nbytes, self.depth, self.build_s)

    # -- saving and loading --------------------------------------------------------------------

    def save(self, directory: Path, meta: dict[str, object] | None = None) -> None:
        """Write the datastore into ``directory`` (created), ``meta`` kept beside it."""
        directory.mkdir(parents=True, exist_ok=True)
        np.save(directory / _TOKENS_FILE, self.tokens)
        np.save(directory / _SUFFIXES_FILE, self.suffixes)
        info = {**(meta or {}), "format": FORMAT, **self.stats().as_dict()}
        (directory / _META_FILE).write_text(json.dumps(info, indent=2))

    @classmethod
    def load(cls, directory: Path, name: str | None = None) -> Datastore:
        """Open a saved datastore, memory-mapped. Raises ValueError for one that is missing or of
        another format."""
        try:
            meta = json.loads((directory / _META_FILE).read_text())
            tokens = np.load(directory / _TOKENS_FILE, mmap_mode="r")
            suffixes = np.load(directory / _SUFFIXES_FILE, mmap_mode="r")
        except (OSError, ValueError) as exc:
            raise ValueError(f"{directory}: not a datastore ({exc})") from exc
        if meta.get("format") != FORMAT:
            raise ValueError(
                f"{directory}: datastore format {meta.get('format')}, this version reads {FORMAT}"
            )
        return cls(
            tokens,
            suffixes,
            int(meta["depth"]),
            name or str(meta.get("name", directory.name)),
            int(meta.get("documents", 0)),
            float(meta.get("build_s", 0.0)),
        )

    # -- lookup --------------------------------------------------------------------------------

    def _key(self, i: int, n: int) -> list[int]:
        start = int(self.suffixes[i])
        return self.tokens[start : start + n].tolist()

    def occurrences(self, tail: Sequence[int]) -> tuple[int, int]:
        """The range [lo, hi) of the suffix array whose suffixes start with ``tail`` (at most
        ``depth`` tokens: the array is sorted that far)."""
        key = [int(t) for t in tail]
        n = len(key)
        if not 0 < n <= self.depth:
            return 0, 0
        lo, hi = 0, len(self)
        while lo < hi:  # the first suffix >= key
            mid = (lo + hi) // 2
            if self._key(mid, n) < key:
                lo = mid + 1
            else:
                hi = mid
        first = lo
        hi = len(self)
        while lo < hi:  # the first suffix that does not start with key
            mid = (lo + hi) // 2
            if self._key(mid, n) == key:
                lo = mid + 1
            else:
                hi = mid
        return first, lo

    def _longest(self, context: Sequence[int], lookup: StaticLookup) -> tuple[int, int, int]:
        """The longest tail that occurs with a continuation: (n, lo, hi); n = 0 for none. A tail of n
        tokens occurs only where its last n - 1 do, so the longest that occurs is found by bisection."""
        lo_n, hi_n = max(1, lookup.min_n), min(lookup.max_n, self.depth, len(context))
        found: dict[int, tuple[int, int]] = {}
        a, b = lo_n, hi_n  # binary search for the longest tail that occurs: occurring is monotone in n
        while a <= b:
            mid = (a + b) // 2
            found[mid] = self.occurrences(context[len(context) - mid :])
            if found[mid][0] < found[mid][1]:
                a = mid + 1
            else:
                b = mid - 1
        for n in range(b, lo_n - 1, -1):  # the longest with a continuation (almost always the first)
            lo, hi = found[n] if n in found else self.occurrences(context[len(context) - n :])
            if self._continues(lo, hi, n):
                return n, lo, hi
        return 0, 0, 0

    def _continues(self, lo: int, hi: int, n: int) -> bool:
        ends = self.suffixes[lo:hi].astype(np.int64) + n
        ends = ends[ends < len(self)]
        return bool(ends.size) and bool(np.any(self.tokens[ends] != SEPARATOR))

    def _positions(self, lo: int, hi: int, n: int, lookup: StaticLookup) -> np.ndarray:
        """Where the occurrences in [lo, hi) continue (an even sample of a very common tail's)."""
        if hi - lo > lookup.max_occurrences:
            picks = np.linspace(lo, hi - 1, lookup.max_occurrences).astype(np.int64)
            starts = np.asarray(self.suffixes[picks], dtype=np.int64)
        else:
            starts = np.asarray(self.suffixes[lo:hi], dtype=np.int64)
        return np.sort(starts + n)

    def _walk(self, positions: np.ndarray, k: int, min_share: float) -> list[int]:
        """The continuation by counts from ``positions`` (see the module docstring)."""
        out: list[int] = []
        size = len(self)
        for j in range(k):
            at = positions + j
            at = at[at < size]
            nxt = np.asarray(self.tokens[at])
            keep = nxt != SEPARATOR
            if not np.any(keep):
                break
            values, counts = np.unique(nxt[keep], return_counts=True)
            best = int(np.argmax(counts))
            if j > 0 and counts[best] < min_share * int(keep.sum()):
                break
            out.append(int(values[best]))
            positions = at[keep][nxt[keep] == values[best]] - j
        return out

    def candidates(
        self, context: Sequence[int], k: int, m: int = 4, lookup: StaticLookup = DEFAULT_STATIC_LOOKUP
    ) -> list[Candidate]:
        """Up to ``m`` continuations of the longest matched tail, one per distinct next token, most
        frequent first (ties: the smaller token id), each walked on by counts up to ``k`` tokens."""
        if k <= 0 or not context or len(self) == 0:
            return []
        n, lo, hi = self._longest(context, lookup)
        if n == 0:
            return []
        positions = self._positions(lo, hi, n, lookup)
        positions = positions[positions < len(self)]
        first = np.asarray(self.tokens[positions])
        keep = first != SEPARATOR
        positions, first = positions[keep], first[keep]
        values, counts = np.unique(first, return_counts=True)
        ranked = sorted(zip(counts.tolist(), values.tolist(), strict=True), key=lambda cv: (-cv[0], cv[1]))
        out = []
        for count, value in ranked[: max(1, m)]:
            support = positions[first == value]
            tokens = self._walk(support, k, lookup.min_share)
            out.append(Candidate(n, int(support[0]), tokens, int(count), int(first.size)))
        return out

    def match(
        self, context: Sequence[int], k: int, lookup: StaticLookup = DEFAULT_STATIC_LOOKUP
    ) -> LookupMatch | None:
        """The best continuation by counts as a ``LookupMatch`` (source and doc id: this datastore's
        name), or None (no tail matched, or its first token has less than ``min_share``)."""
        best = self.candidates(context, k, 1, lookup)
        if not best or not best[0].tokens:
            return None
        c = best[0]
        if c.count < lookup.min_share * c.total:  # even the first token is a guess
            return None
        return LookupMatch(self.name, self.name, c.n, c.position, c.tokens)


class StaticSources:
    """The static lookup sources of an engine, in the order prompt lookup consults them (the
    workspace, then the datastore); each may arrive later (a background build) or be replaced.
    Thread-safe: lookups read a snapshot."""

    def __init__(self, lookup: StaticLookup = DEFAULT_STATIC_LOOKUP, order: Sequence[str] = ()) -> None:
        self.lookup = lookup
        self._lock = threading.Lock()
        self._sources: dict[str, Datastore] = {}
        self._order: list[str] = list(order)  # slots consulted first to last, whenever each arrives

    def set(self, slot: str, store: Datastore | None) -> None:
        """Put ``store`` in ``slot`` (None removes it); a new slot is consulted after the others."""
        with self._lock:
            if store is None:
                self._sources.pop(slot, None)
                return
            if slot not in self._order:
                self._order.append(slot)
            self._sources[slot] = store

    def snapshot(self) -> list[Datastore]:
        with self._lock:
            return [self._sources[s] for s in self._order if s in self._sources]

    def match(self, context: Sequence[int], k: int) -> LookupMatch | None:
        """The first source's match, in order (see ``Datastore.match``)."""
        for store in self.snapshot():
            m = store.match(context, k, self.lookup)
            if m is not None:
                return m
        return None

    def stats(self) -> dict[str, object]:
        with self._lock:
            return {s: self._sources[s].stats().as_dict() for s in self._order if s in self._sources}
