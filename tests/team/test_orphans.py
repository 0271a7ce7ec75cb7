"""Issue 13 item 6: a client that disconnects mid-request must not leave its document re-created in the
engine when its request runs (or finishes) after the disconnect. Deterministic: events, no sleeps."""

from __future__ import annotations

import threading

from specls.decoder.api import CancelCheck, never_cancelled

from specls.api import CompletionRequest, CompletionResult
from specls.team.fake import FakeEngine, FakeEngineSettings
from specls.team.scheduler import FairScheduler
from tests.team.engines import loaded

WAIT_S = 30.0  # a hang bound, never a timing assertion


def req(doc: str) -> CompletionRequest:
    return CompletionRequest(doc_id=doc, prefix="x = ", suffix="", max_tokens=4)


class PromptThenState(FakeEngine):
    """Like an engine that builds the prompt before it creates the document's KV entry: each
    complete() announces ``entered`` and waits for ``proceed`` before touching any state, so a test
    can close the session exactly in that window."""

    def __init__(self) -> None:
        super().__init__(FakeEngineSettings(pass_s=0.0, tokens_per_pass=1))
        self.entered = threading.Event()
        self.proceed = threading.Event()

    def complete(
        self, request: CompletionRequest, cancelled: CancelCheck = never_cancelled
    ) -> CompletionResult:
        self.entered.set()
        assert self.proceed.wait(WAIT_S)
        return super().complete(request, cancelled)  # creates the document's fake KV first thing


def test_session_closed_while_its_request_runs_leaves_no_document() -> None:
    engine = PromptThenState()
    loaded(engine)
    sched = FairScheduler(engine)
    try:
        s = sched.session("alice")
        box: dict[str, CompletionResult] = {}
        t = threading.Thread(target=lambda: box.setdefault("r", s.complete(req("file:///a.py"))))
        t.start()
        assert engine.entered.wait(WAIT_S)
        s.close()  # the client disconnects: its documents are closed while the request is running
        engine.proceed.set()  # ... and only now does the engine create the document's state
        t.join(WAIT_S)
        assert not t.is_alive()
        assert box["r"].cancelled  # stopped at its first pass: the client is gone
        # wrong answer before the fix: kv_cached_sequences == 1 (an orphan nobody will ever close)
        stats = engine.stats()
        assert (stats["kv_cached_sequences"], stats["kv_bytes"]) == (0, 0)
    finally:
        sched.close()


def test_submit_after_the_session_closed_never_reaches_the_engine() -> None:
    """The window between ClientSession.complete's closed check and the scheduler's queue: a request
    submitted for a session the scheduler has dropped is answered cancelled, not queued and run."""
    engine = FakeEngine(FakeEngineSettings(pass_s=0.0))
    loaded(engine)
    sched = FairScheduler(engine)
    try:
        s = sched.session("alice")
        s.close()
        result = sched.submit(s, req(s.inner_id("file:///a.py")))
        assert result.cancelled
        assert engine.calls == []  # wrong before the fix: the queued request ran after the close
        assert engine.stats()["kv_cached_sequences"] == 0
        assert sched.queue_depth() == 0 and sched.active_clients == 0
    finally:
        sched.close()


def test_thirty_disconnects_mid_request_leave_the_engine_empty() -> None:
    """The issue's reproduction (30 disconnects: engine documents 1 -> 17), deterministically."""
    engine = PromptThenState()
    loaded(engine)
    sched = FairScheduler(engine)
    keeper = sched.session("bob")
    keeper.update_document("file:///kept.py", "kept = 1\n")
    try:
        for i in range(30):
            engine.entered.clear()
            engine.proceed.clear()
            s = sched.session(f"c{i}")
            t = threading.Thread(target=s.complete, args=(req(f"file:///victim{i}.py"),))
            t.start()
            assert engine.entered.wait(WAIT_S)
            s.close()
            engine.proceed.set()
            t.join(WAIT_S)
            assert not t.is_alive()
        stats = engine.stats()
        assert stats["open_documents"] == 1  # bob's, untouched
        assert stats["kv_cached_sequences"] == 0  # wrong before the fix: 30
    finally:
        sched.close()
