"""A deterministic, model-free ``Engine`` for exercising the team service (tests, ``specls bench team
--engine fake``, ``specls serve-engine --fake``): each "target pass" sleeps ``pass_s`` and emits
``tokens_per_pass`` words (1 when the scheduler turns drafting off), honours cancellation at every
pass and the text-level ``stop`` after every word, and keeps a per-document fake KV buffer so tests can
see memory released when documents close."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from specls.api import (
    CompletionRequest,
    CompletionResult,
    EngineError,
    NextEditRequest,
    NextEditResult,
    no_next_edit,
)
from specls.decoder.api import CancelCheck, DecodeResult, DrafterStats, never_cancelled


@dataclass(frozen=True)
class FakeEngineSettings:
    pass_s: float = 0.01  # seconds per target pass
    tokens_per_pass: int = 3  # words emitted per pass while drafting is on
    kv_bytes_per_char: int = 64  # fake KV footprint of an open document
    fail_load: str | None = None  # load() raises EngineError with this message


def fake_word(prefix: str, suffix: str, i: int) -> str:
    h = hashlib.sha256(f"{len(prefix)}|{prefix[-64:]}|{suffix[:64]}|{i}".encode()).hexdigest()
    return "w" + h[:4] + " "


class FakeEngine:
    def __init__(self, settings: FakeEngineSettings = FakeEngineSettings()) -> None:
        self.settings = settings
        self._ready = False
        self._lock = threading.Lock()
        self._docs: dict[str, str] = {}
        self._kv: dict[str, bytearray] = {}
        self.calls: list[str] = []  # doc ids in the order complete() ran them
        self.caps_seen: list[int | None] = []
        self.passes = 0

    def load(self, progress: Callable[[str, float], None] | None = None) -> None:
        if self.settings.fail_load:
            raise EngineError(self.settings.fail_load)
        if progress is not None:
            progress("fake engine ready", 1.0)
        self._ready = True

    @property
    def ready(self) -> bool:
        return self._ready

    def update_document(self, doc_id: str, text: str) -> None:
        with self._lock:
            self._docs[doc_id] = text

    def close_document(self, doc_id: str) -> None:
        with self._lock:
            self._docs.pop(doc_id, None)
            self._kv.pop(doc_id, None)

    def expected_text(self, prefix: str, suffix: str, max_tokens: int) -> str:
        return "".join(fake_word(prefix, suffix, i) for i in range(max_tokens))

    def complete(
        self, request: CompletionRequest, cancelled: CancelCheck = never_cancelled
    ) -> CompletionResult:
        if not self._ready:
            raise EngineError("fake engine not loaded")
        with self._lock:
            self.calls.append(request.doc_id)
            self.caps_seen.append(request.speculation_cap)
            self._kv[request.doc_id] = bytearray(
                len(request.prefix + request.suffix) * self.settings.kv_bytes_per_char
            )
        cap = request.speculation_cap
        # a pass verifies up to cap drafted tokens plus the target's own one
        per_pass = (
            self.settings.tokens_per_pass if cap is None else min(self.settings.tokens_per_pass, cap + 1)
        )
        t0 = time.perf_counter()
        text = ""
        n = 0
        passes = drafted = accepted = 0
        stop_reason = "max_tokens"
        while n < request.max_tokens:
            if cancelled():
                stop_reason = "cancelled"
                break
            time.sleep(self.settings.pass_s)
            passes += 1
            take = min(per_pass, request.max_tokens - n)
            if per_pass > 1:
                drafted += per_pass - 1
                accepted += take - 1
            stopped = False
            for _ in range(take):
                text += fake_word(request.prefix, request.suffix, n)
                n += 1
                if request.on_text is not None:
                    request.on_text(text)
                if request.stop is not None:
                    keep = request.stop(text)
                    if keep is not None:
                        text = text[:keep]
                        stop_reason, stopped = "stop", True
                        break
            if stopped:
                break
        with self._lock:
            self.passes += passes
        per = {"fake": DrafterStats(drafted=drafted, accepted=accepted, proposals=passes)} if drafted else {}
        return CompletionResult(
            text=text,
            tokens=n,
            stop_reason=stop_reason,
            cancelled=stop_reason == "cancelled",
            decode=DecodeResult(
                tokens=[],  # a model-free engine has no token ids
                target_passes=passes,
                drafted=drafted,
                accepted=accepted,
                per_drafter=per,
                decode_ms=(time.perf_counter() - t0) * 1000,
            ),
            provider="fake",
        )

    def next_edit(self, request: NextEditRequest, cancelled: CancelCheck = never_cancelled) -> NextEditResult:
        """No edit (a model-free engine has no rewrite to offer), after one fake pass."""
        if not self._ready:
            raise EngineError("fake engine not loaded")
        if cancelled():
            return no_next_edit(request, "cancelled", provider="fake")
        time.sleep(self.settings.pass_s)
        with self._lock:
            self.passes += 1
        return no_next_edit(request, "unchanged", provider="fake")

    def interrupt(self) -> None:
        """A fake has no passes to stop."""

    def stats(self) -> dict[str, object]:
        with self._lock:
            return {
                "open_documents": len(self._docs),
                "kv_cached_sequences": len(self._kv),
                "kv_bytes": sum(len(b) for b in self._kv.values()),
                "target_passes": self.passes,
            }
