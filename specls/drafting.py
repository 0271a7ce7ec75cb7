"""Drafter assembly: what a request drafts with, and what the drafting policy learns from it.

Every drafting path (prompt lookup alone, the draft model alone, both) is planned by the drafting
policy (``specls.decoder.planned.PlannedDrafter``), which picks each pass's length up to
``EngineSettings.draft_length``, greedy or sampling (its proposals carry the draft model's
distributions for rejection sampling). In front of it, the document's previous completion when the
user typed its beginning (``decoder.reuse``: typing through a suggestion costs about one target pass).
Each drafter arrangement learns in a ``PolicyState`` of its own (``policy_state``).
"""

from __future__ import annotations

from specls.api import CompletionRequest
from specls.decoder.api import DecodeResult, DecodeSettings, Drafter
from specls.decoder.buffer_index import BufferIndex
from specls.decoder.drafters import DraftModelDrafter, PromptLookupDrafter
from specls.decoder.head_drafter import HeadDrafter
from specls.decoder.planned import PlannedDrafter, PolicyState
from specls.decoder.reuse import CompletionReuseDrafter, ReuseFirstDrafter
from specls.decoder.timed import TimedDrafter
from specls.documents_state import DocState
from specls.engine_settings import EngineSettings
from specls.loading import LoadedModels
from specls.prompt import Prompt


def policy_state(settings: EngineSettings, models: LoadedModels) -> PolicyState:
    """The drafting policy these settings' requests plan with: the pair's, or lookup's or the draft
    model's alone (``request_drafter`` uses the draft model exactly when this says so)."""
    if not (settings.draft_model and models.draft is not None):
        return models.lookup_policy
    return models.policy if settings.lookup else models.draft_policy


def decode_settings(settings: EngineSettings, max_new: int, reuse: bool, cap: int | None) -> DecodeSettings:
    """The loop offers ``draft_length`` tokens a pass (enough for a completion-reuse proposal when
    there is one): the drafting policy picks each pass's length within it."""
    draft_length = max(settings.draft_length, settings.reuse_max_draft) if reuse else settings.draft_length
    if cap is not None:  # a scheduler under load bounds speculation (0 = off)
        draft_length = min(draft_length, max(0, cap))
    return DecodeSettings(
        max_new_tokens=max_new,
        draft_length=draft_length,
        temperature=settings.temperature,
        seed=settings.seed,
        deadline_s=settings.deadline_s,
    )


def request_drafter(
    settings: EngineSettings,
    models: LoadedModels,
    state: DocState,
    buffers: BufferIndex | None,
    request: CompletionRequest,
    prompt: Prompt,
) -> tuple[Drafter | None, bool]:
    """The drafter for this request (None = plain greedy) and whether completion reuse is on. The
    drafters live in the document's state, so their indexes and caches carry over between keystrokes."""
    s = settings
    if not s.speculation:
        return None, False
    lookup = None
    if buffers is not None:
        static = state.static
        if static is not None:
            static.start(models.tokenizer)  # once: opens the datastore, starts the workspace's index
        if state.lookup_drafter is None:
            sources = static.sources if static is not None else None
            state.lookup_drafter = PromptLookupDrafter(buffers.index, s.drafters, static=sources)
        lookup = state.lookup_drafter
        lookup.set_suffix(prompt.suffix_tokens)
    model = None
    if s.draft_model and models.draft is not None:
        if state.draft_drafter is None:
            state.draft_drafter = DraftModelDrafter(models.draft, s.drafters)
        model = state.draft_drafter
    head = _head_drafter(s, models, state)
    inner: Drafter | None = None
    if lookup is not None or model is not None or head is not None:
        if state.planned_drafter is None:
            state.planned_drafter = PlannedDrafter(lookup, model, policy_state(s, models), feature_head=head)
        state.planned_drafter.end()  # the previous request learns under its own class
        state.planned_drafter.stopped = request.stop is not None or request.early_stop is not None
        inner = state.planned_drafter
    reuse = _reuse_drafter(s, state, request, prompt)
    drafter = inner if reuse is None else ReuseFirstDrafter(reuse, inner, s.draft_length)
    if drafter is None:
        return None, False
    return TimedDrafter(drafter), reuse is not None


def _head_drafter(settings: EngineSettings, models: LoadedModels, state: DocState) -> HeadDrafter | None:
    """The document's feature-head drafter, reading this request's target cache (None: no head, or
    ``feature_head`` off for this engine)."""
    parts = models.head
    if parts is None or not settings.feature_head:
        return None
    if state.head_drafter is None:
        state.head_drafter = HeadDrafter(parts.guess, parts.heads, parts.cost)
    state.head_drafter.bind(parts.features(state.cache) if state.cache is not None else None)
    return state.head_drafter


def _reuse_drafter(
    settings: EngineSettings, state: DocState, request: CompletionRequest, prompt: Prompt
) -> CompletionReuseDrafter | None:
    last = state.last
    if not settings.completion_reuse or last is None:
        return None
    typed = last.typed(request.prefix, request.suffix)
    if typed is None:
        return None
    return CompletionReuseDrafter(len(prompt.tokens), last, typed, settings.reuse_max_draft)


def learn_from(
    settings: EngineSettings, models: LoadedModels, state: DocState, out: DecodeResult, batched: bool
) -> None:
    """After a decode: its length teaches the policy the usual completion length, and its passes the
    pass costs (``learn_costs``). Not from batched passes (shared with other requests), nor from a
    decode that ended before its first pass (the draft model's feeds on record are then the previous
    request's, already learned)."""
    planned = state.planned_drafter
    if planned is None:
        return
    planned.end()
    if settings.learn_costs and not batched and out.pass_ms:
        feeds = planned.model.feed_ms if planned.model is not None else ()
        policy_state(settings, models).learn(out.pass_ms, feeds)
