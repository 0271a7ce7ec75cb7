"""The open buffers as prompt-lookup material: an ``NgramIndex`` over every buffer's tokens, fed from
the editor's full-text updates, with the policy that keeps a big re-index off the keystroke path.

Updates are only recorded (``update``/``close``, any thread); ``flush`` applies them. A buffer is
re-indexed from its first changed position to its end, which for an edit in the middle of a big file
costs far more than a keystroke should (and a team server sees every client's keystrokes): an update
whose changed tail exceeds ``max_chars`` waits until that buffer has not been re-indexed for
``interval_s`` (unless forced). New buffers are indexed at once. Decoding output never depends on
this (only what prompt lookup can find).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from specls.decoder.ngram import NgramIndex

Clock = Callable[[], float]


def common_prefix_chars(a: str, b: str) -> int:
    """Length of the common prefix of two strings (binary search over slice compares, done in C).

    Example: ``common_prefix_chars("def f(x):", "def g(x):") == 4``; ``("abc", "abc") -> 3``."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while lo < hi:  # invariant: a[:lo] == b[:lo], a[:hi+1] != b[:hi+1] (hi exclusive of a match)
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(frozen=True)
class ReindexPolicy:
    """When a buffer's re-index waits (see the module docstring)."""

    max_chars: int = 2_000  # a changed tail longer than this ...
    interval_s: float = 5.0  # ... waits until the buffer was last indexed this long ago


class BufferIndex:
    """Pending buffer texts and the n-gram index they feed (``index``, what prompt lookup reads)."""

    def __init__(
        self,
        policy: ReindexPolicy = ReindexPolicy(),
        index: NgramIndex | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self.policy = policy
        self.index = index if index is not None else NgramIndex()
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: dict[str, str | None] = {}  # doc -> new text (None = closed) not yet indexed
        self._indexed: dict[str, tuple[str, float]] = {}  # doc -> (indexed text, clock time)

    def __len__(self) -> int:
        """Buffers in the index."""
        return len(self.index)

    def update(self, doc_id: str, text: str) -> None:
        """A buffer's full current text (indexed at the next ``flush``)."""
        with self._lock:
            self._pending[doc_id] = text

    def close(self, doc_id: str) -> None:
        with self._lock:
            self._pending[doc_id] = None  # (removes it again after a flush that raced with this)
        self.index.remove(doc_id)  # the index has its own lock

    def flush(self, encode: Callable[[str], list[int]], force: bool = False) -> None:
        """Apply the pending texts (tokenised by ``encode``); a big re-index of a buffer indexed less
        than ``policy.interval_s`` ago stays pending unless ``force``. One flush at a time (the
        caller serialises them)."""
        with self._lock:
            pending, self._pending = self._pending, {}
        now = self._clock()
        deferred: dict[str, str] = {}
        for doc_id, text in pending.items():
            if text is None:
                self.index.remove(doc_id)
                self._indexed.pop(doc_id, None)
                continue
            old = self._indexed.get(doc_id)
            if old is not None and not force:
                old_text, when = old
                changed_tail = len(text) - common_prefix_chars(old_text, text)
                if changed_tail > self.policy.max_chars and now - when < self.policy.interval_s:
                    deferred[doc_id] = text
                    continue
            self.index.update(doc_id, encode(text))
            self._indexed[doc_id] = (text, now)
        if deferred:
            with self._lock:
                for doc_id, text in deferred.items():
                    self._pending.setdefault(doc_id, text)  # a newer text may have arrived meanwhile
