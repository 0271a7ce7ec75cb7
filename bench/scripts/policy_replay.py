"""Replay the drafting policy on recorded real-pair traces, without the models: tokens per pass and
the estimated speedup of a policy change in seconds instead of a 10-minute benchmark.

Greedy decoding makes this exact: the target's output on a point is one fixed path, so whether a drafted
token is accepted depends only on that path; the draft model's greedy proposals along the path are
fixed too (one teacher-forced pass per view start). ``collect`` runs the real pair once per point and
records the prompt, the target's greedy path and the draft model's argmax at every position of it;
``replay`` runs the real engine (prompt building, lookup, policy, decode loop) on oracle models that
answer from the trace, and prices each pass with the pair's calibrated costs (``PassCosts``).

    .venv/bin/python bench/scripts/policy_replay.py collect --model T --draft D --n 24 --out traces.json
    .venv/bin/python bench/scripts/policy_replay.py replay traces.json

Cost model (units of one plain target pass): a verify pass over g+1 tokens ``verify_cost(g)``, a draft
feed of n tokens interpolated between one step (n = 1) and ``16 * catchup`` (n = 16, how calibration
measures catch-up). Attention growing with the context is not modelled (the benchmark has it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from specls.decoder.api import CausalLM, KVCache
from specls.decoder.drafters import draft_view_start
from specls.decoder.planned import PolicyState
from specls.decoder.policy import PassCosts

GARBAGE = 0  # an off-path row's answer: nobody's proposal matches it where it matters


@dataclass
class Trace:
    path: str
    cursor: int
    prefix: str
    suffix: str
    prompt: list[int]
    greedy: list[int]  # the target's plain greedy tokens after the prompt
    draft: dict[int, list[int]]  # view start -> draft argmax after prompt + greedy[:j], j = 0..len


@dataclass
class Tally:
    passes: list[int] = field(default_factory=list)  # target decode passes: tokens per pass
    feeds: list[int] = field(default_factory=list)  # draft feeds: tokens per feed

    def clear(self) -> None:
        self.passes.clear()
        self.feeds.clear()


class _OracleCache(KVCache):
    def __init__(self, model: _Oracle) -> None:
        self.model = model
        self.tokens: list[int] = []

    @property
    def length(self) -> int:
        return len(self.tokens)

    def forward(self, ids: Sequence[int]) -> np.ndarray:
        nxt = self._next(ids)
        rows = np.zeros((len(nxt), self.model.vocab), dtype=np.float32)
        rows[np.arange(len(nxt)), nxt] = 1.0
        return rows  # [n, vocab]

    def forward_greedy(self, ids: Sequence[int]) -> np.ndarray:
        return np.asarray(self._next(ids), dtype=np.int64)

    def append(self, ids: Sequence[int]) -> None:
        self._next(ids)

    def truncate(self, n: int) -> None:
        del self.tokens[n:]

    def _next(self, ids: Sequence[int]) -> list[int]:
        start = len(self.tokens)
        self.tokens.extend(int(t) for t in ids)
        self.model.count(start, len(ids))
        return [self.model.next_after(self.tokens, p) for p in range(start, len(self.tokens))]


class _Oracle(CausalLM):
    """A CausalLM answering from a trace: ``target`` (the greedy path) or a draft (its argmax table)."""

    def __init__(self, vocab: int, granularity: int, is_draft: bool, tally: Tally) -> None:
        self.vocab = vocab
        self.granularity = granularity
        self.is_draft = is_draft
        self.tally = tally
        self.trace: Trace | None = None
        self.full: list[int] = []

    def set_trace(self, trace: Trace) -> None:
        self.trace = trace
        self.full = trace.prompt + trace.greedy

    @property
    def vocab_size(self) -> int:
        return self.vocab

    @property
    def pass_granularity(self) -> int:
        return self.granularity

    def new_cache(self) -> _OracleCache:
        return _OracleCache(self)

    def count(self, start: int, n: int) -> None:
        if self.is_draft:
            self.tally.feeds.append(n)
        elif self.trace is not None and start >= len(self.trace.prompt) - 1:  # not the prefill's
            self.tally.passes.append(n)

    def next_after(self, tokens: list[int], pos: int) -> int:
        """The model's argmax after tokens[: pos + 1]."""
        assert self.trace is not None
        t = self.trace
        p = len(t.prompt)
        if self.is_draft:
            for s, preds in t.draft.items():  # the view start whose tokens these are
                n = pos + 1  # tokens seen, from view start s
                if s + n < p or self.full[s : s + n] != tokens[:n]:
                    continue
                j = s + n - p
                return preds[j] if j < len(preds) else GARBAGE
            return GARBAGE
        if pos + 1 < p or tokens[p : pos + 1] != self.full[p : pos + 1] or tokens[:p] != t.prompt:
            return GARBAGE
        j = pos + 1 - p
        return t.greedy[j] if j < len(t.greedy) else GARBAGE


def feed_cost(n: int, costs: PassCosts) -> float:
    if n <= 1:
        return costs.step
    at16 = 16 * costs.catchup
    if n >= 16:
        return n * costs.catchup
    return costs.step + (n - 1) * (at16 - costs.step) / 15


def draft_predictions(
    draft: Any, full: list[int], p: int, windows: Sequence[int], have: Sequence[int] = ()
) -> dict[int, list[int]]:
    """The draft's argmax after full[:p + j], j = 0 .. len(full) - p, from each view start that the
    windows give (``draft_view_start``) and ``have`` lacks."""
    preds: dict[int, list[int]] = {}
    starts = {draft_view_start(n, w) for w in windows for n in range(p, len(full) + 1)} - set(have)
    for s in sorted(starts):
        cache = draft.new_cache()
        if s < p:
            first = [int(np.argmax(cache.forward_last(full[s:p])))]
            rest = np.argmax(cache.forward(full[p:]), axis=-1).tolist() if len(full) > p else []
        else:  # the view starts inside the generated tokens: no prediction before it
            first = [GARBAGE] * (s - p + 1)
            rest = np.argmax(cache.forward(full[s:]), axis=-1).tolist() if len(full) > s else []
        preds[s] = [*first, *[int(x) for x in rest]]
    return preds


def extend(args: argparse.Namespace) -> int:
    """Add the draft's predictions for more view windows to a trace file (the target is not rerun)."""
    from specls.models.loader import load_model
    from specls.models.runtime import RuntimeSettings

    data, traces = load_traces(args.traces)
    draft = load_model(data["options"]["draft"], RuntimeSettings(threads=args.threads, even_passes=False))
    windows = [int(w) for w in args.windows.split(",")]
    for i, t in enumerate(traces):
        t.draft.update(draft_predictions(draft, t.prompt + t.greedy, len(t.prompt), windows, list(t.draft)))
        data["traces"][i]["draft"] = {str(k): v for k, v in t.draft.items()}
        sys.stderr.write(f"[{i + 1}/{len(traces)}] {len(t.draft)} view starts\n")
    Path(args.traces).write_text(json.dumps(data))
    return 0


def collect(args: argparse.Namespace) -> int:
    from specls.bench.decode import make_points, source_files
    from specls.bench.real import _specls_run
    from specls.engine import EngineSettings, OnnxEngine

    base = EngineSettings(
        model=args.model, draft=args.draft, threads=args.threads, lru_size=0, completion_reuse=False
    )
    engine = OnnxEngine(base)
    engine.load()
    plain = engine.with_settings(replace(base, speculation=False))
    draft = engine.models.draft
    assert draft is not None
    window = base.drafters.draft_window
    traces = []
    for i, point in enumerate(make_points(source_files(None), args.n, args.seed)):
        t0 = time.perf_counter()
        run = _specls_run(plain, point, f"p{i}", args.max_tokens, "64")
        prompt = list(plain.last_prompt)
        full = prompt + run.tokens
        p = len(prompt)
        preds = draft_predictions(draft, full, p, [window])
        traces.append(
            Trace(point.path, len(point.prefix), point.prefix, point.suffix, prompt, run.tokens, preds)
        )
        sys.stderr.write(
            f"[{i + 1}/{args.n}] {Path(point.path).name}: {len(run.tokens)} tokens, {time.perf_counter() - t0:.1f} s\n"
        )
    costs = engine.models.policy.costs
    out = {
        "options": vars(args) | {"func": None},
        "costs": {"verify": list(costs.verify), "step": costs.step, "catchup": costs.catchup},
        "granularity": engine.models.target.pass_granularity,
        "vocab": engine.models.target.vocab_size,
        "traces": [t.__dict__ | {"draft": {str(k): v for k, v in t.draft.items()}} for t in traces],
    }
    Path(args.out).write_text(json.dumps(out))
    return 0


def load_traces(path: str) -> tuple[dict[str, Any], list[Trace]]:
    data = json.loads(Path(path).read_text())
    traces = [Trace(**(t | {"draft": {int(k): v for k, v in t["draft"].items()}})) for t in data["traces"]]
    return data, traces


def replay(args: argparse.Namespace) -> int:
    from specls.models.facts import model_facts
    from specls.models.loader import load_model

    from specls.api import CompletionRequest
    from specls.bench.real import end_of_line
    from specls.engine import EngineSettings, LoadedModels, OnnxEngine

    data, traces = load_traces(args.traces)
    c = data["costs"]
    costs = PassCosts(
        tuple(c["verify"]) if args.verify is None else tuple(float(x) for x in args.verify.split(",")),
        c["step"] if args.step is None else args.step,
        c["catchup"] if args.catchup is None else args.catchup,
    )
    tally = Tally()
    target = _Oracle(data["vocab"], data["granularity"], False, tally)
    draft = _Oracle(data["vocab"], 1, True, tally)
    real = load_model(data["options"]["model"])  # for its tokenizer and prompt facts only
    tok, prompt_facts = real.tokenizer, model_facts(real).prompt
    models = LoadedModels(
        target=target,
        tokenizer=tok,
        fim=prompt_facts.fim,
        eos_ids=prompt_facts.eos_ids,
        draft=draft,
        budget=prompt_facts.budget,
        start_ids=prompt_facts.start_ids,
        policy=PolicyState(costs=costs),
        lookup_policy=PolicyState(costs=costs),
    )
    base = EngineSettings(model=data["options"]["model"], lru_size=0, completion_reuse=False)
    base = _with(base, args.set)
    engine = OnnxEngine(base, models)
    variants = {"lookup": engine.with_settings(replace(base, draft_model=False)), "hybrid": engine}
    tasks = args.tasks.split(",")
    totals: dict[tuple[str, str], list[float]] = {}
    for i, t in enumerate(traces):
        target.set_trace(t)
        draft.set_trace(t)
        for task in tasks:
            for name, e in variants.items():
                tally.clear()
                doc = f"p{i}-{task}-{name}"
                e.update_document(doc, t.prefix + t.suffix)
                e.flush()
                stop = end_of_line if task == "short" else None
                e.complete(CompletionRequest(doc, t.prefix, t.suffix, len(t.greedy), stop=stop))
                e.close_document(doc)
                assert list(e.last_prompt) == t.prompt, "the prompt differs from the trace's"
                got = list(e.last_tokens)
                assert got == t.greedy[: len(got)], f"point {i} {name}: output left the greedy path"
                n = len(got)
                cost = sum(costs.verify_cost(g - 1) for g in tally.passes) + sum(
                    feed_cost(f, costs) for f in tally.feeds
                )
                row = totals.setdefault((task, name), [0.0, 0.0, 0.0, 0.0, 0.0])
                plain_cost = max(0, n - 1)  # plain: the prefill gives the first token
                row[0] += n
                row[1] += len(tally.passes)
                row[2] += cost
                row[3] += plain_cost
                row[4] += sum(tally.feeds)
                if args.verbose:
                    big = [f for f in tally.feeds if f > 1]
                    print(
                        f"  {i:2d} {task} {name:7s} {n:3d} tok {len(tally.passes):3d} passes cost {cost:6.1f} "
                        f"feeds {len(tally.feeds)} ({sum(tally.feeds)} tok; multi {big})"
                    )
    print(
        f"{'task':6s} {'method':7s} {'tokens':>7s} {'tok/pass':>8s} {'cost':>8s} {'est x':>6s} {'draft tok':>9s}"
    )
    for (task, name), row in totals.items():
        tokens, passes, cost, plain, fed = row
        print(
            f"{task:6s} {name:7s} {tokens:7.0f} {tokens / max(passes, 1):8.2f} {cost:8.1f} {plain / max(cost, 1e-9):6.2f} {fed:9.0f}"
        )
    print(json.dumps(models.policy.snapshot()))
    print(
        f"costs: step {costs.step:.3f}, catch-up {costs.catchup:.4f}, verify {[round(v, 3) for v in costs.verify]}"
    )
    return 0


def bound(args: argparse.Namespace) -> int:
    """How much better lookup could choose among its candidates: tokens per pass of lookup alone, free
    to propose any length, when each pass takes (a) the most recent occurrence of the longest matching
    context tail (what ``lookup`` does), (b) the best occurrence of that tail, (c) the best occurrence
    of any tail of 2..8 tokens. Sources: the prompt and the tokens generated so far."""
    _, traces = load_traces(args.traces)
    tot = {"recent": [0, 0], "best-of-longest": [0, 0], "best-any": [0, 0]}
    for t in traces:
        full = t.prompt + t.greedy
        p = len(t.prompt)
        for rule in tot:
            j = p
            while j < len(full):
                ctx = full[:j]
                acc = _lookup_accept(ctx, full[j:], rule, args.min_n, args.max_n)
                step = min(acc + 1, len(full) - j)
                tot[rule][0] += step
                tot[rule][1] += 1
                j += step
    for rule, (n, passes) in tot.items():
        print(f"{rule:16s} tok/pass {n / max(passes, 1):.3f} ({n} tokens, {passes} passes)")
    return 0


def _lookup_accept(ctx: list[int], truth: list[int], rule: str, min_n: int, max_n: int) -> int:
    """Accepted tokens of the lookup proposal ``rule`` picks (see ``bound``)."""
    best = 0
    for n in range(max_n, min_n - 1, -1):
        if len(ctx) < n:
            continue
        tail = ctx[-n:]
        starts = [i + n for i in range(len(ctx) - n) if ctx[i : i + n] == tail]
        if not starts:
            continue
        for s in reversed(starts):
            k = 0
            while k < len(truth) and (ctx + truth)[s + k] == truth[k]:
                k += 1
            if rule == "recent":
                return k
            best = max(best, k)
        if rule == "best-of-longest":
            return best
    return best


def _with(settings: Any, assignments: Sequence[str]) -> Any:
    """``EngineSettings`` with ``name=value`` changes (``drafters.name=value`` for ``DrafterSettings``)."""
    for a in assignments:
        key, value = a.split("=", 1)
        target, name = (settings, key) if "." not in key else (settings.drafters, key.split(".", 1)[1])
        old = getattr(target, name)
        new: Any = value.lower() in ("1", "true", "yes") if isinstance(old, bool) else type(old)(value)
        if target is settings:
            settings = replace(settings, **{name: new})
        else:
            settings = replace(settings, drafters=replace(settings.drafters, **{name: new}))
    return settings


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(required=True)
    c = sub.add_parser("collect")
    c.add_argument("--model", required=True)
    c.add_argument("--draft", required=True)
    c.add_argument("--n", type=int, default=24)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--max-tokens", type=int, default=64)
    c.add_argument("--threads", type=int, default=2)
    c.add_argument("--out", required=True)
    c.set_defaults(func=collect)
    r = sub.add_parser("replay")
    r.add_argument("traces")
    r.add_argument("--tasks", default="64,short")
    r.add_argument("--step", type=float, help="draft step cost (default: the recorded calibration)")
    r.add_argument("--catchup", type=float, help="draft catch-up cost per token")
    r.add_argument("--verbose", action="store_true", help="one line per point and method")
    r.add_argument("--verify", help="verify costs g = 0, 1, ... (comma-separated)")
    r.add_argument(
        "--set", action="append", default=[], help="EngineSettings name=value (drafters.name=value)"
    )
    r.set_defaults(func=replay)
    x = sub.add_parser("extend")
    x.add_argument("traces")
    x.add_argument("--windows", required=True, help="draft windows, comma-separated")
    x.add_argument("--threads", type=int, default=2)
    x.set_defaults(func=extend)
    b = sub.add_parser("bound")
    b.add_argument("traces")
    b.add_argument("--min-n", type=int, default=2)
    b.add_argument("--max-n", type=int, default=4)
    b.set_defaults(func=bound)
    args = ap.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
