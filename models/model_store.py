"""The model cache: converted model directories kept by (source, revision, conversion settings).

Where: ``$SPECLS_CACHE`` when set, else ``$XDG_CACHE_HOME/specls/models``, else
``~/.cache/specls/models``. Downloads stay in huggingface_hub's own cache (``HF_HOME``, ``HF_HUB_CACHE``);
this one holds only what specls made from them.

Each entry is a directory ``<root>/<ID>`` that ``--model DIR`` loads as is, plus ``manifest.json``
(source, revision, settings, size, when made). It is built in ``<root>/.build-<ID>-<pid>-<token>`` and
renamed into place only once complete: a failed or interrupted conversion never leaves a loadable
entry. A failure is remembered in ``<root>/.failed/<ID>.json`` and an interrupted build by its left-over
directory; the next build of the same entry removes both and logs why it starts again. A conversion run
in a child process (a language server's) writes its output to ``<root>/.logs/<ID>.log``.

>>> key = EntryKey("hf:Qwen/Qwen2.5-Coder-0.5B", "a" * 40, ConvertSettings(draft_head="ascii"))
>>> key.entry_id()
'Qwen--Qwen2.5-Coder-0.5B--5b395db9886d'
>>> ConvertSettings.from_dict(ConvertSettings(dtype="fp16").as_dict()) == ConvertSettings(dtype="fp16")
True
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from specls.models.spec import SPEC_FILE

from specls.api import EngineError

log = logging.getLogger(__name__)

CACHE_ENV = "SPECLS_CACHE"
MANIFEST_FILE = "manifest.json"
STORE_FORMAT = 1  # bumped when an entry's layout changes: old entries are then not found by key
_BUILD_PREFIX = ".build-"
_FAILED_DIR = ".failed"
_LOGS_DIR = ".logs"


class StoreError(EngineError):
    """A cache entry that cannot be found, removed or written; the message says which and why."""


def cache_root() -> Path:
    """The cache directory (see the module docstring); not created here."""
    env = os.environ.get(CACHE_ENV, "").strip()
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "specls" / "models"


@dataclass(frozen=True)
class ConvertSettings:
    """How a checkpoint is converted (the ``specls export`` options an entry depends on). The defaults
    are the CLI's: fp32, quantization chosen by size (int8 for 50M+ weights), full LM head."""

    dtype: str = "fp32"  # "fp32" (CPU graph) | "fp16" (CUDA graph)
    quantize: str = "auto"  # "auto" | "int8" | "int4" | "none"
    draft_head: str = "full"  # "ascii": a draft model's reduced LM head
    fim_family: str | None = None  # None: detected from the vocabulary
    trust_remote_code: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ConvertSettings:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def label(self) -> str:
        """A few words for listings ("fp32, quantize auto, ascii head").

        >>> ConvertSettings().label()
        'fp32, quantize auto'
        """
        parts = [self.dtype, f"quantize {self.quantize}"]
        if self.draft_head != "full":
            parts.append(f"{self.draft_head} head")
        if self.fim_family:
            parts.append(f"fim {self.fim_family}")
        if self.trust_remote_code:
            parts.append("remote code")
        return ", ".join(parts)


def _slug(source: str) -> str:
    """A readable directory-name part of a source id."""
    body = source.split(":", 1)[1] if ":" in source else source
    parts = body.rstrip("/").split("/")[-2:] if body.startswith("/") else body.split("/")
    return re.sub(r"[^A-Za-z0-9._-]+", "-", "--".join(parts)).strip("-")[:80] or "model"


@dataclass(frozen=True)
class EntryKey:
    """What an entry is made from: ``source`` ("hf:ORG/NAME", "hf:ORG/NAME/FILE.gguf",
    "file:/abs/FILE.gguf"), ``revision`` (the hub commit, or a local file's size and mtime) and the
    conversion settings."""

    source: str
    revision: str
    settings: ConvertSettings

    def digest(self) -> str:
        blob = json.dumps(
            {
                "format": STORE_FORMAT,
                "source": self.source,
                "revision": self.revision,
                **self.settings.as_dict(),
            },
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def entry_id(self) -> str:
        return f"{_slug(self.source)}--{self.digest()}"


@dataclass(frozen=True)
class Manifest:
    """``manifest.json`` of an entry. ``requested`` and ``ref`` are what the user asked for (the spec
    without its revision, and the revision as given: "main", a tag, a commit), so an offline start finds
    the entry again without asking the hub which commit "main" is."""

    source: str
    revision: str
    settings: ConvertSettings
    requested: str
    ref: str
    size: int
    created: str  # ISO 8601, UTC
    format: int = STORE_FORMAT

    def to_json(self) -> str:
        data = asdict(self)
        data["settings"] = self.settings.as_dict()
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    @classmethod
    def read(cls, path: Path) -> Manifest | None:
        try:
            data = json.loads(path.read_text())
            return cls(
                source=str(data["source"]),
                revision=str(data["revision"]),
                settings=ConvertSettings.from_dict(dict(data["settings"])),
                requested=str(data["requested"]),
                ref=str(data["ref"]),
                size=int(data["size"]),
                created=str(data["created"]),
                format=int(data.get("format", STORE_FORMAT)),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None


@dataclass(frozen=True)
class Entry:
    """A complete cache entry: its id (the directory name), directory and manifest."""

    id: str
    path: Path
    manifest: Manifest


def dir_size(path: Path) -> int:
    """Bytes of the regular files under ``path``."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


class ModelStore:
    """The cache directory (``cache_root()`` by default). Reading it never touches the network."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else cache_root()

    def path_for(self, key: EntryKey) -> Path:
        return self.root / key.entry_id()

    def _entry(self, path: Path) -> Entry | None:
        manifest = Manifest.read(path / MANIFEST_FILE)
        if manifest is None or not (path / SPEC_FILE).is_file():
            return None
        return Entry(path.name, path, manifest)

    def get(self, key: EntryKey) -> Entry | None:
        """The complete entry for ``key``, or None."""
        return self._entry(self.path_for(key))

    def entries(self) -> list[Entry]:
        """Every complete entry, newest first."""
        if not self.root.is_dir():
            return []
        found = [e for p in self.root.iterdir() if not p.name.startswith(".") and (e := self._entry(p))]
        return sorted(found, key=lambda e: e.manifest.created, reverse=True)

    def find(self, requested: str, ref: str, settings: ConvertSettings) -> list[Entry]:
        """Entries made for the spec ``requested`` at revision ``ref`` (as the user gave them, or the
        commit they resolved to) with ``settings``, newest first: what an offline start may load."""
        return [
            e
            for e in self.entries()
            if e.manifest.requested == requested
            and ref in (e.manifest.ref, e.manifest.revision)
            and e.manifest.settings == settings
        ]

    def lookup(self, entry_id: str) -> Entry:
        """The entry named ``entry_id`` or by a unique prefix of it. Raises StoreError."""
        entries = self.entries()
        exact = [e for e in entries if e.id == entry_id]
        matches = exact or [e for e in entries if e.id.startswith(entry_id)]
        if not matches:
            raise StoreError(f"{entry_id}: no such entry in {self.root} (`specls models` lists them)")
        if len(matches) > 1:
            names = ", ".join(e.id for e in matches)
            raise StoreError(f"{entry_id}: matches {len(matches)} entries ({names}); give more of the id")
        return matches[0]

    def remove(self, entry_id: str) -> Entry:
        """Delete an entry (by id or unique prefix); returns what was removed. Raises StoreError."""
        entry = self.lookup(entry_id)
        # renamed away first: a reader never sees a half-deleted entry as loadable
        trash = self.root / f"{_BUILD_PREFIX}rm-{entry.id}-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            entry.path.rename(trash)
            shutil.rmtree(trash)
        except OSError as exc:
            raise StoreError(f"{entry.path}: cannot remove ({exc})") from None
        return entry

    def log_path(self, key: EntryKey) -> Path:
        """Where the output of ``key``'s conversion in a child process goes (the last attempt's)."""
        return self.root / _LOGS_DIR / f"{key.entry_id()}.log"

    def _failure_file(self, entry_id: str) -> Path:
        return self.root / _FAILED_DIR / f"{entry_id}.json"

    def last_failure(self, key: EntryKey) -> str | None:
        """Why the last build of ``key`` did not finish, when it did not: its error, or "interrupted"
        for a build directory left by a process that is gone."""
        try:
            data = json.loads(self._failure_file(key.entry_id()).read_text())
            return str(data["error"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
        for pid, _ in self._builds(key.entry_id()):
            if not _pid_alive(pid):
                return f"interrupted (process {pid} ended before it finished)"
        return None

    def _builds(self, entry_id: str) -> list[tuple[int, Path]]:
        prefix = f"{_BUILD_PREFIX}{entry_id}-"
        out = []
        if self.root.is_dir():
            for p in self.root.iterdir():
                if p.name.startswith(prefix):
                    pid = p.name[len(prefix) :].split("-", 1)[0]
                    out.append((int(pid) if pid.isdigit() else -1, p))
        return out

    @contextlib.contextmanager
    def build(self, key: EntryKey, requested: str, ref: str) -> Iterator[Path]:
        """A fresh, empty directory to convert ``key`` into; on a normal exit the manifest is written
        and the directory renamed into place (the entry exists only then). On an exception it is
        removed, the error kept for the next try's message, and the exception propagates.

        Raises StoreError when another live process is building the same entry."""
        entry_id = key.entry_id()
        self.root.mkdir(parents=True, exist_ok=True)
        why = self.last_failure(key)
        for pid, path in self._builds(entry_id):
            if _pid_alive(pid) and pid != os.getpid():
                raise StoreError(
                    f"{requested}: another specls process (pid {pid}) is preparing this model into "
                    f"{path}; wait for it to finish"
                )
            shutil.rmtree(path, ignore_errors=True)
        if why is not None:
            log.warning("%s: the previous attempt did not finish (%s); starting clean", requested, why)
        self._failure_file(entry_id).unlink(missing_ok=True)
        tmp = self.root / f"{_BUILD_PREFIX}{entry_id}-{os.getpid()}-{secrets.token_hex(4)}"
        tmp.mkdir()
        try:
            yield tmp
            if not (tmp / SPEC_FILE).is_file():
                raise StoreError(f"{requested}: the conversion wrote no {SPEC_FILE}; nothing was cached")
            manifest = Manifest(
                source=key.source,
                revision=key.revision,
                settings=key.settings,
                requested=requested,
                ref=ref,
                size=dir_size(tmp),
                created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            )
            (tmp / MANIFEST_FILE).write_text(manifest.to_json())
            final = self.path_for(key)
            try:
                tmp.rename(final)
            except OSError:
                if self._entry(final) is None:  # not a finished twin from another process: a real error
                    raise
                shutil.rmtree(tmp, ignore_errors=True)
        except BaseException as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            message = str(exc) or type(exc).__name__
            if isinstance(exc, KeyboardInterrupt):
                message = "interrupted"
            with contextlib.suppress(OSError):
                failed = self._failure_file(entry_id)
                failed.parent.mkdir(exist_ok=True)
                failed.write_text(json.dumps({"requested": requested, "error": message}) + "\n")
            raise


__all__ = [
    "CACHE_ENV",
    "MANIFEST_FILE",
    "ConvertSettings",
    "Entry",
    "EntryKey",
    "Manifest",
    "ModelStore",
    "StoreError",
    "cache_root",
    "dir_size",
]
