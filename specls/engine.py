"""The in-process completion engine: ONNX target (+ draft) model, speculative decoding, and the reuse
that makes completion-while-typing cheap. A conductor over named parts:

- ``specls.loading``: the models, their prompt facts and the drafting policy's pass costs, at load;
- ``specls.prompt.PromptBuilder``: the FIM prompt, its token prefix stable across keystrokes;
- ``specls.completion_cache.CompletionCache``: a prompt completed before is answered with zero model
  calls;
- ``specls.documents_state``: per document, the target KV cache, truncated to the longest common
  token prefix with its previous prompt so only new tokens are prefilled, the document's drafters and
  its last completion; and the open buffers' prompt-lookup index (``BufferIndex``);
- ``specls.drafting``: the request's drafters, prompt lookup and the draft model, planned pass by pass
  by the drafting policy (``PlannedDrafter``, within ``EngineSettings.draft_length``), and in front of
  them the document's previous completion when the user typed its beginning (``decoder.reuse``:
  typing through a suggestion costs about one target pass);
- ``specls.decoder.loop.generate``: the decode loop; greedy output equals plain greedy decoding of the
  target whatever the drafters propose; a text stop (``decoder.text.TextStop``) ends it early;
- ``EngineCounters`` (``stats()``), and ``EngineBatching``, off by default.

Threading: ``complete`` runs in one worker thread at a time (serialised by a lock), unless batching is
on (see ``specls.engine_batching``); prompt building and index updates are serialised either way.
``update_document``/``close_document`` may come from any thread (they only touch pending state under a
short lock).
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import nullcontext
from typing import Any

from specls.api import (
    CompletionRequest,
    CompletionResult,
    EngineError,
    NextEditRequest,
    NextEditResult,
)
from specls.completion_cache import FINISHED, CacheHit, CompletionCache
from specls.decoder.api import CancelCheck, DecodeResult, DecodeSettings, Drafter, KVCache, never_cancelled
from specls.decoder.loop import generate
from specls.decoder.reuse import PreviousCompletion
from specls.decoder.text import EarlyStop, TextStop
from specls.decoder.timed import TimedDrafter
from specls.documents_state import DocState, DocumentStates, prefix_cache
from specls.drafting import decode_settings, learn_from, policy_state, request_drafter
from specls.engine_batching import EngineBatching
from specls.engine_settings import EngineSettings
from specls.engine_stats import EngineCounters
from specls.loading import LoadedModels, Progress, load_models
from specls.next_edit.engine_path import EditPath
from specls.next_edit.settings import NextEditSettings
from specls.prompt import DocumentEncoder, Prompt, PromptBuilder, visible_text
from specls.type_ahead import type_ahead_answer

logger = logging.getLogger(__name__)

__all__ = ["EngineSettings", "LoadedModels", "OnnxEngine", "result_to_dict"]


class OnnxEngine:
    """The in-process Engine (see the module docstring)."""

    def __init__(
        self,
        settings: EngineSettings,
        models: LoadedModels | None = None,
        next_edit: NextEditSettings | None = None,
    ) -> None:
        self.settings = settings
        self.next_edit_settings = next_edit or NextEditSettings()
        self._edits: EditPath | None = None  # the next-edit path, made on its first request
        self._models = models
        self._run_lock = threading.Lock()  # one complete() at a time (without batching)
        self._prep_lock = threading.Lock()  # index updates and prompt building
        self._batching: EngineBatching | None = None  # off by default (see specls.engine_batching)
        self._docs = DocumentStates(settings)
        self._completions: CompletionCache | None = None
        self._counters = EngineCounters()
        self._builder: PromptBuilder | None = None
        self._encoder: DocumentEncoder | None = None
        self.last_prompt: list[int] = []  # the last computed request's prompt (benchmarks, debugging)
        self.last_tokens: list[int] = []  # ... and its generated tokens
        if models is not None:
            self._init_parts(models)

    # -- loading -------------------------------------------------------------------------------------

    def load(self, progress: Progress | None = None) -> None:
        say = progress or (lambda message, fraction: None)
        if self._models is None:
            models = load_models(self.settings, say)
            self._init_parts(models)
            self._models = models
        say("ready", 1.0)

    def _init_parts(self, models: LoadedModels) -> None:
        self._completions = CompletionCache(self.settings.lru_size, models.tokenizer)
        budget = self.settings.budget or models.budget
        self._builder = PromptBuilder(models.tokenizer, models.fim, budget, models.start_ids)
        self._encoder = DocumentEncoder(models.tokenizer)
        self._batching = EngineBatching.start(models.target, self.settings.batching)

    @property
    def ready(self) -> bool:
        return self._models is not None

    @property
    def models(self) -> LoadedModels:
        if self._models is None:
            raise EngineError("the engine is not loaded")
        return self._models

    # -- documents -------------------------------------------------------------------------------

    def update_document(self, doc_id: str, text: str) -> None:
        self._docs.update(doc_id, text)

    def close_document(self, doc_id: str) -> None:
        self._docs.close(doc_id)
        if self._edits is not None:
            self._edits.close_document(doc_id)

    def flush(self) -> None:
        """Index every pending document update now (``complete`` defers re-indexing a buffer indexed
        within ``reindex_interval_s``; the next request after it catches up, or a server when idle)."""
        with self._prep_lock:
            self._flush_pending(force=True)

    def _flush_pending(self, force: bool = False) -> None:
        if self._encoder is not None:
            self._docs.flush(self._encoder.encode, force)

    # -- completion ------------------------------------------------------------------------------

    def complete(
        self, request: CompletionRequest, cancelled: CancelCheck = never_cancelled
    ) -> CompletionResult:
        models = self.models
        if self._batching is not None:
            with self._batching.request(request.doc_id):
                return self._complete_counted(models, request, cancelled)
        with self._run_lock:
            return self._complete_counted(models, request, cancelled)

    def _complete_counted(
        self, models: LoadedModels, request: CompletionRequest, cancelled: CancelCheck
    ) -> CompletionResult:
        t0 = time.perf_counter()
        try:
            result = self._complete(models, request, cancelled)
        except EngineError:
            self._counters.error()
            raise
        self._counters.request(result.cancelled, not result.text, (time.perf_counter() - t0) * 1e3)
        return result

    def _complete(
        self, models: LoadedModels, request: CompletionRequest, cancelled: CancelCheck
    ) -> CompletionResult:
        """One completion: type-ahead, else the prompt, then the finished-completion cache, else a
        decode on the document's KV cache with its drafters."""
        provider = models.provider
        if request.max_tokens <= 0:
            return CompletionResult(text="", stop_reason="max_tokens", provider=provider)
        if cancelled():
            return CompletionResult(text="", stop_reason="cancelled", cancelled=True, provider=provider)
        state = self._docs.get(request.doc_id)
        ahead = self._type_ahead(models, state, request)
        if ahead is not None:
            return ahead
        prompt = self._prompt(request)
        max_new = min(request.max_tokens, models.max_positions - len(prompt.tokens))
        if max_new <= 0:
            logger.warning("prompt of %d tokens leaves no room to generate", len(prompt.tokens))
            return CompletionResult(text="", stop_reason="max_tokens", provider=provider)
        greedy = self.settings.temperature <= 0.0
        key = CompletionCache.key(prompt.tokens, max_new) if greedy and self.settings.lru_size > 0 else None
        if key is not None:
            hit = self.completions.lookup(key, request.stop)
            partial = False
            if hit is None and request.early_stop is not None:
                hit, partial = self.completions.lookup(key, request.early_stop), True
            if hit is not None:
                return self._replay(models, state, request, len(prompt.tokens), hit, partial)
        return self._generate(models, state, request, prompt, max_new, key, cancelled)

    def _generate(
        self,
        models: LoadedModels,
        state: DocState,
        request: CompletionRequest,
        prompt: Prompt,
        max_new: int,
        key: bytes | None,
        cancelled: CancelCheck,
    ) -> CompletionResult:
        """A decode on the document's KV cache with its drafters; the document remembers what it
        produced, and the completion cache too (``key``)."""
        cache = prefix_cache(models.target, state, prompt.tokens, self.settings.prefix_reuse)
        kept = cache.length  # prompt tokens whose KV is reused
        drafter, reuse = request_drafter(self.settings, models, state, self._docs.buffers, request, prompt)
        settings = decode_settings(self.settings, max_new, reuse, request.speculation_cap)
        if settings.draft_length <= 0:
            drafter, reuse = None, False
        early = EarlyStop(request.stop, request.early_stop) if request.early_stop is not None else None
        text_stop = early if early is not None else request.stop
        stop = (
            TextStop(models.tokenizer, text_stop, request.on_text)
            if text_stop is not None or request.on_text is not None
            else None
        )
        out = self._decode(models, state, cache, prompt, drafter, settings, cancelled, stop)
        learn_from(self.settings, models, state, out, batched=self._batching is not None)
        raw = self._remember(models, state, request, out)
        text = stop.text[: stop.cut] if stop is not None and stop.cut is not None else raw
        if key is not None:
            self.completions.store(key, out.tokens, out.stop_reason)
        ran = out.prefill_tokens > 0 or out.target_passes > 0
        reused = min(kept, len(prompt.tokens) - 1) if ran else 0
        draft_ms = drafter.ms if isinstance(drafter, TimedDrafter) else 0.0
        partial = (
            early is not None and stop is not None and out.stop_reason == "stop" and early.partial(stop.text)
        )
        self._counters.decoded(out, len(prompt.tokens), reused, reuse, draft_ms)
        return CompletionResult(
            text=text,
            tokens=len(out.tokens),
            stop_reason=out.stop_reason,
            cancelled=out.stop_reason == "cancelled",
            decode=out,
            prefix_reused_tokens=reused,
            completion_reuse=reuse,
            cache_hit=False,
            partial=partial,
            provider=models.provider,
        )

    def _remember(
        self, models: LoadedModels, state: DocState, request: CompletionRequest, out: DecodeResult
    ) -> str:
        """The decode's visible text, kept as the document's last completion (for completion reuse
        and type-ahead) unless a cancelled decode would replace the finished suggestion shown."""
        raw = visible_text(models.tokenizer.decode(out.tokens)) if out.tokens else ""
        shown = state.last
        keep_shown = (  # a decode cancelled at the cursor of the finished suggestion shown keeps that one
            out.stop_reason == "cancelled"
            and shown is not None
            and shown.stop_reason in FINISHED
            and (shown.prefix, shown.suffix) == (request.prefix, request.suffix)
        )
        if raw and not keep_shown:
            state.last = PreviousCompletion(
                request.prefix, request.suffix, raw, list(out.tokens), models.tokenizer, out.stop_reason
            )
        return raw

    @property
    def completions(self) -> CompletionCache:
        if self._completions is None:
            raise EngineError("the engine is not loaded")
        return self._completions

    def _prompt(self, request: CompletionRequest) -> Prompt:
        """The request's FIM prompt (a raw request's: its prefix as it is), after indexing the buffer
        updates that came in (serialised)."""
        assert self._builder is not None
        with self._prep_lock:
            self._flush_pending()
            if request.raw:  # laid out by the client (a next-edit prompt): tokenized as the edit path does
                return Prompt(self.models.tokenizer.encode(request.prefix))
            return self._builder.build(request.prefix, request.suffix, request.context_docs, request.doc_id)

    def _replay(
        self,
        models: LoadedModels,
        state: DocState,
        request: CompletionRequest,
        prompt_tokens: int,
        hit: CacheHit,
        partial: bool,
    ) -> CompletionResult:
        """A completion answered from the finished-completion cache: zero model calls (``partial``:
        cut by the request's early stop)."""
        if hit.raw:
            state.last = PreviousCompletion(
                request.prefix, request.suffix, hit.raw, list(hit.tokens), models.tokenizer, hit.reason
            )
        self._counters.cache_hit(prompt_tokens)
        return CompletionResult(
            text=hit.text,
            tokens=hit.n_tokens,
            stop_reason=hit.reason,
            cache_hit=True,
            partial=partial,
            provider=models.provider,
        )

    def _type_ahead(
        self, models: LoadedModels, state: DocState, request: CompletionRequest
    ) -> CompletionResult | None:
        """``type_ahead_answer`` on the document's last completion (``EngineSettings.type_ahead``;
        greedy only: the text is the greedy answer to the prompt that produced it)."""
        if not self.settings.type_ahead or self.settings.temperature > 0.0 or state.last is None:
            return None
        answer = type_ahead_answer(state.last, request, models.provider)
        if answer is not None:
            self._counters.type_ahead()
        return answer

    def _decode(
        self,
        models: LoadedModels,
        state: DocState,
        cache: KVCache,
        prompt: Prompt,
        drafter: Drafter | None,
        settings: DecodeSettings,
        cancelled: CancelCheck,
        stop: TextStop | None,
    ) -> DecodeResult:
        """The decode loop on the document's cache (through the batcher when batching); afterwards
        the document's state says what its cache holds. A failed decode drops the cache."""
        batched = nullcontext(cache) if self._batching is None else self._batching.cache(cache)
        try:
            with batched as target:
                out = generate(target, prompt.tokens, drafter, settings, models.eos_ids, cancelled, stop)
        except Exception as exc:
            # the cache may be half-updated: drop it, the next request starts cold
            state.cache, state.tokens = None, []
            if isinstance(exc, EngineError):
                raise
            raise EngineError(f"generation failed: {exc}") from exc
        self.last_prompt, self.last_tokens = list(prompt.tokens), list(out.tokens)
        state.tokens = [*prompt.tokens, *out.tokens][: cache.length]
        return out

    # -- next edits ------------------------------------------------------------------------------

    def next_edit(self, request: NextEditRequest, cancelled: CancelCheck = never_cancelled) -> NextEditResult:
        """The region around the cursor rewritten by the model, as edits (docs/next-edit.md;
        ``specls.next_edit.engine_path``). Serialised with completions: they share the target."""
        models = self.models
        with self._run_lock:
            with self._prep_lock:
                self._flush_pending()
            if self._edits is None:
                self._edits = EditPath(self.settings, self.next_edit_settings, models)
            return self._edits.run(request, self._docs.buffers, cancelled)

    @property
    def edits(self) -> EditPath | None:
        """The next-edit path (None before the first request): its last prompt and tokens, counters."""
        return self._edits

    # -- stats -----------------------------------------------------------------------------------

    def interrupt(self) -> None:
        if self._models is not None:
            self._models.interrupt()

    def stats(self) -> dict[str, object]:
        models = self._models
        return {
            **self._counters.snapshot(),
            "documents": len(self._docs),
            "indexed_documents": self._docs.indexed(),
            "kv_tokens": self._docs.kv_tokens(),
            "provider": None if models is None else models.provider,
            "ready": models is not None,
            "drafting_policy": None if models is None else policy_state(self.settings, models).snapshot(),
            "next_edit": None if self._edits is None else self._edits.snapshot(),
            # the workspace's and the datastores' size and cost; None when lookup uses the buffers only
            "lookup_sources": None if self._docs.static is None else self._docs.static.stats(),
            "batching": _batching_stats(self._batching, self.settings),
        }

    def with_settings(self, settings: EngineSettings) -> OnnxEngine:
        """A new engine sharing this one's loaded models (documents, caches and stats are its own)."""
        return OnnxEngine(settings, self.models, self.next_edit_settings)


def _batching_stats(batching: EngineBatching | None, settings: EngineSettings) -> dict[str, object]:
    return (
        batching.snapshot()
        if batching is not None
        else {"enabled": False, "max_batch": settings.batching.max_batch}
    )


def result_to_dict(result: CompletionResult) -> dict[str, Any]:
    """A CompletionResult as plain JSON-able data."""
    return dict(result.to_dict())
