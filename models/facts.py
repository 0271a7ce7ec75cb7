"""What the engine needs to know about a loaded target model, resolved once at load: its prompt layout
(``specls.models.fim.prompt_facts``: FIM token ids, stop ids, budgets, start tokens), its context limit
and where it runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from specls.models.fim import PromptFacts, prompt_facts

if TYPE_CHECKING:  # the runtime pulls in onnxruntime; these facts do not need it
    from specls.models.runtime import OnnxCausalLM

DEFAULT_MAX_POSITIONS = 1024  # a spec without max_context (0): what the bundled pair was trained on


@dataclass(frozen=True)
class ModelFacts:
    prompt: PromptFacts
    max_positions: int
    provider: str  # "cpu" | "cuda"


def model_facts(target: OnnxCausalLM) -> ModelFacts:
    """The facts of a loaded target, from its spec and tokenizer (ValueError naming a FIM token its
    tokenizer lacks)."""
    spec = target.spec
    return ModelFacts(
        prompt=prompt_facts(spec.fim, spec.eos_token_ids, spec.max_context, target.tokenizer),
        max_positions=spec.max_context or DEFAULT_MAX_POSITIONS,
        provider=target.provider,
    )
