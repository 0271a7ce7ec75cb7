"""The text-level contract: what the language server needs from a completion backend (the in-process
engine of ``specls.engine`` or a remote OpenAI-compatible one). The server never sees tokens or
models, only text.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Protocol

from specls.decoder.api import CancelCheck, DecodeResult, DrafterStats, never_cancelled
from specls.next_edit.edit_diff import EditDiff
from specls.next_edit.edits import LastEdit, Region, TextEdit


@dataclass(frozen=True)
class CompletionRequest:
    """One completion at one cursor. ``doc_id`` identifies the buffer (LSP uri) so the engine can
    reuse that buffer's KV prefix and last completion across keystrokes."""

    doc_id: str
    prefix: str  # document text before the cursor
    suffix: str  # document text after the cursor
    max_tokens: int = 64
    language: str = "python"
    # Text-level stop: called with the completion text so far; returns the length to keep when the
    # completion is finished (e.g. end of line in single-line mode), or None to go on. A pure function
    # of the text: the decode also asks it about drafts it may never commit (``Stop.horizon``).
    stop: Callable[[str], int | None] | None = None
    # A stop for a decode only (same contract as ``stop``): when the answer must be decoded it ends
    # here too, an early partial answer (``CompletionResult.partial``) that a later request without it
    # completes; the rest of a finished suggestion (type-ahead) and a replayed completion are cut by
    # ``stop`` first. The server's line-first answers (``ServerSettings.line_first``). Engines that
    # cannot honour it ignore it.
    early_stop: Callable[[str], int | None] | None = None
    # Called with the completion's visible text so far each time a decode commits tokens (a server
    # streaming the answer); never with a draft's text. The final text is CompletionResult.text.
    on_text: Callable[[str], None] | None = None
    # Other open buffers (uri -> text) that may be used as prompt context snippets.
    context_docs: tuple[tuple[str, str], ...] = ()
    # Set by a scheduler under load (specls.team): upper bound on the speculation length for this
    # request; 0 = drafting off; None = the engine's own choice. Engines that cannot honour it ignore it.
    speculation_cap: int | None = None
    # ``prefix`` is the whole prompt as it is (no fill-in-the-middle template, context or window;
    # ``suffix`` unused): a raw completion such as a next-edit prompt sent by ``RemoteEngine``.
    raw: bool = False


class DecodeCounts:
    """A result's decode counts, read from its ``decode`` (zero or empty when no decode ran): one
    reading for a completion and a next edit alike."""

    decode: DecodeResult | None

    @property
    def target_passes(self) -> int:
        return self.decode.target_passes if self.decode is not None else 0

    @property
    def drafted(self) -> int:
        return self.decode.drafted if self.decode is not None else 0

    @property
    def accepted(self) -> int:
        return self.decode.accepted if self.decode is not None else 0

    @property
    def per_drafter(self) -> dict[str, DrafterStats]:
        return self.decode.per_drafter if self.decode is not None else {}

    @property
    def prefill_tokens(self) -> int:
        return self.decode.prefill_tokens if self.decode is not None else 0

    @property
    def prefill_ms(self) -> float:
        return self.decode.prefill_ms if self.decode is not None else 0.0

    @property
    def decode_ms(self) -> float:
        return self.decode.decode_ms if self.decode is not None else 0.0

    @property
    def first_pass_ms(self) -> float:
        return self.decode.first_pass_ms if self.decode is not None else 0.0

    @property
    def first_pass_tokens(self) -> int:
        return self.decode.first_pass_tokens if self.decode is not None else 0


@dataclass
class CompletionResult(DecodeCounts):
    """One completion's text and where it came from. ``decode`` is the decode that produced it, with
    its cost (passes, drafting, prefill, times; a remote engine fills in what its server reports), or
    None when no decode ran (a cache hit, an empty or cancelled request); the properties read it."""

    text: str
    tokens: int = 0  # tokens the text stands for (generated, or replayed from a cache)
    stop_reason: str = "max_tokens"
    cancelled: bool = False
    decode: DecodeResult | None = None
    prefix_reused_tokens: int = 0  # prompt tokens whose KV was reused from the previous request
    completion_reuse: bool = False  # the previous completion was used as the draft
    cache_hit: bool = False  # answered from the finished-completion LRU, no model call
    type_ahead: bool = False  # the rest of the last suggestion, which the user typed into: no model call
    partial: bool = False  # cut by the request's early_stop where its stop would have gone on
    provider: str = "cpu"

    def to_dict(self) -> dict[str, object]:
        """Plain JSON-able data (the decode's counts flat, without its token ids)."""
        return {
            "text": self.text,
            "tokens": self.tokens,
            "stop_reason": self.stop_reason,
            "cancelled": self.cancelled,
            "target_passes": self.target_passes,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "per_drafter": {k: asdict(v) for k, v in self.per_drafter.items()},
            "prefill_tokens": self.prefill_tokens,
            "prefill_ms": self.prefill_ms,
            "decode_ms": self.decode_ms,
            "prefix_reused_tokens": self.prefix_reused_tokens,
            "completion_reuse": self.completion_reuse,
            "cache_hit": self.cache_hit,
            "type_ahead": self.type_ahead,
            "provider": self.provider,
        }


@dataclass
class ResultTotals:
    """Sums over the CompletionResults a caller received (a language server's view of its engine,
    whatever the engine): read from the results, so no caller re-lists their fields."""

    engine_calls: int = 0
    tokens_generated: int = 0
    prefill_tokens: int = 0  # prompt tokens run through the target (not reused)
    prefix_reused_tokens: int = 0  # prompt tokens whose KV came from the previous request
    completion_reuse_hits: int = 0
    cache_hits: int = 0
    type_ahead_hits: int = 0

    def add(self, result: CompletionResult) -> None:
        self.engine_calls += 1
        self.tokens_generated += result.tokens
        self.prefill_tokens += result.prefill_tokens
        self.prefix_reused_tokens += result.prefix_reused_tokens
        self.completion_reuse_hits += int(result.completion_reuse)
        self.cache_hits += int(result.cache_hit)
        self.type_ahead_hits += int(result.type_ahead)

    def snapshot(self) -> dict[str, object]:
        """The sums and the rates per call (prefix reuse: the share of prompt tokens reused)."""
        calls = max(1, self.engine_calls)
        prompt = self.prefix_reused_tokens + self.prefill_tokens
        return {
            **asdict(self),
            "prefill_tokens_per_call": round(self.prefill_tokens / calls, 2),
            "prefix_reuse_rate": round(self.prefix_reused_tokens / max(1, prompt), 4),
            "completion_reuse_rate": round(self.completion_reuse_hits / calls, 4),
            "cache_hit_rate": round(self.cache_hits / calls, 4),
            "type_ahead_rate": round(self.type_ahead_hits / calls, 4),
        }


@dataclass(frozen=True)
class NextEditRequest:
    """A next-edit suggestion near one cursor: the engine rewrites the region around it (docs/next-edit.md).

    ``text`` is the document now; ``line``/``character`` the cursor (0-based, ``character`` in UTF-16
    code units, as LSP); ``history`` the recent edits, oldest first, of this and other documents
    (``specls.lsp.edit_history.EditHistory.edit_diffs``, or ``diffs_between`` of a file's earlier
    version); ``last_edit`` the one a suggestion must not undo (None: the newest of ``history`` on
    this document's ``path``). ``max_tokens`` caps the rewrite (None: from the region's length).
    ``layout`` overrides the model's next-edit layout (``specls.next_edit.layouts``)."""

    doc_id: str
    text: str
    line: int
    character: int
    history: tuple[EditDiff, ...] = ()
    context_docs: tuple[tuple[str, str], ...] = ()  # other open buffers (uri -> text)
    max_tokens: int | None = None
    path: str = ""  # the file's name in the prompt ("": from doc_id, a file: uri's path)
    last_edit: LastEdit | None = None
    layout: str | None = None


@dataclass(frozen=True)
class NextEditResult(DecodeCounts):
    """The suggested edits (document coordinates, UTF-16 characters; empty: nothing to show) and how
    they came: the ``region`` rewritten (lines [start_line, end_line)), the model's ``rewritten``
    region (None: no usable output), and the decode. ``dropped`` says why nothing is shown ("" when
    edits are: "unchanged", "run_on", "too_long", "malformed", "undo", "cancelled", "no_room",
    "empty"; ``specls.next_edit.rewrite_end``); ``undone`` counts edits left out because they would
    undo the last edit."""

    edits: tuple[TextEdit, ...]
    region: Region
    rewritten: str | None
    tokens: int = 0
    stop_reason: str = "max_tokens"
    cancelled: bool = False
    decode: DecodeResult | None = None
    dropped: str = ""
    undone: int = 0
    layout: str = ""
    prefix_reused_tokens: int = 0
    provider: str = "cpu"
    # the edits' confidence: their least sure changed token's top-1/top-2 logit margin
    # (specls.next_edit.confidence); None where none was measured
    confidence: float | None = None

    def to_dict(self) -> dict[str, object]:
        """Plain JSON-able data: ``specls next-edit --json``'s object (edits as LSP ``TextEdit``s).

        >>> NextEditResult((), Region(3, 5), None, dropped="malformed").to_dict()["region"]
        {'start_line': 3, 'end_line': 5}
        """
        return {
            "edits": [e.to_json() for e in self.edits],
            "region": {"start_line": self.region.start_line, "end_line": self.region.end_line},
            "rewritten": self.rewritten,
            "tokens": self.tokens,
            "target_passes": self.target_passes,
            "prefill_ms": self.prefill_ms,
            "decode_ms": self.decode_ms,
            "stop_reason": self.stop_reason,
            "cancelled": self.cancelled,
            "dropped": self.dropped,
            "undone": self.undone,
            "layout": self.layout,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "per_drafter": {k: asdict(v) for k, v in self.per_drafter.items()},
            "prefill_tokens": self.prefill_tokens,
            "prefix_reused_tokens": self.prefix_reused_tokens,
            "provider": self.provider,
            "confidence": self.confidence,
        }


def no_next_edit(request: NextEditRequest, dropped: str, provider: str = "cpu") -> NextEditResult:
    """An empty answer at the cursor's line (a fake engine, a cancelled or impossible request)."""
    return NextEditResult(
        (),
        Region(request.line, request.line),
        None,
        stop_reason="cancelled" if dropped == "cancelled" else "max_tokens",
        cancelled=dropped == "cancelled",
        dropped=dropped,
        provider=provider,
    )


class EngineError(RuntimeError):
    """A backend that cannot serve (model missing/corrupt, remote unreachable). Message is for users."""


class Engine(Protocol):
    """A completion backend. Implementations must be safe to call from one worker thread at a time
    per ``complete`` call; ``update_document``/``close_document`` may come from another thread."""

    def load(self, progress: Callable[[str, float], None] | None = None) -> None:
        """Blocking load; raises EngineError with a clear reason. progress(message, fraction 0..1)."""
        ...

    @property
    def ready(self) -> bool: ...

    def update_document(self, doc_id: str, text: str) -> None:
        """A buffer's full current text (feeds the cross-buffer prompt-lookup index)."""
        ...

    def close_document(self, doc_id: str) -> None: ...

    def complete(
        self, request: CompletionRequest, cancelled: CancelCheck = never_cancelled
    ) -> CompletionResult: ...

    def next_edit(self, request: NextEditRequest, cancelled: CancelCheck = never_cancelled) -> NextEditResult:
        """The edits the user is likely to make next near the cursor (empty: none to show); output
        identical to plain greedy decoding of the edit prompt."""
        ...

    def interrupt(self) -> None:
        """From another thread: stop the model pass in flight now (a cancelled request's, so that the
        request that cancelled it does not wait for the pass); a decode not cancelled runs it again.
        A no-op where passes cannot be stopped midway."""
        ...

    def stats(self) -> dict[str, object]: ...
