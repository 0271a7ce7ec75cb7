"""The model options every command shares, and the one function that turns them into ``EngineSettings``.

``add_model_arguments`` gives ``serve``, ``complete`` and ``serve-engine`` the same flags; each flag's
destination is the name of its setting everywhere: the LSP setting (``model``, ``preset``, ``draft``,
``draftModel``, ``lookup``, ``speculation``, ``typeAhead``, ``draftLength``, ``threads``,
``workspace``, ``datastore``) and the
``EngineSettings`` field. ``engine_settings`` reads those names from the parsed arguments (``vars(args)``),
from the LSP settings (``ServerSettings.engine_options()``) or from a benchmark's options.

One meaning per value: ``threads`` 0 is auto (``specls.models.runtime.auto_threads``) everywhere; the
bundled model is ``None`` (an empty string from an editor means the same); a model is a directory, a
hub id (``ORG/NAME``, ``ORG/NAME-GGUF:Q8_0``) or a ``.gguf`` file (``specls.models.hub``), resolved when
the engine loads.

>>> import argparse
>>> parser = argparse.ArgumentParser()
>>> add_model_arguments(parser)
>>> s = engine_settings(vars(parser.parse_args(["--model", "org/tiny", "--no-draft", "--threads", "0"])))
>>> s.model, s.draft, s.draft_model, s.threads
('org/tiny', None, False, 0)
>>> engine_settings({"model": "", "draft_length": None}).model is None  # "": the bundled model
True
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from typing import Any

from specls.api import EngineError
from specls.engine_settings import EngineSettings
from specls.lsp.settings import MODEL_OPTIONS, parse_draft_length

_NAMES = ("model", "preset", "draft", "datastore")  # None (or ""): not given


def _draft_length(value: str) -> int:
    try:
        return parse_draft_length(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"bad draft length {value!r}: {exc}") from None


def _threads(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--threads takes a whole number, not {value!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError("--threads must not be negative (0: auto)")
    return n


def _preset(value: str) -> str:
    from specls.models.presets import PRESETS

    if value not in PRESETS:
        raise argparse.ArgumentTypeError(f"no preset {value!r} (known: {', '.join(PRESETS)})")
    return value


def add_model_arguments(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """The shared model flags on ``p`` (a parser or an argument group). Flags left out keep the
    engine's defaults (``engine_settings`` skips what was not given)."""
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--model",
        metavar="MODEL",
        help="target model: a directory, a hub id (ORG/NAME, ORG/NAME-GGUF:Q8_0, @REVISION) or a .gguf "
        "file; by name it is downloaded and converted once into the model cache (default: bundled)",
    )
    which.add_argument(
        "--preset",
        type=_preset,
        metavar="NAME",
        help="a tested target + draft pair (`specls models` lists them); downloaded and converted once",
    )
    draft = p.add_mutually_exclusive_group()
    draft.add_argument(
        "--draft",
        metavar="MODEL",
        help="draft model, as --model; by name it is converted with the ASCII head (default: the bundled "
        "draft with the bundled target, none with another target)",
    )
    draft.add_argument(
        "--no-draft",
        dest="draft_model",
        action="store_false",
        default=None,
        help="no draft model (prompt lookup drafts only)",
    )
    p.add_argument(
        "--no-lookup", dest="lookup", action="store_false", default=None, help="no prompt-lookup drafting"
    )
    _add_lookup_arguments(p)
    p.add_argument(
        "--no-speculation",
        dest="speculation",
        action="store_false",
        default=None,
        help="plain greedy decoding on the target (the reference path)",
    )
    p.add_argument(
        "--no-type-ahead",
        dest="type_ahead",
        action="store_false",
        default=None,
        help="decode again on every keystroke typed into a suggestion (default: show the rest of it)",
    )
    p.add_argument(
        "--threads",
        type=_threads,
        metavar="N",
        help="onnxruntime intra-op threads (default 0: auto, the CPUs less one, 1 to 4)",
    )
    p.add_argument(
        "--draft-length",
        type=_draft_length,
        metavar="N",
        help="the most tokens one pass drafts (default 12); the drafting policy picks each pass's "
        "length up to it",
    )


def _add_lookup_arguments(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """The flags of prompt lookup's sources beyond the open buffers."""
    p.add_argument(
        "--workspace",
        action="store_true",
        default=None,
        help="prompt lookup also drafts from the project's files that are not open (indexed in the background)",
    )
    p.add_argument(
        "--datastore",
        metavar="CORPUS",
        help="and from code datastores: stdlib, site-packages or a folder built by `specls datastore "
        "build`, or a datastore folder (several: comma-separated)",
    )
    p.add_argument(
        "--no-feature-head",
        dest="feature_head",
        action="store_false",
        default=None,
        help="do not draft with the target's feature head (one made by `specls head train`)",
    )


def engine_settings(options: Mapping[str, Any], base: EngineSettings | None = None) -> EngineSettings:
    """``base`` (default ``EngineSettings()``) with the shared model options of ``options`` applied, by
    their one name; other keys are ignored. ``None`` means "not given" (the base's value is kept), except
    for ``model``, ``preset``, ``draft`` and ``datastore``, where None and "" both mean "none given": the
    bundled model (or the preset's), no datastore. Raises EngineError for a value out of range."""
    base = base or EngineSettings()
    updates: dict[str, Any] = {}
    for name in MODEL_OPTIONS:
        if name not in options:
            continue
        value = options[name]
        if name in _NAMES:
            updates[name] = (str(value).strip() or None) if value is not None else None
        elif value is not None:
            updates[name] = value
    if updates.get("threads", 0) < 0:
        raise EngineError(f"threads must not be negative (0: auto), not {updates['threads']}")
    if "draft_length" in updates:
        try:
            updates["draft_length"] = parse_draft_length(updates["draft_length"])
        except ValueError as exc:
            raise EngineError(f"bad draft length {updates['draft_length']!r}: {exc}") from None
    return dataclasses.replace(base, **updates)


def resolve_threads(threads: int) -> int:
    """The thread count ``threads`` means (0: auto), for what reports it or sets it elsewhere (torch).

    >>> resolve_threads(3)
    3
    """
    if threads > 0:
        return threads
    from specls.models.runtime import auto_threads

    return auto_threads()


__all__ = ["MODEL_OPTIONS", "add_model_arguments", "engine_settings", "resolve_threads"]
