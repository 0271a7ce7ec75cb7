"""``python -m bench.lab.gpu`` (run from the repository root): what speculative decoding buys on a GPU, predicted from measured pass costs and
checked against the real decode loop.

1. Builds random-weight target and draft models with transformers at real shapes (default: the shapes
   of Qwen2.5-Coder-1.5B and -0.5B; ``--shape small`` or explicit dims for a CPU dry run), with a tiny
   byte-level tokenizer (the benchmark feeds token ids, never text).
2. Exports both to ONNX (fp16 on CUDA) and loads them with the runtime (``--backend torch`` instead runs
   the same checkpoints in torch, no export: a GPU reference that needs no onnxruntime-gpu).
3. Measures T(N), the ms of one target pass over N new tokens at fixed past lengths L (warm-up, repeats,
   median; the cache is truncated back to L after each call), the draft model's ms per step (N=1), the
   cost ratio c = draft step / T(1) and the verify-cost curve T(N)/T(1). The torch backend also times
   batched target passes: one forward over B = 1, 2, 4, 8 sequences of N = 1, 6 new tokens at one past
   length, and the batching speedup B * T(1 seq) / T(B seqs).
4. Predicts each method's speedup with the standard model: tokens per pass (1 - a^(g+1)) / (1 - a),
   cost per pass T(g+1) + g*c*T(1) for the draft model and T(g+1) for prompt lookup (free drafts),
   speedup = tokens/pass * T(1) / cost, at the best g for each acceptance rate a.
5. Runs the real loop (``specls.decoder.loop.generate``) with a drafter that proposes the target's own
   greedy continuation, each token right with probability a (seeded), and for the draft-model method
   also pays for the draft model's steps; measured speedup over plain greedy vs the prediction, and
   the loop's tokens must equal plain greedy.

A lab benchmark, not part of the wheel: it needs nothing of specls' CLI, so it runs where pygls is
absent (the device image); ``scripts/device-bench.sh`` is its one command on a GPU machine.

Modules: ``shapes`` (model shapes, presets, settings), ``checkpoints`` (random-weight checkpoints,
reuse stamps), ``backends`` (torch / ONNX runtime pair), ``timing`` (pass timing), ``predict`` (the
cost model), ``loop`` (the forced-acceptance real loop), ``report`` (tables, JSON, markdown), ``run``
(one whole run), ``cli`` (options and the command). This package re-exports what callers use.
"""

from __future__ import annotations

from bench.lab.gpu.backends import (
    TorchBatchCache,
    TorchCache,
    TorchCausalLM,
    gpu_name,
    is_cuda_provider,
    load_pair,
    provider_of,
    resolve_provider,
)
from bench.lab.gpu.checkpoints import STAMP, build_checkpoint, export_facts, write_tokenizer
from bench.lab.gpu.cli import add_arguments, build_parser, main, run_command, settings_from_args
from bench.lab.gpu.loop import ForcedDrafter, greedy_reference, run_loop
from bench.lab.gpu.predict import (
    alpha_from_counts,
    best_gamma,
    expected_tokens,
    interp_cost,
    load_acceptance,
    predicted_speedup,
    predicted_speedup_with_overhead,
)
from bench.lab.gpu.report import (
    GpuBenchReport,
    LoopMeasurement,
    Prediction,
    render_markdown,
    slug,
    write_report,
)
from bench.lab.gpu.run import run_bench
from bench.lab.gpu.shapes import (
    DEFAULT_ALPHAS,
    METHODS,
    QWEN25_CODER_0_5B,
    QWEN25_CODER_1_5B,
    SHAPES,
    SMALL_DRAFT,
    SMALL_TARGET,
    SPECIAL_TOKENS,
    BenchError,
    GpuBenchSettings,
    ModelShape,
    ShapePreset,
    validate_settings,
)
from bench.lab.gpu.timing import PassTimes, time_batched_passes, time_passes

__all__ = [
    "DEFAULT_ALPHAS",
    "METHODS",
    "QWEN25_CODER_0_5B",
    "QWEN25_CODER_1_5B",
    "SHAPES",
    "SMALL_DRAFT",
    "SMALL_TARGET",
    "SPECIAL_TOKENS",
    "STAMP",
    "BenchError",
    "ForcedDrafter",
    "GpuBenchReport",
    "GpuBenchSettings",
    "LoopMeasurement",
    "ModelShape",
    "PassTimes",
    "Prediction",
    "ShapePreset",
    "TorchBatchCache",
    "TorchCache",
    "TorchCausalLM",
    "add_arguments",
    "alpha_from_counts",
    "best_gamma",
    "build_parser",
    "build_checkpoint",
    "expected_tokens",
    "export_facts",
    "gpu_name",
    "greedy_reference",
    "interp_cost",
    "is_cuda_provider",
    "load_acceptance",
    "load_pair",
    "main",
    "predicted_speedup",
    "predicted_speedup_with_overhead",
    "provider_of",
    "render_markdown",
    "resolve_provider",
    "run_bench",
    "run_command",
    "run_loop",
    "settings_from_args",
    "slug",
    "time_batched_passes",
    "time_passes",
    "validate_settings",
    "write_report",
    "write_tokenizer",
]
