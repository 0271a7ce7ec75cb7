"""The server counters that ``specls/stats`` reports: what became of every request and every
line-first continuation, shared by all sessions of one ``EngineHost``."""

from __future__ import annotations

import concurrent.futures
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from specls.api import CompletionResult, ResultTotals
from specls.stats import percentile

LATENCY_WINDOW = 2000  # latency samples kept for percentiles

Outcome = concurrent.futures.Future[CompletionResult | None]


def percentiles(values: Sequence[float]) -> dict[str, float | int]:
    """Count, median and 95th percentile, rounded for a stats answer.

    >>> percentiles([3.0, 1.0, 2.0])
    {'n': 3, 'p50': 2.0, 'p95': 3.0}
    """
    return {
        "n": len(values),
        "p50": round(percentile(values, 50), 2),
        "p95": round(percentile(values, 95), 2),
    }


def _result(future: Outcome) -> CompletionResult | None:
    """What a generation returned; None when it never ran, failed or returned nothing."""
    if future.cancelled() or future.exception() is not None:
        return None
    return future.result()


RECENT_REQUESTS = 64  # next-edit requests listed one by one in the stats


@dataclass
class NextEditCounters:
    """What became of the next-edit requests (``textDocument/copilotInlineEdit``) and their edits."""

    requests: int = 0
    answered: int = 0  # answers with an edit
    empty: int = 0  # no edit (no document, bad position, the engine had none to offer)
    not_ready: int = 0
    cancelled: int = 0  # preempted by a completion request or an edit, superseded, or $/cancelRequest
    stale_dropped: int = 0  # for a version already superseded, or the document changed meanwhile
    errors: int = 0
    shown: int = 0  # textDocument/didShowInlineEdit, once per offered edit
    accepted: int = 0  # the edit's command through workspace/executeCommand, once per offered edit
    tokens_wasted: int = 0  # generated for edits that were cancelled or stale
    latency_ms: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))
    # of that latency: waiting for the engine thread (work in flight when the request came), then
    # the engine's run (the rest is the server's own)
    queued_ms: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))
    engine_ms: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))
    # the newest requests one by one: ms (the latency), queued_ms and engine_ms when it reached the engine
    recent: deque[dict[str, float]] = field(default_factory=lambda: deque(maxlen=RECENT_REQUESTS))

    def snapshot(self) -> dict[str, object]:
        plain: dict[str, object] = {k: v for k, v in vars(self).items() if not isinstance(v, deque)}
        for k, v in vars(self).items():
            if isinstance(v, deque):
                plain[k] = list(v) if k == "recent" else percentiles(list(v))
        return plain


@dataclass
class Counters:
    requests: int = 0
    answered: int = 0  # results with an item
    empty: int = 0  # empty results (not ready, no document, bad position, nothing useful generated)
    not_ready: int = 0
    cancelled: int = 0  # superseded by a newer keystroke/request, or $/cancelRequest
    stale_dropped: int = 0  # finished, but the document had changed meanwhile
    errors: int = 0
    accepted: int = 0
    shown: int = 0
    tokens_wasted: int = 0  # generated for results that were cancelled or stale
    continuations: int = 0  # blocks decoded in the background after a line-first answer
    continued: int = 0  # ... that finished
    continuations_preempted: int = 0  # ... that a request or an edit stopped
    results: ResultTotals = field(default_factory=ResultTotals)  # every result that came back
    latency_ms: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))
    keystroke_ms: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))
    next_edit: NextEditCounters = field(default_factory=NextEditCounters)

    def generation_done(self, future: Outcome, cancelled: bool) -> None:
        """A request's generation finished (``cancelled``: its request was cancelled meanwhile)."""
        result = _result(future)
        if result is None:
            self.cancelled += 1  # never reached the engine
            return
        self.results.add(result)
        if result.stop_reason == "error":
            self.errors += 1
        elif cancelled or result.cancelled:
            self.cancelled += 1
            self.tokens_wasted += result.tokens

    def continuation_done(self, future: Outcome) -> None:
        """A line-first answer's background block finished, failed or was preempted."""
        result = _result(future)
        if result is not None and result.stop_reason == "error":
            self.errors += 1  # logged by the generation; not something a keystroke stopped
        elif result is None or result.cancelled:
            self.continuations_preempted += 1
            self.tokens_wasted += result.tokens if result is not None else 0
        else:
            self.continued += 1

    def snapshot(self) -> dict[str, object]:
        skip = deque | ResultTotals | NextEditCounters
        plain = {k: v for k, v in vars(self).items() if not isinstance(v, skip)}
        plain.update(self.results.snapshot())
        plain["next_edit"] = self.next_edit.snapshot()
        plain["latency_ms"] = percentiles(list(self.latency_ms))
        plain["keystroke_to_result_ms"] = percentiles(list(self.keystroke_ms))
        return plain
