"""The workspace's files that are not open in the editor, as a prompt-lookup source: read and
tokenised in a background thread, within a size bound, into a static datastore
(``specls.decoder.datastore``) that prompt lookup consults after the open buffers.

Which files: in a git checkout, what ``git ls-files -co --exclude-standard`` lists (tracked and
untracked files, ``.gitignore`` respected); elsewhere a walk that skips version-control folders,
virtual environments, caches and build output (``SKIP_DIRS``). Only source-like files
(``CODE_SUFFIXES``) of at most ``max_file_bytes``, until ``max_total_bytes`` in all, the smallest
files first (more files within the bound); files with NUL bytes are skipped as binary.

Never on a keystroke's path: the build runs in its own daemon thread and publishes the finished
datastore in one step (``StaticSources.set``); it tokenises in line-sized chunks
(``DocumentEncoder.chunks``), so the interpreter lock is never held for a whole file, and the suffix
array's sorts run in numpy without it. A file's on-disk text may be older than its open buffer: the
buffer is consulted first.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from specls.decoder.datastore import Datastore, StaticSources
from specls.prompt import DocumentEncoder, TextTokenizer

log = logging.getLogger(__name__)

SKIP_DIRS = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        "node_modules",
        ".venv",
        "venv",
        "env",
        "__pycache__",
        ".mypy_cache",
        ".ruff_cache",
        ".pytest_cache",
        ".tox",
        ".nox",
        "build",
        "dist",
        "target",
        ".idea",
        ".vscode",
        "site-packages",
    }
)
CODE_SUFFIXES = frozenset(
    {".py", ".pyi", ".js", ".jsx", ".ts", ".tsx", ".go", ".rs", ".c", ".h", ".cc", ".cpp", ".hpp", ".java"}
    | {".kt", ".swift", ".rb", ".php", ".cs", ".scala", ".lua", ".sh", ".sql", ".toml", ".md", ".rst"}
)
ROOT_MARKERS = (".git",)  # a folder holding one of these is a workspace root


@dataclass(frozen=True)
class WorkspaceLimits:
    """How much of a workspace is indexed: a large one is cut, never a reason for a slow editor."""

    max_file_bytes: int = 256_000  # bigger files are mostly generated or data
    max_total_bytes: int = 8_000_000  # a few million tokens: tens of MiB indexed
    max_files: int = 20_000  # the listing itself stays short
    depth: int = 16  # the datastore's match depth (``Datastore.build``)


def root_of(doc_id: str) -> Path | None:
    """The workspace root of a document (a ``file://`` URI or a path): the nearest folder above it
    with a ``ROOT_MARKERS`` entry; None when there is none (the file system's root is never one)."""
    path = Path(unquote(urlparse(doc_id).path)) if doc_id.startswith("file:") else Path(doc_id)
    if not path.is_absolute():
        return None
    for folder in path.parents:
        if folder == folder.parent:
            return None
        if any((folder / marker).exists() for marker in ROOT_MARKERS):
            return folder
    return None


def _git_files(root: Path) -> list[Path] | None:
    """``git ls-files -co --exclude-standard`` under root; None when it is not a git checkout."""
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-co", "--exclude-standard", "-z"],
            capture_output=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return [root / name for name in out.decode("utf-8", "replace").split("\0") if name]


def _walk_files(root: Path, max_files: int) -> list[Path]:
    out: list[Path] = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
        out.extend(Path(folder) / f for f in sorted(files))
        if len(out) >= 10 * max_files:
            break
    return out


def workspace_files(
    root: Path, limits: WorkspaceLimits = WorkspaceLimits(), exclude: Iterable[Path] = ()
) -> list[Path]:
    """The files to index (see the module docstring), smallest first, within the limits."""
    listed = _git_files(root) if (root / ".git").exists() else None
    candidates = listed if listed is not None else _walk_files(root, limits.max_files)
    skip = {p.resolve() for p in exclude}
    sized: list[tuple[int, Path]] = []
    for path in candidates:
        if path.suffix.lower() not in CODE_SUFFIXES or any(part in SKIP_DIRS for part in path.parts):
            continue
        try:
            size = path.stat().st_size
        except OSError:
            continue
        if 0 < size <= limits.max_file_bytes and path.resolve() not in skip:
            sized.append((size, path))
    sized.sort()
    chosen, total = [], 0
    for size, path in sized[: limits.max_files]:
        if total + size > limits.max_total_bytes:
            break
        chosen.append(path)
        total += size
    return chosen


def _read(path: Path) -> str | None:
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if b"\0" in data[:8192]:
        return None  # binary
    return data.decode("utf-8", "replace")


def build_workspace(
    files: Sequence[Path], tokenizer: TextTokenizer, depth: int = 16, name: str = "workspace"
) -> Datastore:
    """The files' datastore, tokenised chunk by chunk (see the module docstring)."""
    encoder = DocumentEncoder(tokenizer)

    def docs() -> Iterable[list[int]]:
        for path in files:
            text = _read(path)
            if text:
                yield encoder.encode(text)

    return Datastore.build(docs(), depth=depth, name=name)


class WorkspaceIndex:
    """A workspace's datastore, built in the background into ``sources`` (slot ``slot``)."""

    def __init__(
        self,
        sources: StaticSources,
        limits: WorkspaceLimits = WorkspaceLimits(),
        slot: str = "workspace",
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.sources = sources
        self.limits = limits
        self.slot = slot
        self._clock = clock
        self._lock = threading.Lock()
        self.root: Path | None = None
        self.state = "idle"  # idle | indexing | ready | failed
        self.files = 0
        self.seconds = 0.0
        self._thread: threading.Thread | None = None

    def start(self, root: Path, tokenizer: TextTokenizer, exclude: Iterable[Path] = ()) -> bool:
        """Index ``root`` in a daemon thread, once per root; False when that root is (being) indexed."""
        with self._lock:
            if self.root == root and self.state in ("indexing", "ready"):
                return False
            self.root, self.state = root, "indexing"
            self._thread = threading.Thread(
                target=self._build,
                args=(root, tokenizer, tuple(exclude)),
                name="specls-workspace",
                daemon=True,
            )
            self._thread.start()
            return True

    def join(self, timeout: float | None = None) -> None:
        """Wait for the build (tests and benchmarks)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _build(self, root: Path, tokenizer: TextTokenizer, exclude: tuple[Path, ...]) -> None:
        t0 = self._clock()
        try:
            files = workspace_files(root, self.limits, exclude)
            store = build_workspace(files, tokenizer, self.limits.depth, self.slot)
        except Exception:
            log.exception("indexing the workspace %s failed", root)
            with self._lock:
                self.state = "failed"
            return
        with self._lock:
            if self.root != root:
                return  # another root was asked for meanwhile
            self.sources.set(self.slot, store)
            self.files, self.seconds, self.state = len(files), self._clock() - t0, "ready"
        log.info(
            "workspace %s: %d files, %d tokens, %.1f MiB indexed in %.1f s",
            root,
            len(files),
            len(store),
            store.nbytes / 2**20,
            self.seconds,
        )

    def stats(self) -> dict[str, object]:
        with self._lock:
            return {
                "root": None if self.root is None else str(self.root),
                "state": self.state,
                "files": self.files,
                "index_s": round(self.seconds, 2),
            }
