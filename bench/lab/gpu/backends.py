"""Backends: the checkpoints in plain torch (``TorchCausalLM``) or exported to ONNX and loaded with the
specls runtime; which provider a run gets; loading the target/draft pair."""

from __future__ import annotations

import inspect
import json
import logging
import platform
import subprocess
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from specls.decoder.api import CausalLM, KVCache

from bench.lab.gpu.checkpoints import STAMP, build_checkpoint, build_stamp, export_options, reusable
from bench.lab.gpu.shapes import BenchError, GpuBenchSettings
from bench.lab.gpu.timing import phase

log = logging.getLogger(__name__)


def _truncate_layers(past: Any, n: int) -> None:
    """Keep the first ``n`` positions of every layer of a DynamicCache (a slice on the sequence axis)."""
    for layer in past.layers:
        if getattr(layer, "keys", None) is not None and layer.keys.numel() > 0:
            layer.keys = layer.keys[..., :n, :]  # [batch, kv_heads, n, head_dim]
            layer.values = layer.values[..., :n, :]


class _DynamicCacheBase:
    """A transformers DynamicCache with a length; truncate slices every layer."""

    def __init__(self, lm: TorchCausalLM) -> None:
        from transformers import DynamicCache

        self._lm = lm
        self._past: Any = DynamicCache()
        self._len = 0

    @property
    def length(self) -> int:
        return self._len

    def truncate(self, n: int) -> None:
        if not 0 <= n <= self._len:
            raise ValueError(f"truncate({n}) on a cache of length {self._len}")
        _truncate_layers(self._past, n)
        self._len = n


class TorchCache(_DynamicCacheBase, KVCache):
    """A KVCache over a transformers model and its DynamicCache (truncate slices every layer)."""

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


class TorchBatchCache(_DynamicCacheBase):
    """B sequences of equal length in one DynamicCache (batch dim B): one forward runs the target over
    ``n`` new tokens of every sequence. For the batched-pass sweep (no padding, no attention mask)."""

    def __init__(self, lm: TorchCausalLM, batch: int) -> None:
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        super().__init__(lm)
        self.batch = batch

    def _run(self, ids: Sequence[Sequence[int]], keep_logits: bool) -> Any:
        import torch

        n = len(ids[0]) if len(ids) else 0
        if len(ids) != self.batch or n == 0 or any(len(row) != n for row in ids):
            raise ValueError(f"forward needs {self.batch} rows of the same positive length")
        dev = self._lm.device
        x = torch.tensor([list(row) for row in ids], dtype=torch.long, device=dev)  # [B, n]
        pos = torch.arange(self._len, self._len + n, device=dev).expand(self.batch, n)  # [B, n]
        kw: dict[str, Any] = {self._lm.cache_kw: self._past}
        if not keep_logits and self._lm.logits_to_keep:
            kw["logits_to_keep"] = 1  # prefill: skip the [B, n, vocab] logits nobody reads
        out = self._lm.model(input_ids=x, position_ids=pos, use_cache=True, **kw)  # updates self._past
        self._len += n
        return out.logits  # [B, n or 1, vocab]

    def prefill(self, ids: Sequence[Sequence[int]], chunk: int = 512) -> None:
        """Append ``ids`` ([B][m]) in chunks of ``chunk`` positions, discarding the logits."""
        import torch

        m = len(ids[0]) if len(ids) else 0
        with torch.inference_mode():
            for start in range(0, m, chunk):
                self._run([row[start : start + chunk] for row in ids], keep_logits=False)

    def forward(self, ids: Sequence[Sequence[int]]) -> np.ndarray:
        """ids: [B][n] -> logits: [B, n, vocab] float32 on the host (as TorchCache.forward). Cache grows by n."""
        import torch

        with torch.inference_mode():
            logits = self._run(ids, keep_logits=True).float().cpu().numpy()  # logits: [B, n, vocab]
        return logits


class TorchCausalLM(CausalLM):
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
        self.logits_to_keep = "logits_to_keep" in params

    @property
    def vocab_size(self) -> int:
        return self._vocab

    def new_cache(self) -> TorchCache:
        return TorchCache(self)

    def new_batch_cache(self, batch: int) -> TorchBatchCache:
        return TorchBatchCache(self, batch)


def torch_has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def ort_has_cuda() -> bool:
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


def load_ort(model_dir: Path, settings: GpuBenchSettings, provider: str) -> CausalLM:
    from specls.models.runtime import OnnxCausalLM, RuntimeSettings

    if provider == "cuda":
        _preload_cuda_libs()
    lm: CausalLM = OnnxCausalLM(model_dir, RuntimeSettings(threads=settings.threads, provider=provider))
    return lm


class RuntimeBatchCache:
    """B of the runtime's own caches advanced together through ``OnnxCausalLM.forward_batch`` (the path
    ``specls serve --batch`` takes); B = 1 runs the cache's own forward on the main graph, as a lone
    pass does in the server. The ``BatchKVCache`` of the batched-pass sweep."""

    def __init__(self, lm: Any, batch: int) -> None:
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        self._lm = lm
        self._caches = [lm.new_cache() for _ in range(batch)]

    @property
    def length(self) -> int:
        return int(self._caches[0].length)

    def prefill(self, ids: Sequence[Sequence[int]]) -> None:
        for cache, row in zip(self._caches, ids, strict=True):
            cache.forward(list(row))

    def forward(self, ids: Sequence[Sequence[int]]) -> np.ndarray:
        """ids: [B][n] -> logits: [B, n, vocab]."""
        if len(self._caches) == 1:
            return self._caches[0].forward(list(ids[0]))[None]
        return np.stack(self._lm.forward_batch(self._caches, [list(r) for r in ids]))

    def truncate(self, n: int) -> None:
        for cache in self._caches:
            cache.truncate(n)


class RuntimeBatchLM:
    """An ``OnnxCausalLM`` with a batch graph as the sweep's ``BatchCausalLM``."""

    def __init__(self, lm: Any) -> None:
        self._lm = lm

    @property
    def vocab_size(self) -> int:
        return int(self._lm.vocab_size)

    def new_batch_cache(self, batch: int) -> RuntimeBatchCache:
        return RuntimeBatchCache(self._lm, batch)


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
    if torch_has_cuda():
        import torch

        return str(torch.cuda.get_device_name(0))
    return f"cpu-{platform.machine() or 'unknown'}"


def resolve_provider(settings: GpuBenchSettings) -> tuple[str, str]:
    """(provider to ask for, dtype) for this backend and machine."""
    if settings.backend == "torch":
        cuda = torch_has_cuda()
    elif settings.backend == "ort":
        cuda = ort_has_cuda()
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


def load_pair(
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
        # the ORT batched sweep needs the target's dynamic-batch graph (fused exports fix the batch to 1)
        with_batch_graph = role == "target" and settings.batched
        onnx_stamp = {**build_stamp(shape, seed, dtype), "batch_graph": with_batch_graph}
        if not (settings.backend == "ort" and settings.reuse and reusable(onnx, onnx_stamp)):
            if settings.reuse and reusable(ckpt, build_stamp(shape, seed, None)):
                log.info("reusing %s", ckpt)
            else:
                with phase(phases, f"build_{role}"):
                    build_checkpoint(shape, ckpt, seed)
                    (ckpt / STAMP).write_text(json.dumps(build_stamp(shape, seed, None)))
            if settings.backend == "ort":
                from specls.models.export import export_model

                with phase(phases, f"export_{role}"):
                    options = export_options(settings, dtype)
                    if with_batch_graph:
                        options = replace(options, batch_graph=True)
                    export_model(str(ckpt), onnx, options)
                    (onnx / STAMP).write_text(json.dumps(onnx_stamp))
        else:
            log.info("reusing %s", onnx)
        with phase(phases, f"load_{role}"):
            if settings.backend == "torch":
                device = "cuda" if provider == "cuda" else "cpu"
                if device == "cpu" and settings.threads > 0:
                    import torch

                    torch.set_num_threads(settings.threads)
                lms.append(TorchCausalLM(ckpt, device, dtype))
            else:
                lms.append(load_ort(onnx, settings, provider))
    return lms[0], lms[1]
