"""FairScheduler: fairness, bounded queues, replacement, cancellation, disconnects, memory, load-aware
speculation. Fake engines only (no model)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from specls.api import CompletionRequest, CompletionResult, EngineError
from specls.team.fake import FakeEngine, FakeEngineSettings
from specls.team.scheduler import (
    ClientSession,
    FairScheduler,
    RequestEvent,
    SchedulerSettings,
    SpeculationDecision,
    decide_speculation,
)
from tests.team.engines import GateEngine, loaded


class Recorder:
    def __init__(self) -> None:
        self.events: list[RequestEvent] = []
        self.lock = threading.Lock()

    def on_request(self, event: RequestEvent) -> None:
        with self.lock:
            self.events.append(event)

    def outcomes(self, doc: str) -> list[str]:
        with self.lock:
            return [e.outcome for e in self.events if e.doc_id == doc]


def req(doc: str, prefix: str = "x = ", max_tokens: int = 4) -> CompletionRequest:
    return CompletionRequest(doc_id=doc, prefix=prefix, suffix="", max_tokens=max_tokens)


def in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, dict[str, object]]:
    """``fn`` on a daemon thread; its result (or the error it raised) lands in the box."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def wait_until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("condition not reached")
        time.sleep(0.002)


@pytest.fixture
def gate() -> GateEngine:
    e = GateEngine()
    e.load()
    return e


def test_session_result_matches_engine() -> None:
    engine = loaded(FakeEngine(FakeEngineSettings(pass_s=0.0)))
    sched = FairScheduler(engine)
    try:
        s = sched.session("alice")
        r = s.complete(req("file:///a.py", "def f(", 6))
        assert r.text == engine.expected_text("def f(", "", 6)
        assert not r.cancelled
        assert engine.calls == [s.inner_id("file:///a.py")]
    finally:
        sched.close()


def test_fast_typist_does_not_starve_slow_one() -> None:
    engine = loaded(FakeEngine(FakeEngineSettings(pass_s=0.002)))
    sched = FairScheduler(engine, SchedulerSettings(per_client_queue=16, max_queue=64, load_aware=False))
    fast, slow = sched.session("fast"), sched.session("slow")
    stop = threading.Event()
    order_at_submit: list[tuple[int, str]] = []

    def typist(i: int) -> None:
        n = 0
        while not stop.is_set():  # several documents, back to back, never waiting for the slow one
            fast.complete(req(f"file:///fast{i}.py", f"fast {n}", 3))
            n += 1

    threads = [threading.Thread(target=typist, args=(i,), daemon=True) for i in range(6)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: sched.queue_depth() >= 4)
        slow_docs = []
        for k in range(5):
            wait_until(lambda: sched.queue_depth() >= 4)
            with engine._lock:
                before = len(engine.calls)
            doc = f"file:///slow{k}.py"
            r = slow.complete(req(doc, f"slow {k}", 3))
            assert not r.cancelled and r.text
            with engine._lock:
                at = engine.calls.index(slow.inner_id(doc))
            order_at_submit.append((at - before, doc))
            slow_docs.append(doc)
        # Round-robin: at most the running request and one queued fast request go before the slow
        # request, although 5+ fast requests were waiting every time.
        assert all(ahead <= 2 for ahead, _ in order_at_submit), order_at_submit
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=10)
        sched.close()


def test_newer_request_replaces_queued_and_running_same_document(gate: GateEngine) -> None:
    rec = Recorder()
    sched = FairScheduler(gate, observers=(rec,))
    try:
        s = sched.session("alice")
        t1, b1 = in_thread(lambda: s.complete(req("doc1", "a")))
        wait_until(gate.entered.is_set)
        t2, b2 = in_thread(lambda: s.complete(req("doc2", "b")))
        wait_until(lambda: sched.queue_depth() == 1)
        t3, b3 = in_thread(lambda: s.complete(req("doc2", "bc")))
        t2.join(5)
        r2 = b2["result"]
        assert isinstance(r2, CompletionResult) and r2.cancelled  # replaced while queued
        t4, b4 = in_thread(lambda: s.complete(req("doc1", "ab")))
        t1.join(5)
        r1 = b1["result"]
        assert isinstance(r1, CompletionResult) and r1.cancelled  # running one superseded
        gate.gate.set()
        for t in (t3, t4):
            t.join(5)
        r3, r4 = b3["result"], b4["result"]
        assert isinstance(r3, CompletionResult) and r3.text == gate.expected_text("bc", "", 4)
        assert isinstance(r4, CompletionResult) and r4.text == gate.expected_text("ab", "", 4)
        assert "superseded" in rec.outcomes("doc2")
        assert rec.outcomes("doc1")[0] == "superseded"
        st = sched.scheduler_stats()
        assert st["superseded"] == 2 and st["served"] == 2
    finally:
        gate.gate.set()
        sched.close()


def test_per_client_limit_drops_oldest(gate: GateEngine) -> None:
    sched = FairScheduler(gate, SchedulerSettings(per_client_queue=2))
    try:
        s = sched.session("alice")
        t0, _ = in_thread(lambda: s.complete(req("running")))
        wait_until(gate.entered.is_set)
        ta, ba = in_thread(lambda: s.complete(req("a")))
        wait_until(lambda: sched.queue_depth() == 1)
        tb, bb = in_thread(lambda: s.complete(req("b")))
        wait_until(lambda: sched.queue_depth() == 2)
        tc, bc = in_thread(lambda: s.complete(req("c")))
        ta.join(5)
        ra = ba["result"]
        assert isinstance(ra, CompletionResult) and ra.cancelled
        assert sched.queue_depth() == 2
        gate.gate.set()
        for t in (t0, tb, tc):
            t.join(5)
        assert isinstance(bb["result"], CompletionResult) and not bb["result"].cancelled
        assert isinstance(bc["result"], CompletionResult) and not bc["result"].cancelled
        assert s.inner_id("a") not in gate.calls
    finally:
        gate.gate.set()
        sched.close()


def test_total_limit_drops_from_the_longest_queue(gate: GateEngine) -> None:
    sched = FairScheduler(gate, SchedulerSettings(per_client_queue=8, max_queue=3))
    try:
        a, b = sched.session("a"), sched.session("b")
        t0, _ = in_thread(lambda: a.complete(req("run")))
        wait_until(gate.entered.is_set)
        ta1, ba1 = in_thread(lambda: a.complete(req("a1")))
        wait_until(lambda: sched.queue_depth() == 1)
        ta2, ba2 = in_thread(lambda: a.complete(req("a2")))
        wait_until(lambda: sched.queue_depth() == 2)
        tb1, bb1 = in_thread(lambda: b.complete(req("b1")))
        wait_until(lambda: sched.queue_depth() == 3)
        tb2, bb2 = in_thread(lambda: b.complete(req("b2")))
        ta1.join(5)
        assert isinstance(ba1["result"], CompletionResult) and ba1["result"].cancelled
        gate.gate.set()
        for t in (t0, ta2, tb1, tb2):
            t.join(5)
        for box in (ba2, bb1, bb2):
            assert isinstance(box["result"], CompletionResult) and not box["result"].cancelled
    finally:
        gate.gate.set()
        sched.close()


def test_cancelled_queued_request_frees_its_slot_without_running(gate: GateEngine) -> None:
    sched = FairScheduler(gate)
    try:
        s = sched.session("alice")
        t0, _ = in_thread(lambda: s.complete(req("run")))
        wait_until(gate.entered.is_set)
        flag = threading.Event()
        t1, b1 = in_thread(lambda: s.complete(req("q"), flag.is_set))
        wait_until(lambda: sched.queue_depth() == 1)
        flag.set()
        t1.join(5)
        assert not t1.is_alive()
        assert isinstance(b1["result"], CompletionResult) and b1["result"].cancelled
        assert sched.queue_depth() == 0
        gate.gate.set()
        t0.join(5)
        assert s.inner_id("q") not in gate.calls
        assert sched.scheduler_stats()["cancelled"] == 1
    finally:
        gate.gate.set()
        sched.close()


def test_killed_client_mid_request_does_not_disturb_another() -> None:
    engine = loaded(FakeEngine(FakeEngineSettings(pass_s=0.005, tokens_per_pass=1)))
    sched = FairScheduler(engine)
    try:
        victim, other = sched.session("victim"), sched.session("other")
        victim.update_document("v.py", "print(1)\n" * 100)
        tv, bv = in_thread(lambda: victim.complete(req("v.py", "long", 100_000)))
        wait_until(lambda: engine.passes > 0 or len(engine.calls) > 0)
        to, bo = in_thread(lambda: other.complete(req("o.py", "short", 5)))
        wait_until(lambda: sched.queue_depth() == 1)
        victim.close()  # the connection dropped
        tv.join(10)
        to.join(10)
        rv, ro = bv["result"], bo["result"]
        assert isinstance(rv, CompletionResult) and rv.cancelled and rv.tokens < 100_000
        assert isinstance(ro, CompletionResult) and ro.text == engine.expected_text("short", "", 5)
        assert sched.active_clients == 1
        assert victim.complete(req("v.py")).cancelled  # a closed session serves nothing
    finally:
        sched.close()


def test_engine_error_reaches_only_its_caller(gate: GateEngine) -> None:
    gate.fail_docs = {"bad"}
    gate.gate.set()
    sched = FairScheduler(gate)
    try:
        s = sched.session("alice")
        with pytest.raises(EngineError, match="boom"):
            s.complete(req("bad"))
        assert s.complete(req("good")).text
        assert sched.scheduler_stats()["errors"] == 1
    finally:
        sched.close()


def test_documents_and_kv_freed_when_sessions_close() -> None:
    engine = loaded(FakeEngine(FakeEngineSettings(pass_s=0.0)))
    sched = FairScheduler(engine)
    try:
        a, b = sched.session("a"), sched.session("b")
        for s in (a, b):
            for i in range(3):
                s.update_document(f"file:///{i}.py", "x = 1\n" * 50)
                s.complete(req(f"file:///{i}.py", "x = 1\n" * 50))
        st = engine.stats()
        # same uris in two sessions are distinct documents in the engine
        assert st["open_documents"] == 6 and st["kv_cached_sequences"] == 6
        a.close_document("file:///0.py")
        assert engine.stats()["open_documents"] == 5
        a.close()
        st = engine.stats()
        assert st["open_documents"] == 3 and st["kv_cached_sequences"] == 3
        b.close()
        st = engine.stats()
        assert (st["open_documents"], st["kv_cached_sequences"], st["kv_bytes"]) == (0, 0, 0)
        assert sched.active_clients == 0
    finally:
        sched.close()


def test_speculation_policy() -> None:
    s = SchedulerSettings(gamma_max=8, drafting_off_depth=5, min_acceptance=0.3)
    assert decide_speculation(s, 1, None).cap is None
    assert decide_speculation(s, 2, 0.9).cap == 8
    assert decide_speculation(s, 3, 0.9).cap == 4
    assert decide_speculation(s, 4, 0.9).cap == 2
    assert decide_speculation(s, 5, 0.9).cap == 0
    assert decide_speculation(s, 5, 0.9).reason == "off_depth"
    assert decide_speculation(s, 2, 0.1).reason == "off_acceptance"
    assert decide_speculation(s, 1, 0.1).cap is None  # idle: the engine's own adaptive choice
    assert decide_speculation(SchedulerSettings(load_aware=False), 9, 0.0).cap is None
    acc = SchedulerSettings(policy="acceptance", min_acceptance=0.3)
    assert decide_speculation(acc, 9, 0.9) == SpeculationDecision(None, "pays")
    assert decide_speculation(acc, 9, 0.1) == SpeculationDecision(0, "off_acceptance")
    assert decide_speculation(acc, 1, 0.1) == SpeculationDecision(None, "idle")
    assert decide_speculation(SchedulerSettings(policy="off"), 9, 0.0).reason == "disabled"
    with pytest.raises(ValueError):
        FairScheduler(FakeEngine(), SchedulerSettings(policy="nope"))


def test_caps_reach_the_engine_under_load(gate: GateEngine) -> None:
    sched = FairScheduler(gate, SchedulerSettings(per_client_queue=8, drafting_off_depth=4))
    try:
        sessions = [sched.session(f"c{i}") for i in range(5)]
        t0, _ = in_thread(lambda: sessions[0].complete(req("d0")))
        wait_until(gate.entered.is_set)
        threads = []
        for i, s in enumerate(sessions[1:], start=1):

            def call(s: ClientSession = s, i: int = i) -> CompletionResult:
                return s.complete(req(f"d{i}"))

            threads.append(in_thread(call)[0])
            wait_until(lambda: sched.queue_depth() == i)  # noqa: B023 (called right away)
        gate.gate.set()
        for t in [t0, *threads]:
            t.join(5)
        # first dispatch idle (None); then depth 4 -> off, 3 -> 2, 2 -> 8... as the queue drains
        assert gate.caps_seen[0] is None
        assert gate.caps_seen[1] == 0
        assert gate.caps_seen[-1] is None
        spec = sched.scheduler_stats()["speculation"]
        assert isinstance(spec, dict) and spec["decisions"].get("off_depth", 0) >= 1
    finally:
        gate.gate.set()
        sched.close()


class CountingGateEngine(GateEngine):
    """A GateEngine that records which documents run at the same time."""

    def __init__(self) -> None:
        super().__init__()
        self.running: list[str] = []
        self.max_running = 0
        self.overlap_same_doc = False
        self._track = threading.Lock()

    def complete(
        self, request: CompletionRequest, cancelled: Callable[[], bool] = lambda: False
    ) -> CompletionResult:
        with self._track:
            self.overlap_same_doc |= request.doc_id in self.running
            self.running.append(request.doc_id)
            self.max_running = max(self.max_running, len(self.running))
        try:
            return super().complete(request, cancelled)
        finally:
            with self._track:
                self.running.remove(request.doc_id)


def test_workers_run_different_documents_at_once_never_one_document_twice() -> None:
    engine = CountingGateEngine()
    engine.load()
    sched = FairScheduler(engine, SchedulerSettings(workers=3, replace_same_document=False))
    try:
        a, b = sched.session("alice"), sched.session("bob")
        jobs = [
            in_thread(lambda: a.complete(req("doc1", "a"))),
            in_thread(lambda: a.complete(req("doc1", "ab"))),  # same document: waits for the first
            in_thread(lambda: b.complete(req("doc1", "c"))),  # bob's doc1 is another document
            in_thread(lambda: b.complete(req("doc2", "d"))),
        ]
        wait_until(lambda: sched.scheduler_stats()["running"] == 3)
        assert sched.queue_depth() == 1  # alice's second doc1 request waits for her first
        assert not engine.overlap_same_doc
        engine.gate.set()
        for t, _ in jobs:
            t.join(10)
        results = [box.get("result") for _, box in jobs]
        assert all(isinstance(r, CompletionResult) and r.text for r in results)
        assert engine.max_running == 3 and not engine.overlap_same_doc
        assert sched.scheduler_stats()["workers"] == 3
    finally:
        engine.gate.set()
        sched.close()


def test_same_document_waits_even_with_a_free_worker() -> None:
    engine = CountingGateEngine()
    engine.load()
    sched = FairScheduler(engine, SchedulerSettings(workers=4, replace_same_document=False))
    try:
        a = sched.session("alice")
        first = in_thread(lambda: a.complete(req("doc1", "a")))
        wait_until(lambda: sched.scheduler_stats()["running"] == 1)
        second = in_thread(lambda: a.complete(req("doc1", "ab")))
        wait_until(lambda: sched.queue_depth() == 1)
        time.sleep(0.05)  # give a wrongly eager worker the chance to start it
        assert sched.scheduler_stats()["running"] == 1 and not engine.overlap_same_doc
        engine.gate.set()
        for t, _ in (first, second):
            t.join(10)
        assert isinstance(second[1].get("result"), CompletionResult)
        assert engine.max_running == 1 and not engine.overlap_same_doc
    finally:
        engine.gate.set()
        sched.close()
