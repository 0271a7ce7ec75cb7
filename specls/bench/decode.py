"""``specls bench decode``: speculative decoding on held-out code, all methods interleaved in one process.

Completion points are cut from real code the bundled pair never saw (default: the interpreter's stdlib
test files): at a line start or mid-line, a "middle" of the rest of the line plus a few lines is
removed, the rest of the file is the suffix, and the editor buffer (what prompt lookup indexes) is
prefix + suffix. Per point, each method completes the same prompt: plain greedy, lookup only, draft
only, hybrid (ours, through ``OnnxEngine``), and, when torch/transformers are installed, Hugging Face
``generate`` on the same checkpoints with the same prompt token ids (greedy, ``assistant_model``,
``prompt_lookup_num_tokens``).
"""

from __future__ import annotations

import argparse
import glob
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from specls.bench import int_list
from specls.decoder.api import CausalLM, KVCache
from specls.decoder.margin import describe_margin, first_difference, plain_greedy_margin
from specls.model_options import resolve_threads

OURS = ("plain", "lookup", "draft", "hybrid")
HF = ("hf-greedy", "hf-assisted", "hf-lookup")


@dataclass(frozen=True)
class BenchOptions:
    files: str | None = None  # glob; None = held-out stdlib test files
    n: int = 24
    max_tokens: int = 64
    seed: int = 0
    threads: int = 1
    model: str | None = None
    draft: str | None = None
    hf: bool = True
    checkpoints: str | None = None  # dir with target/ and draft/ HF checkpoints; None = models/bundled
    draft_lengths: tuple[int, ...] = (1, 2, 4, 8, 12)
    sweep_points: int = 12
    plot: str | None = None
    json_out: str | None = None


@dataclass(frozen=True)
class Point:
    path: str
    kind: str  # "line" | "mid"
    prefix: str
    suffix: str
    middle: str  # the removed text (reference only; never shown to the methods)


@dataclass
class Run:
    """One method's numbers at one point."""

    ms: float
    tokens: list[int]
    passes: int = 0
    drafted: int = 0
    accepted: int = 0
    draft_ms: float = 0.0
    prefill_ms: float = 0.0
    decode_ms: float = 0.0


@dataclass
class MethodSummary:
    name: str
    runs: list[Run] = field(default_factory=list)
    identical: int = 0
    compared: int = 0
    divergences: list[dict[str, Any]] = field(default_factory=list)


def register(sub: Any) -> None:
    p = sub.add_parser("decode", help="speculative decoding benchmark (the default `specls bench`)")
    p.add_argument("--files", default=None, help="glob of source files (default: held-out stdlib tests)")
    p.add_argument("--n", type=int, default=BenchOptions.n, help="completion points")
    p.add_argument("--max-tokens", type=int, default=BenchOptions.max_tokens)
    p.add_argument("--seed", type=int, default=BenchOptions.seed)
    p.add_argument(
        "--threads", type=int, default=BenchOptions.threads, help="ORT and torch threads (0: auto)"
    )
    p.add_argument("--model", default=None, help="target model dir (default: bundled)")
    p.add_argument("--draft", default=None, help="draft model dir (default: bundled)")
    p.add_argument("--checkpoints", default=None, help="HF checkpoints dir with target/ and draft/")
    p.add_argument("--no-hf", action="store_true", help="skip the Hugging Face generate baselines")
    p.add_argument(
        "--draft-lengths",
        default="1,2,4,8,12",
        help="draft lengths for the tokens-per-pass sweep (the hybrid, its policy capped at each)",
    )
    p.add_argument("--sweep-points", type=int, default=BenchOptions.sweep_points)
    p.add_argument("--plot", default=None, help="PNG: tokens per pass vs draft length (needs matplotlib)")
    p.add_argument("--json", dest="json_out", default=None, help="save the numbers as JSON")
    p.set_defaults(func=run)


def options_from_args(args: argparse.Namespace) -> BenchOptions:
    draft_lengths = int_list(args.draft_lengths)
    return BenchOptions(
        files=args.files,
        n=args.n,
        max_tokens=args.max_tokens,
        seed=args.seed,
        threads=resolve_threads(args.threads),  # 0: auto, as everywhere
        model=args.model,
        draft=args.draft,
        hf=not args.no_hf,
        checkpoints=args.checkpoints,
        draft_lengths=draft_lengths,
        sweep_points=args.sweep_points,
        plot=args.plot,
        json_out=args.json_out,
    )


# -- completion points ---------------------------------------------------------------------------


def source_files(pattern: str | None) -> list[Path]:
    if pattern:
        return sorted(Path(p) for p in glob.glob(pattern, recursive=True) if Path(p).is_file())
    try:
        from specls.models.data import split_corpus

        return sorted(split_corpus().heldout)
    except ImportError:
        import sysconfig

        root = Path(sysconfig.get_paths()["stdlib"])
        return sorted(p for p in root.glob("test/**/*.py") if p.is_file())


def make_points(files: list[Path], n: int, seed: int) -> list[Point]:
    """``n`` seeded points, alternating line-start and mid-line, each in a file of 1-200 kB."""
    rng = random.Random(seed)
    candidates = [f for f in files if 1_000 <= f.stat().st_size <= 200_000]
    points: list[Point] = []
    attempts = 0
    while len(points) < n and candidates and attempts < 50 * max(1, n):
        attempts += 1
        path = rng.choice(candidates)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        lines = text.splitlines(keepends=True)
        if len(lines) < 20:
            continue
        i = rng.randrange(10, len(lines) - 5)
        line = lines[i]
        content = line.strip()
        if len(content) < 8 or content.startswith("#"):
            continue
        start = sum(len(x) for x in lines[:i])
        indent = len(line) - len(line.lstrip())
        kind = "line" if len(points) % 2 == 0 else "mid"
        cursor = start + indent + (0 if kind == "line" else rng.randint(1, len(content) - 1))
        extra = rng.randint(0, 4)  # the middle: rest of this line + a few more lines
        end = start + len(line) + sum(len(x) for x in lines[i + 1 : i + 1 + extra])
        points.append(Point(str(path), kind, text[:cursor], text[end:], text[cursor:end]))
    return points


# -- our methods -----------------------------------------------------------------------------------


@dataclass
class CallLog:
    """Every model forward of the run: (role, method, tokens fed, ms)."""

    method: str = ""
    calls: list[tuple[str, str, int, float]] = field(default_factory=list)

    def median_ms(self, role: str, method: str, max_tokens: int) -> float | None:
        ms = [c[3] for c in self.calls if c[0] == role and c[1] == method and c[2] <= max_tokens]
        return statistics.median(ms) if ms else None


class TimedCache(KVCache):
    def __init__(self, inner: Any, role: str, log: CallLog) -> None:
        self._inner = inner
        self._role = role
        self._log = log

    @property
    def length(self) -> int:
        return int(self._inner.length)

    def forward(self, ids: Any) -> Any:
        t0 = time.perf_counter()
        out = self._inner.forward(ids)
        self._log.calls.append((self._role, self._log.method, len(ids), (time.perf_counter() - t0) * 1e3))
        return out

    def truncate(self, n: int) -> None:
        self._inner.truncate(n)


class TimedLM(CausalLM):
    """A CausalLM whose caches log each forward's time."""

    def __init__(self, inner: Any, role: str, log: CallLog) -> None:
        self._inner = inner
        self._role = role
        self._log = log

    @property
    def vocab_size(self) -> int:
        return int(self._inner.vocab_size)

    @property
    def pass_granularity(self) -> int:
        return int(self._inner.pass_granularity)

    def new_cache(self) -> TimedCache:
        return TimedCache(self._inner.new_cache(), self._role, self._log)


def _ours(engine: Any, point: Point, doc_id: str, max_tokens: int) -> Run:
    from specls.api import CompletionRequest

    engine.update_document(doc_id, point.prefix + point.suffix)
    engine.flush()  # indexing the buffer happens on edits, not in the completion's latency
    before = float(engine.stats()["draft_ms"])
    t0 = time.perf_counter()
    r = engine.complete(CompletionRequest(doc_id, point.prefix, point.suffix, max_tokens))
    ms = (time.perf_counter() - t0) * 1e3
    draft_ms = float(engine.stats()["draft_ms"]) - before
    engine.close_document(doc_id)
    return Run(
        ms,
        list(engine.last_tokens),
        r.target_passes,
        r.drafted,
        r.accepted,
        draft_ms,
        r.prefill_ms,
        r.decode_ms,
    )


def _margin_at_divergence(models: Any, prompt: list[int], ref: list[int], got: list[int]) -> dict[str, Any]:
    """Where ``got`` first differs from ``ref``, and the target's top-2 logit margin there on plain
    greedy's own path (a float tie is ~1e-6; anything larger is a bug)."""
    j = first_difference(ref, got)
    return {
        "position": j,
        "ref": ref[j : j + 3],
        "got": got[j : j + 3],
        "top2_margin": plain_greedy_margin(models.target, prompt, ref, j),
    }


# -- Hugging Face baselines ------------------------------------------------------------------------


class HfBaselines:
    def __init__(self, checkpoints: Path, threads: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        self.torch = torch
        self.target = AutoModelForCausalLM.from_pretrained(str(checkpoints / "target"), dtype=torch.float32)
        self.draft = AutoModelForCausalLM.from_pretrained(str(checkpoints / "draft"), dtype=torch.float32)
        self.target.eval()
        self.draft.eval()

    def run(self, method: str, prompt: list[int], max_new: int, eos: list[int]) -> Run:
        kwargs: dict[str, Any] = {}
        if method == "hf-assisted":
            kwargs["assistant_model"] = self.draft
        elif method == "hf-lookup":
            kwargs["prompt_lookup_num_tokens"] = 10
        tokens, ms = hf_greedy(self.target, prompt, max_new, eos, **kwargs)
        return Run(ms, tokens)


def hf_greedy(
    model: Any, prompt: list[int], max_new: int, eos: list[int], **kwargs: Any
) -> tuple[list[int], float]:
    """Greedy ``model.generate`` (transformers) after ``prompt``: the tokens before the first eos and
    the end-to-end milliseconds. ``kwargs`` select assisted / prompt-lookup / stop strings."""
    import torch

    ids = torch.tensor([prompt], dtype=torch.long)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=eos[0],
            **kwargs,
        )
    ms = (time.perf_counter() - t0) * 1e3
    tokens = [int(t) for t in out[0, len(prompt) :].tolist()]
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[:i], ms
    return tokens, ms


# -- the run ---------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    return run_bench(options_from_args(args))


def _timed_engine(opt: BenchOptions) -> tuple[Any, Any, CallLog] | None:
    """The loaded hybrid engine with its models' calls logged, and the base settings; None (said on
    stderr) when it cannot load."""
    from specls.api import EngineError
    from specls.engine import EngineSettings, OnnxEngine
    from specls.model_options import engine_settings

    # each run measures its own pass costs
    base = engine_settings(
        {"model": opt.model, "draft": opt.draft, "threads": opt.threads},
        EngineSettings(lru_size=0, costs_cache=False),
    )
    hybrid = OnnxEngine(replace(base, completion_reuse=False))
    try:
        hybrid.load()
    except EngineError as exc:
        sys.stderr.write(f"specls bench decode: {exc}\n")
        return None
    log = CallLog()
    untimed = hybrid.models
    models = replace(
        untimed,
        target=TimedLM(untimed.target, "target", log),
        draft=TimedLM(untimed.draft, "draft", log) if untimed.draft is not None else None,
    )
    return OnnxEngine(hybrid.settings, models), base, log


def run_bench(opt: BenchOptions) -> int:
    points = make_points(source_files(opt.files), opt.n, opt.seed)
    if not points:
        sys.stderr.write("specls bench decode: no usable source files\n")
        return 2
    loaded = _timed_engine(opt)
    if loaded is None:
        return 2
    hybrid, base, log = loaded
    models = hybrid.models
    engines = {
        "plain": hybrid.with_settings(replace(base, speculation=False)),
        "lookup": hybrid.with_settings(replace(base, draft_model=False, completion_reuse=False)),
        "draft": hybrid.with_settings(replace(base, lookup=False, completion_reuse=False)),
        "hybrid": hybrid,
    }
    hf: HfBaselines | None = None
    if opt.hf:
        hf = _load_hf(opt)
    methods = list(OURS) + (list(HF) if hf is not None else [])
    summary = {m: MethodSummary(m) for m in methods}
    eos = sorted(models.eos_ids)
    say = sys.stderr.write
    say(
        f"bench decode: {len(points)} points, max {opt.max_tokens} tokens, {opt.threads} thread(s), "
        f"provider {models.provider}, methods {', '.join(methods)}\n"
    )
    # warm-up (first-call allocations), untimed
    for name, engine in engines.items():
        log.method = "warmup"
        _ours(engine, points[0], f"warmup-{name}", 8)
    if hf is not None:
        for m in HF:
            hf.run(m, engines["plain"].last_prompt, 4, eos)
    for i, point in enumerate(points):
        ref = _one_point(opt, engines, hf, eos, log, i, point, summary)
        plain_ms = summary["plain"].runs[-1].ms
        say(
            f"  [{i + 1}/{len(points)}] {point.kind:4s} {Path(point.path).name}: "
            + " ".join(f"{m}={summary[m].runs[-1].ms:.0f}ms" for m in methods)
            + f" (plain {len(ref or [])} tokens, hybrid x{plain_ms / max(1e-9, summary['hybrid'].runs[-1].ms):.2f})\n"
        )
    log.method = "sweep"
    print(_table(summary, methods, log))
    sweep = (
        _draft_length_sweep(hybrid, base, points[: max(1, opt.sweep_points)], opt)
        if opt.draft_lengths
        else []
    )
    if sweep:
        print(_sweep_table(sweep))
    if opt.plot:
        _plot(sweep, opt.plot)
    if opt.json_out:
        data = {
            "options": {k: v for k, v in opt.__dict__.items()},
            "provider": models.provider,
            "points": [{"path": p.path, "kind": p.kind, "cursor": len(p.prefix)} for p in points],
            "methods": {m: _numbers(summary[m], summary["plain"], log) for m in methods},
            "draft_length_sweep": sweep,
        }
        Path(opt.json_out).write_text(json.dumps(data, indent=2))
    return 0


def _one_point(
    opt: BenchOptions,
    engines: dict[str, Any],
    hf: HfBaselines | None,
    eos: list[int],
    log: CallLog,
    i: int,
    point: Point,
    summary: dict[str, MethodSummary],
) -> list[int] | None:
    """Run every method at point `i`, each compared with plain greedy's tokens; those tokens."""
    models = engines["hybrid"].models
    ref: list[int] | None = None
    prompt: list[int] = []
    for name in OURS:  # plain first: it is the reference of this point
        log.method = name
        r = _ours(engines[name], point, f"p{i}-{name}", opt.max_tokens)
        if name == "plain":
            ref, prompt = r.tokens, list(engines["plain"].last_prompt)
        _compare(summary[name], models, prompt, ref, r)
        summary[name].runs.append(r)
    if hf is not None:
        max_new = min(opt.max_tokens, models.max_positions - len(prompt))
        for m in HF:
            r = hf.run(m, prompt, max_new, eos)
            _compare(summary[m], models, prompt, ref, r)
            summary[m].runs.append(r)
    return ref


def _load_hf(opt: BenchOptions) -> HfBaselines | None:
    ckpt = Path(opt.checkpoints) if opt.checkpoints else _default_checkpoints()
    if not (ckpt / "target" / "config.json").exists() or not (ckpt / "draft" / "config.json").exists():
        sys.stderr.write(f"bench decode: no HF checkpoints under {ckpt}; skipping the HF baselines\n")
        return None
    try:
        return HfBaselines(ckpt, opt.threads)
    except ImportError as exc:
        sys.stderr.write(f"bench decode: torch/transformers not installed ({exc}); skipping HF\n")
        return None


def _default_checkpoints() -> Path:
    import specls.models

    return Path(specls.models.__file__).resolve().parent / "bundled"


def _compare(s: MethodSummary, models: Any, prompt: list[int], ref: list[int] | None, r: Run) -> None:
    if ref is None:
        return
    s.compared += 1
    if r.tokens == ref:
        s.identical += 1
    elif len(s.divergences) < 5:
        s.divergences.append(_margin_at_divergence(models, prompt, ref, r.tokens))


def _numbers(s: MethodSummary, plain: MethodSummary, log: CallLog) -> dict[str, Any]:
    runs = s.runs
    tokens = sum(len(r.tokens) for r in runs)
    passes = sum(r.passes for r in runs)
    drafted = sum(r.drafted for r in runs)
    accepted = sum(r.accepted for r in runs)
    plain_decode = sum(r.decode_ms for r in plain.runs)
    target_step_ms = log.median_ms("target", "plain", 1) or 0.0
    verify_ms = log.median_ms("target", s.name, 64) if passes else None  # incl. prefill calls: median
    draft_ms = sum(r.draft_ms for r in runs)
    draft_step_ms = log.median_ms("draft", s.name, 2)
    c: float | None = None
    if draft_step_ms is not None and target_step_ms:
        c = draft_step_ms / target_step_ms  # one draft-model step vs one plain target step
    elif drafted and passes and target_step_ms:
        c = (draft_ms / passes) / target_step_ms  # lookup: drafting time per pass
    total = sum(r.ms for r in runs)
    plain_total = sum(r.ms for r in plain.runs)
    decode_ms = sum(r.decode_ms for r in runs)
    return {
        "tokens": tokens,
        "target_passes": passes or None,
        "tokens_per_pass": tokens / passes if passes else None,
        "acceptance": accepted / drafted if drafted else None,
        "draft_cost_ratio": c,
        "median_ms": statistics.median(r.ms for r in runs) if runs else 0.0,
        "total_ms": total,
        "speedup_vs_plain": plain_total / total if total else None,
        "decode_speedup_vs_plain": plain_decode / decode_ms if passes and decode_ms > 0 else None,
        "median_prefill_ms": statistics.median(r.prefill_ms for r in runs) if passes else None,
        "draft_ms_share": draft_ms / decode_ms if passes and drafted and decode_ms > 0 else None,
        "identical_rate": s.identical / s.compared if s.compared else None,
        "divergences": s.divergences,
        "target_step_ms": target_step_ms,
        "draft_step_ms": draft_step_ms,
        "median_target_call_ms": verify_ms,
    }


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _table(summary: dict[str, MethodSummary], methods: list[str], log: CallLog) -> str:
    nums = {m: _numbers(summary[m], summary["plain"], log) for m in methods}
    head = (
        f"{'method':12s} {'tok/pass':>8s} {'alpha':>6s} {'c':>6s} {'med ms':>8s} {'speedup':>8s} "
        f"{'decode x':>8s} {'prefill':>8s} {'draft%':>6s} {'identical':>9s}"
    )
    lines = [head, "-" * len(head)]
    for m in methods:
        n = nums[m]
        lines.append(
            f"{m:12s} {_fmt(n['tokens_per_pass'], '8.2f')} {_fmt(n['acceptance'], '6.2f')} "
            f"{_fmt(n['draft_cost_ratio'], '6.3f')} {n['median_ms']:8.1f} {_fmt(n['speedup_vs_plain'], '7.2f')}x "
            f"{_fmt(n['decode_speedup_vs_plain'], '7.2f')}x {_fmt(n['median_prefill_ms'], '8.1f')} "
            f"{_fmt(100 * n['draft_ms_share'] if n['draft_ms_share'] is not None else None, '5.1f')}% "
            f"{100 * (n['identical_rate'] or 0.0):8.0f}%"
        )
    lines.append(
        f"target step (plain, 1 token): {nums['plain']['target_step_ms']:.2f} ms (median); draft step "
        f"{_fmt(nums['hybrid']['draft_step_ms'], '.2f')} ms; c = draft-model step / target step (lookup: "
        "drafting ms per pass / target step); speedup = total wall time of plain / method (prefill "
        "included); decode x = the same without prefill; draft% = drafting share of decode time"
    )
    hybrid_total = nums["hybrid"]["total_ms"]
    for m in methods:
        if m.startswith("hf-") and hybrid_total:
            lines.append(f"hybrid vs {m}: {nums[m]['total_ms'] / hybrid_total:.2f}x faster")
    for m in methods:
        for d in nums[m]["divergences"]:
            lines.append(
                f"  {m}: diverges from plain at token {d['position']} (ref {d['ref']} got {d['got']}), "
                + describe_margin(d["top2_margin"])
            )
    return "\n".join(lines)


def _draft_length_sweep(
    engine: Any, base: Any, points: list[Point], opt: BenchOptions
) -> list[dict[str, Any]]:
    """The hybrid with ``draft_length`` g (the drafting policy capped at g): measured tokens per pass."""
    out = []
    for g in opt.draft_lengths:
        e = engine.with_settings(replace(base, draft_length=g, completion_reuse=False))
        runs = [_ours(e, p, f"sweep{g}-{i}", opt.max_tokens) for i, p in enumerate(points)]
        tokens = sum(len(r.tokens) for r in runs)
        passes = sum(r.passes for r in runs)
        drafted = sum(r.drafted for r in runs)
        accepted = sum(r.accepted for r in runs)
        out.append(
            {
                "draft_length": g,
                "tokens_per_pass": tokens / passes if passes else 0.0,
                "acceptance": accepted / drafted if drafted else 0.0,
                "median_ms": statistics.median(r.ms for r in runs),
            }
        )
    return out


def expected_tokens_per_pass(alpha: float, g: int) -> float:
    """(1 - alpha^(g+1)) / (1 - alpha): every pass drafting g tokens, each accepted with probability
    alpha (i.i.d.); what the policy could reach at most if it always drafted the whole length."""
    if alpha >= 1.0:
        return float(g + 1)
    return (1.0 - alpha ** (g + 1)) / (1.0 - alpha)


def _sweep_table(sweep: list[dict[str, Any]]) -> str:
    alpha = sweep[0]["acceptance"] if sweep and sweep[0]["draft_length"] == 1 else None
    lines = [f"{'length':>6s} {'tok/pass':>8s} {'alpha':>6s} {'theory':>7s} {'med ms':>8s}"]
    for row in sweep:
        a = alpha if alpha is not None else row["acceptance"]
        lines.append(
            f"{row['draft_length']:6d} {row['tokens_per_pass']:8.2f} {row['acceptance']:6.2f} "
            f"{expected_tokens_per_pass(a, row['draft_length']):7.2f} {row['median_ms']:8.1f}"
        )
    lines.append(
        "length = draft_length (the policy picks each pass's length up to it); theory = "
        "(1 - a^(g+1)) / (1 - a), every pass drafting g, with a = the acceptance measured at length 1"
    )
    return "\n".join(lines)


def _plot(sweep: list[dict[str, Any]], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.stderr.write("bench decode: matplotlib not installed; no plot\n")
        return
    if not sweep:
        return
    lengths = [r["draft_length"] for r in sweep]
    alpha = (
        sweep[0]["acceptance"]
        if sweep[0]["draft_length"] == 1
        else statistics.mean(r["acceptance"] for r in sweep)
    )
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(lengths, [r["tokens_per_pass"] for r in sweep], "o-", label="measured (hybrid)")
    xs = list(range(1, max(lengths) + 1))
    ax.plot(
        xs, [expected_tokens_per_pass(alpha, g) for g in xs], "--", label=f"(1-a^(g+1))/(1-a), a={alpha:.2f}"
    )
    ax.set_xlabel("draft_length (the most tokens a pass drafts)")
    ax.set_ylabel("tokens per target pass")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    sys.stderr.write(f"bench decode: plot written to {path}\n")
