"""The in-process completion engine: ONNX target (+ draft) model, speculative decoding, and the reuse
that makes completion-while-typing cheap. A conductor over named parts:

- ``specls.prompt.PromptBuilder``: the FIM prompt, its token prefix stable across keystrokes;
- ``specls.completion_cache.CompletionCache``: a prompt completed before is answered with zero model
  calls;
- the document's target KV cache, truncated to the longest common token prefix with its previous
  prompt, so only new tokens are prefilled;
- drafters (``specls.decoder``): prompt lookup over every open buffer (``BufferIndex``, an incremental
  n-gram index) and the draft model, combined (``HybridDrafter``), and in front of them the document's
  previous completion when the user typed its beginning (``decoder.reuse``: typing through a
  suggestion costs about one target pass);
- ``specls.decoder.loop.generate``: the decode loop; greedy output equals plain greedy decoding of the
  target whatever the drafters propose; a text stop (``decoder.text.TextStop``) ends it early;
- ``specls.models.facts``: the model's FIM tokens, EOS ids and context limit, resolved at load;
- ``EngineCounters`` (``stats()``), and ``EngineBatching``, off by default.

Threading: ``complete`` runs in one worker thread at a time (serialised by a lock), unless batching is
on (see ``specls.engine_batching``); prompt building and index updates are serialised either way.
``update_document``/``close_document`` may come from any thread (they only touch pending state under a
short lock).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from specls.api import CompletionRequest, CompletionResult, EngineError
from specls.completion_cache import FINISHED, CacheHit, CompletionCache
from specls.decoder.api import (
    CancelCheck,
    CausalLM,
    DecodeResult,
    DecodeSettings,
    Drafter,
    KVCache,
    never_cancelled,
)
from specls.decoder.batching import BatchSettings
from specls.decoder.buffer_index import BufferIndex, ReindexPolicy
from specls.decoder.drafters import DrafterSettings, DraftModelDrafter, PromptLookupDrafter
from specls.decoder.loop import generate
from specls.decoder.ngram import common_prefix_len
from specls.decoder.pass_cost_learner import PassCostLearner
from specls.decoder.planned import PlannedDrafter, PolicyState, calibrate
from specls.decoder.policy import PassCosts
from specls.decoder.reuse import CompletionReuseDrafter, PreviousCompletion, ReuseFirstDrafter
from specls.decoder.text import EarlyStop, TextStop
from specls.decoder.timed import TimedDrafter
from specls.engine_batching import EngineBatching
from specls.engine_stats import EngineCounters
from specls.pass_costs_cache import PassCostsCache, costs_key, default_path, machine_facts
from specls.prompt import (
    DocumentEncoder,
    FimTokens,
    Prompt,
    PromptBudget,
    PromptBuilder,
    TextTokenizer,
    visible_text,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineSettings:
    """How the in-process engine loads and decodes. Field names are the CLI's and the LSP settings'
    (``--model``/``model``, ``--no-draft``/``draft_model``, ``--no-speculation``/``speculation``)."""

    model: str | None = None  # target model dir; None = the bundled target
    draft: str | None = None  # draft model dir; None = the bundled draft
    draft_model: bool = True  # draft with the draft model
    lookup: bool = True  # draft by prompt lookup (the open buffers, the prompt, the suffix)
    speculation: bool = True  # False = plain greedy reference path (no drafter at all)
    # the most tokens one pass drafts; the drafting policy (decoder/planned.py) picks each pass's length
    # up to it, by measured pass costs and learned acceptance
    draft_length: int = 12
    # keep the policy's pass costs per machine (specls.pass_costs_cache): a later load of the same models
    # with the same settings skips the seconds of timing; False measures at every load (the benchmarks
    # do, so each run's costs are its own)
    costs_cache: bool = True
    # follow the host: the pass costs the policy plans with move with every request's own passes
    # (decoder/pass_cost_learner.py); False keeps the load's calibration for the engine's life
    learn_costs: bool = True
    completion_reuse: bool = True
    # typing the beginning of the last finished suggestion answers its rest with zero model calls: the
    # greedy answer to the prompt that was sent, not re-decoded for the new cursor (False re-decodes;
    # completion reuse then verifies the rest in about one target pass, a prefill plus a pass on a CPU)
    type_ahead: bool = True
    prefix_reuse: bool = True
    threads: int = 0  # onnxruntime intra-op threads; 0 = auto (specls.models.runtime.auto_threads)
    provider: str = "auto"
    temperature: float = 0.0
    seed: int | None = None
    deadline_s: float | None = None
    budget: PromptBudget | None = None  # None: the loaded model's (LoadedModels.budget)
    lru_size: int = 128  # finished completions kept (greedy only)
    kv_documents: int = 8  # documents whose KV caches are kept (least recently used dropped)
    reuse_max_draft: int = 64  # longest completion-reuse proposal per pass
    drafters: DrafterSettings = field(default_factory=DrafterSettings)
    # re-indexing a buffer from an edit this far from its end waits until it was last indexed this long ago
    reindex_max_chars: int = 2_000
    reindex_interval_s: float = 5.0
    # joining concurrent requests' target passes (team service); max_batch 1 = off
    batching: BatchSettings = BatchSettings(max_batch=1)


@dataclass
class LoadedModels:
    """What ``load`` produces; tests and the benchmark can build it from other parts."""

    target: CausalLM
    tokenizer: TextTokenizer
    fim: FimTokens | None  # None: prefix-only prompts (a model without FIM tokens)
    eos_ids: frozenset[int]
    draft: CausalLM | None = None
    provider: str = "cpu"
    max_positions: int = 1024
    # the model's prompt budgets and start tokens (specls.models.fim.prompt_facts)
    budget: PromptBudget = field(default_factory=PromptBudget)
    start_ids: tuple[int, ...] = ()
    # what the drafting policy learned about this pair (pass costs calibrated at load, acceptance)
    policy: PolicyState = field(default_factory=PolicyState)
    # the same for prompt lookup alone (no draft model, or ``draft_model`` off) and for the draft model
    # alone (``lookup`` off): each learns on its own, so that engines of one load with other drafters
    # teach each other nothing
    lookup_policy: PolicyState = field(default_factory=PolicyState)
    draft_policy: PolicyState = field(default_factory=PolicyState)


@dataclass
class _DocState:
    cache: KVCache | None = None
    tokens: list[int] = field(default_factory=list)  # what ``cache`` holds
    draft_drafter: DraftModelDrafter | None = None  # keeps its own draft KV cache across requests
    lookup_drafter: PromptLookupDrafter | None = None  # keeps its context n-gram index
    planned_drafter: PlannedDrafter | None = None  # the policy over those
    last: PreviousCompletion | None = None  # for completion reuse and type-ahead


class OnnxEngine:
    """The in-process Engine (see the module docstring)."""

    def __init__(self, settings: EngineSettings, models: LoadedModels | None = None) -> None:
        self.settings = settings
        self._models = models
        self._lock = threading.Lock()  # the documents' states
        self._run_lock = threading.Lock()  # one complete() at a time (without batching)
        self._prep_lock = threading.Lock()  # index updates and prompt building
        self._batching: EngineBatching | None = None  # off by default (see specls.engine_batching)
        self._docs: OrderedDict[str, _DocState] = OrderedDict()
        self._completions: CompletionCache | None = None
        self._counters = EngineCounters()
        # the open buffers for prompt lookup (None: lookup off)
        self._buffers: BufferIndex | None = None
        if settings.speculation and settings.lookup:
            self._buffers = BufferIndex(
                ReindexPolicy(settings.reindex_max_chars, settings.reindex_interval_s)
            )
        self._builder: PromptBuilder | None = None
        self._encoder: DocumentEncoder | None = None
        # the last computed request's prompt and generated tokens (benchmarks and debugging)
        self.last_prompt: list[int] = []
        self.last_tokens: list[int] = []
        if models is not None:
            self._init_parts(models)

    # -- loading -------------------------------------------------------------------------------------

    def load(self, progress: Callable[[str, float], None] | None = None) -> None:
        if self._models is not None:
            if progress:
                progress("ready", 1.0)
            return
        say = progress or (lambda message, fraction: None)
        s = self.settings
        try:
            from specls.models.facts import model_facts
            from specls.models.loader import check_pair, load_model, resolve_model_dir
            from specls.models.runtime import RuntimeSettings, auto_threads
        except ImportError as exc:  # pragma: no cover - an incomplete install
            raise EngineError(f"the model runtime is not available: {exc}") from exc
        threads = s.threads if s.threads > 0 else auto_threads()
        logger.info("onnxruntime threads: %d%s", threads, "" if s.threads > 0 else " (auto)")
        runtime = RuntimeSettings(threads=threads, provider=s.provider)
        try:
            say("loading target model", 0.05)
            target_dir = resolve_model_dir(s.model, "target")
            target = load_model(target_dir, runtime)
            draft = None
            draft_dir = None
            # a draft must share the target's tokenizer: the bundled draft only drafts for the bundled target
            if s.speculation and s.draft_model and (s.draft is not None or s.model is None):
                say("loading draft model", 0.6)
                draft_dir = resolve_model_dir(s.draft, "draft")
                # its numbers move acceptance only, so it skips the target's exactness padding
                draft = load_model(draft_dir, replace(runtime, even_passes=False))
                check_pair(target, draft)
        except EngineError:
            raise
        except (OSError, ValueError, RuntimeError) as exc:
            raise EngineError(f"cannot load model: {exc}") from exc
        try:
            facts = model_facts(target)
        except ValueError as exc:
            raise EngineError(f"model {target_dir}: {exc}") from exc
        prompt = facts.prompt
        logger.info("prompt: FIM family %s, budget %s", prompt.family, prompt.budget)
        models = LoadedModels(
            target=target,
            tokenizer=target.tokenizer,
            fim=prompt.fim,
            eos_ids=prompt.eos_ids,
            draft=draft,
            provider=facts.provider,
            max_positions=facts.max_positions,
            budget=prompt.budget,
            start_ids=prompt.start_ids,
        )
        if s.speculation and (draft is not None or s.lookup):
            costs = self._pass_costs(
                target,
                draft,
                target_dir,
                draft_dir,
                {**dataclasses.asdict(runtime), "provider": models.provider},
                say,
            )
            # each learns from its own requests (lookup alone plans by the verify costs only)
            for policy in (models.policy, models.lookup_policy, models.draft_policy):
                policy.costs = costs
                policy.learner = PassCostLearner(costs, target.pass_granularity)
        self._init_parts(models)
        self._models = models
        say("ready", 1.0)

    def _pass_costs(
        self,
        target: CausalLM,
        draft: CausalLM | None,
        target_dir: Path,
        draft_dir: Path | None,
        runtime: dict[str, Any],
        say: Callable[[str, float], None],
    ) -> PassCosts:
        """The pair's pass costs: measured (``calibrate``), or read from the per-machine cache, whose
        key has the model files, ``runtime`` (the runtime settings and the provider) and the machine."""

        def measure() -> PassCosts:
            say("measuring pass costs", 0.9)
            return calibrate(target, draft, time.perf_counter)

        if not self.settings.costs_cache:
            return measure()
        key = costs_key(target_dir, draft_dir, runtime, machine_facts())
        return PassCostsCache(default_path()).get_or_measure(key, measure)

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
        if self._buffers is not None:
            self._buffers.update(doc_id, text)

    def close_document(self, doc_id: str) -> None:
        with self._lock:
            self._docs.pop(doc_id, None)  # frees its KV caches (a running request keeps its own ref)
        if self._buffers is not None:
            self._buffers.close(doc_id)

    def flush(self) -> None:
        """Index every pending document update now (``complete`` defers big re-indexing of a buffer
        that was indexed less than ``reindex_interval_s`` ago; the next request after the interval
        catches up, or a server may call this when idle)."""
        with self._prep_lock:
            self._flush_pending(force=True)

    def _flush_pending(self, force: bool = False) -> None:
        """Apply pending buffer texts to the prompt-lookup index (``BufferIndex.flush``)."""
        if self._buffers is not None and self._encoder is not None:
            self._buffers.flush(self._encoder.encode, force)

    def _doc(self, doc_id: str) -> _DocState:
        with self._lock:
            state = self._docs.get(doc_id)
            if state is None:
                state = _DocState()
                self._docs[doc_id] = state
            self._docs.move_to_end(doc_id)
            while len(self._docs) > max(1, self.settings.kv_documents):
                self._docs.popitem(last=False)
            return state

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
        """One completion: prompt, then the finished-completion cache, else a decode on the
        document's KV cache with its drafters; the document remembers what it produced."""
        provider = models.provider
        if request.max_tokens <= 0:
            return CompletionResult(text="", stop_reason="max_tokens", provider=provider)
        if cancelled():
            return CompletionResult(text="", stop_reason="cancelled", cancelled=True, provider=provider)
        state = self._doc(request.doc_id)
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

        cache = self._prefix_cache(models, state, prompt.tokens)
        kept = cache.length  # prompt tokens whose KV is reused
        drafter, reuse = self._drafter(models, state, request, prompt)
        settings = self._decode_settings(max_new, reuse, request.speculation_cap)
        if settings.draft_length <= 0:
            drafter, reuse = None, False
        early = EarlyStop(request.stop, request.early_stop) if request.early_stop is not None else None
        text_stop = early if early is not None else request.stop
        on_text = request.on_text
        stop = (
            TextStop(models.tokenizer, text_stop, on_text)
            if text_stop is not None or on_text is not None
            else None
        )
        out = self._decode(models, state, cache, prompt, drafter, settings, cancelled, stop)
        if state.planned_drafter is not None:
            state.planned_drafter.end()  # its length teaches the policy the usual completion length
            # batched: shared passes; no pass: the decode ended before its drafters began, so the draft
            # model's feeds on record are the previous request's, already learned
            if self.settings.learn_costs and self._batching is None and out.pass_ms:
                model = state.planned_drafter.model
                self._policy_state(models).learn(out.pass_ms, model.feed_ms if model is not None else ())

        raw = visible_text(models.tokenizer.decode(out.tokens)) if out.tokens else ""
        text = stop.text[: stop.cut] if stop is not None and stop.cut is not None else raw
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
            provider=provider,
        )

    @property
    def completions(self) -> CompletionCache:
        if self._completions is None:
            raise EngineError("the engine is not loaded")
        return self._completions

    def _prompt(self, request: CompletionRequest) -> Prompt:
        """The request's FIM prompt, after indexing the buffer updates that came in (serialised)."""
        assert self._builder is not None
        with self._prep_lock:
            self._flush_pending()
            return self._builder.build(request.prefix, request.suffix, request.context_docs, request.doc_id)

    def _replay(
        self,
        models: LoadedModels,
        state: _DocState,
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
        self, models: LoadedModels, state: _DocState, request: CompletionRequest
    ) -> CompletionResult | None:
        """The rest of the document's last finished completion when the cursor has since typed its
        beginning (same suffix), cut by this request's stop; None when that is not the case, leaves
        nothing to show, is over ``max_tokens``, or may be shorter than this request's answer (the last
        one was cut off by its token budget or another stop, and neither this request's stop nor its
        early stop cuts the rest). Zero model calls: the text is the greedy answer to the prompt that produced it
        (``EngineSettings.type_ahead``)."""
        last = state.last
        if not self.settings.type_ahead or self.settings.temperature > 0.0 or last is None:
            return None
        typed = last.typed(request.prefix, request.suffix) if last.stop_reason in FINISHED else None
        if not typed:  # None: not typing through it; 0: the same cursor (the completion cache's case)
            return None
        rest = last.text[typed:]
        partial = False
        try:
            cut = request.stop(rest) if request.stop is not None else None
            if cut is None and last.stop_reason != "eos" and request.early_stop is not None:
                cut = request.early_stop(rest)  # the early answer: the rest is left to a later request
                partial = cut is not None
        except Exception:  # a broken stop function: let the decode path (which guards it) answer
            logger.exception("stop function failed on a type-ahead text")
            return None
        if cut is None and last.stop_reason != "eos":
            return None  # the model would have gone on after `rest`
        text = rest if cut is None else rest[:cut]
        offsets = last.offsets()  # the tokens that made text: ending after `typed`, starting before its end
        ends = zip(offsets, offsets[1:], strict=False)
        n = sum(1 for a, b in ends if b > typed and a < typed + len(text))
        if not text.strip() or n > request.max_tokens:
            return None
        self._counters.type_ahead()
        reason = "eos" if cut is None else "stop"
        return CompletionResult(
            text=text,
            tokens=n,
            stop_reason=reason,
            type_ahead=True,
            partial=partial,
            provider=models.provider,
        )

    def _prefix_cache(self, models: LoadedModels, state: _DocState, prompt: list[int]) -> KVCache:
        """The document's target KV cache truncated to its longest common token prefix with ``prompt``
        (only the rest is prefilled), or a new one."""
        cache = state.cache
        reuse = self.settings.prefix_reuse
        if cache is None or not reuse:
            cache = models.target.new_cache()
            state.cache, state.tokens = cache, []
        keep = min(common_prefix_len(state.tokens, prompt) if reuse else 0, cache.length)
        cache.truncate(keep)
        state.tokens = state.tokens[:keep]
        return cache

    def _decode(
        self,
        models: LoadedModels,
        state: _DocState,
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

    def _decode_settings(self, max_new: int, reuse: bool, cap: int | None) -> DecodeSettings:
        """The loop offers ``draft_length`` tokens a pass (enough for a completion-reuse proposal when
        there is one): the drafting policy picks each pass's length within it."""
        s = self.settings
        draft_length = max(s.draft_length, s.reuse_max_draft) if reuse else s.draft_length
        if cap is not None:  # a scheduler under load bounds speculation (0 = off)
            draft_length = min(draft_length, max(0, cap))
        return DecodeSettings(
            max_new_tokens=max_new,
            draft_length=draft_length,
            temperature=s.temperature,
            seed=s.seed,
            deadline_s=s.deadline_s,
        )

    def _drafter(
        self, models: LoadedModels, state: _DocState, request: CompletionRequest, prompt: Prompt
    ) -> tuple[Drafter | None, bool]:
        """The drafter for this request (None = plain greedy) and whether completion reuse is on.
        Every drafting path is planned by the drafting policy, greedy or sampling (its proposals carry
        the draft model's distributions)."""
        s = self.settings
        if not s.speculation:
            return None, False
        # per document, so their own indexes/caches carry over between keystrokes
        lookup = None
        if self._buffers is not None:
            if state.lookup_drafter is None:
                state.lookup_drafter = PromptLookupDrafter(self._buffers.index, s.drafters)
            lookup = state.lookup_drafter
            lookup.set_suffix(prompt.suffix_tokens)
        model = None
        if s.draft_model and models.draft is not None:
            if state.draft_drafter is None:
                state.draft_drafter = DraftModelDrafter(models.draft, s.drafters)
            model = state.draft_drafter
        inner: Drafter | None = None
        if lookup is not None or model is not None:
            if state.planned_drafter is None:
                state.planned_drafter = PlannedDrafter(lookup, model, self._policy_state(models))
            state.planned_drafter.end()  # the previous request learns under its own class
            state.planned_drafter.stopped = request.stop is not None or request.early_stop is not None
            inner = state.planned_drafter
        reuse_drafter = self._reuse_drafter(models, state, request, prompt)
        drafter = inner
        if reuse_drafter is not None:
            drafter = ReuseFirstDrafter(reuse_drafter, inner, s.draft_length)
        if drafter is None:
            return None, False
        return TimedDrafter(drafter), reuse_drafter is not None

    def _reuse_drafter(
        self, models: LoadedModels, state: _DocState, request: CompletionRequest, prompt: Prompt
    ) -> CompletionReuseDrafter | None:
        last = state.last
        if not self.settings.completion_reuse or last is None:
            return None
        typed = last.typed(request.prefix, request.suffix)
        if typed is None:
            return None
        return CompletionReuseDrafter(len(prompt.tokens), last, typed, self.settings.reuse_max_draft)

    # -- stats -----------------------------------------------------------------------------------

    def stats(self) -> dict[str, object]:
        with self._lock:
            documents = len(self._docs)
            kv_tokens = sum(d.cache.length for d in self._docs.values() if d.cache is not None)
        models = self._models
        return {
            **self._counters.snapshot(),
            "documents": documents,
            "indexed_documents": len(self._buffers) if self._buffers is not None else 0,
            "kv_tokens": kv_tokens,
            "provider": None if models is None else models.provider,
            "ready": models is not None,
            "drafting_policy": None if models is None else self._policy_state(models).snapshot(),
            "batching": (
                self._batching.snapshot()
                if self._batching is not None
                else {"enabled": False, "max_batch": self.settings.batching.max_batch}
            ),
        }

    def _policy_state(self, models: LoadedModels) -> PolicyState:
        """The drafting policy this engine's requests plan with: the pair's, or lookup's or the draft
        model's alone (``_drafter`` uses the draft model exactly when this says so)."""
        if not (self.settings.draft_model and models.draft is not None):
            return models.lookup_policy
        return models.policy if self.settings.lookup else models.draft_policy

    def with_settings(self, settings: EngineSettings) -> OnnxEngine:
        """A new engine sharing this one's loaded models (documents, caches and stats are its own)."""
        return OnnxEngine(settings, self.models)


def result_to_dict(result: CompletionResult) -> dict[str, Any]:
    """A CompletionResult as plain JSON-able data."""
    return dict(result.to_dict())
