"""OnnxEngine with batching on: concurrent requests share target passes and get exactly the completions
a one-at-a-time engine gives (fake numpy models: batching there is exact)."""

from __future__ import annotations

import dataclasses
import threading

from specls.decoder.batching import BatchSettings

from specls.api import CompletionRequest
from specls.engine import EngineSettings, LoadedModels, OnnxEngine
from tests.decoder.fakes import FakeLM
from tests.specls.fakes import SOURCE, BatchableFakeLM, fake_models


def models(batchable: bool) -> LoadedModels:
    m = fake_models(allow_eos=False)
    if batchable:
        assert isinstance(m.target, FakeLM)
        m = dataclasses.replace(m, target=BatchableFakeLM(m.target))
    return m


POINTS = [
    SOURCE.index(s) for s in ("import sys", "def walk", "for name", "total = 0", "print(total)", "return 0")
]


def req(i: int, pos: int, doc: str | None = None) -> CompletionRequest:
    return CompletionRequest(
        doc_id=doc or f"file:///w/{i}.py", prefix=SOURCE[:pos], suffix=SOURCE[pos:], max_tokens=32
    )


def run_concurrently(engine: OnnxEngine, requests: list[CompletionRequest]) -> list[str]:
    out: list[str | None] = [None] * len(requests)
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(requests))

    def one(i: int) -> None:
        try:
            barrier.wait()
            out[i] = engine.complete(requests[i]).text
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a request never finished (deadlock)"
    assert not errors, errors
    return [o or "" for o in out]


BATCHING = BatchSettings(max_batch=8, max_tokens=16, max_wait_ms=200.0)


def test_concurrent_requests_batch_and_match_one_at_a_time() -> None:
    requests = [req(i, p) for i, p in enumerate(POINTS)]
    reference = OnnxEngine(EngineSettings(threads=1, lru_size=0), models(batchable=False))
    expected = [reference.complete(r).text for r in requests]
    assert all(expected)  # non-trivial completions

    m = models(batchable=True)
    engine = OnnxEngine(EngineSettings(threads=1, lru_size=0, batching=BATCHING), m)
    got = run_concurrently(engine, requests)
    assert got == expected  # Not a neighbour's completion, not a truncated one
    assert isinstance(m.target, BatchableFakeLM)
    assert m.target.sizes and max(m.target.sizes) > 1  # passes really were joined
    assert m.target.released >= 1  # memory handed back once the burst was over
    stats = engine.stats()["batching"]
    assert isinstance(stats, dict) and stats["enabled"] and stats["batched_passes"] == len(m.target.sizes)

    # a second round on the same documents: prefix reuse and completion reuse still hold per document
    got2 = run_concurrently(engine, requests)
    assert got2 == expected


def test_same_document_requests_run_one_at_a_time() -> None:
    """Two requests for one document at once: its KV cache serves them in turn, both exact."""
    a, b = req(0, POINTS[3], "file:///w/same.py"), req(0, POINTS[4], "file:///w/same.py")
    reference = OnnxEngine(EngineSettings(threads=1, lru_size=0), models(batchable=False))
    want = {reference.complete(a).text, reference.complete(b).text}
    engine = OnnxEngine(EngineSettings(threads=1, lru_size=0, batching=BATCHING), models(batchable=True))
    for _ in range(3):
        assert set(run_concurrently(engine, [a, b])) == want


def test_target_that_cannot_batch_serves_unbatched() -> None:
    engine = OnnxEngine(EngineSettings(threads=1, batching=BATCHING), models(batchable=False))
    stats = engine.stats()["batching"]
    assert isinstance(stats, dict) and stats["enabled"] is False
    requests = [req(i, p) for i, p in enumerate(POINTS[:3])]
    reference = OnnxEngine(EngineSettings(threads=1), models(batchable=False))
    assert run_concurrently(engine, requests) == [reference.complete(r).text for r in requests]


def test_batching_off_by_default() -> None:
    m = models(batchable=True)
    engine = OnnxEngine(EngineSettings(threads=1), m)
    assert engine.stats()["batching"] == {"enabled": False, "max_batch": 1}
    assert isinstance(m.target, BatchableFakeLM) and not m.target.enabled
