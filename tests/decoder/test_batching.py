"""PassBatcher: concurrent decode loops share batched target passes and still decode plain greedy."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import pytest
from specls.decoder.api import DecodeSettings, Drafter, KVCache
from specls.decoder.batching import BatchSettings, PassBatcher
from specls.decoder.loop import generate

from tests.decoder.fakes import FakeCache, FakeLM, FakeLMConfig, ScriptedDrafter

TARGET = FakeLM(FakeLMConfig(vocab=64, window=3, seed=7))
N = 24
K = 4


def frozen_clock() -> float:
    """A batcher clock that never advances: ``max_wait_ms`` never elapses, so a pass runs only when
    every participant is waiting (or one leaves): batches form whatever the thread scheduler does."""
    return 0.0


class RecordingBatch:
    """A forward_batch over fake caches: each cache's own forward, with the batch sizes recorded."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.sizes: list[int] = []
        self.fail_on = fail_on  # a token id whose presence fails the whole batched pass
        self.lock = threading.Lock()

    def __call__(self, caches: Sequence[KVCache], ids: Sequence[Sequence[int]]) -> list[np.ndarray]:
        with self.lock:
            self.sizes.append(len(caches))
        if self.fail_on is not None and any(self.fail_on in i for i in ids):
            raise ValueError("bad token in batch")
        return [c.forward(i) for c, i in zip(caches, ids, strict=True)]


def _join(threads: list[threading.Thread]) -> None:
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a pass never ran (deadlock)"


def _drafter(kind: str, prompt: list[int], ref: list[int]) -> Drafter | None:
    if kind == "none":
        return None
    if kind.startswith("wrong_at_"):
        return ScriptedDrafter(prompt, ref, 64, "wrong_at", int(kind.rsplit("_", 1)[1]))
    return ScriptedDrafter(prompt, ref, 64, kind)


KINDS = ["right", "wrong", "none", *[f"wrong_at_{j}" for j in range(K + 1)]]


def test_concurrent_loops_batch_and_equal_plain_greedy() -> None:
    """Every drafter kind at once, one thread each: outputs are plain greedy, passes were shared."""
    run = RecordingBatch()
    batcher = PassBatcher(run, BatchSettings(max_batch=8, max_tokens=16, max_wait_ms=200.0), frozen_clock)
    settings = DecodeSettings(max_new_tokens=N, draft_length=K)
    results: dict[str, list[int]] = {}
    expected: dict[str, list[int]] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(len(KINDS))

    def one(i: int, kind: str) -> None:
        prompt = [(5 * i + 3 * j) % 64 for j in range(6 + i)]  # different lengths per sequence
        ref = TARGET.greedy(prompt, N + K + 1)
        expected[kind] = ref[:N]
        try:
            with batcher.participant():
                start.wait()  # every loop is a participant before any pass: the first pass waits for all
                out = generate(
                    batcher.wrap(TARGET.new_cache()),
                    prompt,
                    _drafter(kind, prompt, ref),
                    settings,
                    frozenset(),
                )
            results[kind] = out.tokens
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i, k)) for i, k in enumerate(KINDS)]
    for t in threads:
        t.start()
    _join(threads)
    assert not errors
    for kind in KINDS:
        assert results[kind] == expected[kind], kind  # Not a neighbour's tokens, not a shorter list
    stats = batcher.snapshot()
    assert run.sizes and max(run.sizes) > 1  # passes really were shared
    assert run.sizes[0] == len(KINDS)  # the prefills, all in one pass
    assert stats["batched_passes"] == len(run.sizes)  # lone passes never call forward_batch
    assert batcher.active == 0


def test_lone_pass_uses_the_cache_itself() -> None:
    run = RecordingBatch()
    batcher = PassBatcher(run, BatchSettings(max_batch=8, max_wait_ms=1000.0))
    prompt = [1, 2, 3, 4]
    with batcher.participant():
        out = generate(
            batcher.wrap(TARGET.new_cache()), prompt, None, DecodeSettings(max_new_tokens=8), frozenset()
        )
    assert out.tokens == TARGET.greedy(prompt, 8)
    assert run.sizes == []  # a single participant never waits and never batches
    assert batcher.snapshot()["passes"] == out.target_passes  # Not + 1: prompt[:-1] rode with the first pass


def test_prefill_over_max_tokens_runs_alone() -> None:
    run = RecordingBatch()
    batcher = PassBatcher(run, BatchSettings(max_batch=8, max_tokens=4, max_wait_ms=10_000.0))
    idle = threading.Event()
    release = threading.Event()

    def idle_participant() -> None:  # active, never submits until released
        with batcher.participant():
            idle.set()
            release.wait(30)

    t = threading.Thread(target=idle_participant)
    t.start()
    idle.wait(10)
    cache = batcher.wrap(TARGET.new_cache())
    with batcher.participant():
        logits = cache.forward(list(range(10)))  # 10 > max_tokens: no waiting for the idle one
    release.set()
    t.join()
    assert logits.shape == (10, 64)
    assert batcher.snapshot()["solo_prefills"] == 1
    assert cache.length == 10


def test_waiter_runs_when_the_other_participant_leaves() -> None:
    """A pass waits for the other active request; that request finishing (not a timer) releases it."""
    run = RecordingBatch()
    batcher = PassBatcher(run, BatchSettings(max_batch=8, max_wait_ms=60_000.0), frozen_clock)
    inside = threading.Event()
    leave = threading.Event()
    got: list[np.ndarray] = []

    def other() -> None:
        with batcher.participant():
            inside.set()
            leave.wait(30)

    def waiter() -> None:
        with batcher.participant():
            got.append(batcher.wrap(TARGET.new_cache()).forward([1, 2]))

    t1 = threading.Thread(target=other)
    t1.start()
    inside.wait(10)
    t2 = threading.Thread(target=waiter)
    t2.start()
    t2.join(0.3)
    assert t2.is_alive() and not got  # still waiting for the other participant
    leave.set()
    t1.join()
    t2.join(30)
    assert not t2.is_alive() and got[0].shape == (2, 64)


def _passes_at_once(batcher: PassBatcher, ids: list[list[int]]) -> dict[int, object]:
    """One thread per entry, all inside the batcher at once: each runs one pass over its ids and
    records its logits or its ValueError."""
    barrier = threading.Barrier(len(ids))
    out: dict[int, object] = {}

    def one(i: int) -> None:
        cache = batcher.wrap(TARGET.new_cache())
        with batcher.participant():
            barrier.wait()
            try:
                out[i] = cache.forward(ids[i])
            except ValueError as exc:
                out[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(ids))]
    for t in threads:
        t.start()
    _join(threads)
    return out


def test_failed_batch_reruns_one_by_one() -> None:
    """One bad pass in a batch fails alone; its neighbours get their logits."""
    bad_token = 63
    batcher = PassBatcher(
        RecordingBatch(fail_on=bad_token), BatchSettings(max_batch=4, max_wait_ms=60_000.0), frozen_clock
    )
    out = _passes_at_once(batcher, [[bad_token], [1, 2], [2, 3]])
    # FakeCache accepts token 63 alone: only the batched call failed; every pass then ran by itself
    assert all(isinstance(out[i], np.ndarray) for i in range(3))
    assert batcher.stats.fallbacks >= 1


def test_error_reaches_its_own_thread_only() -> None:
    batcher = PassBatcher(RecordingBatch(), BatchSettings(max_batch=4, max_wait_ms=60_000.0), frozen_clock)
    out = _passes_at_once(batcher, [[999], [1]])  # 999: out of the fake vocab
    assert isinstance(out[0], ValueError)
    assert isinstance(out[1], np.ndarray) and out[1].shape == (1, 64)


@pytest.mark.parametrize(
    "settings",
    [
        BatchSettings(max_batch=0),  # Not "unlimited": no pass could ever run
        BatchSettings(max_tokens=0),
        BatchSettings(max_wait_ms=-1.0),
    ],
)
def test_bad_settings(settings: BatchSettings) -> None:
    with pytest.raises(ValueError):
        PassBatcher(RecordingBatch(), settings)


def test_release_compacts_the_inner_cache_when_it_can() -> None:
    class Compacting(FakeCache):
        compacted = 0

        def compact(self) -> None:
            self.compacted += 1

    batcher = PassBatcher(RecordingBatch())
    c = Compacting(TARGET)
    wrapped = batcher.wrap(c)
    wrapped.forward([1, 2])
    wrapped.release()
    assert c.compacted == 1 and wrapped.length == 2
    batcher.wrap(TARGET.new_cache()).release()  # a cache without compact(): nothing to do


def test_append_long_prefill_runs_alone_short_one_through_the_batcher() -> None:
    class Appending(FakeCache):
        def __init__(self, model: FakeLM) -> None:
            super().__init__(model)
            self.appended: list[int] = []

        def append(self, ids: Sequence[int]) -> None:
            self.appended.append(len(ids))
            self.forward(ids)

    batcher = PassBatcher(RecordingBatch(), BatchSettings(max_batch=4, max_tokens=4))
    c = Appending(TARGET)
    wrapped = batcher.wrap(c)
    wrapped.append(list(range(10)))  # long: the inner cache's own append, no waiting
    wrapped.append([1, 2])  # short: a pass like any other (joined when others wait)
    assert c.appended == [10] and wrapped.length == 12
    snap = batcher.snapshot()
    assert snap["solo_prefills"] == 1 and snap["passes"] == 1
