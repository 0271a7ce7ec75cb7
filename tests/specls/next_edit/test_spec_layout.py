"""specls.json's ``next_edit_layout``: read and written with the spec, an unknown name an error naming
the known ones, an older export without it read as None (the engine then picks by the source's name)."""

from __future__ import annotations

from pathlib import Path

import pytest
from specls.models.loader import bundled_dir
from specls.models.spec import ModelLoadError, load_spec, spec_from_dict

from specls.engine import EngineSettings, OnnxEngine
from specls.next_edit.engine_path import model_layout


def bundled_dict() -> dict[str, object]:
    return load_spec(bundled_dir("target")).to_dict()


def test_the_key_round_trips() -> None:
    d = {**bundled_dict(), "next_edit_layout": "sweep"}
    spec = spec_from_dict(d, Path("specls.json"))
    assert spec.next_edit_layout == "sweep" and spec.to_dict()["next_edit_layout"] == "sweep"
    older = {k: v for k, v in bundled_dict().items() if k != "next_edit_layout"}
    assert spec_from_dict(older, Path("specls.json")).next_edit_layout is None


def test_an_unknown_layout_is_an_error_naming_the_known_ones() -> None:
    with pytest.raises(ModelLoadError, match=r"next_edit_layout.*'chat-rewrite'.*got 'zeta'"):
        spec_from_dict({**bundled_dict(), "next_edit_layout": "zeta"}, Path("specls.json"))


def test_the_engine_reads_the_models_layout() -> None:
    engine = OnnxEngine(EngineSettings(threads=1, costs_cache=False))
    engine.load()
    assert model_layout(engine.models) == "fim-rewrite"  # the bundled pair: a code model without the key
