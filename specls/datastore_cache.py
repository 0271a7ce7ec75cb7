"""Code datastores for prompt lookup (``specls.decoder.datastore``), built once per tokenizer and kept
in the model cache: ``<model cache>/.datastores/<tokenizer key>/<corpus>/`` (the dot keeps them out of
the model listings; ``specls.models.model_store.cache_root``).

A datastore holds token ids, so it is only good for the tokenizer that made it: its folder is keyed
by ``tokenizer_key``, a digest of how the tokenizer encodes a fixed probe text (same tokenizer, same
key, whatever folder the model sits in). Corpora (``corpus_files``): ``stdlib`` (the standard library's
modules, its ``test`` packages left out: the benchmarks' held-out points come from there),
``site-packages`` (this interpreter's installed packages, their tests left out) or a folder (as the
workspace index lists one). ``EngineSettings.datastore`` names a corpus built here or gives a
datastore folder; ``open_datastore`` finds it.
"""

from __future__ import annotations

import hashlib
import logging
import sysconfig
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from specls.decoder.datastore import Datastore
from specls.prompt import TextTokenizer
from specls.workspace_index import WorkspaceLimits, workspace_files

log = logging.getLogger(__name__)

CORPORA = ("stdlib", "site-packages")  # or a folder
_PROBE = "def f(x: int) -> list[str]:\n    return [str(i) for i in range(x)]  # é ✓ {}\n\tif x:\n"
_TEST_DIRS = frozenset({"test", "tests", "testing", "idle_test"})
DEFAULT_MAX_TOKENS = 32_000_000  # 256 MiB of datastore at 8 bytes a token
DEFAULT_MAX_FILE_BYTES = 512_000


def tokenizer_key(tokenizer: TextTokenizer) -> str:
    """A digest of how ``tokenizer`` encodes a probe text: equal for the same tokenizer.

    >>> class Chars:
    ...     def encode(self, text): return [ord(c) for c in text]
    >>> len(tokenizer_key(Chars())), tokenizer_key(Chars()) == tokenizer_key(Chars())
    (16, True)
    """
    ids = tokenizer.encode(_PROBE)
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()[:16]


def datastores_root() -> Path:
    from specls.models.model_store import cache_root

    return cache_root() / ".datastores"


def corpus_name(corpus: str) -> str:
    """The cache folder's name for a corpus: its name, or a folder's name and a digest of its path.

    >>> corpus_name("stdlib")
    'stdlib'
    """
    if corpus in CORPORA:
        return corpus
    path = Path(corpus).expanduser().resolve()
    return f"{path.name}-{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"


def datastore_dir(corpus: str, key: str) -> Path:
    return datastores_root() / key / corpus_name(corpus)


def _python_files(root: Path, max_file_bytes: int) -> list[Path]:
    """The ``.py`` files under root, test packages left out, in a stable order."""
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).parts
        if any(part in _TEST_DIRS or part == "site-packages" for part in rel[:-1]):
            continue
        try:
            if 0 < path.stat().st_size <= max_file_bytes:
                out.append(path)
        except OSError:
            continue
    return out


def corpus_files(corpus: str, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES) -> list[Path]:
    """The files of ``corpus`` (see the module docstring). Raises ValueError for an unknown one."""
    if corpus == "stdlib":
        return _python_files(Path(sysconfig.get_paths()["stdlib"]), max_file_bytes)
    if corpus == "site-packages":
        return _python_files(Path(sysconfig.get_paths()["purelib"]), max_file_bytes)
    folder = Path(corpus).expanduser()
    if not folder.is_dir():
        raise ValueError(f"datastore corpus {corpus!r}: not {', '.join(CORPORA)} nor a folder")
    limits = WorkspaceLimits(max_file_bytes=max_file_bytes, max_total_bytes=1 << 40, max_files=1 << 30)
    return workspace_files(folder, limits)


def build_datastore(
    files: Sequence[Path],
    encode_batch: Callable[[list[str]], list[list[int]]],
    name: str,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    depth: int = 16,
    batch: int = 256,
) -> tuple[Datastore, float]:
    """A datastore over the files' text, tokenised ``batch`` files at a time (each document kept as
    int32 until the build), and the seconds the tokenising took; files past ``max_tokens`` are left
    out."""
    t0 = time.perf_counter()
    docs: list[np.ndarray] = []
    total = 0
    for i in range(0, len(files), batch):
        texts = [p.read_text(encoding="utf-8", errors="replace") for p in files[i : i + batch]]
        for ids in encode_batch(texts):
            docs.append(np.asarray(ids, dtype=np.int32))
            total += len(ids) + 1
        if total >= max_tokens:
            break
    tokenize_s = time.perf_counter() - t0
    return Datastore.build(docs, depth=depth, name=name, max_tokens=max_tokens), tokenize_s


def open_datastore(spec: str, tokenizer: TextTokenizer) -> Datastore | None:
    """The datastore ``spec`` names (a datastore folder, or a corpus built for this tokenizer),
    memory-mapped; None, with a warning that says how to build it, when there is none."""
    t0 = time.perf_counter()
    folder = Path(spec).expanduser()
    if not (folder / "datastore.json").is_file():
        folder = datastore_dir(spec, tokenizer_key(tokenizer))
    try:
        store = Datastore.load(folder, name="datastore")
    except ValueError as exc:
        log.warning(
            "no datastore %r for this model's tokenizer (%s); build it with: specls datastore build "
            "--from %s --model DIR",
            spec,
            exc,
            spec,
        )
        return None
    log.info(
        "datastore %s: %d tokens, %.1f MiB mapped in %.0f ms",
        folder,
        len(store),
        store.nbytes / 2**20,
        1e3 * (time.perf_counter() - t0),
    )
    return store
