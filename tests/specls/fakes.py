"""Test stand-ins for the engine: a character-level tokenizer and a fake model pair."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np
from specls.decoder.api import KVCache

from specls.engine import LoadedModels
from specls.prompt import FimTokens
from tests.decoder.fakes import FakeCache, FakeLM, FakeLMConfig

SPECIALS = ("<|endoftext|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<file_sep>")
CHARS = "\n" + "".join(chr(c) for c in range(32, 127))


class CharTokenizer:
    """One token per character of ``CHARS`` (anything else becomes '?'), then the specials."""

    def __init__(self) -> None:
        self._id = {ch: i for i, ch in enumerate(CHARS)}
        for j, s in enumerate(SPECIALS):
            self._id[s] = len(CHARS) + j
        self._str = {i: s for s, i in self._id.items()}
        self.encode_calls = 0

    @property
    def vocab_size(self) -> int:
        return len(self._id)

    def encode(self, text: str) -> list[int]:
        self.encode_calls += 1
        q = self._id["?"]
        return [self._id.get(ch, q) for ch in text]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self._str[int(i)] for i in ids)

    def token_to_id(self, token: str) -> int | None:
        return self._id.get(token)


class ByteTokenizer:
    """Byte-level: token = one UTF-8 byte (so characters split across tokens), decode with U+FFFD."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

    def token_to_id(self, token: str) -> int | None:
        return None


def char_fim(tok: CharTokenizer, order: str = "spm") -> FimTokens:
    def tid(s: str) -> int:
        i = tok.token_to_id(s)
        assert i is not None
        return i

    eos = tid("<|endoftext|>")
    return FimTokens(
        order=order,
        prefix_id=tid("<fim_prefix>"),
        suffix_id=tid("<fim_suffix>"),
        middle_id=tid("<fim_middle>"),
        file_sep_id=tid("<file_sep>"),
        eos_ids=frozenset({eos}),
    )


def fake_models(
    seed: int = 1, draft_noise: float = 0.4, with_draft: bool = True, allow_eos: bool = True
) -> LoadedModels:
    tok = CharTokenizer()
    # window 2: greedy output falls into repeats quickly, so prompt lookup has something to find
    target = FakeLM(FakeLMConfig(vocab=tok.vocab_size, window=2, seed=seed, scale=4.0))
    fim = char_fim(tok)
    eos = frozenset({*fim.eos_ids, fim.prefix_id, fim.suffix_id, fim.middle_id})
    if not allow_eos:  # long completions: the specials never win the argmax
        target.tables[:, :, sorted(eos)] -= 100.0
    draft = FakeLM.perturbed(target, draft_noise, seed + 100) if with_draft else None
    return LoadedModels(target=target, tokenizer=tok, fim=fim, eos_ids=eos, draft=draft, max_positions=4096)


SOURCE = '''import os
import sys


def walk(root):
    """Yield every file under root."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames:
            yield os.path.join(dirpath, name)


def main(argv):
    total = 0
    for path in walk(argv[1]):
        total += os.path.getsize(path)
    print(total)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
'''


class _SlowCache(FakeCache):
    """A FakeCache whose every pass takes ``delay_s`` of wall time (a sleep: no CPU), as a real
    model's does, so that concurrent requests overlap however the threads are scheduled."""

    def __init__(self, model: FakeLM, delay_s: float) -> None:
        super().__init__(model)
        self._delay_s = delay_s

    def forward(self, ids: Sequence[int]) -> np.ndarray:
        time.sleep(self._delay_s)
        return super().forward(ids)


class BatchableFakeLM(FakeLM):
    """A FakeLM with the runtime's batching surface; records every batched pass's size.
    ``pass_delay_s``: each pass sleeps that long (0: as fast as numpy)."""

    def __init__(self, base: FakeLM, pass_delay_s: float = 0.0) -> None:
        super().__init__(base.config, base.tables)
        self.sizes: list[int] = []
        self._lock = threading.Lock()
        self.enabled = False
        self.released = 0  # release_memory() calls (the engine's "all concurrent requests done")
        self._pass_delay_s = pass_delay_s

    def new_cache(self) -> FakeCache:
        return _SlowCache(self, self._pass_delay_s) if self._pass_delay_s > 0 else FakeCache(self)

    def release_memory(self) -> None:
        self.released += 1

    def enable_batching(self) -> bool:
        self.enabled = True
        return True

    def forward_batch(self, caches: Sequence[KVCache], ids: Sequence[Sequence[int]]) -> list[np.ndarray]:
        assert self.enabled
        with self._lock:
            self.sizes.append(len(caches))
        assert all(isinstance(c, FakeCache) for c in caches)  # the real caches, not the wrappers
        return [c.forward(i) for c, i in zip(caches, ids, strict=True)]
