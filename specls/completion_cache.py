"""The finished-completion cache: a greedy completion is a function of its prompt tokens and token
budget, so a prompt completed before is answered again with zero model calls (an LRU)."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from specls.decoder.text import Detokenizer, TextStop, visible_text

# stop reasons of a finished completion (a cancelled or timed-out one is not the model's answer)
FINISHED = frozenset({"eos", "max_tokens", "stop"})


@dataclass(frozen=True)
class CacheHit:
    """A cached completion replayed for one request."""

    text: str  # after this request's stop
    raw: str  # everything the entry generated
    reason: str
    n_tokens: int
    tokens: list[int]


@dataclass(frozen=True)
class _Entry:
    tokens: list[int]
    stop_reason: str


class CompletionCache:
    """Finished greedy completions by ``key(prompt tokens, max_new)``, the ``size`` most recently used
    kept. Thread-safe."""

    def __init__(self, size: int, tokenizer: Detokenizer) -> None:
        self.size = size
        self._tok = tokenizer
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    @staticmethod
    def key(tokens: Sequence[int], max_new: int) -> bytes:
        h = hashlib.blake2b(np.asarray(tokens, dtype=np.int64).tobytes(), digest_size=16)
        h.update(int(max_new).to_bytes(8, "little"))
        return h.digest()

    def store(self, key: bytes, tokens: Sequence[int], stop_reason: str) -> None:
        """Keep a completion that finished (``FINISHED``); others are not the model's whole answer."""
        if stop_reason not in FINISHED or self.size <= 0:
            return
        with self._lock:
            self._entries[key] = _Entry(list(tokens), stop_reason)
            self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)

    def lookup(self, key: bytes, stop: Callable[[str], int | None] | None) -> CacheHit | None:
        """The entry replayed with this request's ``stop``, or None. An entry cut by another request's
        stop answers only if this stop cuts within it."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
        if entry is None:
            return None
        raw = visible_text(self._tok.decode(entry.tokens)) if entry.tokens else ""
        if stop is not None:
            text_stop = TextStop(self._tok, stop)
            for i in range(1, len(entry.tokens) + 1):
                if text_stop(entry.tokens[:i]):
                    assert text_stop.cut is not None
                    return CacheHit(text_stop.text[: text_stop.cut], raw, "stop", i, entry.tokens)
        if entry.stop_reason == "stop":
            return None
        return CacheHit(raw, raw, entry.stop_reason, len(entry.tokens), entry.tokens)
