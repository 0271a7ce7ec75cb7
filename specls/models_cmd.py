"""``specls models``: the presets and the model cache. ``specls models`` (or ``models list``) lists
both; ``models pull NAME`` / ``models pull --preset NAME`` downloads and converts into the cache with a
progress bar; ``models rm ID`` removes an entry. Nothing here imports torch unless a pull converts."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from typing import Any, TextIO

from specls.api import EngineError
from specls.models.model_store import ConvertSettings, Entry, ModelStore
from specls.models.presets import PRESETS, get_preset


def register(sub: Any) -> None:
    p = sub.add_parser(
        "models",
        help="list presets and cached models; pull (download + convert) or remove one",
        description="Models by name: presets, and the cache of converted models ($SPECLS_CACHE, else "
        "$XDG_CACHE_HOME/specls/models, else ~/.cache/specls/models; downloads stay in huggingface_hub's "
        "cache).",
    )
    msub = p.add_subparsers(dest="models_command", metavar="ACTION")
    msub.add_parser("list", help="presets and cached models (the default)")
    pull = msub.add_parser("pull", help="download and convert a model (or a preset's pair) into the cache")
    what = pull.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "model", nargs="?", default=None, help="hub id (ORG/NAME, ORG/NAME:QUANT, @REVISION) or FILE.gguf"
    )
    what.add_argument("--preset", default=None, choices=sorted(PRESETS), help="a preset's target and draft")
    pull.add_argument("--dtype", choices=("fp32", "fp16"), default="fp32")
    pull.add_argument("--quantize", choices=("auto", "int4", "int8", "none"), default="auto")
    pull.add_argument(
        "--draft-head", choices=("full", "ascii"), default="full", help="ascii: for a draft model only"
    )
    rm = msub.add_parser("rm", help="remove cached models by id (or a unique prefix of one)")
    rm.add_argument("ids", nargs="+", metavar="ID")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    store = ModelStore()
    action = args.models_command or "list"
    try:
        if action == "list":
            print_listing(store, sys.stdout)
            return 0
        if action == "rm":
            for entry_id in args.ids:
                entry = store.remove(entry_id)
                sys.stdout.write(
                    f"removed {entry.id} ({entry.manifest.requested}, {human_size(entry.manifest.size)})\n"
                )
            return 0
        return _pull(args, store)
    except EngineError as exc:
        sys.stderr.write(f"specls models: {exc}\n")
        return 1


def _pull(args: argparse.Namespace, store: ModelStore) -> int:
    from specls.models.hub import resolve_model
    from specls.models.progress import ConsoleProgress

    if args.preset is not None:
        preset = get_preset(args.preset)
        choices = [("target", preset.target)] + ([("draft", preset.draft)] if preset.draft else [])
        jobs = [(role, c.spec, c.settings) for role, c in choices]
    else:
        settings = ConvertSettings(dtype=args.dtype, quantize=args.quantize, draft_head=args.draft_head)
        jobs = [("model", args.model, settings)]
    for role, spec, settings in jobs:
        path = resolve_model(spec, settings=settings, progress=ConsoleProgress(), store=store)
        sys.stdout.write(f"{role}: {spec} -> {path}\n")
    return 0


def human_size(n: int) -> str:
    """Bytes as people read them.

    >>> human_size(1_680_000_000), human_size(3_400_000), human_size(512)
    ('1.7 GB', '3.4 MB', '512 B')
    """
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _when(created: str) -> str:
    try:
        t = dt.datetime.fromisoformat(created)
    except ValueError:
        return created
    return t.astimezone().strftime("%Y-%m-%d %H:%M")


def _source(entry: Entry) -> str:
    m = entry.manifest
    rev = m.revision[:12] if len(m.revision) == 40 else m.revision
    return f"{m.requested}@{rev}" if m.source.startswith("hf:") else m.requested


def print_listing(store: ModelStore, out: TextIO) -> None:
    out.write("presets:\n")
    for p in PRESETS.values():
        pair = p.target.spec + (f" + draft {p.draft.spec}" if p.draft else "")
        out.write(f"  {p.name:<24} {pair} [{p.device}, {p.kind}]\n    {p.description}\n")
    entries = store.entries()
    out.write(f"\ncached models ({store.root}):\n")
    if not entries:
        out.write("  none (`specls models pull NAME` or --preset NAME adds one)\n")
        return
    rows = [
        (
            e.id,
            human_size(e.manifest.size),
            _when(e.manifest.created),
            _source(e),
            e.manifest.settings.label(),
        )
        for e in entries
    ]
    header = ("ID", "SIZE", "CREATED", "SOURCE", "SETTINGS")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
    for r in [header, *rows]:
        out.write("  " + "  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + f"  {r[4]}\n")
    total = sum(e.manifest.size for e in entries)
    out.write(f"  {len(entries)} entries, {human_size(total)}\n")


__all__ = ["human_size", "print_listing", "register", "run"]
