"""Loading the engine's models: preparing a model given by name (a hub id, a preset or a .gguf file:
downloaded and converted once into the model cache, ``specls.models.hub``), the target (and draft)
model from disk, the model's prompt facts, and the drafting policy's pass costs (measured at load by
``calibrate``, or read from the per-machine cache, ``specls.pass_costs_cache``).

Progress goes to the load's one callback, ``say(message, fraction)``: while a model is prepared the
message is the stage's status line ("downloading 43%", "converting: quantizing";
``specls.models.progress.status_text``), which the LSP server forwards to the editor as ``$/progress``
and the team service shows on ``/healthz``."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specls.api import EngineError
from specls.decoder.api import CausalLM, KVCache
from specls.decoder.head_drafter import Features, Guess
from specls.decoder.pass_cost_learner import PassCostLearner
from specls.decoder.planned import PolicyState, calibrate
from specls.decoder.policy import PassCosts
from specls.engine_settings import EngineSettings
from specls.pass_costs_cache import PassCostsCache, costs_key, default_path, machine_facts
from specls.prompt import FimTokens, PromptBudget, TextTokenizer

if TYPE_CHECKING:  # the runtime's modules load onnxruntime: imported when a load needs them
    from specls.models.model_store import ConvertSettings
    from specls.models.progress import Progress as StageProgress
    from specls.models.runtime import OnnxCausalLM, RuntimeSettings

logger = logging.getLogger(__name__)

Progress = Callable[[str, float], None]  # (message, fraction done)

# the share of the load's progress that preparing models by name takes (downloads and conversions take
# minutes, opening the files seconds)
PREPARE_SHARE = 0.5
# within one model's preparation: the download's share (the conversion the rest)
_DOWNLOAD_SHARE = 0.4


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
    # the target's feature head (``specls.models.feature_head``): its guesses from a hidden state, how
    # many it makes, and where a target cache's hidden states are read; None: none (or turned off)
    head: FeatureHeadParts | None = None

    def interrupt(self) -> None:
        """Stop the target's verify pass in flight (``OnnxCausalLM.interrupt``); a target that cannot
        stop a pass midway lets it finish."""
        from specls.models.runtime import OnnxCausalLM

        if isinstance(self.target, OnnxCausalLM):
            self.target.interrupt()


@dataclass(frozen=True)
class FeatureHeadParts:
    """A loaded feature head as the drafters see it: token ids and hidden states only."""

    guess: Guess
    heads: int
    features: Callable[[KVCache], Features | None]
    info: dict[str, Any] = field(default_factory=dict)
    cost: float = 0.0  # a guess relative to a one-token target pass, measured at load


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
        head=_feature_head(settings, opened),
    )
    if settings.speculation and (opened.draft is not None or settings.lookup or models.head is not None):
        runtime = {**dataclasses.asdict(opened.runtime), "provider": models.provider}
        costs = pass_costs(settings, opened, runtime, say)
        # each learns from its own requests (lookup alone plans by the verify costs only)
        for policy in (models.policy, models.lookup_policy, models.draft_policy):
            policy.costs = costs
            policy.learner = PassCostLearner(costs, opened.target.pass_granularity)
    return models


@dataclass(frozen=True)
class ModelSource:
    """One model the settings name: ``spec`` for ``resolve_model`` (None: the bundled one) and how to
    convert it when it is given by name."""

    role: str  # "target" | "draft"
    spec: str | None
    convert: ConvertSettings


def model_sources(settings: EngineSettings) -> tuple[ModelSource, ModelSource | None]:
    """The target and the draft (None: no draft model) the settings name, a preset's included. Raises
    EngineError for a preset together with a model or draft."""
    from specls.models.model_store import ConvertSettings
    from specls.models.presets import get_preset

    s = settings
    wants_draft = s.speculation and s.draft_model
    if s.preset is not None:
        if s.model is not None or s.draft is not None:
            raise EngineError(
                f"preset {s.preset}: names its target and draft; give a preset or a model, not both"
            )
        preset = get_preset(s.preset)
        target = ModelSource("target", preset.target.spec, preset.target.settings)
        pd = preset.draft
        return target, ModelSource("draft", pd.spec, pd.settings) if pd is not None and wants_draft else None
    target = ModelSource("target", s.model, ConvertSettings())
    # a draft must share the target's tokenizer: the bundled draft only drafts for the bundled target;
    # a draft by name gets the draft's reduced LM head (as `specls export --draft-head ascii`)
    if wants_draft and (s.draft is not None or s.model is None):
        return target, ModelSource("draft", s.draft, ConvertSettings(draft_head="ascii"))
    return target, None


def _named(source: ModelSource | None) -> bool:
    """Whether ``source`` is given by name (may need downloading or converting), not as a directory."""
    return source is not None and source.spec is not None and not Path(source.spec).expanduser().is_dir()


def prepare_models(settings: EngineSettings, say: Progress) -> tuple[Path, Path | None]:
    """The directories of the target and the draft (None: no draft model), models given by name
    downloaded and converted into the model cache first (in a child process), with their progress
    in the first ``PREPARE_SHARE`` of the load's. Raises EngineError."""
    from specls.models.hub import resolve_model
    from specls.models.loader import resolve_model_dir

    sources = [src for src in model_sources(settings) if src is not None]
    named = [src for src in sources if _named(src)]
    dirs: dict[str, Path] = {}
    for src in sources:
        if src not in named:
            dirs[src.role] = resolve_model_dir(src.spec, src.role)
            continue
        i = named.index(src)
        lo, hi = PREPARE_SHARE * i / len(named), PREPARE_SHARE * (i + 1) / len(named)
        assert src.spec is not None
        dirs[src.role] = resolve_model(
            src.spec, settings=src.convert, progress=_preparing(say, lo, hi), isolated=True
        )
    return dirs["target"], dirs.get("draft")


def _preparing(say: Progress, lo: float, hi: float) -> StageProgress:
    """A ``specls.models.progress.Progress`` reporting to ``say`` within [lo, hi] of the load."""
    from specls.models.progress import status_text

    def report(stage: str, fraction: float, message: str = "") -> None:
        done = {"resolving": 0.0, "downloading": _DOWNLOAD_SHARE * fraction, "ready": 1.0}.get(
            stage, _DOWNLOAD_SHARE + (1 - _DOWNLOAD_SHARE) * fraction
        )
        say(status_text(stage, fraction, message), lo + (hi - lo) * max(0.0, min(1.0, done)))

    return report


def _open(settings: EngineSettings, say: Progress) -> _Opened:
    """The target model and, when it drafts, the draft model, loaded with the settings' runtime."""
    try:
        from specls.models.loader import check_pair, load_model
        from specls.models.runtime import RuntimeSettings, auto_threads
    except ImportError as exc:  # pragma: no cover - an incomplete install
        raise EngineError(f"the model runtime is not available: {exc}") from exc
    s = settings
    threads = s.threads if s.threads > 0 else auto_threads()
    logger.info("onnxruntime threads: %d%s", threads, "" if s.threads > 0 else " (auto)")
    runtime = RuntimeSettings(threads=threads, provider=s.provider)
    named = any(_named(src) for src in model_sources(s))
    base = PREPARE_SHARE if named else 0.0

    def loading(message: str, fraction: float) -> None:
        say(message, base + (1 - base) * fraction)

    try:
        target_dir, draft_dir = prepare_models(s, say)
        loading("loading target model", 0.05)
        target = load_model(target_dir, runtime)
        draft = None
        if draft_dir is not None:
            loading("loading draft model", 0.6)
            # its numbers move acceptance only, so it skips the target's exactness padding
            draft = load_model(draft_dir, replace(runtime, even_passes=False))
            check_pair(target, draft)
    except EngineError:
        raise
    except (OSError, ValueError, RuntimeError) as exc:
        raise EngineError(f"cannot load model: {exc}") from exc
    return _Opened(target, target_dir, draft, draft_dir, runtime)


def _feature_head(settings: EngineSettings, opened: _Opened) -> FeatureHeadParts | None:
    """The target's feature head when the settings draft with it and its graph gives hidden states."""
    if not (settings.speculation and settings.feature_head) or opened.target.spec.hidden_name is None:
        return None
    from specls.models.feature_head import describe, guess_cost, load_feature_head
    from specls.models.runtime import OrtKVCache

    head = load_feature_head(
        opened.target_dir, opened.target.spec.hidden_size, opened.target.settings.threads
    )
    if head is None:
        return None

    def features(cache: KVCache) -> Features | None:
        return cache.hidden_at if isinstance(cache, OrtKVCache) else None

    measured = guess_cost(opened.target, head.guess)
    info = {**describe(head), **measured}
    logger.info("feature head: %s", info)
    return FeatureHeadParts(head.guess, head.heads, features, info, measured["guess_per_pass"])


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
