"""Server settings: one frozen dataclass, parsed from ``initializationOptions`` and
``workspace/didChangeConfiguration``.

Both a flat dict (``{"maxTokens": 48}``) and a namespaced one (``{"specls": {"maxTokens": 48}}``) are
accepted; keys may be camelCase or snake_case. Unknown keys and invalid values never raise: they are
collected as problem strings (the server reports each one once) and the previous value is kept.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MULTILINE_MODES = ("auto", "always", "never")
LOG_LEVELS = ("error", "warning", "info", "debug")

# The model options every command shares, by their one name (CLI destination, LSP setting in
# snake_case, EngineSettings field): specls.model_options gives them their flags
MODEL_OPTIONS = (
    "model",
    "preset",
    "draft",
    "draft_model",
    "lookup",
    "speculation",
    "type_ahead",
    "draft_length",
    "threads",
    "workspace",
    "datastore",
    "feature_head",
)
# Settings that only take effect when the engine is (re)built, i.e. before the model is loaded: the
# model options, by the same names
ENGINE_FIELDS = frozenset(MODEL_OPTIONS)


@dataclass(frozen=True)
class ServerSettings:
    """Everything the language server can be told. Defaults are what `specls serve` uses."""

    # the target: a model directory, a hub id (ORG/NAME, ORG/NAME-GGUF:Q8_0) or a .gguf file, prepared
    # into the model cache at load; None (an editor's "") = the bundled one
    model: str | None = None
    preset: str | None = None  # a named target + draft pair (specls.models.presets), instead of model
    draft: str | None = None  # the draft, as model; None = the bundled one with the bundled target
    max_tokens: int = 64  # per completion
    speculation: bool = True  # speculative decoding on/off (off = plain greedy on the target)
    draft_model: bool = True  # use the draft model (off = prompt lookup drafts only)
    lookup: bool = True  # draft by prompt lookup (the open buffers, the prompt, the suffix)
    # typing into a suggestion shows its rest at once (off: each keystroke is decoded again, exact for it)
    type_ahead: bool = True
    # the most tokens one pass drafts; the drafting policy picks each pass's length up to it
    draft_length: int = 12
    # onnxruntime intra-op threads; 0 = auto (the CPUs less one, 1 to 4: specls.models.runtime.auto_threads)
    threads: int = 0
    # prompt lookup also drafts from the project's files that are not open; off by default: it reads
    # the whole project in the background, which a user turns on knowingly
    workspace: bool = False
    # and from code datastores (stdlib, site-packages or a folder built by `specls datastore build`;
    # comma-separated); None = none
    datastore: str | None = None
    # draft with the target's feature head when it has one (`specls head train`)
    feature_head: bool = True
    languages: tuple[str, ...] = ()  # languageIds to complete in; () = all
    debounce_ms: int = 0  # server-side debounce before generating (editors usually debounce already)
    multiline: str = "auto"  # auto | always | never
    # in a multi-line context, answer with the first line as soon as it is decoded; the rest of the
    # block is decoded once the user pauses, and shows when they accept or type into the line (off:
    # wait for the whole block; on a CPU that is several seconds of a 1.5B model after every Enter)
    line_first: bool = True
    team_token: str = ""  # for the team service (unused by the local server)
    log_level: str = "warning"  # error | warning | info | debug (logs go to stderr)

    def changed_engine_fields(self, other: ServerSettings) -> list[str]:
        return sorted(f for f in ENGINE_FIELDS if getattr(self, f) != getattr(other, f))

    def engine_options(self) -> dict[str, Any]:
        """The engine's settings by their one name, for ``specls.model_options.engine_settings``."""
        return {f: getattr(self, f) for f in sorted(ENGINE_FIELDS)}


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


_ALIASES = {
    "max_new_tokens": "max_tokens",
    "enabled_languages": "languages",
    "token": "team_token",  # the team service reads {"token": ...} (specls.team.auth)
    "drafting": "speculation",  # its former name (editor configs may still say it)
}


def _as_int(value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError("expected an integer")
    if isinstance(value, float) and not value.is_integer():
        raise ValueError("expected an integer")
    number = int(value)
    if not lo <= number <= hi:
        raise ValueError(f"expected {lo}..{hi}")
    return number


def parse_draft_length(value: Any) -> int:
    """``draft_length`` (``draftLength``, ``--draft-length``): 1 to 32 drafted tokens a pass at most."""
    return _as_int(value, 1, 32)


def _as_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "on", "off", "1", "0"):
        return value.lower() in ("true", "on", "1")
    raise ValueError("expected true or false")


def _as_str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("expected a string")
    return value


def _as_name(value: Any) -> str | None:
    """A model or preset name; "" (an editor's empty setting) is None: the bundled model."""
    return _as_str(value).strip() or None


def _as_preset(value: Any) -> str | None:
    from specls.models.presets import PRESETS

    name = _as_name(value)
    if name is not None and name not in PRESETS:
        raise ValueError(f"expected one of {', '.join(PRESETS)}")
    return name


def _as_choice(value: Any, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value.lower() not in choices:
        raise ValueError(f"expected one of {', '.join(choices)}")
    return value.lower()


def _as_languages(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [v for v in value.split(",") if v.strip()]
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise ValueError("expected a list of languageIds")
    langs = tuple(v.strip() for v in value)
    return () if "*" in langs else langs  # "*" = every language, like ()


def _convert(name: str, value: Any) -> Any:
    if name in ("model", "draft", "datastore"):
        return _as_name(value)
    if name == "preset":
        return _as_preset(value)
    if name == "team_token":
        return _as_str(value)
    if name == "max_tokens":
        return _as_int(value, 1, 1024)
    if name == "draft_length":
        return parse_draft_length(value)
    if name == "threads":
        return _as_int(value, 0, 256)
    if name == "debounce_ms":
        return _as_int(value, 0, 5000)
    if name in (
        "speculation",
        "draft_model",
        "lookup",
        "type_ahead",
        "line_first",
        "workspace",
        "feature_head",
    ):
        return _as_bool(value)
    if name == "languages":
        return _as_languages(value)
    if name == "multiline":
        return _as_choice(value, MULTILINE_MODES)
    if name == "log_level":
        return _as_choice(value, LOG_LEVELS)
    raise KeyError(name)


def parse_settings(raw: object, base: ServerSettings | None = None) -> tuple[ServerSettings, list[str]]:
    """Apply ``raw`` (client options) on top of ``base``. Returns the new settings and a list of
    human-readable problems (unknown keys, invalid values), each of which was ignored."""
    settings = base or ServerSettings()
    problems: list[str] = []
    if raw is None:
        return settings, problems
    if not isinstance(raw, Mapping):
        return settings, [f"settings must be an object, got {type(raw).__name__}; ignored"]
    section: Mapping[Any, Any] = raw
    nested = raw.get("specls")
    if nested is not None:
        if isinstance(nested, Mapping):
            section = nested
            # other top-level sections belong to other tools: not ours to complain about
        else:
            return settings, ["setting 'specls' must be an object; ignored"]
    names = {f.name for f in dataclasses.fields(ServerSettings)}
    updates: dict[str, Any] = {}
    for key, value in section.items():
        if not isinstance(key, str):
            problems.append(f"unknown setting {key!r}; ignored")
            continue
        name = _snake(key)
        name = _ALIASES.get(name, name)
        if name not in names:
            problems.append(f"unknown setting {key!r}; ignored")
            continue
        if value is None:  # clients send null for "unset": keep the current value
            continue
        try:
            updates[name] = _convert(name, value)
        except (ValueError, TypeError) as exc:
            problems.append(f"invalid value {value!r} for setting {key!r} ({exc}); ignored")
    return dataclasses.replace(settings, **updates), problems
