"""``specls bench gpu``: what speculative decoding buys on a GPU, predicted from measured pass costs and
checked against the real decode loop.

1. Builds random-weight target and draft models with transformers at real shapes (default: the shapes
   of Qwen2.5-Coder-1.5B and -0.5B; ``--shape small`` or explicit dims for a CPU dry run), with a tiny
   byte-level tokenizer (the benchmark feeds token ids, never text).
2. Exports both to ONNX (fp16 on CUDA) and loads them with the runtime (``--backend torch`` instead runs
   the same checkpoints in torch, no export: a GPU reference that needs no onnxruntime-gpu).
3. Measures T(N), the ms of one target pass over N new tokens at fixed past lengths L (warm-up, repeats,
   median; the cache is truncated back to L after each call), the draft model's ms per step (N=1), the
   cost ratio c = draft step / T(1) and the verify-cost curve T(N)/T(1).
4. Predicts each method's speedup with the standard model: tokens per pass (1 - a^(g+1)) / (1 - a),
   cost per pass T(g+1) + g*c*T(1) for the draft model and T(g+1) for prompt lookup (free drafts),
   speedup = tokens/pass * T(1) / cost, at the best g for each acceptance rate a.
5. Runs the real loop (``specls.decoder.loop.generate``) with a drafter that proposes the target's own
   greedy continuation, each token right with probability a (seeded), and for the draft-model method
   also pays for the draft model's steps; measured speedup over plain greedy vs the prediction, and
   the loop's tokens must equal plain greedy.

``python -m specls.bench.gpu ...`` runs the same command without the rest of the CLI (the device machine
has no pygls).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import inspect
import json
import logging
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from specls.decoder.api import CausalLM, DecodeSettings, EngineError, KVCache

log = logging.getLogger(__name__)

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
    """Everything one `specls bench gpu` run does. Passed whole."""

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
    seed: int = 0
    verify_export: bool = False
    ort_fusions: str | None = None  # export's ORT fusion mode (None = the export's default)
    reuse: bool = False  # reuse checkpoints/exports in work_dir from an earlier run (same shape/seed/dtype)
    work_dir: Path | None = None  # where checkpoints and exports go (None = a temp dir, removed)
    out_dir: Path | None = None

    def alpha_map(self) -> dict[str, tuple[float, ...]]:
        return dict(self.alphas)


# ---------------------------------------------------------------------------------------------
# Prediction (the standard model)
# ---------------------------------------------------------------------------------------------


def expected_tokens(alpha: float, gamma: int) -> float:
    """Expected tokens committed per verify pass with ``gamma`` drafts each accepted with probability
    ``alpha`` (independently): (1 - a^(g+1)) / (1 - a)."""
    if gamma <= 0:
        return 1.0
    if alpha >= 1.0:
        return float(gamma + 1)
    alpha = max(alpha, 0.0)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def interp_cost(curve: Mapping[int, float], n: int) -> float:
    """T(n) from the measured points: linear between them, the end segments extended beyond."""
    xs = sorted(curve)
    if not xs:
        raise ValueError("empty cost curve")
    if n in curve:
        return curve[n]
    if len(xs) == 1:
        return curve[xs[0]] * n / xs[0]
    if n < xs[0]:
        lo, hi = xs[0], xs[1]
    elif n > xs[-1]:
        lo, hi = xs[-2], xs[-1]
    else:
        hi = next(x for x in xs if x > n)
        lo = max(x for x in xs if x < n)
    slope = (curve[hi] - curve[lo]) / (hi - lo)
    return max(curve[lo] + slope * (n - lo), 1e-9)


def predicted_speedup(curve: Mapping[int, float], c: float, alpha: float, gamma: int, method: str) -> float:
    """Speedup over plain greedy: tokens/pass * T(1) / (T(g+1) + g*c*T(1) [draft model only])."""
    t1 = curve[1]
    cost = interp_cost(curve, gamma + 1)
    if method == "draft":
        cost += gamma * c * t1
    return expected_tokens(alpha, gamma) * t1 / cost


def predicted_speedup_with_overhead(
    curve: Mapping[int, float],
    c: float,
    alpha: float,
    gamma: int,
    method: str,
    overhead_ms: float,
    truncate_ms: float = 0.0,
) -> float:
    """The same with a fixed per-pass cost ``overhead_ms`` (the loop's own work: argmax, bookkeeping,
    host<->device copies) added to plain and speculative passes, and the cache rollback after a
    rejection (``truncate_ms``) to speculative ones."""
    t1 = curve[1]
    cost = interp_cost(curve, gamma + 1) + (gamma * c * t1 if method == "draft" else 0.0)
    return expected_tokens(alpha, gamma) * (t1 + overhead_ms) / (cost + overhead_ms + truncate_ms)


def best_gamma(
    curve: Mapping[int, float], c: float, alpha: float, method: str, gamma_max: int
) -> tuple[int, float]:
    """The gamma in 1..gamma_max with the highest predicted speedup, and that speedup."""
    best = (1, predicted_speedup(curve, c, alpha, 1, method))
    for g in range(2, max(1, gamma_max) + 1):
        s = predicted_speedup(curve, c, alpha, g, method)
        if s > best[1] + 1e-12:
            best = (g, s)
    return best


def alpha_from_counts(drafted: float, accepted: float, proposals: float) -> float | None:
    """The per-token acceptance rate a whose standard model gives ``accepted/proposals`` accepted tokens
    per proposal of ``drafted/proposals`` tokens: sum_{i=1..g} a^i (solved by bisection)."""
    if proposals <= 0 or drafted <= 0:
        return None
    g = drafted / proposals
    target = accepted / proposals
    if target <= 0:
        return 0.0
    if target >= g:
        return 0.99

    def mean_accepted(a: float) -> float:
        # sum_{i=1..g} a^i for a real-valued g
        return a * (1.0 - a**g) / (1.0 - a)

    lo, hi = 0.0, 0.999999
    for _ in range(60):
        mid = (lo + hi) / 2
        if mean_accepted(mid) < target:
            lo = mid
        else:
            hi = mid
    return round((lo + hi) / 2, 4)


def _method_of(key: str) -> str | None:
    k = key.lower()
    if "lookup" in k or k in ("pld", "ngram"):
        return "lookup"
    if "draft" in k:
        return "draft"
    return None


def _is_rate(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and 0.0 <= float(v) <= 1.0


def _alphas_from_decode_bench(data: object) -> dict[str, tuple[float, ...]]:
    """`specls bench decode --json`: ``methods.<lookup|draft>`` with ``tokens``, ``target_passes`` and
    ``acceptance`` (accepted/drafted). Each pass commits its accepted drafts plus one token, so
    accepted = tokens - passes and drafted = accepted / acceptance; a is the standard model inverted."""
    methods = data.get("methods") if isinstance(data, dict) else None
    if not isinstance(methods, dict):
        return {}
    out: dict[str, tuple[float, ...]] = {}
    for m in METHODS:
        row = methods.get(m)
        if not isinstance(row, dict):
            continue
        tokens, passes, ratio = row.get("tokens"), row.get("target_passes"), row.get("acceptance")
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (tokens, passes, ratio)):
            continue
        accepted = max(0.0, float(tokens) - float(passes))  # type: ignore[arg-type]
        if float(ratio) <= 0.0 or accepted <= 0.0:  # type: ignore[arg-type]
            out[m] = (0.0,)
            continue
        a = alpha_from_counts(accepted / float(ratio), accepted, float(passes))  # type: ignore[arg-type]
        if a is not None:
            out[m] = (a,)
    return out


def load_acceptance(path: Path) -> dict[str, tuple[float, ...]]:
    """Acceptance rates per method from a JSON file.

    Accepted forms: `specls bench decode --json` output (``methods.lookup`` / ``methods.draft``);
    ``{"lookup": 0.6, "draft": [0.7, 0.8]}`` (optionally under ``"alpha"``); or objects holding
    ``drafted``/``accepted``/``proposals`` counts (e.g. ``per_drafter`` stats) under keys naming the
    method ("lookup", "draft"...), each giving one a (the standard model inverted). Raises BenchError
    when the file holds no usable rate.
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BenchError(f"{path}: unreadable acceptance JSON ({exc})") from None
    from_decode = _alphas_from_decode_bench(data)
    if from_decode:
        return from_decode
    found: dict[str, list[float]] = {m: [] for m in METHODS}

    def rates(value: object) -> list[float] | None:
        if _is_rate(value):
            return [float(value)]  # type: ignore[arg-type]
        if isinstance(value, list) and value and all(_is_rate(v) for v in value):
            return [float(v) for v in value]
        return None

    def walk(obj: object, method: str | None) -> None:
        if isinstance(obj, list):
            for item in obj:
                walk(item, method)
            return
        if not isinstance(obj, dict):
            return
        counts = [obj.get(k) for k in ("drafted", "accepted", "proposals")]
        if method and all(isinstance(v, int | float) and not isinstance(v, bool) for v in counts):
            a = alpha_from_counts(*(float(v) for v in counts))  # type: ignore[arg-type]
            if a is not None:
                found[method].append(a)
            return
        for key, value in obj.items():
            sub = _method_of(str(key)) or method
            vals = rates(value)
            if vals is not None and str(key) in METHODS:
                found[str(key)] += vals
            elif vals is not None and key in ("alpha", "acceptance", "alphas") and method:
                found[method] += vals
            elif isinstance(value, dict | list):
                walk(value, sub)

    walk(data, None)
    out = {m: tuple(sorted(set(round(v, 4) for v in vs))) for m, vs in found.items() if vs}
    if not out:
        raise BenchError(f"{path}: no acceptance rates found (want e.g. {{'lookup': 0.6, 'draft': 0.75}})")
    return out


# ---------------------------------------------------------------------------------------------
# Random-weight checkpoints
# ---------------------------------------------------------------------------------------------


def write_tokenizer(out_dir: Path, vocab_size: int) -> Path:
    """A byte-level BPE over the 256 byte symbols (no merges) plus Qwen2.5-Coder's special tokens; its
    ids (< 263) all lie inside the model's larger vocab. Writes tokenizer.json and tokenizer_config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    if vocab_size < len(alphabet) + len(SPECIAL_TOKENS):
        raise BenchError(f"vocab {vocab_size} is too small for a byte-level tokenizer (needs >= 263)")
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "tokenizer.json"
    tok.save(str(path))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": SPECIAL_TOKENS[0],
        "pad_token": SPECIAL_TOKENS[0],
        "model_max_length": 32768,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return path


def _eos_id() -> int:
    return 256  # the first special token after the 256 byte symbols


def build_checkpoint(shape: ModelShape, out_dir: Path, seed: int) -> Path:
    """A random-weight transformers checkpoint (safetensors, fp32) plus tokenizer in ``out_dir``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    common: dict[str, Any] = {
        "vocab_size": shape.vocab,
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "max_position_embeddings": shape.max_positions,
        "tie_word_embeddings": shape.tie_embeddings,
        "bos_token_id": _eos_id(),
        "eos_token_id": _eos_id(),
        "pad_token_id": _eos_id(),
    }
    model: Any
    torch.manual_seed(seed)
    if shape.arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common, use_sliding_window=False))
    elif shape.arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        raise BenchError(f"unknown arch {shape.arch!r} (qwen2 | llama)")
    model.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir))
    write_tokenizer(out_dir, shape.vocab)
    return out_dir


# ---------------------------------------------------------------------------------------------
# Backends: the ONNX runtime, or plain torch
# ---------------------------------------------------------------------------------------------


class TorchCache:
    """A KVCache over a transformers model and its DynamicCache (truncate slices every layer)."""

    def __init__(self, lm: TorchCausalLM) -> None:
        from transformers import DynamicCache

        self._lm = lm
        self._past: Any = DynamicCache()
        self._len = 0

    @property
    def length(self) -> int:
        return self._len

    def forward(self, ids: Sequence[int]) -> np.ndarray:
        """ids: [n] -> logits: [n, vocab] float32."""
        import torch

        n = len(ids)
        if n == 0:
            raise ValueError("forward needs at least one token")
        dev = self._lm.device
        with torch.inference_mode():
            x = torch.tensor([list(ids)], dtype=torch.long, device=dev)  # [1, n]
            pos = torch.arange(self._len, self._len + n, device=dev).unsqueeze(0)  # [1, n]
            kw = {self._lm.cache_kw: self._past}
            out = self._lm.model(input_ids=x, position_ids=pos, use_cache=True, **kw)  # updates self._past
            logits = out.logits[0].float().cpu().numpy()  # logits: [n, vocab]
        self._len += n
        return logits

    def truncate(self, n: int) -> None:
        if not 0 <= n <= self._len:
            raise ValueError(f"truncate({n}) on a cache of length {self._len}")
        for layer in self._past.layers:
            if getattr(layer, "keys", None) is not None and layer.keys.numel() > 0:
                layer.keys = layer.keys[..., :n, :]  # [batch, kv_heads, n, head_dim]
                layer.values = layer.values[..., :n, :]
        self._len = n


class TorchCausalLM:
    """A transformers checkpoint in torch (eager attention via SDPA) as a CausalLM."""

    def __init__(self, checkpoint: Path, device: str, dtype: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        torch_dtype = torch.float16 if dtype == "fp16" else torch.float32
        model: Any = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch_dtype)
        self.model: Any = model.to(device).eval()
        self.device = device
        self.provider = f"torch-{device}"
        self._vocab = int(self.model.config.vocab_size)
        # transformers 5.x renamed the forward's cache argument (past_key_values -> cache)
        params = inspect.signature(self.model.forward).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values"

    @property
    def vocab_size(self) -> int:
        return self._vocab

    def new_cache(self) -> TorchCache:
        return TorchCache(self)


def _torch_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _ort_cuda() -> bool:
    import onnxruntime as ort

    return "CUDAExecutionProvider" in ort.get_available_providers()


def _preload_cuda_libs() -> None:
    """onnxruntime-gpu finds CUDA/cuDNN from the nvidia-* wheels only once they are loaded."""
    import onnxruntime as ort

    preload = getattr(ort, "preload_dlls", None)
    if preload is None:
        return
    try:
        preload()
    except Exception as exc:  # a missing library shows up again, clearer, when the session starts
        log.warning("onnxruntime.preload_dlls failed: %s", exc)


def _load_ort(model_dir: Path, settings: GpuBenchSettings, provider: str) -> CausalLM:
    from specls.models.runtime import OnnxCausalLM, RuntimeSettings

    if provider == "cuda":
        _preload_cuda_libs()
    lm: CausalLM = OnnxCausalLM(model_dir, RuntimeSettings(threads=settings.threads, provider=provider))
    return lm


def provider_of(lm: object) -> str:
    return str(getattr(lm, "provider", "unknown"))


def is_cuda_provider(name: str) -> bool:
    return "cuda" in name.lower()


def gpu_name() -> str:
    """The GPU's name from nvidia-smi (or torch), else "cpu-<machine>"."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
        names = [line.strip() for line in out.stdout.splitlines() if line.strip()]
        if out.returncode == 0 and names:
            return names[0]
    except (OSError, subprocess.SubprocessError):
        pass
    if _torch_cuda():
        import torch

        return str(torch.cuda.get_device_name(0))
    return f"cpu-{platform.machine() or 'unknown'}"


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-").lower() or "unknown"


# ---------------------------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PassTimes:
    """Medians at one past length: ms per forward of N new tokens, ms per truncate back to L."""

    forward_ms: dict[int, float]
    truncate_ms: float


def time_passes(
    lm: CausalLM, past_length: int, ns: Sequence[int], warmup: int, repeats: int, seed: int
) -> PassTimes:
    """Median ms of one forward over N new tokens on a cache holding ``past_length`` positions, for each
    N, and of the truncate back to ``past_length`` that follows every call. Rounds interleave the sizes
    (N=1, 2, ..., then again) so slow drifts of the machine hit every N alike; ``warmup`` rounds first."""
    rng = np.random.default_rng(seed)
    vocab = lm.vocab_size
    ids = rng.integers(0, vocab, size=past_length + max(ns)).tolist()
    cache = lm.new_cache()
    for start in range(0, past_length, 512):  # chunked prefill keeps the attention matrices small
        cache.forward(ids[start : min(start + 512, past_length)])
    if cache.length != past_length:
        raise BenchError(f"cache holds {cache.length} positions after a {past_length}-token prefill")
    samples: dict[int, list[float]] = {n: [] for n in ns}
    trunc: list[float] = []
    for i in range(warmup + repeats):
        for n in ns:
            t0 = time.perf_counter()
            logits = cache.forward(ids[past_length : past_length + n])  # logits: [n, vocab]
            t1 = time.perf_counter()
            cache.truncate(past_length)
            t2 = time.perf_counter()
            if logits.shape[0] != n:
                raise BenchError(f"forward of {n} tokens returned {logits.shape[0]} rows")
            if i >= warmup:
                samples[n].append((t1 - t0) * 1e3)
                trunc.append((t2 - t1) * 1e3)
    return PassTimes({n: statistics.median(v) for n, v in samples.items()}, statistics.median(trunc))


def greedy_reference(lm: CausalLM, prompt: Sequence[int], n: int) -> list[int]:
    """Plain greedy decoding with one token per pass (no eos): the reference continuation."""
    cache = lm.new_cache()
    logits = cache.forward(list(prompt))  # logits: [len(prompt), vocab]
    out = [int(np.argmax(logits[-1]))]
    while len(out) < n:
        logits = cache.forward([out[-1]])  # logits: [1, vocab]
        out.append(int(np.argmax(logits[-1])))
    return out


class ForcedDrafter:
    """Proposes the target's own greedy continuation ``reference`` of ``prompt``, each drafted token right
    with probability ``alpha`` (seeded) and otherwise a wrong id, always ``k`` tokens so every verify
    pass has N = k + 1. With ``draft_lm`` it also runs the draft model for those k steps (its output
    discarded), so the measured time pays the draft model's real cost."""

    def __init__(
        self,
        prompt: Sequence[int],
        reference: Sequence[int],
        alpha: float,
        vocab: int,
        seed: int,
        draft_lm: CausalLM | None = None,
    ) -> None:
        self.name = "draft" if draft_lm is not None else "lookup"
        self._full = [int(t) for t in prompt] + [int(t) for t in reference]
        self._alpha = alpha
        self._vocab = vocab
        self._rng = np.random.default_rng(seed)
        self._cache: KVCache | None = draft_lm.new_cache() if draft_lm is not None else None
        self._fed: list[int] = []  # the tokens the draft cache holds
        self.proposed = 0

    def prime(self, prompt: Sequence[int]) -> None:
        """Prefill the draft model with the prompt (outside the timed decode phase)."""
        if self._cache is not None and len(prompt) > 1:
            self._cache.forward(list(prompt[:-1]))
            self._fed = list(prompt[:-1])

    def _draft_steps(self, context: Sequence[int], proposal: Sequence[int]) -> None:
        cache = self._cache
        assert cache is not None
        common = 0
        for a, b in zip(self._fed, context, strict=False):
            if a != b:
                break
            common += 1
        cache.truncate(common)
        self._fed = self._fed[:common]
        # one catch-up pass (newly committed tokens) yields the first draft, then one step per draft
        feed = [list(context[common:]), *[[t] for t in proposal[:-1]]]
        for ids in feed:
            if ids:
                cache.forward(ids)  # logits: [len(ids), vocab], discarded
                self._fed += ids

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        n = len(context)
        if k <= 0 or list(context) != self._full[:n]:
            return []
        right = self._full[n : n + k]
        out = [t if self._rng.random() < self._alpha else (t + 1) % self._vocab for t in right]
        if self._cache is not None and out:
            self._draft_steps(context, out)
        self.proposed += len(out)
        return out

    def observe(self, n_accepted: int) -> None:
        pass

    def proposal_probs(self) -> np.ndarray | None:
        return None


# ---------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------


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

    def verify_curve(self) -> dict[int, dict[int, float]]:
        """L -> N -> T(N)/T(1)."""
        return {L: {n: t / row[1] for n, t in row.items()} for L, row in self.target_ms.items() if 1 in row}

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
        return d


def render_markdown(r: GpuBenchReport) -> str:
    lines = [
        f"# specls bench gpu — {r.gpu}, {r.date}",
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


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


@contextmanager
def _phase(phases: dict[str, float], name: str) -> Iterator[None]:
    t0 = time.perf_counter()
    log.info("phase %s ...", name)
    try:
        yield
    finally:
        phases[name] = round(phases.get(name, 0.0) + time.perf_counter() - t0, 2)
        log.info("phase %s: %.1f s", name, phases[name])


def _resolve_provider(settings: GpuBenchSettings) -> tuple[str, str]:
    """(provider to ask for, dtype) for this backend and machine."""
    if settings.backend == "torch":
        cuda = _torch_cuda()
    elif settings.backend == "ort":
        cuda = _ort_cuda()
    else:
        raise BenchError(f"unknown backend {settings.backend!r} (ort | torch)")
    if settings.provider == "cuda" and not cuda:
        raise BenchError(f"--provider cuda: CUDA is not available to the {settings.backend} backend here")
    if settings.provider == "cpu":
        cuda = False
    if settings.require_cuda and not cuda:
        raise BenchError(
            f"--require-cuda: the {settings.backend} backend has no CUDA here "
            "(onnxruntime-gpu not installed, or no GPU/driver visible)"
        )
    provider = "cuda" if cuda else "cpu"
    dtype = settings.dtype if settings.dtype != "auto" else ("fp16" if cuda else "fp32")
    if dtype not in ("fp16", "fp32"):
        raise BenchError(f"unknown dtype {dtype!r} (auto | fp32 | fp16)")
    return provider, dtype


def _validate(settings: GpuBenchSettings) -> None:
    if not settings.ns or 1 not in settings.ns or any(n < 1 for n in settings.ns):
        raise BenchError(f"--ns must hold 1 and positive sizes, got {list(settings.ns)}")
    if not settings.past_lengths or any(L < 1 for L in settings.past_lengths):
        raise BenchError(f"--past-lengths must be positive, got {list(settings.past_lengths)}")
    if settings.repeats < 1 or settings.warmup < 0:
        raise BenchError("--repeats must be >= 1 and --warmup >= 0")
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


STAMP = "bench-build.json"


def _export_options(settings: GpuBenchSettings, dtype: str) -> Any:
    from specls.models.export import ExportOptions

    options = ExportOptions(dtype=dtype, verify=settings.verify_export)
    if settings.ort_fusions is not None:
        if "ort_fusions" not in getattr(ExportOptions, "__dataclass_fields__", {}):
            raise BenchError("--ort-fusions: this export has no ort_fusions option")
        options = replace(options, ort_fusions=settings.ort_fusions)
    return options


def export_facts(onnx_dir: Path) -> dict[str, Any]:
    """What the export recorded (export.json): time, fused graph or not, options."""
    from specls.models.export import read_report

    rep = read_report(onnx_dir)
    opts = rep.get("options") if isinstance(rep.get("options"), dict) else {}
    return {
        "export_s": rep.get("export_s"),
        "ort_fusions": rep.get("ort_fusions", "none"),
        "dtype": opts.get("dtype") if isinstance(opts, dict) else None,
    }


def _stamp(shape: ModelShape, seed: int, dtype: str | None) -> dict[str, Any]:
    return {"shape": asdict(shape), "seed": seed, "dtype": dtype}


def _reusable(path: Path, stamp: dict[str, Any]) -> bool:
    try:
        return bool(json.loads((path / STAMP).read_text()) == stamp)
    except (OSError, ValueError):
        return False


def _load_pair(
    settings: GpuBenchSettings, work: Path, provider: str, dtype: str, phases: dict[str, float]
) -> tuple[CausalLM, CausalLM]:
    """Build (and for ort, export) then load target and draft. With ``settings.reuse`` a checkpoint or
    export already in the work dir from an earlier run with the same shape/seed/dtype is used as is."""
    lms: list[CausalLM] = []
    for role, shape, seed in (
        ("target", settings.target, settings.seed),
        ("draft", settings.draft, settings.seed + 1),
    ):
        ckpt, onnx = work / f"{role}-ckpt", work / f"{role}-onnx"
        onnx_stamp = _stamp(shape, seed, dtype)
        if not (settings.backend == "ort" and settings.reuse and _reusable(onnx, onnx_stamp)):
            if settings.reuse and _reusable(ckpt, _stamp(shape, seed, None)):
                log.info("reusing %s", ckpt)
            else:
                with _phase(phases, f"build_{role}"):
                    build_checkpoint(shape, ckpt, seed)
                    (ckpt / STAMP).write_text(json.dumps(_stamp(shape, seed, None)))
            if settings.backend == "ort":
                from specls.models.export import export_model

                with _phase(phases, f"export_{role}"):
                    export_model(str(ckpt), onnx, _export_options(settings, dtype))
                    (onnx / STAMP).write_text(json.dumps(onnx_stamp))
        else:
            log.info("reusing %s", onnx)
        with _phase(phases, f"load_{role}"):
            if settings.backend == "torch":
                device = "cuda" if provider == "cuda" else "cpu"
                if device == "cpu" and settings.threads > 0:
                    import torch

                    torch.set_num_threads(settings.threads)
                lms.append(TorchCausalLM(ckpt, device, dtype))
            else:
                lms.append(_load_ort(onnx, settings, provider))
    return lms[0], lms[1]


def run_bench(settings: GpuBenchSettings, progress: Callable[[str], None] | None = None) -> GpuBenchReport:
    """Build, export, load, measure, predict, run the loop. Raises BenchError on a run that cannot go
    as asked (e.g. --require-cuda without CUDA)."""
    say = progress or (lambda msg: log.info("%s", msg))
    _validate(settings)
    provider, dtype = _resolve_provider(settings)
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
        target, draft = _load_pair(settings, work, provider, dtype, phases)
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
        with _phase(phases, "passes"):
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
        if settings.out_dir is not None and settings.loop:
            # the pass costs and predictions survive a run killed during the loop (device time limits)
            write_report(report, settings.out_dir)
        if settings.loop:
            with _phase(phases, "loop"):
                _run_loop(settings, report, target, draft, say)
        return report
    finally:
        if tmp is not None:
            tmp.cleanup()


def _run_loop(
    settings: GpuBenchSettings,
    report: GpuBenchReport,
    target: CausalLM,
    draft: CausalLM,
    say: Callable[[str], None],
) -> None:
    from specls.decoder.loop import generate

    prompt_len = settings.prompt_tokens or min(settings.past_lengths)
    rng = np.random.default_rng(settings.seed + 7)
    prompt = rng.integers(0, target.vocab_size, size=prompt_len).tolist()
    n = settings.gen_tokens
    reference = greedy_reference(target, prompt, n)
    # the prediction at the loop's mean past length (prompt + half the new tokens), from the curve at
    # the nearest measured L
    L = min(settings.past_lengths, key=lambda x: abs(x - (prompt_len + n // 2)))
    curve, c = report.target_ms[L], report.c[L]

    def run(drafter: ForcedDrafter | None, gamma: int) -> tuple[list[int], float, Any]:
        decode = DecodeSettings(
            max_new_tokens=n,
            gamma=gamma,
            gamma_min=max(gamma, 1),
            gamma_max=max(gamma, 1),
            adaptive_gamma=False,
            min_speedup=0.0,
        )
        cache = target.new_cache()
        if drafter is not None:
            drafter.prime(prompt)
        res = generate(cache, prompt, drafter, decode, frozenset())
        return list(res.tokens), float(res.decode_ms), res

    greedy_times: list[float] = []
    for i in range(settings.loop_repeats + 1):  # the first run warms up
        toks, ms, _ = run(None, 0)
        if toks != reference:
            report.greedy_matches = False
        if i > 0:
            greedy_times.append(ms)
    greedy_ms = statistics.median(greedy_times)
    overhead = max(0.0, greedy_ms / n - curve[1])
    report.loop_overhead_ms = overhead
    say(f"loop: plain greedy {n} tokens after a {prompt_len}-token prompt: {greedy_ms:.1f} ms")
    for method in METHODS:
        for a in settings.loop_alphas:
            gamma, _ = best_gamma(curve, c, a, method, max(report.ns) - 1)
            times: list[float] = []
            matches = True
            res: Any = None
            counts = np.zeros(3)  # drafted, accepted, proposals over every run (warm-up included)
            for i in range(settings.loop_repeats + 1):
                drafter = ForcedDrafter(
                    prompt,
                    reference,
                    a,
                    target.vocab_size,
                    settings.seed + 100 + i,
                    draft if method == "draft" else None,
                )
                toks, ms, res = run(drafter, gamma)
                matches = matches and toks == reference
                st = res.per_drafter.get(drafter.name)
                if st is not None:
                    counts += (st.drafted, st.accepted, st.proposals)
                if i > 0:
                    times.append(ms)
            spec_ms = statistics.median(times)
            realized = alpha_from_counts(*(float(x) for x in counts))
            m = LoopMeasurement(
                method=method,
                alpha=a,
                gamma=gamma,
                prompt_tokens=prompt_len,
                new_tokens=n,
                greedy_ms=greedy_ms,
                spec_ms=spec_ms,
                measured_speedup=greedy_ms / spec_ms if spec_ms > 0 else 0.0,
                predicted_speedup=predicted_speedup(curve, c, a, gamma, method),
                target_passes=int(res.target_passes),
                drafted=int(res.drafted),
                accepted=int(res.accepted),
                realized_alpha=realized,
                predicted_at_realized=(
                    predicted_speedup(curve, c, realized, gamma, method) if realized is not None else None
                ),
                predicted_with_overhead=(
                    predicted_speedup_with_overhead(
                        curve, c, realized, gamma, method, overhead, report.truncate_ms.get(L, 0.0)
                    )
                    if realized is not None
                    else None
                ),
                matches_greedy=matches,
            )
            report.loop.append(m)
            say(
                f"loop: {method} a={a} g={gamma}: {spec_ms:.1f} ms, measured {m.measured_speedup:.2f}x, "
                f"predicted {m.predicted_speedup:.2f}x, == greedy: {matches}"
            )


def write_report(report: GpuBenchReport, out_dir: Path) -> tuple[Path, Path]:
    """results-<date>-<gpu>.json and .md in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"results-{report.date[:10]}-{slug(report.gpu)}-{report.backend}"
    js = out_dir / f"{stem}.json"
    md = out_dir / f"{stem}.md"
    js.write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
    md.write_text(render_markdown(report), encoding="utf-8")
    return js, md


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _dims(text: str) -> tuple[int, ...]:
    dims = _ints(text)
    if len(dims) != 5 or any(d < 1 for d in dims):
        raise argparse.ArgumentTypeError(f"expected HIDDEN,LAYERS,HEADS,KV_HEADS,FFN, got {text!r}")
    return dims


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--shape",
        choices=sorted(SHAPES),
        default="full",
        help="full: Qwen2.5-Coder-1.5B target / 0.5B draft shapes; small: tiny CPU dry run",
    )
    p.add_argument("--arch", choices=("qwen2", "llama"), default=None, help="override the preset's layout")
    p.add_argument(
        "--target-dims",
        type=_dims,
        default=None,
        metavar="H,L,A,KV,FFN",
        help="explicit target dims: hidden,layers,heads,kv_heads,intermediate",
    )
    p.add_argument(
        "--draft-dims", type=_dims, default=None, metavar="H,L,A,KV,FFN", help="explicit draft dims"
    )
    p.add_argument("--vocab", type=int, default=None, help="vocab size of both models (>= 263)")
    p.add_argument(
        "--backend",
        choices=("ort", "torch"),
        default="ort",
        help="ort: export + specls runtime (default); torch: transformers in torch, no export",
    )
    p.add_argument("--dtype", choices=("auto", "fp32", "fp16"), default="auto", help="auto: fp16 on CUDA")
    p.add_argument("--provider", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--require-cuda", action="store_true", help="fail unless the models run on CUDA")
    p.add_argument("--threads", type=int, default=1, help="CPU threads for the runtime (0 = default)")
    p.add_argument("--past-lengths", type=_ints, default=None, help="past lengths L (default: preset's)")
    p.add_argument("--ns", type=_ints, default=None, help="new-token counts N (must include 1)")
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument(
        "--acceptance",
        type=Path,
        default=None,
        help="JSON with acceptance rates (`specls bench decode --json` output or {method: a})",
    )
    p.add_argument("--alphas", type=_floats, default=None, help="acceptance rates for both methods")
    p.add_argument("--loop-alphas", type=_floats, default=(0.5, 0.8), help="rates forced in the real loop")
    p.add_argument("--loop-repeats", type=int, default=2)
    p.add_argument("--gen-tokens", type=int, default=None, help="new tokens per loop run")
    p.add_argument("--prompt-tokens", type=int, default=0, help="loop prompt length (0 = smallest L)")
    p.add_argument("--no-loop", action="store_true", help="skip the real decode loop")
    p.add_argument("--verify-export", action="store_true", help="check ORT vs torch after each export")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", type=Path, default=None, help="keep checkpoints/exports here (default: temp)")
    p.add_argument(
        "--ort-fusions",
        choices=("auto", "cpu", "cuda", "none"),
        default=None,
        help="export with ONNX Runtime fusions (default: the export's own default)",
    )
    p.add_argument(
        "--reuse", action="store_true", help="reuse checkpoints/exports already in --work (same shape)"
    )
    p.add_argument(
        "--out", type=Path, default=None, help="write results-<date>-<gpu>-<backend>.json/.md here"
    )
    p.add_argument("--json", action="store_true", help="print the JSON report instead of the tables")


def settings_from_args(args: argparse.Namespace) -> GpuBenchSettings:
    preset = SHAPES[args.shape]
    target, draft = preset.target, preset.draft
    if args.target_dims:
        h, n, a, kv, ff = args.target_dims
        target = replace(target, hidden=h, layers=n, heads=a, kv_heads=kv, intermediate=ff)
    if args.draft_dims:
        h, n, a, kv, ff = args.draft_dims
        draft = replace(draft, hidden=h, layers=n, heads=a, kv_heads=kv, intermediate=ff)
    if args.vocab:
        target, draft = replace(target, vocab=args.vocab), replace(draft, vocab=args.vocab)
    if args.arch:
        target, draft = replace(target, arch=args.arch), replace(draft, arch=args.arch)
    custom = bool(args.target_dims or args.draft_dims or args.vocab or args.arch)
    if args.acceptance is not None:
        found = load_acceptance(args.acceptance)
        alphas = tuple((m, found.get(m, DEFAULT_ALPHAS[m])) for m in METHODS)
        source = f"{args.acceptance} ({', '.join(sorted(found))})"
    elif args.alphas:
        alphas = tuple((m, tuple(args.alphas)) for m in METHODS)
        source = "--alphas"
    else:
        alphas = tuple(DEFAULT_ALPHAS.items())
        source = "default set"
    return GpuBenchSettings(
        target=target,
        draft=draft,
        shape_name=args.shape + (" (custom dims)" if custom else ""),
        backend=args.backend,
        dtype=args.dtype,
        provider=args.provider,
        require_cuda=args.require_cuda,
        threads=args.threads,
        past_lengths=args.past_lengths or preset.past_lengths,
        ns=tuple(sorted(set(args.ns or preset.ns))),
        warmup=preset.warmup if args.warmup is None else args.warmup,
        repeats=preset.repeats if args.repeats is None else args.repeats,
        alphas=alphas,
        alpha_source=source,
        loop=not args.no_loop,
        loop_alphas=tuple(args.loop_alphas),
        loop_repeats=max(1, args.loop_repeats),
        gen_tokens=args.gen_tokens or preset.gen_tokens,
        prompt_tokens=args.prompt_tokens,
        seed=args.seed,
        verify_export=args.verify_export,
        reuse=args.reuse,
        ort_fusions=args.ort_fusions,
        work_dir=args.work,
        out_dir=args.out,
    )


def run_command(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    try:
        settings = settings_from_args(args)
        report = run_bench(
            settings,
            progress=lambda msg: print(
                f"[{time.perf_counter() - t0:7.1f}s] {msg}", file=sys.stderr, flush=True
            ),
        )
    except (BenchError, EngineError) as exc:  # EngineError: export/load failures, with their reason
        print(f"specls bench gpu: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(render_markdown(report))
    if settings.out_dir is not None:
        js, md = write_report(report, settings.out_dir)
        print(f"wrote {js} and {md}", file=sys.stderr)
    print(f"total {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    ok = report.greedy_matches and all(m.matches_greedy for m in report.loop)
    if not ok:
        print("specls bench gpu: the loop's output differs from plain greedy", file=sys.stderr)
    return 0 if ok else 1


def register(sub: Any) -> None:
    p = sub.add_parser("gpu", help="GPU pass costs, predicted vs measured speculative speedup")
    add_arguments(p)
    p.set_defaults(func=run_command)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specls.bench.gpu", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="count", default=0)
    add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return run_command(args)


if __name__ == "__main__":
    sys.exit(main())
