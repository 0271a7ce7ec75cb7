"""``DocumentSync``: the engine's copy of one session's open buffers. Each buffer is known to the
engine under the session's id for it; updates run on the engine thread and are coalesced, one queued
per buffer, which reads the newest text when it runs, so a burst of typing costs one update."""

from __future__ import annotations

import logging
import threading
from functools import partial
from typing import TYPE_CHECKING

from specls.lsp.documents import DocumentStore, sanitize
from specls.lsp.team_auth import TeamAuth

from specls.api import Engine

if TYPE_CHECKING:
    from specls.lsp.server import EngineHost

logger = logging.getLogger(__name__)


class DocumentSync:
    def __init__(self, host: EngineHost, store: DocumentStore, team_auth: TeamAuth, doc_prefix: str) -> None:
        self.host = host
        self.store = store
        self.team_auth = team_auth
        self.doc_prefix = doc_prefix
        self.closed = False  # the session is gone: queued updates do nothing
        self._pending: set[str] = set()
        self._lock = threading.Lock()

    def doc_id(self, uri: str) -> str:
        """The engine's id for a buffer: one engine serves many sessions, each with its own buffers."""
        return f"{self.doc_prefix}{uri}"

    @property
    def engine(self) -> Engine:
        """Where the session's documents and completions go: in team mode its scheduler session (one
        namespaced id per buffer for updates and completions alike), else the host's engine."""
        return self.team_auth.engine_or(self.host.engine)

    def update(self, uri: str) -> None:
        """Tell the engine a buffer's text (queued on the engine thread)."""
        if not self.host.ready:
            return  # sent for every open document once the engine is loaded
        if not self.team_auth.authenticated:
            return  # team mode, not authenticated: nothing of this client reaches the shared engine
        with self._lock:
            if uri in self._pending:
                return
            self._pending.add(uri)
        self.host.submit(partial(self._update, uri))

    def close(self, uri: str) -> None:
        """The buffer was closed: the engine drops it (queued on the engine thread)."""
        self.host.submit(partial(self._close, self.doc_id(uri)))

    def _update(self, uri: str) -> None:
        with self._lock:
            self._pending.discard(uri)
        doc = self.store.get(uri)
        if doc is None or self.closed:
            return
        try:
            self.engine.update_document(self.doc_id(uri), sanitize(doc.engine_text()))
        except Exception:
            logger.exception("engine.update_document failed for %s", uri)

    def _close(self, doc_id: str) -> None:
        try:
            self.engine.close_document(doc_id)
        except Exception:
            logger.exception("engine.close_document failed for %s", doc_id)
