"""Test engines built on the team FakeEngine."""

from __future__ import annotations

import threading

from specls.decoder.api import CancelCheck, never_cancelled

from specls.api import (
    CompletionRequest,
    CompletionResult,
    EngineError,
    NextEditRequest,
    NextEditResult,
    no_next_edit,
)
from specls.next_edit.edits import Position, Region, TextEdit
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


class EditGateEngine(GateEngine):
    """``GateEngine`` whose next edits also wait for ``gate`` (or their cancellation); each next edit
    answers one scripted edit (line 0 -> ``"edited\\n"``) and the order of engine calls is kept."""

    def __init__(self) -> None:
        super().__init__()
        self.edit_entered = threading.Event()
        self.edit_requests: list[NextEditRequest] = []
        self.order: list[str] = []  # "complete:<doc>" / "next_edit:<doc>", as they started

    def complete(
        self, request: CompletionRequest, cancelled: CancelCheck = never_cancelled
    ) -> CompletionResult:
        with self._lock:
            self.order.append(f"complete:{request.doc_id}")
        return super().complete(request, cancelled)

    def next_edit(self, request: NextEditRequest, cancelled: CancelCheck = never_cancelled) -> NextEditResult:
        with self._lock:
            self.order.append(f"next_edit:{request.doc_id}")
            self.edit_requests.append(request)
        self.edit_entered.set()
        while not self.gate.wait(0.005):
            if cancelled():
                return no_next_edit(request, "cancelled", provider="fake")
        edit = TextEdit(Position(0, 0), Position(1, 0), "edited\n")
        return NextEditResult((edit,), Region(0, 1), "edited\n", tokens=2, provider="fake")
