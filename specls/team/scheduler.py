"""One engine, many clients: a fair scheduler in front of an ``Engine``.

``FairScheduler`` owns ``workers`` threads that run the wrapped engine's ``complete`` (one by default,
the Engine contract; more only for an engine that batches concurrent requests, such as ``OnnxEngine``
with batching on). Two requests for the same document never run at once. Each client (one LSP
connection) gets a ``ClientSession`` -- itself an ``Engine`` -- whose calls are queued per client:

- per-client FIFO, round-robin across clients: a fast typist queues behind itself, never in front of
  a slow one;
- bounded: a per-client limit and a total limit. A newer request for the same document replaces the
  queued older one (and, by default, cancels it if it is running); over the per-client limit the
  client's oldest queued request is dropped; over the total limit the oldest request of the client
  with the longest queue is dropped. Dropped requests return an empty, ``cancelled`` result;
- cancellation: a queued request whose client cancels leaves the queue at once; a running one is
  stopped by the engine at its next target pass (the scheduler's cancel check also turns true when
  the request is superseded or its client disconnects);
- load-aware speculation: at dispatch the scheduler caps the speculation length from the queue depth
  (``CompletionRequest.speculation_cap``): the engine's own choice when idle, halved per extra queued
  request, 0 (drafting off) once the queue is deep enough that the target is the bottleneck or when
  recent acceptance is too low to pay for drafting under load. Decisions are counted in ``stats()``.

Next edits (``ClientSession.next_edit``) queue the same way, fair between clients, but below every
completion: a queued completion of any client starts before a queued next edit, and a completion
request of a client cancels that client's queued or running next edit (outcome ``preempted``), so
keystroke latency does not pay for next edits. A newer next edit for a document replaces the older
one as a newer completion does; a completion and a next edit never replace each other.

Document ids are namespaced per session so two editors with the same file open never share (or
corrupt) each other's KV prefix; ``ClientSession.close`` closes all of its documents in the engine
(freeing their KV caches) and cancels its outstanding requests.

Batching target passes of different clients happens in the engine (``specls.decoder.batching``): the
scheduler only lets up to ``workers`` requests run at once."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from specls.api import (
    CompletionRequest,
    CompletionResult,
    Engine,
    EngineError,
    NextEditRequest,
    NextEditResult,
    no_next_edit,
)
from specls.decoder.api import CancelCheck, never_cancelled
from specls.next_edit.request_prompt import doc_path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SchedulerSettings:
    max_queue: int = 64  # queued (not running) requests over all clients
    per_client_queue: int = 4  # queued requests per client
    replace_same_document: bool = True  # a newer request for a document replaces the queued older one
    cancel_superseded_running: bool = True  # ... and stops the running older one at its next pass
    load_aware: bool = True
    # "depth": cap gamma by queue depth, drafting off when deep (for backends whose passes grow with
    # the batch); "acceptance": leave gamma to the engine, drafting off only when recent acceptance is
    # too low to pay under load; "off": never cap.
    policy: str = "depth"
    gamma_max: int = 8  # cap with one request waiting behind the running one (halved per extra)
    drafting_off_depth: int = 4  # queue depth (running + queued) at which drafting is switched off
    min_acceptance: float = 0.25  # under load, drafting off when recent acceptance is below this
    acceptance_window: int = 32  # results in the rolling acceptance estimate
    poll_s: float = 0.02  # how often a waiting caller re-checks its own cancellation
    workers: int = 1  # requests running at once (> 1 only for an engine that batches them)


@dataclass
class RequestEvent:
    """What happened to one request; observers (metrics, request log) get one per request."""

    client: str
    session: int
    doc_id: str  # the client's own document id (not namespaced)
    outcome: str  # served | cancelled | superseded | preempted | dropped | error
    result: CompletionResult | None  # a next edit's: its decode as a completion (text: the rewrite)
    latency_s: float  # submit -> result
    queued_s: float  # submit -> dispatch (or -> drop)
    speculation_cap: int | None
    speculation_reason: str | None = None  # None when never dispatched to the engine
    error: str | None = None
    kind: str = "completion"  # completion | next_edit


class SchedulerObserver(Protocol):
    def on_request(self, event: RequestEvent) -> None: ...


@dataclass
class _Job:
    session: ClientSession
    request: CompletionRequest | NextEditRequest  # doc ids already namespaced
    caller_cancelled: CancelCheck
    submitted: float
    done: threading.Event = field(default_factory=threading.Event)
    result: CompletionResult | NextEditResult | None = None
    error: BaseException | None = None
    stop_flag: str | None = None  # superseded | preempted | dropped | disconnected
    dispatched: float | None = None
    cap: int | None = None
    cap_reason: str | None = None

    @property
    def doc_id(self) -> str:
        return self.request.doc_id

    @property
    def is_edit(self) -> bool:
        return isinstance(self.request, NextEditRequest)

    def kind(self) -> str:
        return "next_edit" if self.is_edit else "completion"

    def unrun(self) -> CompletionResult | NextEditResult:
        """The empty, cancelled answer of a request that never ran (or whose session left)."""
        if isinstance(self.request, NextEditRequest):
            return no_next_edit(self.request, "cancelled")
        return _cancelled_result("unrun")

    def event(
        self,
        outcome: str,
        result: CompletionResult | None,
        now: float,
        queued_until: float,
        error: BaseException | None = None,
    ) -> RequestEvent:
        """What happened to this job, for the observers: submitted until ``now``, queued until
        ``queued_until`` (its dispatch, or ``now`` for one that never ran: no speculation cap then)."""
        return RequestEvent(
            client=self.session.client,
            session=self.session.id,
            doc_id=self.session.outer_id(self.doc_id),
            outcome=outcome,
            result=result,
            latency_s=now - self.submitted,
            queued_s=queued_until - self.submitted,
            speculation_cap=self.cap,
            speculation_reason=self.cap_reason,
            error=None if error is None else f"{type(error).__name__}: {error}",
            kind=self.kind(),
        )

    def cancelled(self) -> bool:
        if self.stop_flag is not None:
            return True
        try:
            return bool(self.caller_cancelled())
        except Exception:  # a broken cancel check means nobody is waiting
            return True


def _cancelled_result(reason: str) -> CompletionResult:
    del reason  # the reason travels in RequestEvent.outcome
    return CompletionResult(text="", tokens=0, stop_reason="cancelled", cancelled=True)


def edit_as_completion(result: NextEditResult) -> CompletionResult:
    """A next edit's decode in a completion's terms, for observers (metrics, request log).

    >>> from specls.next_edit.edits import Region
    >>> edit_as_completion(NextEditResult((), Region(0, 2), "x = 1\\n", tokens=4)).text
    'x = 1\\n'
    """
    return CompletionResult(
        text=result.rewritten or "",
        tokens=result.tokens,
        stop_reason=result.stop_reason,
        cancelled=result.cancelled,
        decode=result.decode,
        prefix_reused_tokens=result.prefix_reused_tokens,
        provider=result.provider,
    )


_OUTCOMES = ("superseded", "preempted", "dropped")  # why a request stopped, besides "cancelled"


@dataclass(frozen=True)
class SpeculationDecision:
    cap: int | None  # None = the engine's own choice
    reason: str  # idle | shrink | off_depth | off_acceptance | pays | disabled


SPECULATION_POLICIES = ("depth", "acceptance", "off")


def decide_speculation(
    settings: SchedulerSettings, depth: int, acceptance: float | None
) -> SpeculationDecision:
    """The speculation cap for a request dispatched with ``depth`` requests in the system (itself
    included). Pure, so the policy is testable on its own."""
    if not settings.load_aware or settings.policy == "off":
        return SpeculationDecision(None, "disabled")
    if depth <= 1:
        return SpeculationDecision(None, "idle")
    if settings.policy == "depth" and depth >= settings.drafting_off_depth:
        return SpeculationDecision(0, "off_depth")
    if acceptance is not None and acceptance < settings.min_acceptance:
        return SpeculationDecision(0, "off_acceptance")
    if settings.policy == "acceptance":
        return SpeculationDecision(None, "pays")
    return SpeculationDecision(max(1, settings.gamma_max >> (depth - 2)), "shrink")


class _Queues:
    """The scheduler's queued and running requests and the order it serves them in. Every method
    runs with the scheduler's lock held."""

    def __init__(self, settings: SchedulerSettings) -> None:
        self.settings = settings
        self.queues: dict[int, deque[_Job]] = {}
        self.rr: deque[int] = deque()  # sessions with queued work, in service order
        self.running: list[_Job] = []

    def queued(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def admit(self, job: _Job) -> list[tuple[_Job, str]]:
        """Queue ``job``; returns what left the queues to make room for it, each with why."""
        q = self.queues.setdefault(job.session.id, deque())
        to_finish = self._make_room(job, q)
        q.append(job)
        self._requeue()
        return to_finish

    def _make_room(self, job: _Job, q: deque[_Job]) -> list[tuple[_Job, str]]:
        """Takes out of the queues, to make room for ``job`` in its session's queue ``q``, what must
        leave them, and returns each with why."""
        s = self.settings
        to_finish: list[tuple[_Job, str]] = []
        # Sweep requests whose callers already gave up: they free their slots now.
        for old in [j for j in q if j.cancelled()]:
            q.remove(old)
            to_finish.append((old, "cancelled"))
        if not job.is_edit:  # a completion goes before the client's next edits: they stop
            to_finish += self._take(q, job, lambda old: old.is_edit, "preempted", True)
        if s.replace_same_document:

            def same(old: _Job) -> bool:  # a completion and a next edit never replace each other
                return old.is_edit == job.is_edit and old.doc_id == job.doc_id

            to_finish += self._take(q, job, same, "superseded", s.cancel_superseded_running)
        while len(q) >= max(1, s.per_client_queue):
            to_finish.append((q.popleft(), "dropped"))
        total = self.queued()
        while total >= max(1, s.max_queue):
            victim_sid = max(self.queues, key=lambda k: len(self.queues[k]))
            to_finish.append((self.queues[victim_sid].popleft(), "dropped"))
            total -= 1
        return to_finish

    def _take(
        self, q: deque[_Job], job: _Job, which: Callable[[_Job], bool], why: str, running: bool
    ) -> list[tuple[_Job, str]]:
        """``job``'s session's requests ``which`` leave its queue ``q`` (to be finished with ``why``);
        with ``running``, its running ones stop at their next pass."""
        taken = [old for old in q if which(old)]
        for old in taken:
            q.remove(old)
        if running:
            for run in self.running:
                if run.session is job.session and which(run):
                    run.stop_flag = why
        return [(old, why) for old in taken]

    def withdraw(self, job: _Job) -> bool:
        """Take a queued ``job`` out (its caller gave up); False when it is not queued."""
        q = self.queues.get(job.session.id)
        if job.dispatched is not None or q is None or job not in q:
            return False
        q.remove(job)
        self._requeue()
        return True

    def drop_session(self, session: ClientSession) -> list[_Job]:
        """The session's queued jobs, out of the queues; its running ones stop at their next pass."""
        q = self.queues.pop(session.id, None)
        if session.id in self.rr:
            self.rr.remove(session.id)
        self.stop_running(lambda run: run.session is session)
        return list(q or ())

    def stop_running(self, which: Callable[[_Job], bool]) -> None:
        for run in self.running:
            if which(run):
                run.stop_flag = "disconnected"

    def pop_next(self) -> _Job | None:
        """The next job to start (fair: its session goes to the back of the line), if one can."""
        sid = self._next_session()
        if sid is None:
            return None
        self.rr.remove(sid)
        q = self.queues[sid]
        job = q.popleft()
        if q:
            self.rr.append(sid)  # back of the line: round-robin
        return job

    def _requeue(self) -> None:
        # keep rr == sessions with non-empty queues, order preserved
        live = [sid for sid in self.rr if self.queues.get(sid)]
        for sid, q in self.queues.items():
            if q and sid not in live:
                live.append(sid)
        self.rr = deque(live)

    def _next_session(self) -> int | None:
        """The first session in service order whose next job can start now: its document has no
        running request (a document's KV cache serves one request at a time); a session whose next
        job is a completion goes before one whose next job is a next edit."""
        edit_first: int | None = None
        for sid in list(self.rr):
            q = self.queues.get(sid)
            if not q:
                self.rr.remove(sid)
                continue
            head = q[0]
            if any(r.session is head.session and r.doc_id == head.doc_id for r in self.running):
                continue
            if not head.is_edit:
                return sid
            if edit_first is None:
                edit_first = sid
        return edit_first


class FairScheduler:
    """Fair, bounded, load-aware front of one Engine. Create sessions with ``session(name)``."""

    def __init__(
        self,
        engine: Engine,
        settings: SchedulerSettings = SchedulerSettings(),
        observers: tuple[SchedulerObserver, ...] = (),
    ) -> None:
        if settings.policy not in SPECULATION_POLICIES:
            raise ValueError(
                f"speculation policy must be one of {SPECULATION_POLICIES}, not {settings.policy!r}"
            )
        self.engine = engine
        self.settings = settings
        self._observers = list(observers)
        self._cond = threading.Condition()
        self._q = _Queues(settings)
        self._sessions: dict[int, ClientSession] = {}
        self._ids = itertools.count(1)
        self._closed = False
        self._load_lock = threading.Lock()
        self._accept: deque[tuple[int, int]] = deque(maxlen=settings.acceptance_window)
        self._counts: dict[str, int] = {
            "submitted": 0,
            "served": 0,
            "cancelled": 0,
            "superseded": 0,
            "preempted": 0,
            "dropped": 0,
            "errors": 0,
        }
        self._decisions: dict[str, int] = {}
        self._last_decision = SpeculationDecision(None, "idle")
        self._max_depth = 0
        self._workers = [
            threading.Thread(target=self._run, name=f"specls-scheduler-{i}", daemon=True)
            for i in range(max(1, settings.workers))
        ]
        for w in self._workers:
            w.start()

    # -- sessions --------------------------------------------------------------------------------

    def add_observer(self, observer: SchedulerObserver) -> None:
        self._observers.append(observer)

    def session(self, client: str, namespace: bool = True) -> ClientSession:
        """A new client session. ``namespace=False`` when the caller already makes document ids unique
        per connection (the LSP server prefixes them per session)."""
        with self._cond:
            sid = next(self._ids)
            s = ClientSession(self, client, sid, namespace)
            self._sessions[sid] = s
            return s

    @property
    def active_clients(self) -> int:
        with self._cond:
            return len(self._sessions)

    def clients(self) -> dict[str, int]:
        """Active sessions per client name."""
        with self._cond:
            out: dict[str, int] = {}
            for s in self._sessions.values():
                out[s.client] = out.get(s.client, 0) + 1
            return out

    def _drop_session(self, session: ClientSession) -> None:
        with self._cond:
            self._sessions.pop(session.id, None)
            dropped = self._q.drop_session(session)
            self._cond.notify_all()
        for job in dropped:
            self._finish_unrun(job, "disconnected")

    # -- Engine-ish surface ------------------------------------------------------------------------

    def load(self, progress: Callable[[str, float], None] | None = None) -> None:
        with self._load_lock:
            if not self.engine.ready:
                self.engine.load(progress)

    @property
    def ready(self) -> bool:
        return self.engine.ready

    def queue_depth(self) -> int:
        """Requests waiting (not counting the running one)."""
        with self._cond:
            return self._q.queued()

    def acceptance(self) -> float | None:
        with self._cond:
            drafted = sum(d for d, _ in self._accept)
            accepted = sum(a for _, a in self._accept)
        return accepted / drafted if drafted else None

    def submit(
        self, session: ClientSession, request: CompletionRequest, cancelled: CancelCheck = never_cancelled
    ) -> CompletionResult:
        """Queue ``request`` for ``session`` and block until it is served, dropped or cancelled."""
        result = self._submit(_Job(session, request, cancelled, time.monotonic()))
        assert isinstance(result, CompletionResult)
        return result

    def submit_edit(
        self, session: ClientSession, request: NextEditRequest, cancelled: CancelCheck = never_cancelled
    ) -> NextEditResult:
        """Queue a next edit for ``session`` (below every completion) and block until it is served,
        dropped, preempted or cancelled."""
        result = self._submit(_Job(session, request, cancelled, time.monotonic()))
        assert isinstance(result, NextEditResult)
        return result

    def _submit(self, job: _Job) -> CompletionResult | NextEditResult:
        session = job.session
        with self._cond:
            if self._closed:
                raise EngineError("the completion service is shutting down")
            if self._sessions.get(session.id) is not session:
                # The session closed between its caller's check and here: queueing would run the
                # request after close freed the session's documents, and re-create one in the engine.
                return job.unrun()
            self._counts["submitted"] += 1
            to_finish = self._q.admit(job)
            depth = self._q.queued() + len(self._q.running)
            self._max_depth = max(self._max_depth, depth)
            self._cond.notify_all()
        for old, why in to_finish:
            self._finish_unrun(old, why)
        self._wait(job)
        if job.error is not None:
            raise job.error
        assert job.result is not None
        return job.result

    def _wait(self, job: _Job) -> None:
        """Wait until ``job`` is done, re-checking its cancellation so a queued request leaves
        without a target pass."""
        while not job.done.wait(self.settings.poll_s):
            if job.dispatched is None and job.cancelled():
                with self._cond:
                    removed = self._q.withdraw(job)
                if removed:
                    self._finish_unrun(job, job.stop_flag or "cancelled")

    def _finish_unrun(self, job: _Job, why: str) -> None:
        if job.done.is_set():
            return
        outcome = why if why in _OUTCOMES else "cancelled"
        with self._cond:
            self._counts[outcome] += 1
        job.result = job.unrun()
        now = time.monotonic()
        self._emit(job.event(outcome, _cancelled_result(why), now, queued_until=now))
        job.done.set()

    def _emit(self, event: RequestEvent) -> None:
        for obs in self._observers:
            try:
                obs.on_request(event)
            except Exception:
                log.exception("scheduler observer failed")

    def _forget_document(self, doc_id: str) -> None:
        """A request of a session that closed while it ran: the session already closed its documents,
        and the engine may have (re)created this one's state during the run (an engine builds the
        prompt before it creates a document's KV entry). Close it again so nothing is orphaned."""
        try:
            self.engine.close_document(doc_id)
        except Exception:
            log.exception("closing a departed client's document failed")

    # -- worker ------------------------------------------------------------------------------------

    def _next_job(self) -> _Job | None:
        with self._cond:
            while True:
                if self._closed:
                    return None
                job = self._q.pop_next()
                if job is not None:
                    if job.cancelled():
                        self._cond.release()
                        try:
                            self._finish_unrun(job, job.stop_flag or "cancelled")
                        finally:
                            self._cond.acquire()
                        continue
                    depth = 1 + len(self._q.running) + self._q.queued()
                    drafted = sum(d for d, _ in self._accept)
                    acc = sum(a for _, a in self._accept) / drafted if drafted else None
                    decision = decide_speculation(self.settings, depth, acc)
                    self._decisions[decision.reason] = self._decisions.get(decision.reason, 0) + 1
                    self._last_decision = decision
                    job.cap, job.cap_reason = decision.cap, decision.reason
                    job.dispatched = time.monotonic()
                    self._q.running.append(job)
                    return job
                self._cond.wait()

    def _run(self) -> None:
        while True:
            job = self._next_job()
            if job is None:
                return
            result, error = self._execute(job)
            with self._cond:
                departed = self._sessions.get(job.session.id) is not job.session
            if departed:
                self._forget_document(job.doc_id)
            self._settle(job, result, error)

    def _execute(self, job: _Job) -> tuple[CompletionResult | NextEditResult | None, BaseException | None]:
        """Run ``job`` on the engine: its result, or the error it raised (for its caller)."""
        req = job.request
        try:
            if isinstance(req, NextEditRequest):
                return self.engine.next_edit(req, job.cancelled), None
            if job.cap is not None:
                req = dataclasses.replace(req, speculation_cap=job.cap)
            return self.engine.complete(req, job.cancelled), None
        except BaseException as exc:  # report to the caller, keep serving others
            return None, exc

    def _settle(
        self, job: _Job, result: CompletionResult | NextEditResult | None, error: BaseException | None
    ) -> None:
        """Count a job the engine ran, tell the observers, and hand the result to its caller."""
        summary = edit_as_completion(result) if isinstance(result, NextEditResult) else result
        now = time.monotonic()
        with self._cond:
            self._q.running.remove(job)
            if summary is not None:
                if summary.cancelled or job.stop_flag is not None:
                    outcome = job.stop_flag if job.stop_flag in _OUTCOMES else "cancelled"
                else:
                    outcome = "served"
                    if summary.drafted:
                        self._accept.append((summary.drafted, summary.accepted))
                self._counts[outcome] += 1
            else:
                outcome = "error"
                self._counts["errors"] += 1
            self._cond.notify_all()
        job.result, job.error = result, error
        assert job.dispatched is not None
        self._emit(job.event(outcome, summary, now, queued_until=job.dispatched, error=error))
        job.done.set()

    # -- lifecycle / stats -------------------------------------------------------------------------

    def close(self) -> None:
        with self._cond:
            self._closed = True
            sessions = list(self._sessions.values())
            self._q.stop_running(lambda run: True)
            self._cond.notify_all()
        for s in sessions:
            s.close()
        for w in self._workers:
            w.join(timeout=10)

    def scheduler_stats(self) -> dict[str, object]:
        acc = self.acceptance()
        with self._cond:
            return {
                "active_clients": len(self._sessions),
                "queue_depth": self._q.queued(),
                "running": len(self._q.running),
                "workers": len(self._workers),
                "max_depth_seen": self._max_depth,
                **self._counts,
                "speculation": {
                    "load_aware": self.settings.load_aware,
                    "policy": self.settings.policy if self.settings.load_aware else "off",
                    "current_cap": self._last_decision.cap,
                    "last_reason": self._last_decision.reason,
                    "decisions": dict(self._decisions),
                    "recent_acceptance": None if acc is None else round(acc, 3),
                },
            }

    def interrupt(self) -> None:
        """Nothing to stop from here: the scheduler preempts its own work between passes."""

    def stats(self) -> dict[str, object]:
        try:
            engine_stats = self.engine.stats()
        except Exception as exc:
            engine_stats = {"error": f"{type(exc).__name__}: {exc}"}
        return {"scheduler": self.scheduler_stats(), "engine": engine_stats}


_SEP = "\x1f"  # unit separator: never in an LSP uri


class ClientSession:
    """One client's view of the shared engine (an ``Engine``). Document ids are namespaced by session;
    ``close`` releases everything the session holds."""

    def __init__(self, scheduler: FairScheduler, client: str, sid: int, namespace: bool = True) -> None:
        self.scheduler = scheduler
        self.client = client
        self.id = sid
        self.namespace = namespace
        self._docs: set[str] = set()
        self._lock = threading.Lock()
        self._closed = False

    def inner_id(self, doc_id: str) -> str:
        return f"s{self.id}{_SEP}{doc_id}" if self.namespace else doc_id

    def outer_id(self, inner: str) -> str:
        if not self.namespace:
            return inner
        prefix = f"s{self.id}{_SEP}"
        return inner[len(prefix) :] if inner.startswith(prefix) else inner

    @property
    def open_documents(self) -> int:
        with self._lock:
            return len(self._docs)

    # Engine protocol
    def load(self, progress: Callable[[str, float], None] | None = None) -> None:
        self.scheduler.load(progress)

    @property
    def ready(self) -> bool:
        return self.scheduler.ready

    def update_document(self, doc_id: str, text: str) -> None:
        with self._lock:
            if self._closed:
                return
            self._docs.add(doc_id)
        self.scheduler.engine.update_document(self.inner_id(doc_id), text)

    def close_document(self, doc_id: str) -> None:
        with self._lock:
            self._docs.discard(doc_id)
        self.scheduler.engine.close_document(self.inner_id(doc_id))

    def complete(
        self, request: CompletionRequest, cancelled: CancelCheck = never_cancelled
    ) -> CompletionResult:
        with self._lock:
            if self._closed:
                return _cancelled_result("disconnected")
            self._docs.add(request.doc_id)  # the engine may now hold KV for it: freed on close
        inner = dataclasses.replace(
            request,
            doc_id=self.inner_id(request.doc_id),
            context_docs=tuple((self.inner_id(u), t) for u, t in request.context_docs),
        )
        return self.scheduler.submit(self, inner, cancelled)

    def next_edit(self, request: NextEditRequest, cancelled: CancelCheck = never_cancelled) -> NextEditResult:
        """A next edit through the scheduler: fair between clients, below every completion (one of
        this client's completion requests preempts it). Only the document id is namespaced: the file's
        path and the other files' names go into the prompt as the client named them."""
        with self._lock:
            if self._closed:
                return no_next_edit(request, "cancelled")
            self._docs.add(request.doc_id)  # the engine may now hold its edit KV: freed on close
        inner = dataclasses.replace(request, doc_id=self.inner_id(request.doc_id), path=doc_path(request))
        return self.scheduler.submit_edit(self, inner, cancelled)

    def interrupt(self) -> None:
        """Nothing to stop from here: the scheduler preempts its own work between passes."""

    def stats(self) -> dict[str, object]:
        out = self.scheduler.stats()
        out["session"] = {"client": self.client, "id": self.id, "open_documents": self.open_documents}
        return out

    def close(self) -> None:
        """The client went away: cancel its requests and close its documents (frees their KV)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            docs = list(self._docs)
            self._docs.clear()
        self.scheduler._drop_session(self)
        for d in docs:
            try:
                self.scheduler.engine.close_document(self.inner_id(d))
            except Exception:
                log.exception("closing a document of a departed client failed")
