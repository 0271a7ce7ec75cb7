"""The specls language server (pygls): inline completions from an ``Engine``, text in, text out.

- ``EngineHost``: one engine shared by every session (connection): its load state, its single worker
  thread (generations and document updates run there, in order; the event loop never blocks) and the
  server counters that ``specls/stats`` reports.
- ``create_server(settings, engine)``: one session's ``LanguageServer``: documents, settings, and the
  newest-request-wins bookkeeping. Pass ``host=`` to share an engine between sessions.

A ``Session`` keeps its parts in their own modules: ``team_auth`` (team mode's token check and engine
view, behind typed protocols), ``continuation`` (a line-first answer's block, decoded once the user
pauses), ``document_sync`` (the engine's copy of the open buffers), ``load_progress`` (the model load
shown in the client), ``counters`` (what ``specls/stats`` reports) and ``job`` (one request).

Never stale: a completion request is for the document as it was when the request arrived. Its snapshot
is taken when the message is dispatched (``SpeclsProtocol.handle_message``), before the messages after it
in the same read (a didChange right behind it) are applied; the answer is computed on that snapshot and
dropped (empty answer) when the document changed before it is sent. A didChange or a newer request for
the same document, and ``$/cancelRequest``, cancel the request, queued or running (a running generation
stops at its next target pass: the pass in flight, finished, is what the next keystroke types through).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import itertools
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcServerNotInitialized
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol, default_converter
from pygls.protocol.json_rpc import JsonRPCNotification, RPCNotification, RPCRequest
from pygls.protocol.language_server import lsp_method
from specls.lsp import next_edit_feature
from specls.lsp.continuation import Continuation
from specls.lsp.counters import Counters
from specls.lsp.document_sync import DocumentSync
from specls.lsp.documents import Document, DocumentStore, sanitize, window
from specls.lsp.event_loop import post_to_loop
from specls.lsp.job import CursorParams, Job
from specls.lsp.load_progress import LoadProgress
from specls.lsp.next_edit_feature import NextEdits
from specls.lsp.postprocess import (
    Completion,
    CursorContext,
    finalize,
    first_line_point,
    lf_breaks,
    make_context,
    stop_point,
)
from specls.lsp.settings import ServerSettings, parse_settings
from specls.lsp.team_auth import Team, TeamAuth

from specls import __version__
from specls.api import CompletionRequest, CompletionResult, Engine

logger = logging.getLogger(__name__)

SERVER_NAME = "specls"
SERVER_VERSION = __version__  # pyproject.toml, read once (specls/__init__.py)
STATS_METHOD = "specls/stats"
ACCEPTED_METHOD = "specls/accepted"
SHOWN_METHOD = "specls/shown"
PREFIX_CHARS = 24_000  # text before the cursor handed to the engine (it builds its prompt from the end)
SUFFIX_CHARS = 6_000
CONTEXT_DOCS = 4  # other open buffers passed as context
CONTEXT_DOC_CHARS = 32_000
COMPLETION_TRIGGERS = [".", "(", "[", "{", ",", ":", "="]
COMPLETION_REQUESTS = (types.InlineCompletionRequest, types.CompletionRequest)

EngineFactory = Callable[[ServerSettings], Engine]


def _jsonable(value: Any) -> Any:
    """Engine stats may hold numpy scalars or dataclasses: make them plain JSON values."""
    return json.loads(json.dumps(value, default=lambda o: o.item() if hasattr(o, "item") else str(o)))


class EngineHost:
    """One engine for every session: load once, run everything engine-side on one worker thread."""

    def __init__(self, engine: Engine, factory: EngineFactory | None = None) -> None:
        self.engine = engine
        self.factory = factory
        self.executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="specls-engine"
        )
        self.state = "new"  # new | loading | ready | failed
        self.error = ""
        self.counters = Counters()
        self.sessions = 0
        self.team: Team | None = None  # the team service, when serving a team (specls serve --tcp)
        self._lock = threading.Lock()
        self._load: concurrent.futures.Future[None] | None = None
        self._progress_listeners: list[Callable[[str, float], None]] = []
        self._background: Job | None = None  # the queued or running background work (one at a time)
        # ... when a client asked for it (a next edit), its future: a speculative block waits for it
        self._asked: concurrent.futures.Future[Any] | None = None

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    def configure(self, settings: ServerSettings) -> bool:
        """Rebuild the engine for new engine-level settings; only possible before loading starts."""
        with self._lock:
            if self.state != "new" or self.factory is None:
                return False
            self.engine = self.factory(settings)
            return True

    def start_load(
        self, progress: Callable[[str, float], None] | None = None
    ) -> concurrent.futures.Future[None]:
        """Start loading (once); every caller gets the same future."""
        with self._lock:
            if progress is not None:
                self._progress_listeners.append(progress)
            if self._load is None:
                self.state = "loading"
                self._load = self.executor.submit(self._do_load)
            return self._load

    def _report(self, message: str, fraction: float) -> None:
        for listener in list(self._progress_listeners):
            try:
                listener(message, fraction)
            except Exception:  # a listener of a closed session
                logger.debug("progress listener failed", exc_info=True)

    def _do_load(self) -> None:
        started = time.monotonic()
        try:
            self.engine.load(self._report)
            if not self.engine.ready:
                raise RuntimeError("the engine finished loading but is not ready")
        except Exception as exc:
            self.error = str(exc) or type(exc).__name__
            self.state = "failed"
            logger.error("engine load failed: %s", self.error)
            raise
        finally:
            self._progress_listeners.clear()
        self.state = "ready"
        logger.info("engine ready in %.1f s", time.monotonic() - started)

    def submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        return self.executor.submit(fn)

    def submit_background(
        self, job: Job, fn: Callable[[], Any], asked: bool = True
    ) -> concurrent.futures.Future[Any]:
        """Work that goes after every completion request: a next edit a client ``asked`` for, or a
        line-first answer's block (speculative: ``asked`` False, submitted only while no asked-for
        work is pending, ``asked_pending``). Cancelled through ``job`` by ``preempt``; one at a time
        (submitting preempts the previous one). Event loop thread only."""
        self.preempt()
        self._background = job
        future = self.executor.submit(fn)
        self._asked = future if asked else None
        return future

    def asked_pending(self) -> bool:
        """Background work a client asked for is queued or running (and not preempted)."""
        job, future = self._background, self._asked
        return job is not None and future is not None and not job.cancelled and not future.done()

    def after_asked(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` once the background work a client asked for is done (at once when there is
        none): on the engine thread, or on this one when it is done already."""
        future = self._asked
        if future is None:
            fn()
        else:
            future.add_done_callback(lambda _: fn())

    def preempt(self) -> None:
        """A request or an edit came: cancel the background work (a running decode stops at its next
        target pass; a next edit's pass in flight is stopped midway, ``Engine.interrupt``, so the
        request does not wait for it). Event loop thread only."""
        job, self._background = self._background, None
        if job is not None:
            job.cancel("preempted")
            future = self._asked
            if future is not None and future.running():
                # a next edit's pass in flight is stopped: the request or the edit that came does not
                # wait for it (a pass that just began another job's work is run again by that job's
                # decode). A block's is not: a finished pass of it is what typing on can go through
                self.engine.interrupt()

    def stats(self) -> dict[str, object]:
        try:
            engine_stats = _jsonable(self.engine.stats()) if self.ready else {}
        except Exception as exc:
            engine_stats = {"error": str(exc)}
        return {
            "engine": engine_stats,
            "server": {
                "state": self.state,
                "error": self.error,
                "sessions": self.sessions,
                **self.counters.snapshot(),
            },
        }

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


class SpeclsProtocol(LanguageServerProtocol):
    """pygls' protocol without its own document workspace (we keep ours, with our UTF-16 handling and
    our error policy) and with ``exit`` ending the session instead of the process."""

    _server: SpeclsServer

    def _note_arrival(self, message: Any) -> None:
        # A completion request's handler is a task that starts only after every message of the same
        # read has been dispatched: take its document snapshot now, in arrival order.
        try:
            if isinstance(message, COMPLETION_REQUESTS):
                self._server.session.request_arrived(message.id, message.params)
            elif isinstance(message, types.CancelNotification):
                self._server.session.request_cancelled(message.params.id)
        except Exception:  # a bug here must not leave the request unanswered: it answers empty
            logger.exception("could not register %s", type(message).__name__)

    @lsp_method(types.TEXT_DOCUMENT_DID_OPEN)
    def lsp_text_document__did_open(self, params: types.DidOpenTextDocumentParams) -> Any:
        if (user_handler := self.fm.features.get(types.TEXT_DOCUMENT_DID_OPEN)) is not None:
            yield user_handler, (params,), None

    @lsp_method(types.TEXT_DOCUMENT_DID_CHANGE)
    def lsp_text_document__did_change(self, params: types.DidChangeTextDocumentParams) -> Any:
        if (user_handler := self.fm.features.get(types.TEXT_DOCUMENT_DID_CHANGE)) is not None:
            yield user_handler, (params,), None

    @lsp_method(types.TEXT_DOCUMENT_DID_CLOSE)
    def lsp_text_document__did_close(self, params: types.DidCloseTextDocumentParams) -> Any:
        if (user_handler := self.fm.features.get(types.TEXT_DOCUMENT_DID_CLOSE)) is not None:
            yield user_handler, (params,), None

    @lsp_method(types.INITIALIZE)
    def lsp_initialize(self, params: types.InitializeParams) -> Any:
        result = yield from super().lsp_initialize(params)
        # custom methods have no standard capability: announce the next-edit method as experimental
        caps = result.capabilities
        caps.experimental = {**(caps.experimental or {}), **next_edit_feature.CAPABILITY}
        return result

    def structure_message(self, data: dict[str, Any]) -> Any:
        # copilot.el runs an accepted next edit's command as a notification: take it as one
        if data.get("method") == types.WORKSPACE_EXECUTE_COMMAND and "id" not in data:
            return self._converter.structure(data, JsonRPCNotification)
        return super().structure_message(data)

    @lsp_method(types.EXIT)
    def lsp_exit(self, *args: Any) -> Any:
        self._server.session.exit_requested(clean=self._shutdown)
        return None

    # pygls caches these with functools.lru_cache on the method, which keys the cache on ``self``:
    # the class-level cache kept up to 128 (protocol, method) pairs -- closed connections' protocols
    # with their servers and converters -- alive. The lookup is one dict get; no cache needed.
    def get_message_type(self, method: str) -> Any:  # type: ignore[override]  # (a plain method)
        return types.METHOD_TO_TYPES.get(method, (None,))[0]

    def get_result_type(self, method: str) -> Any:  # type: ignore[override]
        return types.METHOD_TO_TYPES.get(method, (None, None))[1]

    def handle_message(self, message: Any) -> None:
        """Every message enters here, in arrival order. Team mode gate: until ``initialize`` presents a
        valid token only ``initialize`` and ``exit`` are served; other requests get ServerNotInitialized
        and notifications (didOpen...) are dropped, so an unauthenticated connection never reaches the
        shared engine or the stats. The token is checked here, before pygls' initialize (whose error
        path logs a traceback). Authenticated: completion requests are noted on arrival (their document
        snapshot), then pygls handles the message."""
        session = self._server.session
        method = message.method if isinstance(message, RPCRequest | RPCNotification) else None
        if session.authenticated:
            self._note_arrival(message)  # also drops a cancelled job whose handler never started
            if method == types.CANCEL_REQUEST and message.params.id not in self._request_futures:
                logger.debug("$/cancelRequest for unknown id %r", message.params.id)  # finished already
                return
            super().handle_message(message)
            return
        if isinstance(message, RPCRequest) and method == types.INITIALIZE:
            try:
                session.authenticate(message.params.initialization_options)
            except JsonRpcException as exc:
                self._send_response(message.id, None, exc.to_response_error())
                return
            super().handle_message(message)
        elif method == types.EXIT:
            super().handle_message(message)
        elif isinstance(message, RPCRequest):
            self._send_response(
                message.id,
                None,
                JsonRpcServerNotInitialized(
                    "specls: send initialize with a valid token first"
                ).to_response_error(),
            )


class SpeclsServer(LanguageServer):
    session: Session

    def report_server_error(self, error: Exception, source: Any) -> None:
        # pygls would pop up a showMessage for every internal error; log instead
        logger.error("server error (%s): %s", getattr(source, "__name__", source), error)
        self.log(str(error), types.MessageType.Error)

    def log(self, message: str, kind: types.MessageType = types.MessageType.Info) -> None:
        """A line in the client's log (window/logMessage); a client that is gone is not an error."""
        try:
            self.window_log_message(types.LogMessageParams(type=kind, message=message))
        except Exception:
            logger.debug("could not send logMessage", exc_info=True)

    def show(self, message: str, kind: types.MessageType) -> None:
        """A message the user sees (window/showMessage), also written to the client's log."""
        try:
            self.window_show_message(types.ShowMessageParams(type=kind, message=message))
        except Exception:
            logger.debug("could not send showMessage", exc_info=True)
        self.log(message, kind)


_session_ids = itertools.count(1)


class Session:
    """One client connection: its documents, settings and in-flight jobs. Team authentication is
    ``self.team_auth`` (``TeamAuth``), the line-first block waiting for a pause ``self.continuation``, the
    model load shown in the client ``self.progress``; what happened is counted in ``host.counters``."""

    def __init__(
        self, server: SpeclsServer, settings: ServerSettings, host: EngineHost, doc_prefix: str
    ) -> None:
        self.server = server
        self.settings = settings
        self.host = host
        self.store = DocumentStore()
        self.jobs: dict[str, Job] = {}
        self.reported: set[str] = set()
        self.pending_problems: list[str] = []
        self.load_failure_shown = False
        self.exit_clean: bool | None = None
        self.on_exit: Callable[[bool], None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.closed = False
        self.team_auth = TeamAuth(host)
        self.sync = DocumentSync(host, self.store, self.team_auth, doc_prefix)
        self.continuation = Continuation(host, self._generate, self._outdated)
        self.progress = LoadProgress(server)
        self.next_edits = NextEdits(
            host,
            self.store,
            self.sync,
            self.team_auth,
            lambda: self.settings.languages,
            self.continuation.preempt,
        )

    # ------------------------------------------------------------------ helpers
    def report_problems(self, problems: list[str]) -> None:
        new = [p for p in problems if p not in self.reported]
        if not new:
            return
        self.reported.update(new)
        self.server.show("specls settings: " + "; ".join(new), types.MessageType.Warning)

    def apply_settings(self, raw: object) -> None:
        updated, problems = parse_settings(raw, self.settings)
        changed = self.settings.changed_engine_fields(updated)
        if changed and not self.host.configure(updated):
            problems.append(f"{', '.join(changed)}: takes effect when the server restarts")
        if updated.log_level != self.settings.log_level:
            logging.getLogger("specls").setLevel(updated.log_level.upper())
        self.settings = updated
        if self._loop is None:
            self.pending_problems.extend(problems)  # reported once initialized
        else:
            self.report_problems(problems)

    # ------------------------------------------------------------------ lifecycle
    @property
    def authenticated(self) -> bool:
        """Serving requests: always outside team mode; in team mode once initialize had a valid token."""
        return self.team_auth.authenticated

    def authenticate(self, initialization_options: object) -> None:
        """Team service: token check (raises a JSON-RPC error), then this client's fair-queue session."""
        if not self.closed:
            self.team_auth.authenticate(self, initialization_options)

    def initialize(self, params: types.InitializeParams) -> None:
        self.authenticate(params.initialization_options)
        self.apply_settings(params.initialization_options)

    async def initialized(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self.pending_problems:
            problems, self.pending_problems = self.pending_problems, []
            self.report_problems(problems)
        listener = await self.progress.begin(loading=self.host.state in ("new", "loading"))
        load = self.host.start_load(listener)
        asyncio.wrap_future(load).add_done_callback(self._load_done)

    def _load_done(self, future: asyncio.Future[None]) -> None:
        if not future.cancelled():
            future.exception()  # retrieved: a failed load is reported below, not as "never retrieved"
        self.progress.end(self.host.ready)
        if self.closed:
            return
        if self.host.state == "failed":
            self.show_load_failure()
        else:
            self.server.log("specls: model loaded")
            for uri in self.store.uris():  # documents opened while loading
                self.sync.update(uri)

    def show_load_failure(self) -> None:
        if not self.load_failure_shown:
            self.load_failure_shown = True
            self.server.show(
                f"specls: the model could not be loaded: {self.host.error}", types.MessageType.Error
            )

    def shutdown(self) -> None:
        self.continuation.preempt()
        self.next_edits.cancel("shutdown")
        for job in self.jobs.values():
            job.cancel("shutdown")

    def exit_requested(self, clean: bool) -> None:
        self.exit_clean = clean
        if self.on_exit is not None:
            self.on_exit(clean)

    def close(self) -> None:
        """The connection is gone: cancel work and drop this session's documents from the engine."""
        if self.closed:
            return
        self.closed = True
        self.progress.closed = self.sync.closed = True
        self.shutdown()
        self.next_edits.close()
        self.team_auth.close()  # cancels its queued/running requests, frees its documents' KV
        for uri in self.store.uris():
            self.store.close(uri)
            self.sync.close(uri)
        self.host.sessions -= 1

    # ------------------------------------------------------------------ documents
    def did_open(self, params: types.DidOpenTextDocumentParams) -> None:
        item = params.text_document
        self.store.open(item.uri, item.language_id, item.version, item.text)
        self.next_edits.did_open(item.uri, item.text)
        self.sync.update(item.uri)

    def did_change(self, params: types.DidChangeTextDocumentParams) -> None:
        uri = params.text_document.uri
        self.continuation.preempt()
        job = self.jobs.get(uri)
        if job is not None:
            job.cancel("changed")
        try:
            doc = self.store.change(uri, params.text_document.version, params.content_changes)
        except Exception:
            logger.exception("could not apply a change to %s", uri)
            return
        if doc is not None:
            self.next_edits.did_change(uri, params.content_changes)
            self.sync.update(uri)

    def did_close(self, params: types.DidCloseTextDocumentParams) -> None:
        uri = params.text_document.uri
        self.continuation.preempt()
        job = self.jobs.pop(uri, None)
        if job is not None:
            job.cancel("closed")
        self.next_edits.did_close(uri)
        if self.store.close(uri) is not None:
            self.sync.close(uri)

    # ------------------------------------------------------------------ completions
    def request_arrived(self, msg_id: Any, params: CursorParams) -> None:
        """A completion request was just received (called before its handler runs, in message
        order): snapshot its document and make it the document's newest request."""
        uri = params.text_document.uri
        self.continuation.preempt()
        previous = self.jobs.get(uri)
        if previous is not None:
            previous.cancel("superseded")
        doc = self.store.get(uri)
        snapshot = doc.snapshot() if doc is not None else None
        self.jobs[uri] = Job(uri, msg_id, params, snapshot, started=time.monotonic())

    def request_cancelled(self, msg_id: Any) -> None:
        """``$/cancelRequest``: cancel the job, also one whose handler never starts (pygls cancels
        its task before it runs, so nothing else would ever remove the job)."""
        for uri, job in list(self.jobs.items()):
            if job.msg_id == msg_id:
                job.cancel("client")
                if not job.claimed:
                    del self.jobs[uri]

    def changed_since(self, snapshot: Document) -> bool:
        """Whether the store's document is no longer the one ``snapshot`` was taken of."""
        current = self.store.get(snapshot.uri)
        return current is None or current.revision != snapshot.revision

    def _outdated(self, snapshot: Document) -> bool:
        """A background block for ``snapshot`` is no longer wanted: the session closed or it changed."""
        return self.closed or self.changed_since(snapshot)

    async def complete(self, params: CursorParams) -> tuple[Completion, Document, int] | None:
        """The completion for a request (``params``: the object ``request_arrived`` got) and the
        document snapshot it was computed on, or None (empty answer). Cancelled by $/cancelRequest
        through asyncio task cancellation. A bug on the way is logged and answered empty, never an
        error."""
        try:
            return await self._complete(params)
        except asyncio.CancelledError:
            raise
        except Exception:
            pos = params.position
            logger.exception(
                "completion failed for %s at %d:%d", params.text_document.uri, pos.line, pos.character
            )
            self.host.counters.errors += 1
            return None

    async def _complete(self, params: CursorParams) -> tuple[Completion, Document, int] | None:
        counters = self.host.counters
        counters.requests += 1
        uri = params.text_document.uri
        job = self.jobs.get(uri)
        if job is None or job.params is not params:
            # before its handler started: superseded by a newer request for the document, or the
            # document closed
            counters.cancelled += 1
            return None
        job.claimed = True
        try:
            return await self._complete_job(job, params.position.line, params.position.character)
        except asyncio.CancelledError:
            job.cancel("client")  # counted when the generation returns (_account)
            raise
        finally:
            if self.jobs.get(uri) is job:
                del self.jobs[uri]

    async def _complete_job(
        self, job: Job, line: int, character: int
    ) -> tuple[Completion, Document, int] | None:
        counters = self.host.counters
        if not self.host.ready:
            counters.not_ready += 1
            counters.empty += 1
            if self.host.state == "failed":
                self.show_load_failure()
            return None
        doc = job.snapshot
        if doc is None or (self.settings.languages and doc.language_id not in self.settings.languages):
            counters.empty += 1
            return None
        if job.cancelled:  # a didChange (or close, or shutdown) came right behind the request
            counters.cancelled += 1
            return None
        offset = doc.offset_at(line, character)
        if offset is None:
            counters.empty += 1
            return None
        result = await self._run(job, doc, offset)
        done = time.monotonic()
        counters.latency_ms.append((done - job.started) * 1000)
        if result is None:
            counters.empty += 1
            return None
        counters.answered += 1
        counters.keystroke_ms.append((done - doc.changed_at) * 1000)
        return result, doc, offset

    async def _run(self, job: Job, doc: Document, offset: int) -> Completion | None:
        """Generate on ``doc`` (the job's snapshot) at ``offset``."""
        counters = self.host.counters
        if self.settings.debounce_ms > 0:
            await asyncio.sleep(self.settings.debounce_ms / 1000)
            if job.cancelled or self.changed_since(doc):
                counters.cancelled += 1
                return None
        ctx, request = _engine_request(self.settings, self.sync, doc, offset)
        generate = partial(self._generate, request, job)
        future = self.team_auth.submit(generate)
        if future is None:
            future = self.host.submit(generate)
        loop = asyncio.get_running_loop()
        # account on the loop thread, also for generations whose request was cancelled meanwhile
        future.add_done_callback(lambda f: post_to_loop(loop, self._account, f, job))
        result: CompletionResult | None = await asyncio.wrap_future(future)
        if result is None or result.stop_reason == "error" or job.cancelled or result.cancelled:
            return None
        if self.changed_since(doc):
            counters.stale_dropped += 1
            counters.tokens_wasted += result.tokens
            return None
        # no await from here to the answer: the document the answer is positioned against is current
        if result.partial and self.team_auth.engine is None:
            self.continuation.later(doc, job.params, replace(request, early_stop=None))
        return finalize(ctx, result.text, truncated=result.stop_reason == "max_tokens")

    def _account(self, future: concurrent.futures.Future[CompletionResult | None], job: Job) -> None:
        self.host.counters.generation_done(future, job.cancelled)

    def _generate(self, request: CompletionRequest, job: Job) -> CompletionResult | None:
        """On the engine thread."""
        if job.cancelled or self.closed:
            return None
        if not self.team_auth.authenticated:
            return None  # team mode and not authenticated
        engine = self.sync.engine
        try:
            return engine.complete(request, job.event.is_set)
        except Exception as exc:
            logger.exception("engine.complete failed")
            logger.debug("engine error: %s", exc)
            return CompletionResult(text="", stop_reason="error")

    def stats(self) -> dict[str, object]:
        stats = self.host.stats()
        stats["session"] = {"open_documents": len(self.store), "in_flight": len(self.jobs)}
        team = self.team_auth.stats()
        if team is not None:
            stats["team"] = team
        return stats


def _engine_request(
    settings: ServerSettings, sync: DocumentSync, doc: Document, offset: int
) -> tuple[CursorContext, CompletionRequest]:
    """The cursor's context and the engine request for ``doc`` (a snapshot) at ``offset``, with the
    session's other open buffers as context."""
    text = doc.text
    prefix = sanitize(text[max(0, offset - PREFIX_CHARS) : offset])
    suffix = sanitize(text[offset : offset + SUFFIX_CHARS])
    ctx = make_context(prefix, suffix, settings.multiline, doc.language_id)
    line_first = ctx.multiline and settings.line_first
    others = tuple(
        (sync.doc_id(d.uri), sanitize(window(d.text, d.last_edit, CONTEXT_DOC_CHARS)))
        for d in sync.store.others(doc.uri, CONTEXT_DOCS)
    )
    request = CompletionRequest(
        doc_id=sync.doc_id(doc.uri),
        prefix=prefix,
        suffix=suffix,
        max_tokens=settings.max_tokens,
        language=doc.language_id,
        stop=partial(stop_point, ctx),
        early_stop=partial(first_line_point, ctx) if line_first else None,
        context_docs=others,
    )
    return ctx, request


def _completion_range(doc: Document, offset: int, completion: Completion) -> types.Range:
    line, character = doc.position_at(offset)
    end_line, end_char = doc.position_at(offset + completion.replace)
    return types.Range(
        start=types.Position(line=line, character=character),
        end=types.Position(line=end_line, character=end_char),
    )


def _insert_text(doc: Document, offset: int, text: str) -> str:
    """``text`` with every line break (``\\n``, ``\\r\\n`` or a lone ``\\r``, whatever the model
    wrote) made the line ending of the cursor line (``Document.line_ending``), also on the last line."""
    if "\n" not in text and "\r" not in text:
        return text
    line, _ = doc.position_at(offset)
    return lf_breaks(text).replace("\n", doc.line_ending(line))


@functools.cache
def shared_converter() -> Any:
    """One lsprotocol converter for every session: a converter generates (and keeps) structuring code
    for each message type it meets, so one per session made every connection cost noticeably more
    memory. Its hooks are stateless, and every session structures messages on the one event loop
    thread."""
    return default_converter()


def create_server(
    settings: ServerSettings,
    engine: Engine,
    host: EngineHost | None = None,
    factory: EngineFactory | None = None,
) -> LanguageServer:
    """One session's language server. ``host``: share an already created ``EngineHost`` (one engine for
    many connections); otherwise a new one is made for ``engine`` (``factory`` rebuilds it when the
    client's initializationOptions change engine-level settings before loading)."""
    host = host or EngineHost(engine, factory)
    server = SpeclsServer(
        SERVER_NAME,
        SERVER_VERSION,
        protocol_cls=SpeclsProtocol,
        converter_factory=shared_converter,
        text_document_sync_kind=types.TextDocumentSyncKind.Incremental,
    )
    session_no = next(_session_ids)
    host.sessions += 1
    doc_prefix = "" if host.sessions == 1 and session_no == 1 else f"s{session_no}|"
    session = Session(server, settings, host, doc_prefix)
    server.session = session
    _lifecycle_features(server, session)
    _document_features(server, session)
    _completion_features(server, session)
    _specls_features(server, session)
    next_edit_feature.register(server, session.next_edits)
    return server


def _lifecycle_features(server: SpeclsServer, session: Session) -> None:
    @server.feature(types.INITIALIZE)
    def on_initialize(params: types.InitializeParams) -> None:
        session.initialize(params)

    @server.feature(types.INITIALIZED)
    async def on_initialized(params: types.InitializedParams) -> None:
        await session.initialized()

    @server.feature(types.SHUTDOWN)
    def on_shutdown(params: Any) -> None:
        session.shutdown()

    @server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
    def on_configuration(params: types.DidChangeConfigurationParams) -> None:
        session.apply_settings(params.settings)


def _document_features(server: SpeclsServer, session: Session) -> None:
    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def on_open(params: types.DidOpenTextDocumentParams) -> None:
        session.did_open(params)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def on_change(params: types.DidChangeTextDocumentParams) -> None:
        session.did_change(params)

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def on_close(params: types.DidCloseTextDocumentParams) -> None:
        session.did_close(params)


def _inline_item(found: tuple[Completion, Document, int]) -> types.InlineCompletionItem:
    completion, doc, offset = found
    return types.InlineCompletionItem(
        insert_text=_insert_text(doc, offset, completion.text),
        range=_completion_range(doc, offset, completion),
    )


def _completion_item(found: tuple[Completion, Document, int]) -> types.CompletionItem:
    completion, doc, offset = found
    text = _insert_text(doc, offset, completion.text)
    first_line = text.strip().splitlines()[0] if text.strip() else text
    label = first_line if len(first_line) <= 60 else first_line[:57] + "..."
    return types.CompletionItem(
        label=label,
        kind=types.CompletionItemKind.Snippet,
        detail="specls",
        sort_text="0",
        insert_text_format=types.InsertTextFormat.PlainText,
        text_edit=types.TextEdit(range=_completion_range(doc, offset, completion), new_text=text),
    )


def _completion_features(server: SpeclsServer, session: Session) -> None:
    @server.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
    async def on_inline(params: types.InlineCompletionParams) -> types.InlineCompletionList:
        found = await session.complete(params)
        return types.InlineCompletionList(items=[] if found is None else [_inline_item(found)])

    @server.feature(
        types.TEXT_DOCUMENT_COMPLETION,
        types.CompletionOptions(trigger_characters=COMPLETION_TRIGGERS, resolve_provider=False),
    )
    async def on_completion(params: types.CompletionParams) -> types.CompletionList:
        found = await session.complete(params)
        return types.CompletionList(
            is_incomplete=True, items=[] if found is None else [_completion_item(found)]
        )


def _specls_features(server: SpeclsServer, session: Session) -> None:
    @server.feature(STATS_METHOD)
    def on_stats(params: Any) -> dict[str, object]:
        return session.stats()

    @server.feature(ACCEPTED_METHOD)
    def on_accepted(params: Any) -> None:
        session.host.counters.accepted += 1

    @server.feature(SHOWN_METHOD)
    def on_shown(params: Any) -> None:
        session.host.counters.shown += 1
