"""What could verifying several lookup candidates in one pass (a tree of drafts) gain on the novel
tasks? Decodes each of ``bench real``'s novel tasks plain greedy once, then replays its output pass
by pass with an oracle that knows the greedy continuation: each pass gains the tokens its best
candidate agrees with, plus the one the target adds. Candidates, in the order a tree would take them:

- ``single``: what lookup proposes (the most recent occurrence of the longest matched tail, up to 4
  tokens, in the prompt and output; else the workspace's, then the datastore's walk by counts);
- ``wN``: that and the next ones up to N distinct: the source's ``candidates`` by counts, then the
  other occurrences in the prompt and output, most recent first;
- ``all``: every occurrence of the tail (the datastore's longest, up to 4096) and every occurrence in
  the prompt and output: a tree of unlimited width.

Each candidate holds at most K tokens (rows a pass verifies: about 1 + N * K, shared prefixes not
merged). Prints tokens per pass per K; the pass costs to weigh them by are the engine's
(``pass_cost_compare.py``: rows 2 / 8 / 16 / 32 about 82 / 95 / 106 / 141 ms on the int8 1.5B).

    .venv/bin/python bench/scripts/candidate_oracle.py MODEL_DIR NOVEL_SDISTS [--datastore site-packages] [--k 4,8]

An upper bound for the choice among candidates (what no pass can do better with these candidates),
not a measure of speed; run it alone on the machine.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from specls.decoder.datastore import DEFAULT_STATIC_LOOKUP, SEPARATOR

WIDTHS = (2, 3, 4)


def agreed(candidates: Sequence[Sequence[int]], truth: Sequence[int], k: int) -> int:
    """The most leading tokens any candidate (cut to ``k``) shares with ``truth``.

    >>> agreed([[1, 2, 9], [1, 2, 3, 4]], [1, 2, 3, 5], k=8), agreed([[1, 2, 3, 4]], [1, 2, 3, 4], k=2)
    (3, 2)
    """
    best = 0
    for c in candidates:
        n = 0
        while n < min(len(c), len(truth), k) and c[n] == truth[n]:
            n += 1
        best = max(best, n)
    return best


def sequence_candidates(seq: Sequence[int], i: int, k: int, max_n: int = 4) -> list[list[int]]:
    """The continuations (up to ``k`` tokens, all before ``i``) of every occurrence in ``seq[:i]`` of its
    tail of ``max_n`` .. 1 tokens: the longest tail's first, each tail's most recent first.

    >>> sequence_candidates([5, 1, 2, 5, 1, 3, 5, 1], 8, k=2)  # Not [[2, 5], ...]: 3 came last
    [[3, 5], [2, 5], [3, 5], [2, 5]]
    """
    out: list[list[int]] = []
    for n in range(max_n, 0, -1):
        if i <= n:
            continue
        tail = list(seq[i - n : i])
        ends = [j for j in range(n, i) if list(seq[j - n : j]) == tail]
        out += [list(seq[j : min(j + k, i)]) for j in reversed(ends)]
    return out


def store_candidates(store: Any, context: Sequence[int], k: int) -> list[list[int]]:
    """Every continuation (up to ``k`` tokens, within its document) of the longest tail (16 .. 2
    tokens) of ``context`` found in a datastore."""
    for n in range(min(16, len(context)), 1, -1):
        lo, hi = store.occurrences(context[-n:])
        if lo >= hi:
            continue
        out = []
        first = np.asarray(store.suffixes[lo:hi][: DEFAULT_STATIC_LOOKUP.max_occurrences], dtype=np.int64)
        for start in first + n:
            c = [int(t) for t in store.tokens[start : start + k]]
            c = c[: c.index(SEPARATOR)] if SEPARATOR in c else c
            if c:
                out.append(c)
        return out
    return []


def passes(seq: Sequence[int], start: int, stores: Sequence[Any], k: int) -> dict[str, int]:
    """Target passes to decode ``seq[start:]`` per candidate mode (module docstring)."""
    at = dict.fromkeys(("single", *(f"w{w}" for w in WIDTHS), "all"), start)
    count = dict.fromkeys(at, 0)
    for mode in at:
        while at[mode] < len(seq):
            p = at[mode]
            seen = sequence_candidates(seq, p, k)
            first = seen[:1]
            if not first:
                match = next((m for s in stores if (m := s.match(seq[:p], k)) is not None), None)
                first = [list(match.tokens)] if match is not None else []
            if mode == "single":
                pool = first
            elif mode == "all":
                pool = seen + [c for s in stores for c in store_candidates(s, seq[:p], k)]
            else:
                width = int(mode[1:])
                by_counts = next((cs for s in stores if (cs := s.candidates(seq[:p], k, m=width))), [])
                pool = []
                for c in first + [list(x.tokens) for x in by_counts] + seen:
                    if c and c not in pool:
                        pool.append(c)
                pool = pool[:width]
            count[mode] += 1
            at[mode] = p + min(agreed(pool, seq[p:], k) + 1, len(seq) - p)
    return count


def decode_novel_tasks(
    model: str, novel_sdists: str, datastore_spec: str, threads: int, n: int
) -> tuple[list[tuple[list[int], int, list[Any]]], int]:
    """Each novel task of ``bench real`` decoded plain greedy (64 tokens) by ``model``: (prompt + output
    token ids, the prompt's length, its lookup sources: the task's workspace, then the datastore) per
    task, and the datastore's size in tokens."""
    from specls.bench.novel_tasks import novel_tasks, workspace_of
    from specls.bench.real import _specls_run
    from specls.datastore_cache import open_datastore
    from specls.engine import EngineSettings, OnnxEngine
    from specls.model_options import engine_settings
    from specls.workspace_index import build_workspace, workspace_files

    settings = engine_settings(
        {"model": model, "threads": threads}, EngineSettings(lru_size=0, speculation=False)
    )
    engine = OnnxEngine(settings)
    engine.load()
    tok = engine.models.tokenizer
    tasks = novel_tasks(Path(novel_sdists), Path(tempfile.mkdtemp(prefix="specls-novel-")), n, 0)
    datastore = open_datastore(datastore_spec, tok)
    workspaces = {
        pkg: build_workspace(workspace_files(pkg, exclude=ex), tok) for pkg, ex in workspace_of(tasks).items()
    }
    decoded = []
    for i, t in enumerate(tasks):
        _specls_run(engine, t.point, f"novel{i}", 64, "64")
        seq = list(engine.last_prompt) + list(engine.last_tokens)
        decoded.append((seq, len(engine.last_prompt), [workspaces[t.package], datastore]))
    return decoded, len(datastore)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="the target's specls model directory")
    p.add_argument("novel_sdists", help="bench real's --novel-sdists folder")
    p.add_argument("--datastore", default="site-packages")
    p.add_argument("--k", default="4,8", help="tokens a candidate holds, comma-separated")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--n", type=int, default=14)
    args = p.parse_args()
    decoded, store_tokens = decode_novel_tasks(
        args.model, args.novel_sdists, args.datastore, args.threads, args.n
    )
    tokens = sum(len(seq) - start for seq, start, _ in decoded)
    print(
        f"{len(decoded)} novel tasks, {tokens} greedy tokens, datastore {args.datastore} ({store_tokens} tokens)"
    )
    for k in (int(x) for x in args.k.split(",")):
        total: dict[str, int] = {}
        for seq, start, stores in decoded:
            for mode, n in passes(seq, start, stores, k).items():
                total[mode] = total.get(mode, 0) + n
        cells = ", ".join(f"{mode} {tokens / n:.3f}" for mode, n in total.items())
        print(f"K={k}: tokens per pass: {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
