"""Training data for the bundled code-model pair: the stdlib corpus split, FIM transforms, packing.

Corpus: every ``*.py`` file of the running interpreter's stdlib (``sysconfig.get_paths()["stdlib"]``),
except ``site-packages`` and every test directory (``test``/``tests`` anywhere, ``idlelib/idle_test``).
Held-out evaluation files: exactly the ``*.py`` files inside those test directories.

Sample formats (FIM is applied per chunk of at most ``DataOptions.fim_chunk_chars`` characters, so that a
FIM sample fits the training context):

- plain: ``<file_sep>{relpath}\\n{document}<|endoftext|>`` (the file-separator header on half of them),
- FIM samples, some preceded by a snippet of another file as ``<file_sep>{relpath}\\n{snippet}\\n`` (the
  layout ``specls.models.fim.fim_prompt_text`` uses for context files), then one of:
- PSM: ``<fim_prefix>{prefix}<fim_suffix>{suffix}<fim_middle>{middle}<|endoftext|>``,
- SPM (StarCoder style, so the prompt's tail is prefix text that grows as the user types):
  ``<fim_prefix><fim_suffix>{suffix}<fim_middle>{prefix}{middle}<|endoftext|>``.
"""

from __future__ import annotations

import logging
import random
import sysconfig
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

log = logging.getLogger(__name__)

EOT = "<|endoftext|>"
FIM_PREFIX = "<fim_prefix>"
FIM_MIDDLE = "<fim_middle>"
FIM_SUFFIX = "<fim_suffix>"
FILE_SEP = "<file_sep>"
PAD = "<pad>"
SPECIAL_TOKENS: tuple[str, ...] = (EOT, FIM_PREFIX, FIM_MIDDLE, FIM_SUFFIX, FILE_SEP, PAD)

FimMode = Literal["psm", "spm"]

_TEST_DIR_NAMES = frozenset({"test", "tests"})


@dataclass(frozen=True)
class CorpusSplit:
    """Training and held-out files, both sorted by their path relative to ``root``."""

    root: Path
    train: tuple[Path, ...]
    heldout: tuple[Path, ...]


@dataclass(frozen=True)
class DataOptions:
    """How documents become training samples."""

    seed: int = 0
    psm_rate: float = 0.25  # fraction of documents turned into PSM FIM samples
    spm_rate: float = 0.25  # fraction turned into SPM FIM samples (the rest stay plain)
    file_sep_rate: float = 0.5  # fraction of plain documents with a <file_sep>{path} header
    fim_chunk_chars: int = 1500  # FIM documents are cut (at line ends) into chunks this long
    fim_context_rate: float = 0.3  # FIM samples preceded by a <file_sep>{path}\n{snippet} of another file
    context_chars: int = 600  # longest such snippet


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"]).resolve()


def is_test_path(rel: Path) -> bool:
    """True when ``rel`` (relative to the stdlib root) lies in a test directory."""
    dirs = rel.parts[:-1]
    if any(d in _TEST_DIR_NAMES for d in dirs):
        return True
    return any(a == "idlelib" and b == "idle_test" for a, b in zip(dirs, dirs[1:], strict=False))


def split_corpus(root: Path | None = None) -> CorpusSplit:
    """All ``*.py`` files under ``root`` (default: the stdlib) split into training and held-out files.

    ``site-packages`` is skipped entirely; files in test directories are held out.
    """
    base = (root or stdlib_root()).resolve()
    train: list[Path] = []
    heldout: list[Path] = []
    for path in sorted(base.rglob("*.py"), key=lambda p: p.relative_to(base).as_posix()):
        rel = path.relative_to(base)
        if "site-packages" in rel.parts or "__pycache__" in rel.parts or not path.is_file():
            continue
        (heldout if is_test_path(rel) else train).append(path)
    return CorpusSplit(root=base, train=tuple(train), heldout=tuple(heldout))


def read_source(path: Path) -> str | None:
    """The file's text, or None when it is not UTF-8 (or unreadable)."""
    try:
        return path.read_bytes().decode("utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def iter_documents(files: Sequence[Path], root: Path) -> Iterator[tuple[str, str]]:
    """(relative posix path, text) for every readable, non-empty UTF-8 file, in the given order."""
    for path in files:
        text = read_source(path)
        if text is None:
            log.debug("skipping non-UTF-8 file %s", path)
            continue
        if text.strip():
            yield path.relative_to(root).as_posix(), text


def fim_split(text: str, rng: random.Random) -> tuple[str, str, str]:
    """Split ``text`` at two random character points into (prefix, middle, suffix)."""
    n = len(text)
    a, b = sorted((rng.randint(0, n), rng.randint(0, n)))
    return text[:a], text[a:b], text[b:]


def format_fim(prefix: str, middle: str, suffix: str, mode: FimMode) -> str:
    if mode == "psm":
        return f"{FIM_PREFIX}{prefix}{FIM_SUFFIX}{suffix}{FIM_MIDDLE}{middle}{EOT}"
    if mode == "spm":
        return f"{FIM_PREFIX}{FIM_SUFFIX}{suffix}{FIM_MIDDLE}{prefix}{middle}{EOT}"
    raise ValueError(f"unknown FIM mode {mode!r}")


def parse_fim(sample: str) -> tuple[str, str, str, FimMode]:
    """Inverse of :func:`format_fim`: (prefix, middle, suffix, mode).

    For SPM the prefix/middle boundary is not in the text; the whole ``{prefix}{middle}`` comes back as
    the middle with an empty prefix.
    """
    if not sample.startswith(FIM_PREFIX) or not sample.endswith(EOT):
        raise ValueError("not a FIM sample")
    body = sample[len(FIM_PREFIX) : -len(EOT)]
    if body.startswith(FIM_SUFFIX):
        suffix, _, rest = body[len(FIM_SUFFIX) :].partition(FIM_MIDDLE)
        return "", rest, suffix, "spm"
    prefix, _, rest = body.partition(FIM_SUFFIX)
    suffix, _, middle = rest.partition(FIM_MIDDLE)
    return prefix, middle, suffix, "psm"


def chunk_lines(text: str, max_chars: int) -> list[str]:
    """Cut ``text`` at line ends into chunks of at most ``max_chars`` (longer single lines stay whole)."""
    chunks: list[str] = []
    cur: list[str] = []
    size = 0
    for line in text.splitlines(keepends=True):
        if cur and size + len(line) > max_chars:
            chunks.append("".join(cur))
            cur, size = [], 0
        cur.append(line)
        size += len(line)
    if cur:
        chunks.append("".join(cur))
    return chunks


def make_samples(docs: Iterator[tuple[str, str]], options: DataOptions) -> Iterator[str]:
    """Training sample texts (special tokens inline) from (path, text) documents; seeded, deterministic."""
    rng = random.Random(options.seed)
    previous: tuple[str, str] | None = None  # (path, snippet) of the last document, for context
    for rel, text in docs:
        r = rng.random()
        if r < options.psm_rate + options.spm_rate:
            mode: FimMode = "psm" if r < options.psm_rate else "spm"
            for chunk in chunk_lines(text, options.fim_chunk_chars):
                pre, mid, suf = fim_split(chunk, rng)
                head = ""
                if previous is not None and rng.random() < options.fim_context_rate:
                    ctx_path, snippet = previous
                    head = f"{FILE_SEP}{ctx_path}\n{snippet}" + ("" if snippet.endswith("\n") else "\n")
                yield head + format_fim(pre, mid, suf, mode)
        elif rng.random() < options.file_sep_rate:
            yield f"{FILE_SEP}{rel}\n{text}{EOT}"
        else:
            yield f"{text}{EOT}"
        cut = chunk_lines(text, options.context_chars)
        previous = (rel, cut[0][: options.context_chars] if cut else "")


def pack(token_ids: Sequence[Sequence[int]], seq_len: int) -> np.ndarray:
    """Concatenate tokenized samples and cut the stream into rows of ``seq_len`` (the tail is dropped).

    Returns int32 [n_rows, seq_len].
    """
    if seq_len <= 0:
        raise ValueError("seq_len must be positive")
    total = sum(len(t) for t in token_ids)
    stream = np.empty(total, dtype=np.int32)
    pos = 0
    for ids in token_ids:
        stream[pos : pos + len(ids)] = ids
        pos += len(ids)
    n_rows = total // seq_len
    return stream[: n_rows * seq_len].reshape(n_rows, seq_len)
