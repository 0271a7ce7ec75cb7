from __future__ import annotations

import pytest
from specls.lsp.settings import ServerSettings, parse_settings


def test_defaults_are_sane():
    s = ServerSettings()
    assert s.max_tokens > 0 and s.multiline == "auto" and s.speculation and s.languages == ()


@pytest.mark.parametrize(
    "raw",
    [
        {"maxTokens": 32, "multiline": "never", "languages": ["python", "rust"]},
        {"specls": {"max_tokens": 32, "multiline": "NEVER", "languages": "python,rust"}},
    ],
)
def test_flat_and_namespaced_camel_and_snake(raw):
    s, problems = parse_settings(raw)
    assert problems == []
    assert s.max_tokens == 32 and s.multiline == "never" and s.languages == ("python", "rust")


def test_unknown_and_invalid_are_reported_and_ignored():
    base = ServerSettings(max_tokens=40)
    s, problems = parse_settings(
        {"maxTokens": -3, "bogus": 1, "multiline": "sometimes", "drafting": "maybe", "draftLength": 4}, base
    )
    assert s.max_tokens == 40  # invalid value keeps the previous one
    assert s.multiline == "auto" and s.speculation is True
    assert s.draft_length == 4  # the valid one still applies
    assert len(problems) == 4
    assert any("bogus" in p for p in problems)
    assert any("maxTokens" in p for p in problems)


@pytest.mark.parametrize("raw", ["a string", 5, [1, 2], {"specls": 7}])
def test_wrong_shapes_never_raise(raw):
    s, problems = parse_settings(raw)
    assert s == ServerSettings()
    assert len(problems) == 1


def test_none_and_null_values_keep_settings():
    base = ServerSettings(max_tokens=12)
    assert parse_settings(None, base) == (base, [])
    assert parse_settings({"maxTokens": None}, base) == (base, [])


def test_bool_is_not_an_int_and_float_ints_are():
    s, problems = parse_settings({"maxTokens": True, "draftLength": 3.0, "debounceMs": 2.5})
    assert s.max_tokens == ServerSettings().max_tokens  # True is not 1 token
    assert s.draft_length == 3
    assert s.debounce_ms == 0
    assert len(problems) == 2


def test_engine_fields_change_detection():
    a = ServerSettings()
    b, _ = parse_settings({"model": "/m", "maxTokens": 8, "draftModel": False})
    assert a.changed_engine_fields(b) == ["draft_model", "model"]


def test_star_means_every_language():
    s, problems = parse_settings({"enabledLanguages": ["python", "*"]})
    assert problems == [] and s.languages == ()  # not a languageId called "*"


@pytest.mark.parametrize("key", ["speculation", "drafting"])
def test_speculation_setting_and_its_former_name(key):
    s, problems = parse_settings({key: False})
    assert problems == [] and s.speculation is False  # Not an unknown setting: "drafting" was its name


def test_type_ahead_setting_reaches_the_engine():
    import argparse

    from specls.lsp.cli import make_engine, register, settings_from_args

    s, problems = parse_settings({"typeAhead": False})
    assert problems == [] and s.type_ahead is False
    assert ServerSettings().changed_engine_fields(s) == ["type_ahead"]
    from specls.engine import OnnxEngine

    engine = make_engine(s)
    assert isinstance(engine, OnnxEngine) and engine.settings.type_ahead is False  # Not the default
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    assert settings_from_args(parser.parse_args(["serve", "--no-type-ahead"])).type_ahead is False
    assert settings_from_args(parser.parse_args(["serve"])).type_ahead is True


@pytest.mark.parametrize("key", ["draftLength", "draft_length"])
def test_draft_length_setting_reaches_the_engine(key):
    import argparse

    from specls.lsp.cli import make_engine, register, settings_from_args

    s, problems = parse_settings({key: 5})
    assert problems == [] and s.draft_length == 5
    assert ServerSettings().changed_engine_fields(s) == ["draft_length"]  # the engine is rebuilt
    from specls.engine import OnnxEngine

    engine = make_engine(s)
    assert isinstance(engine, OnnxEngine) and engine.settings.draft_length == 5  # Not the default 12
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    assert settings_from_args(parser.parse_args(["serve", "--draft-length", "3"])).draft_length == 3
    assert settings_from_args(parser.parse_args(["serve"])).draft_length == ServerSettings().draft_length
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--draft-length", "0"])  # the setting's range: 1 to 32


@pytest.mark.parametrize("raw", [{"gamma": 4}, {"specls": {"gamma": 4}}])
def test_the_old_gamma_key_is_an_unknown_setting(raw):
    s, problems = parse_settings(raw)
    assert s == ServerSettings()  # Not a draft length: "draftLength" is the one name
    assert problems == ["unknown setting 'gamma'; ignored"]


@pytest.mark.parametrize("value", [0, 33, "many"])
def test_a_draft_length_out_of_range_is_reported_and_ignored(value):
    s, problems = parse_settings({"draftLength": value}, ServerSettings(draft_length=7))
    assert s.draft_length == 7 and len(problems) == 1 and "draftLength" in problems[0]


@pytest.mark.parametrize(
    ("raw", "workspace", "datastore"),
    [
        ({"workspace": True, "datastore": "stdlib"}, True, "stdlib"),
        (
            {"specls": {"workspace": "on", "datastore": " stdlib,site-packages "}},
            True,
            "stdlib,site-packages",
        ),
        ({"datastore": ""}, False, None),  # an editor's empty setting: no datastore, Not ""
    ],
)
def test_lookup_sources_reach_the_engine(raw, workspace, datastore):
    from specls.model_options import engine_settings

    s, problems = parse_settings(raw)
    assert problems == []
    engine = engine_settings(s.engine_options())
    assert (engine.workspace, engine.datastore) == (workspace, datastore)
    assert {"workspace", "datastore"} & set(s.changed_engine_fields(ServerSettings())) == (
        {"workspace"} if workspace else set()
    ) | ({"datastore"} if datastore else set())


def test_a_bad_lookup_source_is_reported_and_ignored():
    s, problems = parse_settings({"workspace": "sometimes", "datastore": 3})
    assert (s.workspace, s.datastore) == (False, None)
    assert len(problems) == 2
