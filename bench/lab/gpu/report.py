"""The report of one run: its dataclasses, the markdown tables and the results-*.json/.md files."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.lab.gpu.shapes import METHODS


@dataclass(frozen=True)
class Prediction:
    method: str
    past_length: int
    alpha: float
    gamma: int
    tokens_per_pass: float
    speedup: float


@dataclass(frozen=True)
class LoopMeasurement:
    method: str
    alpha: float
    gamma: int
    prompt_tokens: int
    new_tokens: int
    greedy_ms: float
    spec_ms: float
    measured_speedup: float
    predicted_speedup: float
    target_passes: int
    drafted: int
    accepted: int
    realized_alpha: float | None
    predicted_at_realized: float | None  # the prediction at the acceptance rate this run drew
    # ... and with the plain loop's measured per-pass overhead (greedy ms / tokens - T(1)) added
    predicted_with_overhead: float | None
    matches_greedy: bool


@dataclass
class GpuBenchReport:
    date: str
    gpu: str
    backend: str
    provider: str
    draft_provider: str
    dtype: str
    shape: str
    target: dict[str, Any]
    draft: dict[str, Any]
    past_lengths: list[int]
    ns: list[int]
    warmup: int
    repeats: int
    target_ms: dict[int, dict[int, float]] = field(default_factory=dict)  # L -> N -> ms
    draft_ms: dict[int, float] = field(default_factory=dict)  # L -> ms per draft step
    truncate_ms: dict[int, float] = field(default_factory=dict)  # L -> ms per target cache truncate
    c: dict[int, float] = field(default_factory=dict)  # L -> draft step / T(1)
    alphas: dict[str, list[float]] = field(default_factory=dict)
    alpha_source: str = "default"
    predictions: list[Prediction] = field(default_factory=list)
    loop: list[LoopMeasurement] = field(default_factory=list)
    greedy_matches: bool = True
    loop_overhead_ms: float | None = None  # plain greedy ms per token - T(1): the loop's own cost per pass
    phases_s: dict[str, float] = field(default_factory=dict)
    host: str = ""
    exports: dict[str, dict[str, Any]] = field(default_factory=dict)  # role -> export.json facts (ort)
    batch_past_length: int | None = None  # L of the batched-pass sweep (None: not run)
    batched_ms: dict[int, dict[int, float]] = field(default_factory=dict)  # B -> N -> ms of one forward
    batched_error: str | None = None  # why the batched sweep failed (it did not stop the run)

    def verify_curve(self) -> dict[int, dict[int, float]]:
        """L -> N -> T(N)/T(1)."""
        return {L: {n: t / row[1] for n, t in row.items()} for L, row in self.target_ms.items() if 1 in row}

    def batching_speedup(self) -> dict[int, dict[int, float]]:
        """B -> N -> B * T(1 seq) / T(B seqs): how many single-sequence passes one batched pass is worth."""
        one = self.batched_ms.get(1, {})
        return {
            b: {n: b * one[n] / t for n, t in row.items() if n in one and t > 0}
            for b, row in self.batched_ms.items()
        }

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["target_ms"] = {
            str(L): {str(n): round(t, 4) for n, t in row.items()} for L, row in self.target_ms.items()
        }
        d["draft_ms"] = {str(L): round(t, 4) for L, t in self.draft_ms.items()}
        d["c"] = {str(L): round(v, 4) for L, v in self.c.items()}
        d["truncate_ms"] = {str(L): round(t, 4) for L, t in self.truncate_ms.items()}
        d["verify_curve"] = {
            str(L): {str(n): round(v, 4) for n, v in row.items()} for L, row in self.verify_curve().items()
        }
        d["batched_ms"] = {
            str(b): {str(n): round(t, 4) for n, t in row.items()} for b, row in self.batched_ms.items()
        }
        d["batching_speedup"] = {
            str(b): {str(n): round(v, 4) for n, v in row.items()}
            for b, row in self.batching_speedup().items()
        }
        return d


def render_markdown(r: GpuBenchReport) -> str:
    lines = [
        f"# bench.lab.gpu — {r.gpu}, {r.date}",
        "",
        f"- backend: {r.backend}; provider: target {r.provider}, draft {r.draft_provider}; dtype: {r.dtype}",
        f"- shapes ({r.shape}): target {r.target['describe']}; draft {r.draft['describe']}",
        f"- timing: median of {r.repeats} after {r.warmup} warm-up calls; cache truncated back to L each call",
        f"- host: {r.host}",
        *(
            [
                "- exports: "
                + "; ".join(
                    f"{role} ort_fusions={e.get('ort_fusions')} ({e.get('export_s')} s)"
                    for role, e in r.exports.items()
                )
            ]
            if r.exports
            else []
        ),
        "- phases (s): " + ", ".join(f"{k} {v:.1f}" for k, v in r.phases_s.items()),
        "",
        "## Target ms per pass, T(N) (and T(N)/T(1))",
        "",
        "| L | " + " | ".join(f"N={n}" for n in r.ns) + " | draft step ms | c | truncate ms |",
        "|---|" + "---|" * len(r.ns) + "---|---|---|",
    ]
    curve = r.verify_curve()
    for L in r.past_lengths:
        row = r.target_ms.get(L, {})
        cells = [f"{row[n]:.3f} ({curve[L][n]:.2f}x)" if n in row else "-" for n in r.ns]
        extra = [r.draft_ms.get(L), r.c.get(L), r.truncate_ms.get(L)]
        lines.append(
            f"| {L} | " + " | ".join(cells + [f"{v:.3f}" if v is not None else "-" for v in extra]) + " |"
        )
    lines += [
        "",
        f"## Predicted speedup over plain greedy (best gamma; acceptance rates: {r.alpha_source})",
        "",
        "tokens/pass = (1 - a^(g+1)) / (1 - a); cost = T(g+1) + g*c*T(1) (draft model) or T(g+1) (lookup)",
        "",
        "| method | a | " + " | ".join(f"L={L}: g, speedup" for L in r.past_lengths) + " |",
        "|---|---|" + "---|" * len(r.past_lengths),
    ]
    for method in METHODS:
        for a in r.alphas.get(method, []):
            cells = []
            for L in r.past_lengths:
                p = next(
                    (p for p in r.predictions if p.method == method and p.alpha == a and p.past_length == L),
                    None,
                )
                cells.append(f"g={p.gamma}, {p.speedup:.2f}x" if p else "-")
            lines.append(f"| {method} | {a:.2f} | " + " | ".join(cells) + " |")
    lines += _batched_table(r)
    if r.loop:
        lines += [
            "",
            "## Real decode loop vs prediction (forced acceptance, random-weight pair)",
            "",
            "Each drafted token is the target's own greedy token with probability a, else a wrong id; the "
            "draft-model rows also run the draft model for every drafted token. Speedups are plain "
            "greedy decode ms / speculative decode ms (medians). Loop overhead per pass (plain greedy ms "
            "per token - T(1)): "
            + (f"{r.loop_overhead_ms:.3f} ms." if r.loop_overhead_ms is not None else "-"),
            "",
            "| method | a | g | prompt | tokens | greedy ms | spec ms | measured | predicted | passes | "
            "accepted/drafted | realized a | predicted at realized a | + overhead, truncate | == greedy |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for m in r.loop:
            ra = f"{m.realized_alpha:.2f}" if m.realized_alpha is not None else "-"
            pr = f"{m.predicted_at_realized:.2f}x" if m.predicted_at_realized is not None else "-"
            po = f"{m.predicted_with_overhead:.2f}x" if m.predicted_with_overhead is not None else "-"
            lines.append(
                f"| {m.method} | {m.alpha:.2f} | {m.gamma} | {m.prompt_tokens} | {m.new_tokens} | "
                f"{m.greedy_ms:.1f} | {m.spec_ms:.1f} | {m.measured_speedup:.2f}x | "
                f"{m.predicted_speedup:.2f}x | {m.target_passes} | {m.accepted}/{m.drafted} | {ra} | "
                f"{pr} | {po} | {'yes' if m.matches_greedy else 'NO'} |"
            )
    return "\n".join(lines) + "\n"


def _batched_table(r: GpuBenchReport) -> list[str]:
    """The "batched target passes" section (empty when the sweep did not run)."""
    if r.batched_error:
        return ["", f"## Batched target passes: failed ({r.batched_error})"]
    if not r.batched_ms:
        return []
    ns = sorted({n for row in r.batched_ms.values() for n in row})
    speedup = r.batching_speedup()
    lines = [
        "",
        f"## Batched target passes (one target forward over B sequences, L={r.batch_past_length})",
        "",
        "ms of ONE forward over N new tokens of each of B sequences (batch dim B, every sequence with L "
        "cached positions, KV cache truncated back after each call; logits copied to the host as float32 "
        "as in T(N)), and the batching speedup B * T(1 seq) / T(B seqs).",
        "",
        "| B | " + " | ".join(f"N={n} ms | N={n} batching speedup" for n in ns) + " |",
        "|---|" + "---|---|" * len(ns),
    ]
    for b in sorted(r.batched_ms):
        cells = []
        for n in ns:
            t, s = r.batched_ms[b].get(n), speedup.get(b, {}).get(n)
            cells += [f"{t:.3f}" if t is not None else "-", f"{s:.2f}x" if s is not None else "-"]
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    return lines


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-").lower() or "unknown"


def write_report(report: GpuBenchReport, out_dir: Path) -> tuple[Path, Path]:
    """results-<date>-<gpu>.json and .md in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"results-{report.date[:10]}-{slug(report.gpu)}-{report.backend}"
    js = out_dir / f"{stem}.json"
    md = out_dir / f"{stem}.md"
    js.write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
    md.write_text(render_markdown(report), encoding="utf-8")
    return js, md
