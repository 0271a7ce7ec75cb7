"""The text-level contract: what the language server needs from a completion backend (the in-process
engine of ``specls.engine`` or a remote OpenAI-compatible one). The server never sees tokens or
models, only text.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from specls.decoder.api import CancelCheck, DrafterStats, never_cancelled


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
    # completion is finished (e.g. end of line in single-line mode), or None to go on.
    stop: Callable[[str], int | None] | None = None
    # Other open buffers (uri -> text) that may be used as prompt context snippets.
    context_docs: tuple[tuple[str, str], ...] = ()
    # Set by a scheduler under load (specls.team): upper bound on the speculation length for this
    # request; 0 = drafting off; None = the engine's own choice. Engines that cannot honour it ignore it.
    speculation_cap: int | None = None


@dataclass
class CompletionResult:
    text: str
    tokens: int = 0
    stop_reason: str = "max_tokens"
    cancelled: bool = False
    target_passes: int = 0
    drafted: int = 0
    accepted: int = 0
    per_drafter: dict[str, DrafterStats] = field(default_factory=dict)
    prefill_tokens: int = 0
    prefill_ms: float = 0.0
    decode_ms: float = 0.0
    prefix_reused_tokens: int = 0  # prompt tokens whose KV was reused from the previous request
    completion_reuse: bool = False  # the previous completion was used as the draft
    cache_hit: bool = False  # answered from the finished-completion LRU, no model call
    provider: str = "cpu"


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

    def stats(self) -> dict[str, object]: ...
