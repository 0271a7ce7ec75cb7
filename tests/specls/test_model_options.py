"""Settings from one place: the same model flags give the same EngineSettings for ``serve``, ``complete``
and ``serve-engine``; ``--threads 0`` is auto everywhere; the bundled model is None everywhere; one name
per setting from the CLI to the LSP settings to the engine; a preset or a model given by name is what
the load prepares."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
from specls.lsp.cli import make_engine, settings_from_args
from specls.lsp.settings import ENGINE_FIELDS, ServerSettings, parse_settings
from specls.models.model_store import ConvertSettings

from specls import __version__
from specls.api import EngineError
from specls.cli import build_parser
from specls.engine import OnnxEngine
from specls.engine_settings import EngineSettings
from specls.loading import model_sources
from specls.model_options import MODEL_OPTIONS, engine_settings, resolve_threads
from specls.team.cli import engine_from_args

FLAGS = [
    "--model",
    "org/tiny",
    "--draft",
    "org/tiny-draft",
    "--no-lookup",
    "--no-type-ahead",
    "--threads",
    "0",
    "--draft-length",
    "5",
]


def _args(command: str, *flags: str) -> argparse.Namespace:
    extra = ["f.py", "--line", "0", "--character", "0"] if command == "complete" else []
    return build_parser().parse_args([command, *extra, *flags])


def _serve(*flags: str) -> EngineSettings:
    engine = make_engine(settings_from_args(_args("serve", *flags)))
    assert isinstance(engine, OnnxEngine)
    return engine.settings


def _serve_engine(*flags: str) -> EngineSettings:
    engine = engine_from_args(_args("serve-engine", *flags))
    assert isinstance(engine, OnnxEngine)
    return engine.settings


def _complete(*flags: str) -> EngineSettings:
    return engine_settings(vars(_args("complete", *flags)))


SHARED = ("model", "preset", "draft", "draft_model", "lookup", "speculation", "type_ahead", "draft_length")


@pytest.mark.parametrize("make", [_serve, _serve_engine, _complete])
def test_the_same_flags_give_the_same_engine_settings(make) -> None:
    s = make(*FLAGS)
    got = {name: getattr(s, name) for name in (*SHARED, "threads")}
    assert got == {
        "model": "org/tiny",
        "preset": None,
        "draft": "org/tiny-draft",
        "draft_model": True,
        "lookup": False,
        "speculation": True,
        "type_ahead": False,
        "draft_length": 5,
        "threads": 0,  # auto, resolved at load (specls.models.runtime.auto_threads)
    }
    defaults = make()
    assert {n: getattr(defaults, n) for n in SHARED} == {n: getattr(EngineSettings(), n) for n in SHARED}
    assert defaults.model is None and defaults.draft is None  # the bundled pair: None, never ""


def test_threads_zero_is_auto_for_every_command() -> None:
    # Not os.cpu_count(): serve-engine's --threads 0 used to mean all CPUs
    for make in (_serve, _serve_engine, _complete):
        assert make("--threads", "0").threads == 0 and make().threads == 0
        assert make("--threads", "3").threads == 3
    assert resolve_threads(0) >= 1 and resolve_threads(2) == 2
    with pytest.raises(SystemExit):
        _args("serve", "--threads", "-1")
    with pytest.raises(EngineError, match="must not be negative"):
        engine_settings({"threads": -1})


def test_one_name_per_setting_from_cli_to_lsp_to_engine() -> None:
    assert ENGINE_FIELDS == set(MODEL_OPTIONS)
    engine_fields = {f.name for f in dataclasses.fields(EngineSettings)}
    server_fields = {f.name for f in dataclasses.fields(ServerSettings)}
    assert set(MODEL_OPTIONS) <= engine_fields and set(MODEL_OPTIONS) <= server_fields
    # each CLI flag lands in the namespace under the setting's name
    ns = vars(_args("serve", "--no-draft", "--no-speculation", "--no-lookup", "--no-type-ahead"))
    assert (ns["draft_model"], ns["speculation"], ns["lookup"], ns["type_ahead"]) == (False,) * 4
    # and an editor's camelCase setting reaches the same field
    lsp, problems = parse_settings({"draftModel": False, "typeAhead": False, "lookup": False, "preset": ""})
    assert problems == []
    s = engine_settings(lsp.engine_options())
    assert (s.draft_model, s.type_ahead, s.lookup, s.preset) == (False, False, False, None)


def test_the_bundled_model_is_none_everywhere() -> None:
    assert ServerSettings().model is None and ServerSettings().draft is None
    s, problems = parse_settings({"model": "", "draft": "  "}, ServerSettings(model="/m", draft="/d"))
    assert problems == [] and s.model is None and s.draft is None  # Not "": an empty editor setting
    assert engine_settings({"model": "", "draft": None}).model is None


def test_model_and_preset_are_one_choice() -> None:
    with pytest.raises(SystemExit):
        _args("serve", "--model", "org/x", "--preset", "qwen2.5-coder-1.5b")
    with pytest.raises(SystemExit):
        _args("serve", "--preset", "no-such-preset")
    with pytest.raises(SystemExit):
        _args("complete", "--draft", "d", "--no-draft")
    assert _serve("--preset", "qwen2.5-coder-0.5b").preset == "qwen2.5-coder-0.5b"
    _, problems = parse_settings({"preset": "no-such-preset"})
    assert len(problems) == 1 and "qwen2.5-coder-1.5b" in problems[0]
    # an editor that sets both gets the reason when the model loads
    with pytest.raises(EngineError, match="a preset or a model, not both"):
        model_sources(EngineSettings(model="org/x", preset="qwen2.5-coder-1.5b"))


def test_what_the_load_prepares() -> None:
    target, draft = model_sources(EngineSettings(preset="qwen2.5-coder-1.5b"))
    assert (target.spec, target.convert) == ("Qwen/Qwen2.5-Coder-1.5B", ConvertSettings())
    assert draft is not None and draft.spec == "Qwen/Qwen2.5-Coder-0.5B"
    assert draft.convert.draft_head == "ascii"
    assert model_sources(EngineSettings(preset="qwen2.5-coder-1.5b", draft_model=False))[1] is None
    assert model_sources(EngineSettings(preset="qwen2.5-coder-0.5b"))[1] is None  # a target alone
    # a draft by name gets the draft's reduced head; another target has no bundled draft
    _, named = model_sources(EngineSettings(model="org/t", draft="org/d"))
    assert named is not None and named.convert == ConvertSettings(draft_head="ascii")
    assert model_sources(EngineSettings(model="org/t"))[1] is None
    bundled_target, bundled_draft = model_sources(EngineSettings())
    assert bundled_target.spec is None and bundled_draft is not None and bundled_draft.spec is None
    assert model_sources(EngineSettings(speculation=False))[1] is None


def test_the_version_is_read_once() -> None:
    from importlib.metadata import version

    from specls.lsp.server import SERVER_VERSION

    assert __version__ == version("specls") == SERVER_VERSION


def test_the_editor_offers_the_completion_presets() -> None:
    import json
    from pathlib import Path

    from specls.models.presets import PRESETS

    package = Path(__file__).resolve().parents[2] / "editors" / "vscode" / "package.json"
    setting = json.loads(package.read_text())["contributes"]["configuration"]["properties"]["specls.preset"]
    assert setting["enum"] == ["", *(p.name for p in PRESETS.values() if p.kind == "completion")]
