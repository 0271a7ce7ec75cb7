"""``EngineSettings``: how the in-process engine (``specls.engine``) loads and decodes."""

from __future__ import annotations

from dataclasses import dataclass, field

from specls.decoder.batching import BatchSettings
from specls.decoder.drafters import DrafterSettings
from specls.prompt import PromptBudget


@dataclass(frozen=True)
class EngineSettings:
    """How the in-process engine loads and decodes. Field names are the CLI's and the LSP settings'
    (``--model``/``model``, ``--no-draft``/``draft_model``, ``--no-speculation``/``speculation``;
    ``specls.model_options`` makes them from the command line)."""

    # the target: a model directory, a hub id or a .gguf file (specls.models.hub, resolved at load);
    # None = the bundled target
    model: str | None = None
    # a named target + draft pair with its conversion settings (specls.models.presets); instead of
    # model and draft
    preset: str | None = None
    # the draft, as model; None = the bundled draft with the bundled target, none with another target
    draft: str | None = None
    draft_model: bool = True  # draft with the draft model
    lookup: bool = True  # draft by prompt lookup (the open buffers, the prompt, the suffix)
    # prompt lookup also drafts from the workspace's files that are not open (the git root above the
    # first opened file; indexed in the background within a size bound, specls.workspace_index): code
    # new to the open buffers is often elsewhere in the project. Off by default: it reads the project
    workspace: bool = False
    # and then from a code datastore (specls.datastore_cache): a corpus built by `specls datastore
    # build` for the model's tokenizer (stdlib, site-packages, a folder) or a datastore folder (several:
    # comma-separated, consulted in that order); None = none.
    # For code with nothing to copy from the project: its idioms are in other code
    datastore: str | None = None
    # draft with the target's feature head when its directory has one (`specls head train`): guesses
    # from the target's own hidden state at a few percent of a pass, for code with nothing to copy
    feature_head: bool = True
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
