"""The team service in front of the real ``OnnxEngine`` class: on fake numpy models (fast) and, in the
slow test, on the bundled ONNX pair. Remote engine end to end (front end -> serve-engine -> engine)
gives exactly the in-process engine's completions; closing sessions frees the engine's documents and
KV; load-aware caps reach the engine and keep output exact."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from specls.models.loader import bundled_dir

from specls.api import CompletionRequest
from specls.engine import EngineSettings, OnnxEngine
from specls.team.remote import RemoteEngine, RemoteSettings
from specls.team.scheduler import FairScheduler
from specls.team.serve_engine import EngineHTTPServer, ServeEngineSettings
from tests.specls.fakes import SOURCE, fake_models

POINTS = [SOURCE.index("total = 0") + len("total"), SOURCE.index("print(total)"), len(SOURCE)]


def fake_engine(**kw: object) -> OnnxEngine:
    e = OnnxEngine(EngineSettings(threads=1, **kw), models=fake_models(allow_eos=False))  # type: ignore[arg-type]
    e.load()
    return e


def req(pos: int, doc: str = "file:///w/a.py", max_tokens: int = 24) -> CompletionRequest:
    return CompletionRequest(doc_id=doc, prefix=SOURCE[:pos], suffix=SOURCE[pos:], max_tokens=max_tokens)


@pytest.fixture
def served() -> Iterator[tuple[EngineHTTPServer, OnnxEngine]]:
    engine = fake_engine()
    server = EngineHTTPServer(ServeEngineSettings(port=0), engine).start()
    try:
        yield server, engine
    finally:
        server.close()


@pytest.mark.parametrize("stream", [True, False])
def test_remote_end_to_end_equals_in_process(
    served: tuple[EngineHTTPServer, OnnxEngine], stream: bool
) -> None:
    server, _ = served
    local = fake_engine(lru_size=0)
    remote = RemoteEngine(RemoteSettings(base_url=server.url, stream=stream, cache_size=0))
    remote.load()
    for pos in POINTS:
        want = local.complete(req(pos))
        got = remote.complete(req(pos))
        assert got.text == want.text and want.text
        assert got.tokens == want.tokens
        assert got.target_passes > 0  # the engine's decode statistics travelled back


def test_remote_stop_matches_in_process(served: tuple[EngineHTTPServer, OnnxEngine]) -> None:
    server, _ = served
    local = fake_engine(lru_size=0)
    remote = RemoteEngine(RemoteSettings(base_url=server.url, cache_size=0))
    remote.load()

    def stop(text: str) -> int | None:
        return 5 if len(text) >= 5 else None

    pos = POINTS[0]
    r = CompletionRequest("file:///w/a.py", SOURCE[:pos], SOURCE[pos:], max_tokens=24, stop=stop)
    want, got = local.complete(r), remote.complete(r)
    assert got.text == want.text and len(got.text) == 5 and got.stop_reason == "stop"


def test_sessions_closing_free_engine_documents_and_kv() -> None:
    engine = fake_engine()
    sched = FairScheduler(engine)
    try:
        sessions = [sched.session(f"c{i}") for i in range(3)]
        for s in sessions:
            s.update_document("file:///w/a.py", SOURCE)
            assert s.complete(req(POINTS[0])).text
        st = engine.stats()
        assert st["documents"] == 3 and isinstance(st["kv_tokens"], int) and st["kv_tokens"] > 0
        for s in sessions:
            s.close()
        st = engine.stats()
        assert st["documents"] == 0 and st["kv_tokens"] == 0
    finally:
        sched.close()


def test_speculation_cap_keeps_output_exact() -> None:
    engine = fake_engine(lru_size=0)
    plain = fake_engine(lru_size=0, speculation=False)
    for pos in POINTS:
        want = plain.complete(req(pos, doc="p"))
        for cap in (0, 1, 3):
            got = engine.complete(
                CompletionRequest("d", SOURCE[:pos], SOURCE[pos:], max_tokens=24, speculation_cap=cap)
            )
            assert got.text == want.text
            if cap == 0:
                assert got.drafted == 0


@pytest.mark.slow
def test_bundled_engine_remote_end_to_end() -> None:
    if not (bundled_dir("target") / "specls.json").is_file():
        pytest.fail("the bundled target model is missing")
    engine = OnnxEngine(EngineSettings(threads=1))
    engine.load()
    server = EngineHTTPServer(ServeEngineSettings(port=0), engine).start()
    try:
        remote = RemoteEngine(RemoteSettings(base_url=server.url, cache_size=0))
        remote.load()
        local = engine.with_settings(EngineSettings(threads=1, lru_size=0))
        pos = POINTS[0]
        want = local.complete(req(pos, doc="local", max_tokens=16))
        got = remote.complete(req(pos, max_tokens=16))
        assert want.text and got.text == want.text and got.tokens == want.tokens
        assert server.scheduler.stats()["engine"]["documents"] == 1  # type: ignore[index]
    finally:
        server.close()


def test_batched_service_survives_a_killed_client() -> None:
    """Batching on, three clients at once: killing one mid-request cancels only its request (at its next
    pass) and frees its documents; the other two get exactly the one-at-a-time completions."""
    import dataclasses
    import threading
    import time
    from collections.abc import Sequence

    import numpy as np
    from specls.decoder.batching import BatchSettings

    from specls.team.scheduler import SchedulerSettings
    from tests.decoder.fakes import FakeCache, FakeLM
    from tests.specls.fakes import BatchableFakeLM

    class SlowCache(FakeCache):
        def forward(self, ids: Sequence[int]) -> np.ndarray:
            time.sleep(0.002)  # a pass takes time, so the victim is still decoding when killed
            return super().forward(ids)

    class SlowBatchable(BatchableFakeLM):
        def new_cache(self) -> FakeCache:
            return SlowCache(self)

    base = fake_models(allow_eos=False)
    assert isinstance(base.target, FakeLM)
    models = dataclasses.replace(base, target=SlowBatchable(base.target))
    reference = OnnxEngine(EngineSettings(threads=1, lru_size=0), fake_models(allow_eos=False))
    want = {p: reference.complete(req(p, f"file:///w/{p}.py")).text for p in POINTS[:2]}
    engine = OnnxEngine(
        EngineSettings(threads=1, lru_size=0, batching=BatchSettings(max_batch=4, max_wait_ms=20.0)), models
    )
    sched = FairScheduler(engine, SchedulerSettings(workers=3))
    try:
        victim = sched.session("victim")
        others = [sched.session(f"c{i}") for i in range(2)]
        got: dict[str, object] = {}

        def run(name: str, fn: object) -> threading.Thread:
            def target() -> None:
                got[name] = fn()  # type: ignore[operator]

            t = threading.Thread(target=target)
            t.start()
            return t

        tv = run("victim", lambda: victim.complete(req(len(SOURCE), "file:///w/v.py", max_tokens=3000)))
        deadline = time.monotonic() + 10
        while not sched.scheduler_stats()["running"] and time.monotonic() < deadline:
            time.sleep(0.005)
        threads = [
            run(str(p), lambda p=p, s=s: s.complete(req(p, f"file:///w/{p}.py")))
            for p, s in zip(POINTS[:2], others, strict=True)
        ]
        time.sleep(0.05)
        victim.close()  # the connection dropped
        for t in [tv, *threads]:
            t.join(30)
        rv = got["victim"]
        assert rv.cancelled and rv.tokens < 3000  # type: ignore[attr-defined]
        for p in POINTS[:2]:
            assert got[str(p)].text == want[p]  # type: ignore[attr-defined]
        assert engine.stats()["batching"]["batched_passes"] > 0  # type: ignore[index]
        assert all(not d.startswith(victim.inner_id("")) for d in engine._docs)  # its KV is freed
    finally:
        sched.close()
