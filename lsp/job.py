"""``Job``: one completion request (or a line-first answer's background block), from its arrival to
its answer, with the flag that cancels its generation."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from lsprotocol import types
from specls.lsp.documents import Document

CursorParams = types.InlineCompletionParams | types.CompletionParams


@dataclass
class Job:
    """One completion request, from its arrival to its answer, for the document as it was when the
    request arrived (``snapshot``; None: the document was not open)."""

    uri: str
    msg_id: Any  # the request's JSON-RPC id (for $/cancelRequest)
    params: CursorParams  # the request's params object: its handler gets this very object
    snapshot: Document | None
    started: float
    event: threading.Event = field(default_factory=threading.Event)
    reason: str = ""
    claimed: bool = False  # its handler has started

    def cancel(self, reason: str) -> None:
        if not self.event.is_set():
            self.reason = reason
            self.event.set()

    @property
    def cancelled(self) -> bool:
        return self.event.is_set()
