"""Named models: a target and (optionally) a draft, each a hub id with its conversion settings.

``--preset NAME`` (and ``specls models pull --preset NAME``) resolve both through
``specls.models.hub.resolve_model``; the first use downloads and converts, later ones load from the
cache. The draft is converted with ``draft_head="ascii"`` (``specls export --draft-head ascii``): its
LM head scores only ASCII and added tokens, and the target still checks every token.

>>> get_preset("qwen2.5-coder-1.5b").draft.spec
'Qwen/Qwen2.5-Coder-0.5B'
>>> get_preset("qwen2.5-coder-1.5b").draft.settings.draft_head
'ascii'
>>> DEFAULT_PRESET in PRESETS
True
"""

from __future__ import annotations

from dataclasses import dataclass

from specls.models.model_store import ConvertSettings

from specls.api import EngineError

DRAFT = ConvertSettings(draft_head="ascii")
# fp16 is the CUDA graph; "auto" leaves fp16 graphs unquantized (see specls export --quantize)
GPU = ConvertSettings(dtype="fp16")
GPU_DRAFT = ConvertSettings(dtype="fp16", draft_head="ascii")


class PresetError(EngineError):
    """An unknown preset name."""


@dataclass(frozen=True)
class ModelChoice:
    """One model of a preset: what ``resolve_model`` takes, and how to convert it."""

    spec: str
    settings: ConvertSettings = ConvertSettings()


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    target: ModelChoice
    draft: ModelChoice | None = None  # None: the target alone (prompt-lookup drafting only)
    device: str = "cpu"  # "cpu" | "cuda": the execution provider its graphs are built for
    # "completion": fill-in-the-middle completion; "next-edit": a next-edit model (its prompt format is
    # not served yet: listed so it can be pulled and converted)
    kind: str = "completion"


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "qwen2.5-coder-1.5b",
            "the CPU recommendation: Qwen2.5-Coder 1.5B (int8) checked by greedy verification, "
            "0.5B (int8, ASCII head) drafting",
            ModelChoice("Qwen/Qwen2.5-Coder-1.5B"),
            ModelChoice("Qwen/Qwen2.5-Coder-0.5B", DRAFT),
        ),
        Preset(
            "qwen2.5-coder-0.5b",
            "small machines: Qwen2.5-Coder 0.5B (int8) alone, prompt-lookup drafting",
            ModelChoice("Qwen/Qwen2.5-Coder-0.5B"),
        ),
        Preset(
            "qwen2.5-coder-7b-gpu",
            "a CUDA GPU: Qwen2.5-Coder 7B (fp16) with the 0.5B (fp16, ASCII head) drafting",
            ModelChoice("Qwen/Qwen2.5-Coder-7B", GPU),
            ModelChoice("Qwen/Qwen2.5-Coder-0.5B", GPU_DRAFT),
            device="cuda",
        ),
        Preset(
            "sweep-next-edit-1.5b",
            "next-edit prediction: sweepai's Sweep Next-Edit 1.5B (a Qwen2.5-Coder fine-tune; its "
            "prompt format is not served yet)",
            ModelChoice("sweepai/sweep-next-edit-1.5B"),
            kind="next-edit",
        ),
    )
}
DEFAULT_PRESET = "qwen2.5-coder-1.5b"


def get_preset(name: str) -> Preset:
    """The preset called ``name``. Raises PresetError naming the known ones."""
    try:
        return PRESETS[name]
    except KeyError:
        raise PresetError(f"{name}: no such preset (known: {', '.join(PRESETS)})") from None


__all__ = ["DEFAULT_PRESET", "PRESETS", "ModelChoice", "Preset", "PresetError", "get_preset"]
