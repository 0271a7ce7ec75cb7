"""Next edits through the FairScheduler: a client's session delegates them as it does completions
(namespaced document, the client's path in the prompt), fair between clients but below every
completion; a completion of the same client preempts its queued or running next edit."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from specls.api import CompletionResult, NextEditRequest, NextEditResult
from specls.team.metrics import Metrics
from specls.team.scheduler import FairScheduler, SchedulerSettings
from specls.team.service import TeamMetricsObserver
from tests.team.engines import EditGateEngine
from tests.team.test_scheduler import Recorder, in_thread, req, wait_until

URI = "file:///w/app.py"
TEXT = "x = 1\ny = 2\n"


def edit_req(doc: str = URI) -> NextEditRequest:
    return NextEditRequest(doc, TEXT, 0, 0, context_docs=(("file:///w/other.py", "z = 3\n"),))


def observed_scheduler(engine: EditGateEngine) -> tuple[FairScheduler, Recorder, Metrics]:
    """A scheduler whose events go to a Recorder and to the team's metrics."""
    rec, metrics = Recorder(), Metrics()
    return FairScheduler(engine, observers=(rec, TeamMetricsObserver(metrics, None))), rec, metrics


@pytest.fixture
def engine() -> Iterator[EditGateEngine]:
    e = EditGateEngine()
    e.load()
    yield e
    e.gate.set()


def test_next_edit_goes_through_the_session(engine: EditGateEngine) -> None:
    sched, rec, metrics = observed_scheduler(engine)
    try:
        s = sched.session("alice")
        engine.gate.set()
        r = s.next_edit(edit_req())
        assert isinstance(r, NextEditResult) and not r.cancelled
        assert [e.text for e in r.edits] == ["edited\n"]
        (sent,) = engine.edit_requests
        # the engine sees the namespaced document, the prompt the client's names
        assert sent.doc_id == s.inner_id(URI) and sent.path == "/w/app.py"
        assert sent.context_docs == (("file:///w/other.py", "z = 3\n"),)
        assert rec.outcomes(URI) == ["served"] and rec.events[0].kind == "next_edit"
        assert sched.scheduler_stats()["served"] == 1
        assert metrics.value("next_edits", {"outcome": "served"}) == 1
        # the session holds the document the next edit ran on, to free it when it closes
        assert s.open_documents == 1
        s.close()
        assert s.open_documents == 0
        assert s.next_edit(edit_req()).cancelled  # a closed session answers nothing
    finally:
        sched.close()


def test_completion_preempts_the_running_next_edit_of_its_client(engine: EditGateEngine) -> None:
    sched, rec, metrics = observed_scheduler(engine)
    try:
        s = sched.session("alice")
        te, be = in_thread(lambda: s.next_edit(edit_req()))
        wait_until(engine.edit_entered.is_set)
        tc, bc = in_thread(lambda: s.complete(req(URI, "x = ")))
        te.join(5)
        r = be["result"]
        assert isinstance(r, NextEditResult) and r.cancelled and not r.edits  # stopped at its next pass
        engine.gate.set()
        tc.join(5)
        c = bc["result"]
        assert isinstance(c, CompletionResult) and c.text == engine.expected_text("x = ", "", 4)
        assert rec.outcomes(URI) == ["preempted", "served"]
        st = sched.scheduler_stats()
        assert st["preempted"] == 1 and st["served"] == 1
        assert metrics.value("cancellations", {"reason": "preempted"}) == 1
        assert metrics.value("next_edits", {"outcome": "preempted"}) == 1
    finally:
        sched.close()


def test_completion_preempts_a_queued_next_edit_only_of_its_client(engine: EditGateEngine) -> None:
    sched = FairScheduler(engine, SchedulerSettings(load_aware=False))
    try:
        a, b = sched.session("alice"), sched.session("bob")
        t0, _ = in_thread(lambda: b.complete(req("running")))
        wait_until(engine.entered.is_set)
        ta, ba = in_thread(lambda: a.next_edit(edit_req()))
        tb, bb = in_thread(lambda: b.next_edit(edit_req()))
        wait_until(lambda: sched.queue_depth() == 2)
        tc, bc = in_thread(lambda: a.complete(req("other.py")))  # another document: still preempts
        ta.join(5)
        ra = ba["result"]
        assert isinstance(ra, NextEditResult) and ra.cancelled
        engine.gate.set()
        for t in (t0, tb, tc):
            t.join(5)
        rb, rc = bb["result"], bc["result"]
        assert isinstance(rb, NextEditResult) and not rb.cancelled and rb.edits  # bob's kept its turn
        assert isinstance(rc, CompletionResult) and not rc.cancelled
        assert f"next_edit:{a.inner_id(URI)}" not in engine.order  # alice's never ran
    finally:
        sched.close()


def test_completions_of_any_client_go_before_queued_next_edits(engine: EditGateEngine) -> None:
    sched = FairScheduler(engine, SchedulerSettings(load_aware=False))
    try:
        a, b, c = sched.session("alice"), sched.session("bob"), sched.session("carol")
        t0, _ = in_thread(lambda: c.complete(req("running")))
        wait_until(engine.entered.is_set)
        ta, _ = in_thread(lambda: a.next_edit(edit_req()))
        wait_until(lambda: sched.queue_depth() == 1)
        tb, _ = in_thread(lambda: b.complete(req("b.py")))  # queued after alice's next edit
        wait_until(lambda: sched.queue_depth() == 2)
        engine.gate.set()
        for t in (t0, ta, tb):
            t.join(5)
        assert engine.order[1:] == [f"complete:{b.inner_id('b.py')}", f"next_edit:{a.inner_id(URI)}"]
    finally:
        sched.close()


def test_newer_next_edit_replaces_the_older_never_a_completion(engine: EditGateEngine) -> None:
    rec = Recorder()
    sched = FairScheduler(engine, observers=(rec,))
    try:
        s = sched.session("alice")
        t0, b0 = in_thread(lambda: s.complete(req(URI, "x = ")))
        wait_until(engine.entered.is_set)
        t1, b1 = in_thread(lambda: s.next_edit(edit_req()))
        wait_until(lambda: sched.queue_depth() == 1)
        t2, b2 = in_thread(lambda: s.next_edit(edit_req()))
        t1.join(5)
        r1 = b1["result"]
        assert isinstance(r1, NextEditResult) and r1.cancelled  # replaced while queued
        engine.gate.set()
        for t in (t0, t2):
            t.join(5)
        r0, r2 = b0["result"], b2["result"]
        assert isinstance(r0, CompletionResult) and not r0.cancelled  # the next edit left it alone
        assert isinstance(r2, NextEditResult) and r2.edits
        assert rec.outcomes(URI) == ["superseded", "served", "served"]
    finally:
        sched.close()
