"""Next-edit tasks mined from real edits: two releases of a third-party package (sdists fetched once
with ``pip download --no-binary :all: --no-deps`` into a cache, or two local directories or archives),
their Python files diffed into hunks (``difflib``, as ``specls.next_edit.edit_diff.diffs_between``).

A task, for a file with hunks 1..n: the file with its first k hunks applied, the cursor at the end of
hunk k, the k hunks as the history; the expected next edit is hunk k+1 when it lies inside the region
around the cursor (a *near* task), else none is expected (a *far* task: any edit shown is a false
one). Seeded: the same sources and seed give the same tasks.
"""

from __future__ import annotations

import difflib
import io
import logging
import random
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from specls.next_edit.edit_diff import EditDiff
from specls.next_edit.edits import lines_of

log = logging.getLogger(__name__)

# Releases a few months apart of small, well-known pure-Python packages (sdists on PyPI).
DEFAULT_PACKAGES = (
    "requests==2.31.0:2.32.3",
    "flask==2.3.3:3.0.0",
    "packaging==23.2:24.0",
    "pluggy==1.3.0:1.4.0",
    "more-itertools==10.1.0:10.2.0",
)
MAX_HUNK_LINES = 12  # a bigger hunk is a rewrite, not a next edit
MAX_FILE_CHARS = 200_000


@dataclass(frozen=True)
class EditTask:
    """``text``: the file after ``history``; the cursor (``line``, ``character``); ``expected``: the
    file after the next edit when it is near the cursor, else None."""

    source: str  # "package/path.py#k"
    path: str
    text: str
    line: int
    character: int
    history: tuple[EditDiff, ...]
    expected: str | None


def fetch_sdist(spec: str, version: str, cache: Path) -> Path:
    """The sdist of ``spec``==``version`` in ``cache`` (downloaded once with pip). Raises
    RuntimeError when pip cannot get it."""
    target = cache / f"{spec}-{version}"
    found = sorted(p for p in target.glob("*") if p.suffix in (".gz", ".zip", ".tgz", ".bz2"))
    if found:
        return found[0]
    target.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", "-d", str(target)]
    done = subprocess.run([*cmd, f"{spec}=={version}"], capture_output=True, text=True, check=False)
    found = sorted(p for p in target.glob("*") if p.is_file())
    if done.returncode != 0 or not found:
        raise RuntimeError(f"pip download {spec}=={version} failed: {done.stderr.strip()[-400:]}")
    return found[0]


def _strip_top(name: str) -> str:
    parts = name.split("/", 1)
    return parts[1] if len(parts) == 2 else parts[0]


def python_files(source: Path) -> dict[str, str]:
    """The ``.py`` files of an sdist archive (its top folder left out of the names) or a directory."""
    out: dict[str, str] = {}
    if source.is_dir():
        for p in sorted(source.rglob("*.py")):
            out[p.relative_to(source).as_posix()] = p.read_text(encoding="utf-8", errors="replace")
        return out
    if zipfile.is_zipfile(source):
        with zipfile.ZipFile(source) as z:
            for name in sorted(z.namelist()):
                if name.endswith(".py"):
                    out[_strip_top(name)] = z.read(name).decode("utf-8", errors="replace")
        return out
    with tarfile.open(source) as t:
        for member in sorted(t.getmembers(), key=lambda m: m.name):
            if member.isfile() and member.name.endswith(".py"):
                data = t.extractfile(member)
                if data is not None:
                    out[_strip_top(member.name)] = io.TextIOWrapper(data, "utf-8", "replace").read()
    return out


def _hunks(old: list[str], new: list[str]) -> list[tuple[int, int, int, int]]:
    ops = difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes()
    return [(i1, i2, j1, j2) for tag, i1, i2, j1, j2 in ops if tag != "equal"]


def file_tasks(name: str, path: str, old_text: str, new_text: str, before: int, after: int) -> list[EditTask]:
    """Every task of one file changed between releases (module docstring), in hunk order."""
    old, new = lines_of(old_text), lines_of(new_text)
    hunks = _hunks(old, new)
    if any(max(i2 - i1, j2 - j1) > MAX_HUNK_LINES for i1, i2, j1, j2 in hunks):
        hunks = [h for h in hunks if max(h[1] - h[0], h[3] - h[2]) <= MAX_HUNK_LINES]
    tasks = []
    for k in range(1, len(hunks)):
        applied, rest = hunks[:k], hunks[k]
        i2, j2 = applied[-1][1], applied[-1][3]
        # the first k hunks applied: new lines up to hunk k's end, then the old ones (equal between hunks
        # of one opcode list; hunks left out for size make the text a mix, still a real file state)
        text_lines = new[:j2] + old[i2:]
        text = "".join(text_lines)
        history = tuple(EditDiff(path, "".join(old[a:b]), "".join(new[c:d]), c) for a, b, c, d in applied)
        j1 = applied[-1][2]
        line = max(j1, j2 - 1)
        character = len(text_lines[line].rstrip("\r\n")) if line < len(text_lines) else 0
        start = j2 + (rest[0] - i2)  # hunk k+1 in this text's lines
        end = start + (rest[1] - rest[0])
        near = line - before <= start and end <= line + after + 1
        expected = "".join(text_lines[:start] + new[rest[2] : rest[3]] + text_lines[end:]) if near else None
        tasks.append(EditTask(f"{name}/{path}#{k}", path, text, line, character, history, expected))
    return tasks


def mine_tasks(
    pairs: list[tuple[str, Path, Path]], n: int, seed: int, before: int = 11, after: int = 12
) -> list[EditTask]:
    """``n`` tasks (seeded sample, near and far as they come) from (name, old, new) source pairs."""
    tasks: list[EditTask] = []
    for name, old_src, new_src in pairs:
        old_files, new_files = python_files(old_src), python_files(new_src)
        for path in sorted(set(old_files) & set(new_files)):
            a, b = old_files[path], new_files[path]
            if a != b and max(len(a), len(b)) <= MAX_FILE_CHARS:
                tasks += file_tasks(name, path, a, b, before, after)
    rng = random.Random(seed)
    rng.shuffle(tasks)
    log.info("bench edit: %d tasks mined, %d taken", len(tasks), min(n, len(tasks)))
    return tasks[:n]


def package_pairs(specs: list[str], cache: Path) -> list[tuple[str, Path, Path]]:
    """``NAME==A:B`` specs as (name, old sdist, new sdist), fetched into ``cache``; a package pip
    cannot get is left out with a warning."""
    out = []
    for spec in specs:
        name, _, versions = spec.partition("==")
        a, _, b = versions.partition(":")
        if not (name and a and b):
            raise ValueError(f"package {spec!r}: expected NAME==OLD:NEW")
        try:
            out.append((name, fetch_sdist(name, a, cache), fetch_sdist(name, b, cache)))
        except RuntimeError as exc:
            log.warning("bench edit: %s", exc)
    return out
