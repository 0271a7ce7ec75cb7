"""Loading the engine's models: the target (and draft) model from disk, the model's prompt facts, and
the drafting policy's pass costs (measured at load by ``calibrate``, or read from the per-machine
cache, ``specls.pass_costs_cache``)."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specls.api import EngineError
from specls.decoder.api import CausalLM
from specls.decoder.pass_cost_learner import PassCostLearner
from specls.decoder.planned import PolicyState, calibrate
from specls.decoder.policy import PassCosts
from specls.engine_settings import EngineSettings
from specls.pass_costs_cache import PassCostsCache, costs_key, default_path, machine_facts
from specls.prompt import FimTokens, PromptBudget, TextTokenizer

if TYPE_CHECKING:  # the runtime's modules load onnxruntime: imported when a load needs them
    from specls.models.runtime import OnnxCausalLM, RuntimeSettings

logger = logging.getLogger(__name__)

Progress = Callable[[str, float], None]  # (message, fraction done)


@dataclass
class LoadedModels:
    """What ``load_models`` produces; tests and the benchmark can build it from other parts."""

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
class _Opened:
    """The models as loaded from disk, with where they came from and how they run."""

    target: OnnxCausalLM
    target_dir: Path
    draft: OnnxCausalLM | None
    draft_dir: Path | None
    runtime: RuntimeSettings


def load_models(settings: EngineSettings, say: Progress) -> LoadedModels:
    """The settings' models, their prompt facts and, when something drafts, the policy's pass costs.
    Raises ``EngineError`` with what went wrong."""
    try:
        from specls.models.facts import model_facts
    except ImportError as exc:  # pragma: no cover - an incomplete install
        raise EngineError(f"the model runtime is not available: {exc}") from exc
    opened = _open(settings, say)
    try:
        facts = model_facts(opened.target)
    except ValueError as exc:
        raise EngineError(f"model {opened.target_dir}: {exc}") from exc
    prompt = facts.prompt
    logger.info("prompt: FIM family %s, budget %s", prompt.family, prompt.budget)
    models = LoadedModels(
        target=opened.target,
        tokenizer=opened.target.tokenizer,
        fim=prompt.fim,
        eos_ids=prompt.eos_ids,
        draft=opened.draft,
        provider=facts.provider,
        max_positions=facts.max_positions,
        budget=prompt.budget,
        start_ids=prompt.start_ids,
    )
    if settings.speculation and (opened.draft is not None or settings.lookup):
        runtime = {**dataclasses.asdict(opened.runtime), "provider": models.provider}
        costs = pass_costs(settings, opened, runtime, say)
        # each learns from its own requests (lookup alone plans by the verify costs only)
        for policy in (models.policy, models.lookup_policy, models.draft_policy):
            policy.costs = costs
            policy.learner = PassCostLearner(costs, opened.target.pass_granularity)
    return models


def _open(settings: EngineSettings, say: Progress) -> _Opened:
    """The target model and, when it drafts, the draft model, loaded with the settings' runtime."""
    try:
        from specls.models.loader import check_pair, load_model, resolve_model_dir
        from specls.models.runtime import RuntimeSettings, auto_threads
    except ImportError as exc:  # pragma: no cover - an incomplete install
        raise EngineError(f"the model runtime is not available: {exc}") from exc
    s = settings
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
    return _Opened(target, target_dir, draft, draft_dir, runtime)


def pass_costs(
    settings: EngineSettings, opened: _Opened, runtime: dict[str, Any], say: Progress
) -> PassCosts:
    """The pair's pass costs: measured (``calibrate``), or read from the per-machine cache, whose key
    has the model files, ``runtime`` (the runtime settings and the provider) and the machine."""

    def measure() -> PassCosts:
        say("measuring pass costs", 0.9)
        return calibrate(opened.target, opened.draft, time.perf_counter)

    if not settings.costs_cache:
        return measure()
    key = costs_key(opened.target_dir, opened.draft_dir, runtime, machine_facts())
    return PassCostsCache(default_path()).get_or_measure(key, measure)
