"""Next-edit suggestions over LSP: ``textDocument/copilotInlineEdit`` (the method GitHub Copilot's
language server answers, so its clients work against specls), ``textDocument/didShowInlineEdit``, and
the accept command run through ``workspace/executeCommand``. The protocol: docs/next-edit.md.

One ``NextEdits`` per session keeps the ``EditHistory`` of the session's documents (fed by the
server's didOpen/didChange/didClose) and passes it with every request. Never stale: a request names
the document version it is for; one whose version is already superseded is answered empty at once,
and an answer is dropped (empty) when the document changed while the edit was computed (checked with
no await between the check and the answer). Never in the way of typing: the edit runs as the engine's
background work (``EngineHost.submit_background``), which every completion request and every edit
preempts (a running decode's pass in flight is stopped midway), as a newer next-edit request does (a
line-first answer's block, which nobody asked for yet, waits until it is answered); in team
mode the scheduler runs it below every completion, and the client's completions preempt it there.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from specls.lsp.counters import NextEditCounters
from specls.lsp.document_sync import DocumentSync
from specls.lsp.documents import Document, DocumentStore, sanitize, window
from specls.lsp.edit_history import EditHistory, LspRange, uri_to_path
from specls.lsp.job import Job
from specls.lsp.team_auth import TeamAuth

from specls.api import NextEditRequest, NextEditResult, no_next_edit
from specls.next_edit.edits import LastEdit, TextEdit

if TYPE_CHECKING:
    from specls.lsp.server import EngineHost

logger = logging.getLogger(__name__)

INLINE_EDIT_METHOD = "textDocument/copilotInlineEdit"
DID_SHOW_METHOD = "textDocument/didShowInlineEdit"
# Copilot's clients send it when a buffer gets focus; nothing to do, but it must not be an unknown method
DID_FOCUS_METHOD = "textDocument/didFocus"
ACCEPT_COMMAND = "specls.didAcceptNextEdit"
# The experimental capability a client can check before asking (docs/next-edit.md)
CAPABILITY = {
    "nextEdit": {"method": INLINE_EDIT_METHOD, "didShow": DID_SHOW_METHOD, "acceptCommand": ACCEPT_COMMAND}
}
CONTEXT_DOCS = 4  # other open buffers passed as context (as completions get)
CONTEXT_DOC_CHARS = 32_000
OFFERED_KEPT = 256  # offered edits remembered for counting their show and accept once each


def empty() -> dict[str, Any]:
    return {"edits": []}


def _field(obj: Any, *names: str) -> Any:
    """A field of a custom method's params (pygls gives them as namedtuples), None when absent.

    >>> from collections import namedtuple
    >>> _field(namedtuple("P", "textDocument")(namedtuple("T", "uri")("u")), "textDocument", "uri")
    'u'
    >>> _field({"textDocument": {"uri": "u"}}, "textDocument", "version") is None
    True
    """
    for name in names:
        if obj is None:
            return None
        obj = obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)
    return obj


def merged_edit(doc: Document, edits: Sequence[TextEdit]) -> tuple[types.Range, str] | None:
    """The engine's edits as one replacement (from the first one's start to the last one's end, the
    text between them kept), so that clients that apply only an answer's first item apply them all;
    None when an edit's position is not in ``doc``.

    >>> from specls.next_edit.edits import Position
    >>> d = Document("u", "python", 1, "def f(a, b):\\n    return a\\n")
    >>> e1 = TextEdit(Position(0, 6), Position(0, 7), "x")
    >>> e2 = TextEdit(Position(1, 11), Position(1, 12), "x")
    >>> rng, text = merged_edit(d, [e2, e1])
    >>> (rng.start.line, rng.start.character, rng.end.line, rng.end.character), text
    ((0, 6, 1, 12), 'x, b):\\n    return x')
    """
    spans: list[tuple[int, int, str]] = []
    for e in edits:
        a = doc.offset_at(e.start.line, e.start.character)
        b = doc.offset_at(e.end.line, e.end.character)
        if a is None or b is None or b < a:
            return None
        spans.append((a, b, e.text))
    if not spans:
        return None
    spans.sort()
    start, end = spans[0][0], max(b for _, b, _ in spans)
    parts, at = [], start
    for a, b, text in spans:
        if a < at:
            return None  # overlapping edits: not one replacement
        parts += [doc.text[at:a], text]
        at = b
    parts.append(doc.text[at:end])
    (sl, sc), (el, ec) = doc.position_at(start), doc.position_at(end)
    rng = types.Range(start=types.Position(line=sl, character=sc), end=types.Position(line=el, character=ec))
    return rng, "".join(parts)


def _item(doc: Document, rng: types.Range, text: str, suggestion_id: str) -> dict[str, Any]:
    """One ``copilotInlineEdit`` item: Copilot's shape (``text``, ``range``, ``textDocument`` with the
    version the edit is for, ``command`` to run on accept)."""

    def pos(p: types.Position) -> dict[str, int]:
        return {"line": p.line, "character": p.character}

    return {
        "text": text,
        "range": {"start": pos(rng.start), "end": pos(rng.end)},
        "textDocument": {"uri": doc.uri, "version": doc.version},
        "command": {"title": "Accept next edit", "command": ACCEPT_COMMAND, "arguments": [suggestion_id]},
    }


class NextEdits:
    """One session's next edits: the edit history of its documents, the request in flight (one at a
    time: a newer one supersedes it) and the edits offered, for counting their show and accept."""

    def __init__(
        self,
        host: EngineHost,
        store: DocumentStore,
        sync: DocumentSync,
        team_auth: TeamAuth,
        languages: Callable[[], tuple[str, ...]],
        preempt: Callable[[], None],
    ) -> None:
        self.host = host
        self.store = store
        self.sync = sync
        self.team_auth = team_auth
        self.languages = languages  # the session's languages setting, read at each request
        # stops the session's line-first block waiting for a pause, and any running background work:
        # an edit the client asks for goes before a block decoded on speculation
        self.preempt = preempt
        self.history = EditHistory()
        self.closed = False
        self._job: Job | None = None
        self._offered: OrderedDict[str, str] = OrderedDict()  # suggestion id -> uri
        self._shown: set[str] = set()
        self._accepted: set[str] = set()

    @property
    def counters(self) -> NextEditCounters:
        return self.host.counters.next_edit

    # ------------------------------------------------------------------ the edit history
    def did_open(self, uri: str, text: str) -> None:
        self.history.open(uri, text)

    def did_change(self, uri: str, changes: Sequence[Any]) -> None:
        """The same content changes, in the same order, as ``DocumentStore.change`` applies; the edit
        in flight is for a text that is gone (outside team mode the host's preemption stops it too)."""
        self.cancel("changed")
        try:
            for change in changes:
                rng: LspRange | None = getattr(change, "range", None)  # absent: the whole text
                self.history.change(uri, change.text, rng)
        except Exception:  # the history is context: a bug in it must not lose the edit itself
            logger.exception("edit history: could not record a change to %s", uri)

    def did_close(self, uri: str) -> None:
        self.history.close(uri)

    def close(self) -> None:
        self.closed = True
        self.cancel("closed")

    def cancel(self, reason: str) -> None:
        job, self._job = self._job, None
        if job is not None:
            job.cancel(reason)

    # ------------------------------------------------------------------ requests
    async def request(self, params: Any) -> dict[str, Any]:
        """``textDocument/copilotInlineEdit``: ``{edits: [item]}`` with one item for the version the
        request names, or ``{edits: []}``. A bug on the way is logged and answered empty."""
        counters = self.counters
        counters.requests += 1
        started = time.monotonic()
        timing: dict[str, float] = {}  # filled on the engine thread: queued_ms, engine_ms
        try:
            answer = await self._request(params, timing)
        except asyncio.CancelledError:
            counters.cancelled += 1  # $/cancelRequest
            raise
        except Exception:
            logger.exception("next edit failed for %s", _field(params, "textDocument", "uri"))
            counters.errors += 1
            return empty()
        ms = (time.monotonic() - started) * 1000
        counters.latency_ms.append(ms)
        counters.recent.append({"ms": round(ms, 1), **{k: round(v, 1) for k, v in timing.items()}})
        return answer

    async def _request(self, params: Any, timing: dict[str, float]) -> dict[str, Any]:
        counters = self.counters
        uri = _field(params, "textDocument", "uri")
        version = _field(params, "textDocument", "version")
        line, character = _field(params, "position", "line"), _field(params, "position", "character")
        self.cancel("superseded")  # one request at a time: the newest is the one the client shows
        doc = self.store.get(uri) if isinstance(uri, str) else None
        if not self.host.ready or self.closed:
            counters.not_ready += 1
        elif doc is None or not isinstance(line, int) or not isinstance(character, int):
            counters.empty += 1
        elif isinstance(version, int) and version != doc.version:
            counters.stale_dropped += 1  # superseded before it started: no edit for that version
        elif doc.offset_at(line, character) is None:
            counters.empty += 1
        elif self.languages() and doc.language_id not in self.languages():
            counters.empty += 1
        else:
            return await self._run(doc.snapshot(), line, character, timing)
        return empty()

    async def _run(
        self, doc: Document, line: int, character: int, timing: dict[str, float]
    ) -> dict[str, Any]:
        """Compute the edit on ``doc`` (a snapshot) as background work; answer it only if ``doc`` is
        still the document."""
        counters = self.counters
        request = self._engine_request(doc, line, character)
        params = types.CompletionParams(
            text_document=types.TextDocumentIdentifier(uri=doc.uri),
            position=types.Position(line=line, character=character),
        )
        job = Job(doc.uri, None, params, doc, started=time.monotonic())
        self.preempt()
        self._job = job
        generate = partial(self._generate, request, job, timing)
        # team mode: the scheduler runs it below every completion (the client's completions preempt it)
        future = self.team_auth.submit(generate)
        if future is None:
            future = self.host.submit_background(job, generate)
        try:
            result: NextEditResult | None = await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            job.cancel("client")
            raise
        finally:
            if self._job is job:
                self._job = None
        if result is not None and result.dropped == "error":
            counters.errors += 1
            return empty()
        if result is None or job.cancelled or result.cancelled:
            counters.cancelled += 1  # preempted by a completion request or an edit, or superseded
            counters.tokens_wasted += result.tokens if result is not None else 0
            return empty()
        current = self.store.get(doc.uri)
        if current is None or current.revision != doc.revision:
            counters.stale_dropped += 1
            counters.tokens_wasted += result.tokens
            return empty()
        # no await from here to the answer: the version the answer names is the document's
        merged = merged_edit(doc, result.edits)
        if merged is None:
            counters.empty += 1
            return empty()
        suggestion_id = self._offer(doc.uri)
        counters.answered += 1
        item = _item(doc, merged[0], merged[1], suggestion_id)
        if result.confidence is not None:
            item["confidence"] = round(result.confidence, 3)  # a client may rank or hide by it
        return {"edits": [item]}

    def _engine_request(self, doc: Document, line: int, character: int) -> NextEditRequest:
        last = self.history.last(doc.uri)
        others = tuple(
            (self.sync.doc_id(d.uri), sanitize(window(d.text, d.last_edit, CONTEXT_DOC_CHARS)))
            for d in self.store.others(doc.uri, CONTEXT_DOCS)
        )
        return NextEditRequest(
            doc_id=self.sync.doc_id(doc.uri),
            text=sanitize(doc.text),
            line=line,
            character=character,
            history=tuple(self.history.edit_diffs()),
            context_docs=others,
            path=uri_to_path(doc.uri),
            last_edit=LastEdit(last.start_line, last.old_text, last.new_text) if last is not None else None,
        )

    def _generate(
        self, request: NextEditRequest, job: Job, timing: dict[str, float]
    ) -> NextEditResult | None:
        """On the engine thread; None when it never ran (preempted or closed before it started)."""
        if job.cancelled or self.closed or not self.team_auth.authenticated:
            return None
        start = time.monotonic()
        timing["queued_ms"] = (start - job.started) * 1000
        self.counters.queued_ms.append(timing["queued_ms"])
        try:
            return self.sync.engine.next_edit(request, job.event.is_set)
        except Exception:
            logger.exception("engine.next_edit failed")
            return no_next_edit(request, "error")
        finally:
            timing["engine_ms"] = (time.monotonic() - start) * 1000
            self.counters.engine_ms.append(timing["engine_ms"])

    # ------------------------------------------------------------------ shown and accepted
    def _offer(self, uri: str) -> str:
        suggestion_id = uuid.uuid4().hex
        self._offered[suggestion_id] = uri
        while len(self._offered) > OFFERED_KEPT:
            old, _ = self._offered.popitem(last=False)
            self._shown.discard(old)
            self._accepted.discard(old)
        return suggestion_id

    def shown(self, params: Any) -> None:
        """``textDocument/didShowInlineEdit`` (``{item: {command: ...}}``, the item or its command):
        counted once per offered edit."""
        suggestion_id = _command_id(_field(params, "item", "command"))
        if suggestion_id is not None and suggestion_id in self._offered and suggestion_id not in self._shown:
            self._shown.add(suggestion_id)
            self.counters.shown += 1

    def accepted(self, arguments: Sequence[Any]) -> None:
        """The accept command (``workspace/executeCommand``, the item's ``arguments``): counted once
        per offered edit; an id never offered is not counted."""
        suggestion_id = arguments[0] if arguments else None
        if isinstance(suggestion_id, str) and suggestion_id in self._offered:
            if suggestion_id not in self._accepted:
                self._accepted.add(suggestion_id)
                self.counters.accepted += 1
        else:
            logger.debug("accept of a next edit never offered: %r", suggestion_id)


def _command_id(command: Any) -> str | None:
    arguments = _field(command, "arguments")
    if isinstance(arguments, list | tuple) and arguments and isinstance(arguments[0], str):
        return arguments[0]
    return None


def register(server: LanguageServer, next_edits: NextEdits) -> None:
    """The session's next-edit methods and its accept command (``executeCommandProvider`` lists it)."""

    @server.feature(INLINE_EDIT_METHOD)
    async def on_inline_edit(params: Any) -> dict[str, Any]:
        return await next_edits.request(params)

    @server.feature(DID_SHOW_METHOD)
    def on_did_show(params: Any) -> None:
        next_edits.shown(params)

    @server.feature(DID_FOCUS_METHOD)
    def on_did_focus(params: Any) -> None:
        return None

    @server.command(ACCEPT_COMMAND)
    def on_accept(*arguments: Any) -> None:
        next_edits.accepted(arguments)
