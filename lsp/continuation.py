"""Line-first continuation: after a line-first answer (its first line at once), the whole block is
decoded in the background once nothing happened for ``CONTINUE_AFTER_S`` (since the answer to a
next edit the client asked for meanwhile, if one was). It is the engine's last
completion when it finishes, so accepting or typing into the line shows the rest of the block by
type-ahead, and asking again at the cursor replays it; a request or an edit preempts it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from specls.lsp.documents import Document
from specls.lsp.event_loop import post_to_loop
from specls.lsp.job import CursorParams, Job

from specls.api import CompletionRequest, CompletionResult

if TYPE_CHECKING:
    from specls.lsp.server import EngineHost

# Longer than the gap between the keystrokes of someone typing (`specls bench lsp` replays such
# typing), so a burst of typing does not start (and preempt) a block decode per key.
CONTINUE_AFTER_S = 0.3

Generate = Callable[[CompletionRequest, Job], CompletionResult | None]


class Continuation:
    """One session's pending block: at most one waits for the pause (a newer one replaces it).

    ``generate`` runs a request on the engine thread; ``outdated(doc)`` says the session closed or
    ``doc`` changed since the answer, so its block is no longer wanted."""

    def __init__(self, host: EngineHost, generate: Generate, outdated: Callable[[Document], bool]) -> None:
        self.host = host
        self.generate = generate
        self.outdated = outdated
        self._waiting: object | None = None  # the block waiting for the pause
        self.deferred = False  # ... and, past it, for a next edit the client asked for

    def preempt(self) -> None:
        """A request, an edit, a close or a shutdown: no block starts after the pause, and a running
        one stops at its next target pass."""
        self._waiting = None
        self.deferred = False
        self.host.preempt()

    def later(self, doc: Document, params: CursorParams, request: CompletionRequest) -> None:
        """Decode ``request`` (the answer's cursor, without the early stop) on ``doc`` after the pause."""
        token = object()
        self._waiting = token
        loop = asyncio.get_running_loop()
        loop.call_later(CONTINUE_AFTER_S, self._start, token, doc, params, request)

    def _start(self, token: object, doc: Document, params: CursorParams, request: CompletionRequest) -> None:
        if self._waiting is not token or self.outdated(doc):
            return  # a request or an edit came meanwhile
        if self.host.asked_pending():
            # a next edit the client asked for goes before a block nobody asked for yet: the block's
            # pause starts over once it is answered, unless a request or an edit comes first
            self.deferred = True
            loop = asyncio.get_running_loop()
            self.host.after_asked(lambda: post_to_loop(loop, self._pause, token, doc, params, request))
            return
        self._waiting = None
        self.deferred = False
        job = Job(doc.uri, None, params, doc, started=time.monotonic())
        self.host.counters.continuations += 1
        future = self.host.submit_background(job, partial(self.generate, request, job), asked=False)
        loop = asyncio.get_running_loop()
        future.add_done_callback(lambda f: post_to_loop(loop, self._finished, f))

    def _pause(self, token: object, doc: Document, params: CursorParams, request: CompletionRequest) -> None:
        if self._waiting is token:
            asyncio.get_running_loop().call_later(CONTINUE_AFTER_S, self._start, token, doc, params, request)

    def _finished(self, future: concurrent.futures.Future[CompletionResult | None]) -> None:
        self.host.counters.continuation_done(future)
