"""``LoadProgress``: the model load shown in one client as LSP work done progress, when the client
supports it and the model is still to load. A model given by name is prepared first: the messages are
then the preparing stage's status ("downloading 43%", "converting: quantizing"; ``specls.loading``),
each sent once (a download reports every chunk; the percentage shown moves by whole numbers)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from specls.lsp.event_loop import post_to_loop

logger = logging.getLogger(__name__)

ProgressValue = types.WorkDoneProgressReport | types.WorkDoneProgressEnd


class LoadProgress:
    def __init__(self, server: LanguageServer) -> None:
        self.server = server
        self.closed = False  # the session is gone: nothing more is sent
        self._loop: asyncio.AbstractEventLoop | None = None
        self._token: str | None = None
        self._last: tuple[str, int] | None = None  # the last (message, percentage) sent

    async def begin(self, loading: bool) -> Callable[[str, float], None] | None:
        """Start the progress in the client (``loading``: the model is not loaded yet). Returns the
        listener to hand ``EngineHost.start_load``, or None when no progress is shown."""
        self._loop = asyncio.get_running_loop()
        caps = self.server.client_capabilities
        use_progress = bool(caps and caps.window and caps.window.work_done_progress)
        if not (use_progress and loading):
            return None
        token = f"specls-load-{id(self)}"
        try:
            await self.server.work_done_progress.create_async(token)
            self.server.work_done_progress.begin(
                token, types.WorkDoneProgressBegin(title="specls: loading model", percentage=0)
            )
        except Exception as exc:
            logger.info("client refused work done progress: %s", exc)
            return None
        self._token = token
        return self.report

    def report(self, message: str, fraction: float) -> None:
        """Called on the engine thread."""
        loop, token = self._loop, self._token
        if loop is None or token is None or self.closed:
            return
        pct = int(max(0.0, min(1.0, fraction)) * 100)
        if (message, pct) == self._last:
            return
        self._last = (message, pct)
        value = types.WorkDoneProgressReport(message=message, percentage=pct)
        post_to_loop(loop, self._send, token, value)

    def end(self, ready: bool) -> None:
        """The load finished (``ready``) or failed: close the progress, if one was begun."""
        if self._token is not None:
            self._send(self._token, types.WorkDoneProgressEnd(message="ready" if ready else "failed"))
            self._token = None

    def _send(self, token: str, value: ProgressValue) -> None:
        if not self.closed:
            try:
                if isinstance(value, types.WorkDoneProgressEnd):
                    self.server.work_done_progress.end(token, value)
                else:
                    self.server.work_done_progress.report(token, value)
            except Exception:
                logger.debug("progress notification failed", exc_info=True)
