"""Held-out tasks with little to copy, for ``specls bench real --tasks novel``: function bodies and
lines of third-party packages that are in no other set (not the standard library the datastore is
built from, not installed here, not HumanEval, which stays a held-out check of its own).

The packages come as source distributions, fetched once by the person running the benchmark:

    pip download --no-binary :all: --no-deps boltons==25.0.0 toolz==1.0.0 -d DIR

then ``specls bench real --tasks novel --novel-sdists DIR``. Each task is a fill-in-the-middle point
cut to at most ``BEFORE_LINES`` lines before the cursor and ``AFTER_LINES`` after it:

- ``body``: a function's body (after its docstring) removed, the cursor at its first statement: what
  a canonical solution of a code benchmark asks for, on code the models' authors did not pick;
- ``line``: the rest of a line from its indentation, as ``bench decode`` makes them.

A task's workspace (the "+ workspace" lever) is its package's other files: those holding a task are
left out, so no task can copy its own answer from the workspace.
"""

from __future__ import annotations

import ast
import random
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from specls.bench.decode import Point

PACKAGES = ("boltons==25.0.0", "toolz==1.0.0")
DOWNLOAD = f"pip download --no-binary :all: --no-deps {' '.join(PACKAGES)} -d DIR"
BEFORE_LINES = 60
AFTER_LINES = 12
_SKIP_PARTS = frozenset({"tests", "test", "docs", "doc", "examples", "benchmarks", "build"})
_SKIP_NAMES = frozenset({"setup.py", "conftest.py", "__init__.py", "_version.py", "versioneer.py"})


@dataclass(frozen=True)
class NovelTask:
    point: Point
    package: Path  # the unpacked package's folder: its workspace


def unpack(sdists: Path, into: Path) -> list[Path]:
    """Each ``.tar.gz`` / ``.zip`` in ``sdists`` unpacked into ``into``; the packages' folders."""
    roots = []
    for archive in sorted(sdists.iterdir()):
        name = archive.name
        if name.endswith((".tar.gz", ".tgz")):
            with tarfile.open(archive) as tar:
                tar.extractall(into, filter="data")
            roots.append(into / name.removesuffix(".tar.gz").removesuffix(".tgz"))
        elif name.endswith(".zip"):
            with zipfile.ZipFile(archive) as z:
                z.extractall(into)
            roots.append(into / name.removesuffix(".zip"))
    return [r for r in roots if r.is_dir()]


def package_files(root: Path) -> list[Path]:
    """The package's own modules: no tests, docs, examples, setup or empty ``__init__``."""
    return [
        p
        for p in sorted(root.rglob("*.py"))
        if p.name not in _SKIP_NAMES and not _SKIP_PARTS.intersection(p.relative_to(root).parts[:-1])
    ]


def _cut(path: Path, kind: str, lines: list[str], start: int, end: int, cursor_col: int) -> Point:
    """A point whose middle runs from (start, cursor_col) to the start of line ``end``."""
    head = "".join(lines[max(0, start - BEFORE_LINES) : start]) + lines[start][:cursor_col]
    middle = lines[start][cursor_col:] + "".join(lines[start + 1 : end])
    tail = "".join(lines[end : end + AFTER_LINES])
    return Point(str(path), kind, head, tail, middle)


def body_points(path: Path, text: str) -> list[Point]:
    """One point per function whose body (after its docstring) is 2 to 20 lines."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    lines = text.splitlines(keepends=True)
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        body = node.body
        if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]  # the docstring stays in the prompt
        if not body or node.end_lineno is None:
            continue
        start, end = body[0].lineno - 1, node.end_lineno
        if 2 <= end - start <= 20:
            out.append(_cut(path, "body", lines, start, end, body[0].col_offset))
    return out


def line_points(path: Path, text: str, rng: random.Random, n: int) -> list[Point]:
    """Up to ``n`` points at the indentation of a code line, its rest the middle."""
    lines = text.splitlines(keepends=True)
    usable = [i for i, s in enumerate(lines) if len(s.strip()) >= 8 and not s.strip().startswith(("#", '"'))]
    out = []
    for i in rng.sample(usable, min(n, len(usable))):
        indent = len(lines[i]) - len(lines[i].lstrip())
        out.append(_cut(path, "line", lines, i, i + 1, indent))
    return out


def novel_tasks(sdists: Path, workdir: Path, n: int, seed: int) -> list[NovelTask]:
    """``n`` seeded tasks, bodies and lines alternating, the packages taking turns."""
    rng = random.Random(seed)
    pools: list[tuple[Path, list[Point], list[Point]]] = []
    for root in unpack(sdists, workdir):
        bodies, lines = [], []
        for path in package_files(root):
            text = path.read_text(encoding="utf-8", errors="replace")
            bodies += body_points(path, text)
            lines += line_points(path, text, rng, 2)
        rng.shuffle(bodies)
        rng.shuffle(lines)
        pools.append((root, bodies, lines))
    tasks: list[NovelTask] = []
    turn = 0
    while len(tasks) < n and any(b or c for _, b, c in pools):
        root, bodies, lines = pools[turn % len(pools)]
        pool = bodies if (turn // len(pools)) % 2 == 0 else lines  # each package gets both kinds
        pool = pool or bodies or lines
        if pool:
            tasks.append(NovelTask(pool.pop(), root))
        turn += 1
    return tasks


def workspace_of(tasks: list[NovelTask]) -> dict[Path, list[Path]]:
    """Per package, the files holding a task: its workspace leaves them out."""
    held: dict[Path, list[Path]] = {}
    for t in tasks:
        held.setdefault(t.package, [])
        if Path(t.point.path) not in held[t.package]:
            held[t.package].append(Path(t.point.path))
    return held
