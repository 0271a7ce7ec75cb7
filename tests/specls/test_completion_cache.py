"""The finished-completion cache: keys, eviction, what is kept, and replay under another stop."""

from __future__ import annotations

from specls.completion_cache import CompletionCache
from tests.specls.fakes import CharTokenizer

TOK = CharTokenizer()


def test_key_depends_on_prompt_and_budget() -> None:
    k = CompletionCache.key([1, 2, 3], 16)
    assert k == CompletionCache.key([1, 2, 3], 16)
    assert k != CompletionCache.key([1, 2, 3], 17)  # Not the same: a longer budget may say more
    assert k != CompletionCache.key([1, 2, 4], 16)


def test_only_finished_completions_are_kept_and_the_oldest_goes() -> None:
    cache = CompletionCache(2, TOK)
    a, b, c, d = (CompletionCache.key([i], 8) for i in range(4))
    cache.store(a, TOK.encode("x = 1"), "eos")
    cache.store(b, TOK.encode("y"), "cancelled")  # Not kept: not the model's whole answer
    cache.store(c, TOK.encode("z"), "deadline")
    assert len(cache) == 1
    cache.store(c, TOK.encode("z"), "max_tokens")
    assert cache.lookup(a, None) is not None  # a is now the most recently used
    cache.store(d, TOK.encode("w"), "eos")
    assert cache.lookup(c, None) is None and cache.lookup(a, None) is not None  # Not a: c was older
    assert len(CompletionCache(0, TOK)) == 0


def test_replay_with_this_request_stop() -> None:
    cache = CompletionCache(4, TOK)
    key = CompletionCache.key([1], 8)
    cache.store(key, TOK.encode("ab\ncd"), "max_tokens")
    hit = cache.lookup(key, lambda text: text.find("\n") if "\n" in text else None)
    assert hit is not None and hit.text == "ab" and hit.reason == "stop" and hit.n_tokens == 3
    assert hit.raw == "ab\ncd"
    whole = cache.lookup(key, None)
    assert whole is not None and whole.text == "ab\ncd" and whole.reason == "max_tokens"
    cut = CompletionCache.key([2], 8)
    cache.store(cut, TOK.encode("ab"), "stop")  # cut by another request's stop
    assert cache.lookup(cut, None) is None  # Not "ab": without that stop the model would go on
    hit = cache.lookup(cut, lambda text: 1 if len(text) >= 2 else None)
    assert hit is not None and hit.text == "a"  # this stop cuts within it
