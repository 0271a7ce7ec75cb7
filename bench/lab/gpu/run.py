"""One whole run: build/export/load the pair, time the passes, predict, run the loop."""

from __future__ import annotations

import datetime as _dt
import logging
import platform
import tempfile
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from specls.decoder.api import CausalLM

from bench.lab.gpu.backends import (
    RuntimeBatchLM,
    TorchCausalLM,
    gpu_name,
    is_cuda_provider,
    load_pair,
    provider_of,
    resolve_provider,
)
from bench.lab.gpu.checkpoints import export_facts
from bench.lab.gpu.loop import run_loop
from bench.lab.gpu.predict import best_gamma, expected_tokens
from bench.lab.gpu.report import GpuBenchReport, Prediction, write_report
from bench.lab.gpu.shapes import BenchError, GpuBenchSettings, validate_settings
from bench.lab.gpu.timing import phase, time_batched_passes, time_passes

log = logging.getLogger(__name__)


def run_bench(settings: GpuBenchSettings, progress: Callable[[str], None] | None = None) -> GpuBenchReport:
    """Build, export, load, measure, predict, run the loop. Raises BenchError on a run that cannot go
    as asked (e.g. --require-cuda without CUDA)."""
    say = progress or (lambda msg: log.info("%s", msg))
    validate_settings(settings)
    provider, dtype = resolve_provider(settings)
    phases: dict[str, float] = {}
    tmp: tempfile.TemporaryDirectory[str] | None = None
    if settings.work_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="specls-bench-gpu-")
        work = Path(tmp.name)
    else:
        work = Path(settings.work_dir)
        work.mkdir(parents=True, exist_ok=True)
    try:
        say(
            f"building {settings.backend} pair: target {settings.target.describe()}; draft {settings.draft.describe()}"
        )
        target, draft = load_pair(settings, work, provider, dtype, phases)
        got = provider_of(target)
        say(f"provider: target {got}, draft {provider_of(draft)}; dtype {dtype}")
        if settings.require_cuda and not (is_cuda_provider(got) and is_cuda_provider(provider_of(draft))):
            raise BenchError(f"--require-cuda: the runtime runs on {got} / {provider_of(draft)}, not CUDA")
        report = GpuBenchReport(
            date=_dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            gpu=gpu_name(),
            backend=settings.backend,
            provider=got,
            draft_provider=provider_of(draft),
            dtype=dtype,
            shape=settings.shape_name,
            target={**asdict(settings.target), "describe": settings.target.describe()},
            draft={**asdict(settings.draft), "describe": settings.draft.describe()},
            past_lengths=list(settings.past_lengths),
            ns=sorted(settings.ns),
            warmup=settings.warmup,
            repeats=settings.repeats,
            alphas={m: list(v) for m, v in settings.alphas},
            alpha_source=settings.alpha_source,
            phases_s=phases,
            host=f"{platform.node()} {platform.machine()} python {platform.python_version()}",
        )
        if settings.backend == "ort":
            report.exports = {role: export_facts(work / f"{role}-onnx") for role in ("target", "draft")}
        with phase(phases, "passes"):
            for L in settings.past_lengths:
                times = time_passes(target, L, report.ns, settings.warmup, settings.repeats, settings.seed)
                report.target_ms[L] = times.forward_ms
                report.truncate_ms[L] = times.truncate_ms
                report.draft_ms[L] = time_passes(
                    draft, L, (1,), settings.warmup, settings.repeats, settings.seed
                ).forward_ms[1]
                report.c[L] = report.draft_ms[L] / report.target_ms[L][1]
                say(
                    f"L={L}: T(N) ms "
                    + ", ".join(f"{n}:{t:.3f}" for n, t in report.target_ms[L].items())
                    + f"; draft step {report.draft_ms[L]:.3f} ms; c={report.c[L]:.3f}"
                )
        gamma_max = max(report.ns) - 1
        for L in settings.past_lengths:
            for method, alphas in settings.alphas:
                for a in alphas:
                    g, s = best_gamma(report.target_ms[L], report.c[L], a, method, gamma_max)
                    report.predictions.append(Prediction(method, L, a, g, expected_tokens(a, g), s))
        if settings.batched:
            _batched_sweep(settings, report, target, phases, say)
        if settings.out_dir is not None and settings.loop:
            # the pass costs and predictions survive a run killed during the loop (device time limits)
            write_report(report, settings.out_dir)
        if settings.loop:
            with phase(phases, "loop"):
                run_loop(settings, report, target, draft, say)
        return report
    finally:
        if tmp is not None:
            tmp.cleanup()


def _batched_sweep(
    settings: GpuBenchSettings,
    report: GpuBenchReport,
    target: CausalLM,
    phases: dict[str, float],
    say: Callable[[str], None],
) -> None:
    """The batched-pass sweep (torch backend): one target forward over B sequences, for each (B, N). A
    failure (e.g. out of memory) is reported and the run goes on to the loop."""
    batch_lm: Any
    if isinstance(target, TorchCausalLM):
        batch_lm = target
    elif callable(getattr(target, "enable_batching", None)) and target.enable_batching():  # type: ignore[attr-defined]
        batch_lm = RuntimeBatchLM(target)  # the runtime's own batched path: gather, batch graph, split
    else:
        say(f"batched target passes: the {settings.backend} target has no dynamic-batch graph, skipped")
        return
    L = settings.batch_length()
    report.batch_past_length = L
    try:
        with phase(phases, "batched"):
            report.batched_ms = time_batched_passes(
                batch_lm,
                L,
                sorted(settings.batch_sizes),
                sorted(settings.batch_ns),
                settings.warmup,
                settings.repeats,
                settings.seed,
            )
    except Exception as exc:  # out-of-memory and device errors (torch, onnxruntime): report, go on
        report.batched_error = f"{type(exc).__name__}: {exc}"
        log.warning("batched target passes failed: %s", exc)
        say(f"batched target passes failed: {report.batched_error}")
        return
    speedup = report.batching_speedup()
    for b, row in report.batched_ms.items():
        say(
            f"batched L={L} B={b}: "
            + ", ".join(f"N={n} {t:.3f} ms ({speedup[b][n]:.2f}x)" for n, t in row.items())
        )
