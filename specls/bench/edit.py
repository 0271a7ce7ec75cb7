"""``specls bench edit``: next-edit suggestions on edits mined from real releases (``edit_tasks``).

Per task, per layout, every arm suggests the next edit on the same request, interleaved: ``plain``
(greedy, no drafts), ``region`` (the region drafts alone), ``lookup`` (prompt lookup alone), ``policy``
(region, lookup and the draft model under the drafting policy). Speed per arm: tokens per target
pass, decode tok/s, end-to-end ms, identical-to-plain % (the output token for token; on a divergence
the target's top-2 margin). Quality per layout (from plain greedy: every arm gives the same output):
exact match of the next edit, similarity of the changed lines, no-edit rate on near tasks, false
edits on far tasks, undo rate.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from specls.api import NextEditRequest, NextEditResult
from specls.bench.edit_tasks import DEFAULT_PACKAGES, EditTask, mine_tasks, package_pairs
from specls.decoder.margin import describe_margin, first_difference, plain_greedy_margin
from specls.engine import EngineSettings, OnnxEngine
from specls.next_edit.confidence import EditConfidence
from specls.next_edit.edits import apply_edits
from specls.next_edit.settings import NextEditSettings

ARMS = ("plain", "region", "lookup", "policy")


@dataclass(frozen=True)
class EditBenchOptions:
    packages: tuple[str, ...] = DEFAULT_PACKAGES
    sources: tuple[str, ...] = ()  # "NAME=OLD:NEW" local directories or archives instead of packages
    cache: str = str(Path.home() / ".cache" / "specls" / "bench-edit")
    n: int = 40
    seed: int = 0
    layouts: tuple[str | None, ...] = (None,)  # None: the model's
    arms: tuple[str, ...] = ARMS
    max_tokens: int | None = None
    json_out: str | None = None
    plain: bool = True  # the plain arm: the reference of identical-to-plain (False: quality runs)


def arm_engine(base: OnnxEngine, arm: str, settings: EngineSettings, edit: NextEditSettings) -> OnnxEngine:
    """An engine on ``base``'s models drafting as ``arm`` says."""
    s = replace(settings, speculation=arm != "plain")
    if arm == "region":
        s = replace(s, lookup=False, draft_model=False)
    elif arm == "lookup":
        s, edit = replace(s, draft_model=False), replace(edit, region=False)
    return OnnxEngine(s, base.models, edit)


@dataclass
class ArmStats:
    tokens: int = 0
    passes: int = 0
    decode_ms: float = 0.0
    e2e_ms: list[float] = field(default_factory=list)
    identical: int = 0
    compared: int = 0
    divergences: list[str] = field(default_factory=list)
    prefill_ms: float = 0.0
    # target decode passes by rows fed: (passes, ms) per bucket of PASS_ROWS
    pass_rows: dict[str, list[float]] = field(default_factory=dict)

    def add(self, r: NextEditResult, ms: float) -> None:
        self.tokens += r.tokens
        self.passes += r.target_passes
        self.decode_ms += r.decode_ms
        self.prefill_ms += r.prefill_ms
        self.e2e_ms.append(ms)
        for rows, pass_ms in r.decode.pass_ms if r.decode is not None else ():
            bucket = self.pass_rows.setdefault(_rows_bucket(rows), [0.0, 0.0])
            bucket[0] += 1
            bucket[1] += pass_ms

    def summary(self) -> dict[str, Any]:
        ms = sorted(self.e2e_ms)
        return {
            "tokens_per_pass": round(self.tokens / self.passes, 2) if self.passes else None,
            "decode_tok_s": round(1e3 * self.tokens / self.decode_ms, 1) if self.decode_ms else None,
            "e2e_ms_p50": round(statistics.median(ms), 1) if ms else None,
            "e2e_ms_mean": round(statistics.fmean(ms), 1) if ms else None,
            "identical_to_plain": round(100.0 * self.identical / self.compared, 1) if self.compared else None,
            "divergences": self.divergences[:5],
            "prefill_ms_mean": round(self.prefill_ms / len(ms), 1) if ms else None,
            # what a target pass costs by its rows: where the decode time goes
            "pass_ms_by_rows": {
                k: {"passes": int(n), "ms_mean": round(t / n, 1)}
                for k, (n, t) in sorted(self.pass_rows.items(), key=lambda kv: int(kv[0].split("-")[0]))
            },
        }


PASS_ROWS = ((1, 1), (2, 8), (9, 16), (17, 32), (33, 49), (50, 10_000))


def _rows_bucket(rows: int) -> str:
    """The PASS_ROWS bucket of a pass over ``rows`` tokens, as "lo-hi".

    >>> _rows_bucket(1), _rows_bucket(20)
    ('1-1', '17-32')
    """
    lo, hi = next(((a, b) for a, b in PASS_ROWS if a <= rows <= b), PASS_ROWS[-1])
    return f"{lo}-{hi}"


def _changed(before: str, after: str) -> list[str]:
    """The lines ``after`` has that ``before`` has not (its side of the diff)."""
    ops = difflib.SequenceMatcher(None, before.splitlines(), after.splitlines(), autojunk=False).get_opcodes()
    return [line for tag, _, _, j1, j2 in ops if tag != "equal" for line in after.splitlines()[j1:j2]]


@dataclass
class Quality:
    near: int = 0
    far: int = 0
    exact: int = 0
    similarity: float = 0.0
    no_edit: int = 0
    false_edit: int = 0
    undo: int = 0
    malformed: int = 0  # cut before its end: the token budget, or too many lines
    run_on: int = 0  # the region copied, then written on past it (specls.next_edit.rewrite_end)
    # each shown edit: (its least sure changed token's margin, whether it was the expected edit, the
    # similarity of its changed lines to the expected ones: 0 for a false edit)
    shown: list[tuple[float, bool, float]] = field(default_factory=list)
    # each task's outcome, for reading which tasks a layout got right (the JSON's ``tasks``)
    outcomes: list[dict[str, Any]] = field(default_factory=list)

    def add(self, task: EditTask, r: NextEditResult, confidence: EditConfidence | None = None) -> None:
        got = apply_edits(task.text, r.edits) if r.edits else None
        self.outcomes.append(
            {
                "task": task.source,
                "near": task.expected is not None,
                "shown": bool(r.edits),
                "exact": got is not None and got == task.expected,
                "dropped": r.dropped,
                "margin": None
                if confidence is None or not math.isfinite(confidence.min_margin)
                else round(confidence.min_margin, 3),
            }
        )
        self.undo += int(r.undone > 0)
        self.malformed += int(r.dropped in ("malformed", "too_long"))
        self.run_on += int(r.dropped == "run_on")
        margin = confidence.min_margin if confidence is not None else float("inf")
        if task.expected is None:
            self.far += 1
            self.false_edit += int(bool(r.edits))
            if r.edits:
                self.shown.append((margin, False, 0.0))
            return
        self.near += 1
        if got is None:
            self.no_edit += 1
            return
        self.exact += int(got == task.expected)
        a, b = _changed(task.text, got), _changed(task.text, task.expected)
        similarity = difflib.SequenceMatcher(None, "\n".join(a), "\n".join(b)).ratio()
        self.similarity += similarity
        self.shown.append((margin, got == task.expected, similarity))

    def summary(self) -> dict[str, Any]:
        def pct(x: float, n: int) -> float | None:
            return round(100.0 * x / n, 1) if n else None

        return {
            "near_tasks": self.near,
            "far_tasks": self.far,
            "exact_pct": pct(self.exact, self.near),
            "changed_lines_similarity": round(self.similarity / self.near, 3) if self.near else None,
            "no_edit_pct": pct(self.no_edit, self.near),
            "false_edit_pct": pct(self.false_edit, self.far),
            "undo_pct": pct(self.undo, self.near + self.far),
            "malformed_pct": pct(self.malformed, self.near + self.far),
            "run_on_pct": pct(self.run_on, self.near + self.far),
            "show_rule": show_rule(self.shown, self.near + self.far),
            "show_bars": show_bars(self.shown, self.near + self.far),
            "tasks": self.outcomes,
        }


SIMILAR = 0.8  # a shown edit this similar to the expected one counts as nearly right


def show_rule(shown: list[tuple[float, bool, float]], tasks: int) -> list[dict[str, Any]]:
    """Precision against coverage of the rule "show an edit when its ``min_margin`` is at least m",
    for m at each shown edit's margin (the surest first): shown edits, exact ones among them, and
    nearly right ones (changed lines at least ``SIMILAR`` alike, exact ones included).

    >>> rows = show_rule([(2.0, True, 1.0), (0.5, False, 0.9)], 4)
    >>> [(r["min_margin"], r["shown"], r["precision_pct"], r["similar_precision_pct"]) for r in rows]
    [(2.0, 1, 100.0, 100.0), (0.5, 2, 50.0, 100.0)]
    """
    rows, hits, near = [], 0, 0
    for n, (margin, exact, similarity) in enumerate(sorted(shown, key=lambda x: -x[0]), start=1):
        hits += int(exact)
        near += int(exact or similarity >= SIMILAR)
        rows.append(
            {
                "min_margin": round(margin, 3),
                "shown": n,
                "exact": hits,
                "precision_pct": round(100.0 * hits / n, 1),
                "similar": near,
                "similar_precision_pct": round(100.0 * near / n, 1),
                "coverage_pct": round(100.0 * n / tasks, 1) if tasks else None,
            }
        )
    return rows


SHOW_BARS = (None, 0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0)  # the bars show_bars sweeps (None: show all)


def show_bars(shown: list[tuple[float, bool, float]], tasks: int) -> list[dict[str, Any]]:
    """``show_rule`` at fixed bars (``SHOW_BARS``): for each, the edits shown and the exact and nearly
    right ones among them, so that runs can be compared and a default bar picked from them.

    >>> [(r["bar"], r["shown"], r["exact"]) for r in show_bars([(2.5, True, 1.0), (0.7, False, 0.2)], 4)][:4]
    [(None, 2, 1), (0.5, 2, 1), (1.0, 1, 1), (2.0, 1, 1)]
    """
    rows = []
    for bar in SHOW_BARS:
        kept = [x for x in shown if bar is None or x[0] >= bar]
        exact = sum(int(e) for _, e, _ in kept)
        similar = sum(int(e or sim >= SIMILAR) for _, e, sim in kept)
        n = len(kept)
        rows.append(
            {
                "bar": bar,
                "shown": n,
                "exact": exact,
                "similar": similar,
                "precision_pct": round(100.0 * exact / n, 1) if n else None,
                "similar_precision_pct": round(100.0 * similar / n, 1) if n else None,
                "coverage_pct": round(100.0 * n / tasks, 1) if tasks else None,
            }
        )
    return rows


def request_of(task: EditTask, i: int, layout: str | None, max_tokens: int | None) -> NextEditRequest:
    return NextEditRequest(
        f"bench://edit/{i}/{task.path}",  # one document per task: no KV carried between tasks
        task.text,
        task.line,
        task.character,
        task.history,
        max_tokens=max_tokens,
        path=task.path,
        layout=layout,
    )


def _divergence(engine: OnnxEngine, plain: OnnxEngine, source: str) -> str:
    assert engine.edits is not None and plain.edits is not None
    ref, got = plain.edits.last_tokens, engine.edits.last_tokens
    j = first_difference(ref, got)
    m = plain_greedy_margin(plain.models.target, plain.edits.last_prompt, ref, j)
    return f"{source}: token {j}, {describe_margin(m)}"


def run_tasks(
    base: OnnxEngine, tasks: list[EditTask], opt: EditBenchOptions, edit: NextEditSettings
) -> dict[str, Any]:
    """Every task through every arm, per layout; the numbers as a JSON-able dict."""
    out: dict[str, Any] = {"tasks": len(tasks), "layouts": {}}
    for layout in opt.layouts:
        # without plain (``plain=False``) the first arm is the quality's reference: every arm
        # outputs what plain would (the invariant the runs with plain check)
        arms = ("plain", *opt.arms) if opt.plain else opt.arms
        engines = {arm: arm_engine(base, arm, base.settings, edit) for arm in arms}
        stats = {arm: ArmStats() for arm in engines}
        quality = Quality()
        name, ref = layout or "", arms[0]
        for i, task in enumerate(tasks):
            req = request_of(task, i, layout, opt.max_tokens)
            for arm, engine in engines.items():
                t0 = time.perf_counter()
                r = engine.next_edit(req)
                stats[arm].add(r, (time.perf_counter() - t0) * 1e3)
                if arm == ref:
                    quality.add(task, r, engine.edits.last_confidence if engine.edits is not None else None)
                    name = r.layout
                if arm == "plain" or not opt.plain:
                    continue
                e, p = engine.edits, engines["plain"].edits
                same = e is not None and p is not None and e.last_tokens == p.last_tokens
                stats[arm].compared += 1
                stats[arm].identical += int(same)
                if not same:
                    stats[arm].divergences.append(_divergence(engine, engines["plain"], task.source))
        out["layouts"][name] = {
            "quality": quality.summary(),
            "arms": {arm: s.summary() for arm, s in stats.items()},
        }
    return out


def format_table(data: dict[str, Any]) -> str:
    lines = [f"bench edit: {data['tasks']} tasks"]
    for layout, d in data["layouts"].items():
        q = d["quality"]
        lines.append(
            f"layout {layout}: exact {q['exact_pct']}% of {q['near_tasks']} near, similarity "
            f"{q['changed_lines_similarity']}, no edit {q['no_edit_pct']}%, false edits {q['false_edit_pct']}% "
            f"of {q['far_tasks']} far, undo {q['undo_pct']}%, malformed {q['malformed_pct']}%, "
            f"run on {q['run_on_pct']}%"
        )
        lines += [
            f"  show if min margin >= {x['bar']}: {x['shown']} shown, {x['exact']} exact "
            f"({x['precision_pct']}% precision), {x['similar']} similar >= {SIMILAR} "
            f"({x['similar_precision_pct']}%), {x['coverage_pct']}% of tasks"
            for x in q["show_bars"]
        ]
        lines.append(
            f"  {'arm':8s} {'tok/pass':>8s} {'tok/s':>8s} {'p50 ms':>9s} {'mean ms':>9s} {'=plain%':>8s}"
        )
        for arm, s in d["arms"].items():
            lines.append(
                f"  {arm:8s} {s['tokens_per_pass']!s:>8s} {s['decode_tok_s']!s:>8s} {s['e2e_ms_p50']!s:>9s} "
                f"{s['e2e_ms_mean']!s:>9s} {s['identical_to_plain'] if arm != 'plain' else '-'!s:>8s}"
            )
            lines += [f"    diverged: {x}" for x in s["divergences"]]
            rows = ", ".join(
                f"{k}: {v['passes']} x {v['ms_mean']} ms" for k, v in s["pass_ms_by_rows"].items()
            )
            lines.append(f"    prefill {s['prefill_ms_mean']} ms; target passes by rows: {rows}")
    return "\n".join(lines)


def register(sub: Any) -> None:
    from specls.model_options import add_model_arguments

    p = sub.add_parser("edit", help="next-edit suggestions on edits mined from two releases of packages")
    p.add_argument(
        "--packages", default=",".join(DEFAULT_PACKAGES), help="NAME==OLD:NEW,... (sdists via pip)"
    )
    p.add_argument(
        "--sources", action="append", default=[], help="NAME=OLD:NEW local dirs/archives (repeatable)"
    )
    p.add_argument("--cache", default=EditBenchOptions.cache, help="where sdists are kept")
    p.add_argument("-n", type=int, default=40, help="tasks (a seeded sample)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--layouts", default="", help="layouts side by side, comma-separated (default: the model's)"
    )
    p.add_argument("--arms", default=",".join(ARMS), help=f"of {', '.join(ARMS)}")
    p.add_argument("--max-tokens", type=int, default=None)
    d = NextEditSettings()
    p.add_argument("--lines-before", type=int, default=d.lines_before, help="region lines above the cursor's")
    p.add_argument("--lines-after", type=int, default=d.lines_after, help="region lines below the cursor's")
    p.add_argument(
        "--no-plain",
        action="store_true",
        help="no plain arm (quality from the first arm, no identical-to-plain check): a quicker quality run",
    )
    p.add_argument("--json-out", default=None, help="write the numbers as JSON here")
    add_model_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from specls.model_options import engine_settings

    arms = tuple(a for a in args.arms.split(",") if a)
    if any(a not in ARMS for a in arms):
        sys.stderr.write(f"specls bench edit: arms are {', '.join(ARMS)}\n")
        return 2
    opt = EditBenchOptions(
        packages=tuple(x for x in args.packages.split(",") if x) if not args.sources else (),
        sources=tuple(args.sources),
        cache=args.cache,
        n=args.n,
        seed=args.seed,
        layouts=tuple(x for x in args.layouts.split(",") if x) or (None,),
        arms=tuple(a for a in arms if a != "plain"),
        max_tokens=args.max_tokens,
        json_out=args.json_out,
        plain=not args.no_plain,
    )
    if not opt.plain and not opt.arms:
        sys.stderr.write("specls bench edit: --no-plain needs another arm\n")
        return 2
    engine = OnnxEngine(engine_settings(vars(args), EngineSettings(costs_cache=False)))
    engine.load()
    # every edit is shown (no bar): the quality's show rule is the curve over the bars
    edit = NextEditSettings(lines_before=args.lines_before, lines_after=args.lines_after, min_margin=None)
    return run_bench(engine, opt, edit)


def source_pairs(opt: EditBenchOptions) -> list[tuple[str, Path, Path]]:
    pairs = []
    for spec in opt.sources:
        name, _, rest = spec.partition("=")
        old, _, new = rest.partition(":")
        pairs.append((name, Path(old), Path(new)))
    return pairs + package_pairs(list(opt.packages), Path(opt.cache))


def run_bench(engine: OnnxEngine, opt: EditBenchOptions, edit: NextEditSettings) -> int:
    tasks = mine_tasks(source_pairs(opt), opt.n, opt.seed, edit.lines_before, edit.lines_after)
    if not tasks:
        sys.stderr.write("specls bench edit: no tasks (no sources, or no edits between them)\n")
        return 2
    data = run_tasks(engine, tasks, opt, edit)
    print(format_table(data))
    if opt.json_out:
        Path(opt.json_out).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return 0
