"""Test engines built on the team FakeEngine."""

from __future__ import annotations

import threading

from specls.decoder.api import CancelCheck, never_cancelled

from specls.api import CompletionRequest, CompletionResult, EngineError
from specls.team.fake import FakeEngine, FakeEngineSettings


class GateEngine(FakeEngine):
    """Blocks each complete() until ``gate`` is set (or the request is cancelled)."""

    def __init__(self) -> None:
        super().__init__(FakeEngineSettings(pass_s=0.001))
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.fail_docs: set[str] = set()

    def complete(
        self, request: CompletionRequest, cancelled: CancelCheck = never_cancelled
    ) -> CompletionResult:
        self.entered.set()
        while not self.gate.wait(0.005):
            if cancelled():
                with self._lock:
                    self.calls.append(request.doc_id)
                return CompletionResult(text="", stop_reason="cancelled", cancelled=True)
        if any(request.doc_id.endswith(d) for d in self.fail_docs):
            raise EngineError("boom")
        return super().complete(request, cancelled)


def loaded(engine: FakeEngine) -> FakeEngine:
    engine.load()
    return engine
