"""The engine's next-edit path (docs/next-edit.md): a request -> the region around the cursor -> the
prompt in the model's layout (``request_prompt.build_job``) -> a greedy decode whose draft is the
region itself (``RegionDrafter``), with prompt lookup and the draft model, all planned pass by pass by
the drafting policy (``PlannedDrafter``, which prices the region's tokens by their own acceptance) ->
the rewritten region (``layout.parse``) -> minimal edits, an undo of the user's last edit left out.

Nothing is suggested for a rewrite equal to the region, an output that copies the region and writes
on past it or holds too many lines (``rewrite_end``), a malformed output (no end marker: cut by the
budget, a deadline or a cancel) or edits that only undo. The output is plain greedy decoding of the
prompt whatever drafts: the core invariant tests hold this path to it.

Each document keeps its edit prompt's KV (apart from its completions' KV, which a prompt of another
shape would evict) for the ``kv_documents`` documents asked most recently, and the file view its
last prompt showed (``request_prompt.FileView``), so successive requests share the prompt up to the
region and re-prefill from their first changed token only.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass, replace
from functools import partial

from specls.api import EngineError, NextEditRequest, NextEditResult, no_next_edit
from specls.decoder.api import CancelCheck, DecodeResult, DecodeSettings, Drafter, KVCache, unless_stopped
from specls.decoder.buffer_index import BufferIndex
from specls.decoder.drafters import DraftModelDrafter, PromptLookupDrafter
from specls.decoder.loop import generate
from specls.decoder.pass_cost_learner import PassCostLearner
from specls.decoder.planned import PlannedDrafter, PolicyState
from specls.decoder.region_drafter import RegionDrafter
from specls.decoder.text import TextStop
from specls.documents_state import DocState, DocumentStates, prefix_cache
from specls.drafting import policy_state
from specls.engine_settings import EngineSettings
from specls.loading import LoadedModels
from specls.next_edit.confidence import EditConfidence, changed_positions, confidence_of
from specls.next_edit.edits import suggested_edits
from specls.next_edit.layouts import EditLayout, get_layout, layout_for_model
from specls.next_edit.request_prompt import EditJob, FileView, build_job
from specls.next_edit.rewrite_end import RewriteEnd
from specls.next_edit.settings import NextEditSettings

log = logging.getLogger(__name__)


def model_layout(models: LoadedModels) -> str:
    """The loaded target's next-edit layout: its ``specls.json`` ``next_edit_layout``, else the one
    ``layout_for_model`` gives its source (a model without a spec: the FIM layout)."""
    from specls.models.runtime import OnnxCausalLM  # loaded already when the target is one

    target = models.target
    if isinstance(target, OnnxCausalLM):
        spec = target.spec
        return spec.next_edit_layout or layout_for_model(spec.source or str(target.model_dir))
    return layout_for_model("")


def end_marker_ids(layout: EditLayout, models: LoadedModels) -> frozenset[int]:
    """The layout's end markers that are one token of the model's vocabulary (an eos for the decode)."""
    ids = (models.tokenizer.token_to_id(m) for m in layout.end_markers)
    return frozenset(i for i in ids if i is not None)


RECENT_KEPT = 64  # requests whose prompt and prefill the stats list
VIEWS_KEPT = 16  # documents whose file view is kept


@dataclass
class EditCounters:
    requests: int = 0
    shown: int = 0
    tokens: int = 0
    target_passes: int = 0
    prefix_reused_tokens: int = 0
    prefill_tokens: int = 0


class EditPath:
    """The next-edit path of one loaded engine (module docstring). ``run`` is called one at a time."""

    def __init__(self, settings: EngineSettings, edit: NextEditSettings, models: LoadedModels) -> None:
        self.settings = settings
        self.edit = edit
        self.models = models
        # the documents' edit KV and drafters; lookup's buffer index is the engine's (``run`` gets it)
        self._docs = DocumentStates(replace(settings, lookup=False, kv_documents=edit.kv_documents))
        # what the policy learns on edits (their lengths and the region's acceptance) stays apart
        # from completions', from the same measured pass costs; its table reaches the longest draft,
        # so long region passes are priced by what such passes measure (the learner), not by the
        # calibration's slope carried past its last point
        base = policy_state(settings, models).costs
        n = max(len(base.verify), edit.draft_length + 1)
        costs = replace(base, verify=tuple(base.verify_cost(g) for g in range(n)))
        self.policy = PolicyState(costs=costs, learner=PassCostLearner(costs, models.target.pass_granularity))
        self.counters = EditCounters()
        self._lock = threading.Lock()
        self.last_prompt: list[int] = []
        self.last_tokens: list[int] = []
        self.last_confidence: EditConfidence | None = None  # of the last request's edits
        # each recent request's prompt size, what its KV reused and what it cost (the stats' view of
        # how well the prompt's stable part is kept between requests)
        self.recent: deque[dict[str, object]] = deque(maxlen=RECENT_KEPT)
        # each document's file view (request_prompt.FileView), the most recently asked last
        self._views: dict[str, FileView] = {}

    def layout(self, request: NextEditRequest) -> EditLayout:
        name = request.layout or self.edit.layout or model_layout(self.models)
        try:
            return get_layout(name)
        except ValueError as exc:
            raise EngineError(str(exc)) from None

    def close_document(self, doc_id: str) -> None:
        self._docs.close(doc_id)
        self._views.pop(doc_id, None)

    def run(
        self, request: NextEditRequest, buffers: BufferIndex | None, cancelled: CancelCheck
    ) -> NextEditResult:
        provider = self.models.provider
        if cancelled():
            return no_next_edit(request, "cancelled", provider)
        layout = self.layout(request)
        view = self._views.pop(request.doc_id, None)
        job = build_job(request, layout, self.models.tokenizer, self.edit, self.models.max_positions, view)
        if job is None:
            return no_next_edit(request, "no_room", provider)
        if job.view is not None:
            self._views[request.doc_id] = job.view
            while len(self._views) > VIEWS_KEPT:
                del self._views[next(iter(self._views))]
        state = self._docs.get(request.doc_id)
        cache = prefix_cache(self.models.target, state, job.prompt, self.settings.prefix_reuse)
        kept = cache.length
        planned = self._drafter(state, buffers, job)
        ends = RewriteEnd.of(layout, job.region_text, job.after, self.edit.max_added_lines)
        stop = TextStop(self.models.tokenizer, ends.stop)
        eos = self.models.eos_ids | end_marker_ids(layout, self.models)
        out = self._decode(state, cache, job, planned, eos, cancelled, stop)
        if planned is not None:
            planned.end()
            if self.settings.learn_costs and out.pass_ms:
                feeds = planned.model.feed_ms if planned.model is not None else ()
                self.policy.learn(out.pass_ms, feeds)
        reused = min(kept, len(job.prompt) - 1) if out.prefill_tokens or out.target_passes else 0
        result = self._result(request, job, out, ends, stop.text, reused)
        self.last_confidence = self._confidence(state, cache, job, out, cancelled) if result.edits else None
        if self.last_confidence is not None:
            result = replace(result, confidence=self.last_confidence.min_margin)
        if self._unsure(self.last_confidence):
            result = replace(result, edits=(), dropped="unsure")
        self._count(result, len(job.prompt))
        return result

    def _drafter(self, state: DocState, buffers: BufferIndex | None, job: EditJob) -> PlannedDrafter | None:
        """The region, lookup and the draft model under the policy (None: plain greedy)."""
        s, models = self.settings, self.models
        if not s.speculation or self.edit.draft_length <= 0:
            return None
        lookup = None
        if s.lookup:
            if state.lookup_drafter is None:
                state.lookup_drafter = PromptLookupDrafter(buffers.index if buffers else None, s.drafters)
            lookup = state.lookup_drafter
        model = None
        if s.draft_model and models.draft is not None:
            if state.draft_drafter is None:
                state.draft_drafter = DraftModelDrafter(models.draft, s.drafters)
            model = state.draft_drafter
        region = (
            RegionDrafter(job.unchanged, len(job.prompt), self.edit.min_match) if self.edit.region else None
        )
        if lookup is None and model is None and region is None:
            return None
        return PlannedDrafter(lookup, model, self.policy, region)

    def _decode(
        self,
        state: DocState,
        cache: KVCache,
        job: EditJob,
        drafter: Drafter | None,
        eos: frozenset[int],
        cancelled: CancelCheck,
        stop: TextStop,
    ) -> DecodeResult:
        """Greedy, on the document's edit KV; a failed decode drops that KV."""
        settings = DecodeSettings(
            max_new_tokens=job.max_new,
            draft_length=self.edit.draft_length if drafter is not None else 0,
            temperature=0.0,  # a suggestion is the greedy rewrite: exact, and what drafts pay for
            deadline_s=self.settings.deadline_s,
        )
        try:
            out = generate(cache, job.prompt, drafter, settings, eos, cancelled, stop)
        except Exception as exc:
            state.cache, state.tokens = None, []
            if isinstance(exc, EngineError):
                raise
            raise EngineError(f"next-edit generation failed: {exc}") from exc
        length = cache.length
        state.tokens = [*job.prompt, *out.tokens][:length]
        self.last_prompt, self.last_tokens = list(job.prompt), list(out.tokens)
        return out

    def _result(
        self,
        request: NextEditRequest,
        job: EditJob,
        out: DecodeResult,
        ends: RewriteEnd,
        text: str,
        reused: int,
    ) -> NextEditResult:
        """The decode's output read back: parsed, diffed against the region, undos left out."""
        base = NextEditResult(
            (),
            job.region,
            None,
            tokens=len(out.tokens),
            stop_reason=out.stop_reason,
            cancelled=out.stop_reason == "cancelled",
            decode=out,
            layout=job.layout.name,
            prefix_reused_tokens=reused,
            provider=self.models.provider,
        )
        if out.stop_reason in ("cancelled", "deadline"):
            return replace(base, dropped=out.stop_reason)
        rewritten, why = ends.read(text, eos=out.stop_reason == "eos")
        if rewritten is None:
            return replace(base, dropped=why)
        edits, dropped, undone = suggested_edits(
            request.text, job.region, job.region_text, rewritten, job.last_edit
        )
        return replace(base, edits=tuple(edits), rewritten=rewritten, dropped=dropped, undone=undone)

    def _confidence(
        self, state: DocState, cache: KVCache, job: EditJob, out: DecodeResult, cancelled: CancelCheck
    ) -> EditConfidence | None:
        """The target's confidence on the output's changed tokens: one pass from the first of them
        to the last on the document's edit KV (which then holds the output that far)."""
        at = changed_positions(out.tokens, job.unchanged)
        if not self.edit.confidence or not at:
            return None
        base, full = len(job.prompt), [*job.prompt, *out.tokens]
        start = max(0, min(cache.length, base + at[0] - 1))
        try:
            cache.truncate(start)
            logits = unless_stopped(partial(cache.forward, full[start : base + at[-1]]), cancelled)
            if logits is None:  # cancelled while its pass was stopped: the KV as before it
                state.tokens = full[: cache.length]
                return None
        except Exception as exc:  # a failed pass leaves no KV to trust, and no confidence
            log.warning("next edit: confidence pass failed: %s", exc)
            state.cache, state.tokens = None, []
            return None
        state.tokens = full[: cache.length]
        rows = [base + p - start - 1 for p in at]
        return confidence_of(logits[rows], [out.tokens[p] for p in at])

    def _unsure(self, c: EditConfidence | None) -> bool:
        """Whether the show rule holds an edit back: its least sure changed token below the bar."""
        bar = self.edit.min_margin
        return bar is not None and c is not None and c.min_margin < bar

    def _count(self, r: NextEditResult, prompt_tokens: int) -> None:
        record = {
            "prompt_tokens": prompt_tokens,
            "reused_tokens": r.prefix_reused_tokens,
            "prefill_tokens": r.prefill_tokens,
            "prefill_ms": round(r.prefill_ms, 1),
            "decode_ms": round(r.decode_ms, 1),
            "tokens": r.tokens,
            "target_passes": r.target_passes,
            "dropped": r.dropped,
        }
        log.info("next edit: %s", record)
        with self._lock:
            self.recent.append(record)
            c = self.counters
            c.requests += 1
            c.shown += int(bool(r.edits))
            c.tokens += r.tokens
            c.target_passes += r.target_passes
            c.prefix_reused_tokens += r.prefix_reused_tokens
            c.prefill_tokens += r.prefill_tokens

    def snapshot(self) -> dict[str, object]:
        with self._lock:
            c = self.counters
            counts = {k: getattr(c, k) for k in c.__dataclass_fields__}
            recent = list(self.recent)
        return {
            **counts,
            "documents": len(self._docs),
            "recent_requests": recent,
            "drafting_policy": self.policy.snapshot(),
        }
