"""Presets (specls.models.presets): each names real hub specs with the settings its role needs."""

from __future__ import annotations

import pytest
from specls.models.hub import parse_spec
from specls.models.model_store import ConvertSettings
from specls.models.presets import DEFAULT_PRESET, PRESETS, PresetError, get_preset


def test_every_preset_names_hub_specs() -> None:
    for preset in PRESETS.values():
        choices = [preset.target] + ([preset.draft] if preset.draft else [])
        for choice in choices:
            hub = parse_spec(choice.spec)
            assert hub.revision is None and "/" in hub.repo, choice
        assert preset.target.settings.draft_head == "full", preset.name  # a target scores every token
        if preset.draft is not None:
            assert preset.draft.settings.draft_head == "ascii", preset.name
            assert preset.draft.settings.dtype == preset.target.settings.dtype, preset.name


def test_the_required_presets() -> None:
    cpu = get_preset(DEFAULT_PRESET)
    assert cpu.device == "cpu" and cpu.kind == "completion"
    assert (cpu.target.spec, cpu.draft and cpu.draft.spec) == (
        "Qwen/Qwen2.5-Coder-1.5B",
        "Qwen/Qwen2.5-Coder-0.5B",
    )
    assert cpu.target.settings == ConvertSettings()  # the export defaults: fp32, quantize auto
    small = get_preset("qwen2.5-coder-0.5b")
    assert small.draft is None and small.target.spec == "Qwen/Qwen2.5-Coder-0.5B"
    gpu = [p for p in PRESETS.values() if p.device == "cuda"]
    assert gpu and all(p.target.settings.dtype == "fp16" and p.draft is not None for p in gpu)
    assert [p.target.spec for p in PRESETS.values() if p.kind == "next-edit"] == [
        "sweepai/sweep-next-edit-1.5B"
    ]


def test_unknown_preset_names_the_known_ones() -> None:
    with pytest.raises(PresetError, match="no such preset.*qwen2.5-coder-1.5b"):
        get_preset("gpt-5")
