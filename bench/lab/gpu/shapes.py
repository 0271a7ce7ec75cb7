"""Model shapes, presets and the settings of one ``bench.lab.gpu`` run (plus their validation)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

METHODS = ("lookup", "draft")
# Default acceptance rates when no `specls bench decode --json` result is given: prompt lookup on code
# ranges from ~0.3 (fresh code) to ~0.9 (edits of text already in a buffer); a same-family draft model
# (Qwen2.5-Coder 0.5B for 1.5B) typically accepts 0.6-0.8 of greedy tokens on code.
DEFAULT_ALPHAS: dict[str, tuple[float, ...]] = {
    "lookup": (0.3, 0.5, 0.7, 0.9),
    "draft": (0.6, 0.7, 0.8),
}
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)


class BenchError(RuntimeError):
    """A benchmark that cannot run as asked (bad option, no CUDA with --require-cuda, ...)."""


# ---------------------------------------------------------------------------------------------
# Shapes and settings
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer's dimensions (Qwen2 or Llama layout)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    arch: str = "qwen2"  # "qwen2" (q/k/v biases) | "llama"
    tie_embeddings: bool = True
    max_positions: int = 32768

    def params(self) -> int:
        """Parameter count (embeddings counted once when tied)."""
        head_dim = self.hidden // self.heads
        attn = self.hidden * head_dim * (self.heads * 2 + self.kv_heads * 2)
        if self.arch == "qwen2":
            attn += head_dim * (self.heads + 2 * self.kv_heads)
        mlp = 3 * self.hidden * self.intermediate
        per_layer = attn + mlp + 2 * self.hidden
        emb = self.vocab * self.hidden * (1 if self.tie_embeddings else 2)
        return self.layers * per_layer + emb + self.hidden

    def describe(self) -> str:
        return (
            f"{self.arch} h{self.hidden} L{self.layers} heads {self.heads}/{self.kv_heads} "
            f"ffn {self.intermediate} vocab {self.vocab} ({self.params() / 1e6:.1f}M params)"
        )


QWEN25_CODER_1_5B = ModelShape(hidden=1536, layers=28, heads=12, kv_heads=2, intermediate=8960, vocab=151936)
QWEN25_CODER_0_5B = ModelShape(hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864, vocab=151936)
SMALL_TARGET = ModelShape(
    hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=512, max_positions=4096
)
SMALL_DRAFT = ModelShape(
    hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64, vocab=512, max_positions=4096
)


@dataclass(frozen=True)
class ShapePreset:
    target: ModelShape
    draft: ModelShape
    past_lengths: tuple[int, ...]
    ns: tuple[int, ...]
    gen_tokens: int
    warmup: int
    repeats: int


SHAPES: dict[str, ShapePreset] = {
    "full": ShapePreset(QWEN25_CODER_1_5B, QWEN25_CODER_0_5B, (512, 2048), (1, 2, 4, 8, 16), 128, 3, 10),
    "small": ShapePreset(SMALL_TARGET, SMALL_DRAFT, (64, 256), (1, 2, 4, 8, 16), 128, 3, 20),
}


@dataclass(frozen=True)
class GpuBenchSettings:
    """Everything one `bench.lab.gpu` run does. Passed whole."""

    target: ModelShape
    draft: ModelShape
    shape_name: str = "custom"
    backend: str = "ort"  # "ort" (export + specls.models.runtime) | "torch" (transformers, no export)
    dtype: str = "auto"  # "auto" (fp16 on CUDA, fp32 otherwise) | "fp32" | "fp16"
    provider: str = "auto"  # "auto" | "cuda" | "cpu"
    require_cuda: bool = False
    threads: int = 1  # CPU threads for the runtime (0 = its default)
    past_lengths: tuple[int, ...] = (512, 2048)
    ns: tuple[int, ...] = (1, 2, 4, 8, 16)
    warmup: int = 3
    repeats: int = 10
    alphas: tuple[tuple[str, tuple[float, ...]], ...] = tuple(DEFAULT_ALPHAS.items())
    alpha_source: str = "default"
    loop: bool = True
    loop_alphas: tuple[float, ...] = (0.5, 0.8)
    loop_repeats: int = 2
    gen_tokens: int = 128
    prompt_tokens: int = 0  # 0 = the smallest past length
    batched: bool = (
        True  # the batched-pass sweep (torch: batch-dim forward; ort: the runtime's forward_batch)
    )
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8)  # B: sequences in one target forward (must hold 1)
    batch_ns: tuple[int, ...] = (1, 6)  # N: new tokens per sequence (6 = a gamma-5 verify)
    batch_past_length: int = 0  # L of every sequence; 0 = the smallest past length
    seed: int = 0
    verify_export: bool = False
    ort_fusions: str | None = None  # export's ORT fusion mode (None = the export's default)
    reuse: bool = False  # reuse checkpoints/exports in work_dir from an earlier run (same shape/seed/dtype)
    work_dir: Path | None = None  # where checkpoints and exports go (None = a temp dir, removed)
    out_dir: Path | None = None

    def alpha_map(self) -> dict[str, tuple[float, ...]]:
        return dict(self.alphas)

    def batch_length(self) -> int:
        """The past length of the batched-pass sweep."""
        return self.batch_past_length or min(self.past_lengths)


def _validate_batched(settings: GpuBenchSettings) -> None:
    """The batched-pass sweep's settings (only checked when it runs)."""
    if not settings.batch_sizes or 1 not in settings.batch_sizes or any(b < 1 for b in settings.batch_sizes):
        raise BenchError(f"--batch-sizes must hold 1 and positive sizes, got {list(settings.batch_sizes)}")
    if not settings.batch_ns or any(n < 1 for n in settings.batch_ns):
        raise BenchError(f"--batch-ns must be positive, got {list(settings.batch_ns)}")
    if settings.batch_past_length < 0:
        raise BenchError(f"--batch-past-length must be >= 0, got {settings.batch_past_length}")
    if settings.target.max_positions < settings.batch_length() + max(settings.batch_ns):
        raise BenchError(
            f"batched past length {settings.batch_length()} exceeds {settings.target.max_positions} positions"
        )


def validate_settings(settings: GpuBenchSettings) -> None:
    if not settings.ns or 1 not in settings.ns or any(n < 1 for n in settings.ns):
        raise BenchError(f"--ns must hold 1 and positive sizes, got {list(settings.ns)}")
    if not settings.past_lengths or any(L < 1 for L in settings.past_lengths):
        raise BenchError(f"--past-lengths must be positive, got {list(settings.past_lengths)}")
    if settings.repeats < 1 or settings.warmup < 0:
        raise BenchError("--repeats must be >= 1 and --warmup >= 0")
    if settings.batched:
        _validate_batched(settings)
    for shape in (settings.target, settings.draft):
        if shape.hidden % shape.heads or shape.heads % shape.kv_heads:
            raise BenchError(f"bad shape {shape.describe()}: hidden % heads and heads % kv_heads must be 0")
        if shape.max_positions < max(settings.past_lengths) + max(settings.ns):
            raise BenchError(
                f"past length {max(settings.past_lengths)} exceeds {shape.max_positions} positions"
            )
    if settings.target.vocab != settings.draft.vocab:
        raise BenchError("target and draft must share the vocab (same tokenizer)")
    if settings.target.vocab < 256 + len(SPECIAL_TOKENS):
        raise BenchError(
            f"vocab {settings.target.vocab} is too small for a byte-level tokenizer (needs >= 263)"
        )
    if settings.gen_tokens < 2:
        raise BenchError("--gen-tokens must be >= 2")
    for a in settings.loop_alphas:
        if not 0.0 <= a <= 1.0:
            raise BenchError(f"acceptance rate {a} outside [0, 1]")
