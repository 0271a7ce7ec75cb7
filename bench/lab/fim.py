"""``python -m bench.lab.fim`` (from the repository root): which prompt layout keeps a model's fill-in-the-middle quality, and what each
costs a keystroke.

A PSM model (Qwen2.5-Coder: ``<fim_prefix> prefix <fim_suffix> suffix <fim_middle>``) puts the suffix
after the cursor's tokens, so every keystroke prefills the suffix window again; an SPM layout
(``<fim_prefix><fim_suffix> suffix <fim_middle> prefix``) prefills only the typed tokens, but the model
may not have been trained on it; a short suffix window is cheap to re-prefill but tells the model less.
This measures the trade on held-out lines instead of guessing:

- points: seeded held-out lines (``specls bench decode``'s points: CPython's ``test/`` files, line
  start and mid-line cursors), the rest of the cursor's line removed; a completion is an exact match
  when its first line equals the removed text (trailing spaces ignored);
- layouts: ``psm`` with suffix windows of ``--suffix-windows`` tokens, ``spm`` (the PSM family's
  tokens in SPM order, the widest window) and ``prefix`` (no FIM: the prefix alone);
- per layout: exact matches, and the prompt tokens after the cursor's position in the prompt (what a
  keystroke at the cursor makes the model prefill again, besides the typed tokens themselves).

Every completion is plain greedy on the same model, one line at most (``LINE_TOKENS``). The "ms per
point" column is what one cold completion cost, except for the PSM windows after the first, which
reuse its KV up to ``<fim_suffix>``: read it as a rough guide, ``specls bench lsp`` measures keystrokes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from specls.bench import int_list
from specls.bench.decode import Point, make_points, source_files
from specls.bench.real import end_of_line  # the stop of a one-line completion

LINE_TOKENS = 48  # a line's budget: longer held-out lines are rare and count as misses


@dataclass(frozen=True)
class FimBenchOptions:
    model: str | None = None  # None = the bundled target
    files: str | None = None  # glob; None = held-out stdlib test files
    n: int = 40
    seed: int = 0
    threads: int = 2
    # the prefix window of every layout: smaller than the served 672 so a 1.5B run takes minutes
    prefix_tokens: int = 384
    suffix_windows: tuple[int, ...] = (64, 32, 16)
    json_out: str | None = None


@dataclass(frozen=True)
class Layout:
    name: str
    order: str | None  # "psm" | "spm" | None (prefix only)
    suffix_tokens: int


@dataclass
class LayoutScore:
    layout: Layout
    exact: int = 0
    points: int = 0
    after_cursor: list[int] = field(default_factory=list)  # prompt tokens after the cursor's tokens
    ms: list[float] = field(default_factory=list)

    def row(self) -> dict[str, object]:
        n = max(1, self.points)
        return {
            "layout": self.layout.name,
            "exact": self.exact,
            "points": self.points,
            "exact_rate": round(self.exact / n, 4),
            "tokens_after_cursor": round(sum(self.after_cursor) / n, 1),
            "ms_per_point": round(sum(self.ms) / n, 1),
        }


def layouts(order: str, suffix_windows: tuple[int, ...]) -> list[Layout]:
    """The layouts to compare for a model whose own FIM order is ``order``: its order with each
    suffix window, the other order with the widest window, and prefix-only.

    >>> [(x.name, x.order, x.suffix_tokens) for x in layouts("psm", (64, 16))]
    [('psm-64', 'psm', 64), ('psm-16', 'psm', 16), ('spm-64', 'spm', 64), ('prefix', None, 0)]
    """
    other = "spm" if order == "psm" else "psm"
    wide = max(suffix_windows)
    out = [Layout(f"{order}-{s}", order, s) for s in suffix_windows]
    return [*out, Layout(f"{other}-{wide}", other, wide), Layout("prefix", None, 0)]


def line_task(point: Point) -> tuple[str, str, str]:
    """(prefix, suffix, expected): only the rest of the cursor's line is removed.

    >>> line_task(Point("f.py", "mid", "x = f(", "\\nz = 2\\n", "a, b)\\ny = 1"))
    ('x = f(', '\\ny = 1\\nz = 2\\n', 'a, b)')
    """
    line, nl, rest = point.middle.partition("\n")
    return point.prefix, nl + rest + point.suffix, line


def exact(completion: str, expected: str) -> bool:
    """The completion's first line is the removed text (trailing whitespace aside).

    >>> exact("a, b)  \\nmore", "a, b)"), exact("a, b", "a, b)")
    (True, False)
    """
    return completion.split("\n", 1)[0].rstrip() == expected.rstrip()


def tokens_after_cursor(prompt: list[int], order: str | None, suffix_id: int) -> int:
    """Prompt tokens after the last prefix token: PSM's ``<fim_suffix> suffix <fim_middle>``; none
    for SPM and prefix-only, where the prefix ends the prompt.

    >>> tokens_after_cursor([1, 7, 7, 2, 9, 9, 3], "psm", 2), tokens_after_cursor([1, 2, 9, 3, 7], "spm", 2)
    (4, 0)
    """
    return len(prompt) - prompt.index(suffix_id) if order == "psm" and suffix_id in prompt else 0


def run_bench(opt: FimBenchOptions, out: Any = sys.stdout) -> int:
    from specls.decoder.api import DecodeSettings
    from specls.decoder.loop import generate
    from specls.decoder.ngram import common_prefix_len
    from specls.decoder.text import TextStop

    from specls.api import EngineError
    from specls.engine import EngineSettings, OnnxEngine
    from specls.prompt import PromptBudget, PromptBuilder, visible_text

    say = sys.stderr.write
    loader = OnnxEngine(EngineSettings(model=opt.model, draft_model=False, threads=opt.threads))
    try:
        loader.load()
    except EngineError as exc:
        say(f"bench.lab.fim: {exc}\n")
        return 2
    models = loader.models
    fim = models.fim
    if fim is None:
        say("bench.lab.fim: the model has no FIM template; nothing to compare\n")
        return 2
    points = make_points(source_files(opt.files), opt.n, opt.seed)
    if not points:
        say("bench.lab.fim: no usable source files\n")
        return 2
    scores: list[tuple[PromptBuilder, LayoutScore]] = []
    for layout in layouts(fim.order, opt.suffix_windows):
        budget = PromptBudget(opt.prefix_tokens, layout.suffix_tokens, 0, models.budget.line_chunk)
        layout_fim = None if layout.order is None else replace(fim, order=layout.order)
        builder = PromptBuilder(models.tokenizer, layout_fim, budget, models.start_ids)
        scores.append((builder, LayoutScore(layout)))
    settings = DecodeSettings(max_new_tokens=LINE_TOKENS, draft_length=0)  # plain greedy: layouts, not speed
    say(f"bench.lab.fim: {len(points)} points, {len(scores)} layouts, {opt.threads} threads\n")
    for i, point in enumerate(points):
        prefix, suffix, expected = line_task(point)
        # one cache per point, cut to each prompt's common prefix with the last one: the PSM
        # layouts share everything up to <fim_suffix>, so only the first pays the prefix's prefill
        cache = models.target.new_cache()
        held: list[int] = []
        for builder, score in scores:
            prompt = builder.build(prefix, suffix).tokens
            keep = common_prefix_len(held, prompt)
            cache.truncate(min(keep, cache.length))
            stop = TextStop(models.tokenizer, end_of_line)
            t0 = time.perf_counter()
            result = generate(cache, prompt, None, settings, models.eos_ids, stop=stop)
            score.ms.append((time.perf_counter() - t0) * 1e3)
            held = [*prompt, *result.tokens][: cache.length]
            text = visible_text(models.tokenizer.decode(result.tokens)) if result.tokens else ""
            score.points += 1
            score.exact += int(exact(text, expected))
            score.after_cursor.append(tokens_after_cursor(prompt, score.layout.order, fim.suffix_id))
        say(
            f"  point {i + 1}/{len(points)} exact so far: " + " ".join(str(s.exact) for _, s in scores) + "\n"
        )
    rows = [s.row() for _, s in scores]
    out.write(render(rows, opt))
    if opt.json_out:
        with open(opt.json_out, "w", encoding="utf-8") as f:
            json.dump({"options": opt.__dict__, "rows": rows}, f, indent=2, default=list)
    return 0


def render(rows: list[dict[str, object]], opt: FimBenchOptions) -> str:
    """The table, one row per layout (Markdown)."""
    head = (
        f"FIM layouts, {opt.n} held-out lines (seed {opt.seed}), prefix window {opt.prefix_tokens} tokens\n\n"
        "| layout | exact match | tokens after the cursor (re-prefilled per keystroke) | ms per point |\n"
        "|---|---|---|---|\n"
    )
    body = "".join(
        f"| {r['layout']} | {r['exact']}/{r['points']} ({100 * float(str(r['exact_rate'])):.1f}%) "
        f"| {r['tokens_after_cursor']} | {r['ms_per_point']} |\n"
        for r in rows
    )
    return head + body


def build_parser() -> argparse.ArgumentParser:
    """The command's options (``python -m bench.lab.fim``); ``func`` is ``run``."""
    d = FimBenchOptions
    p = argparse.ArgumentParser(
        prog="python -m bench.lab.fim",
        description="FIM layouts (PSM suffix windows, SPM, prefix-only): exact match vs cost",
    )
    p.add_argument("--model", metavar="DIR", help="target model dir (default: bundled)")
    p.add_argument("--files", default=None, help="glob of source files (default: held-out stdlib tests)")
    p.add_argument("--n", type=int, default=d.n, help="held-out lines")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--threads", type=int, default=d.threads)
    p.add_argument("--prefix-tokens", type=int, default=d.prefix_tokens, help="prefix window of every layout")
    p.add_argument(
        "--suffix-windows",
        default=",".join(str(s) for s in d.suffix_windows),
        help="suffix windows (tokens) of the model's own order, comma-separated",
    )
    p.add_argument("--json", dest="json_out", default=None, help="save the numbers as JSON")
    p.set_defaults(func=run)
    return p


def options_from_args(args: argparse.Namespace) -> FimBenchOptions:
    try:
        windows = int_list(args.suffix_windows)
    except ValueError:
        bad = f"--suffix-windows must be integers (got {args.suffix_windows!r})"
        raise SystemExit(f"bench.lab.fim: {bad}") from None
    if not windows or min(windows) < 0 or args.n < 1 or args.prefix_tokens < 1:
        raise SystemExit("bench.lab.fim: --n, --prefix-tokens and --suffix-windows must be positive")
    return FimBenchOptions(
        model=args.model,
        files=args.files,
        n=args.n,
        seed=args.seed,
        threads=max(1, args.threads),
        prefix_tokens=args.prefix_tokens,
        suffix_windows=windows,
        json_out=args.json_out,
    )


def run(args: argparse.Namespace) -> int:
    return run_bench(options_from_args(args))


def main(argv: Sequence[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
