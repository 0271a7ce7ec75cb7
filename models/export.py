"""Export a Hugging Face causal LM (hub id, local checkpoint dir, or a GGUF file) to an ONNX graph with KV
cache in/out, plus ``tokenizer.json`` and ``specls.json``, then verify ONNX Runtime against torch.

Graph (see ``ModelSpec``): input_ids [batch, new], attention_mask [batch, total], position_ids
[batch, new], past_key_values.{i}.key/value [batch, kv_heads, past, head_dim] -> logits
[batch, new, vocab], present.{i}.key/value [batch, kv_heads, past+new, head_dim]; batch/new/past dynamic.

torch/transformers/onnx are imported inside the functions: this module is importable without them.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import json
import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from specls.models.agreement import AgreementOptions, AgreementResult, ReferenceGraph, StoredLogits
from specls.models.fim import NO_FIM, PRESETS, FimTemplate, detect_template, fit_template
from specls.models.gguf import (
    GgufError,
    find_gguf,
    load_gguf_model,
    load_gguf_model_mapped,
    load_gguf_tokenizer,
)
from specls.models.head import DRAFT_HEADS, HEAD_IDS_FILE, ascii_token_ids, slice_head
from specls.models.kv_buffer import share_kv_buffer
from specls.models.quantize import QUANTIZE_MODES, QuantizeError, QuantizeOptions, options_for, quantize_graph
from specls.models.spec import LOGITS_TO_KEEP, SPEC_FILE, ModelSpec, kv_names
from specls.models.tokenizer import Tokenizer

from specls.api import EngineError
from specls.memory import release_freed_memory, resident_bytes
from specls.next_edit.layouts import layout_for_model

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

ONNX_FILE = "model.onnx"
BATCH_ONNX_FILE = "model.batch.onnx"  # plain graph with a dynamic batch axis, beside a fused batch-1 one
SAFETENSORS_FILE = "model.safetensors"
# what --share-weights copies from the checkpoint so the model dir also loads with from_pretrained
HF_FILES = ("config.json", "generation_config.json", "tokenizer_config.json", "special_tokens_map.json")
TOKENIZER_FILE = "tokenizer.json"
REPORT_FILE = "export.json"

# progress(step message, fraction done 0..1)
Progress = Callable[[str, float], None]


class ExportError(EngineError):
    """The export failed; the message says which step and why."""


@dataclass(frozen=True)
class ExportOptions:
    dtype: str = "fp32"  # "fp32" | "fp16"
    opset: int = 18
    verify: bool = True
    tolerance: float = 1e-3  # max abs logit diff ORT vs torch allowed for fp32
    # the same for fp16 graphs (against the fp32 torch model), scaled by max(1, max |logit| / 10)
    fp16_tolerance: float = 0.5
    trust_remote_code: bool = False
    fim_family: str | None = None  # None = detect from the tokenizer's vocab; "none" = prefix-only
    # specls.json's next_edit_layout (specls.next_edit.layouts); None = by the source's name
    next_edit_layout: str | None = None
    attn_implementation: str = "sdpa"  # what transformers traces ("sdpa" | "eager")
    # ONNX Runtime op fusions through transformers' own exporter (GroupQueryAttention, RotaryEmbedding,
    # SkipSimplifiedLayerNormalization; batch fixed to 1): "auto" = "cpu" for fp32, "cuda" for fp16;
    # "none" = plain torch.onnx.export of our KV wrapper (any batch). A failed fusion export falls back
    # to "none" with a warning.
    ort_fusions: str = "auto"  # "auto" | "cpu" | "cuda" | "none"
    # one copy of the weights: copy the checkpoint's model.safetensors (+ config files) next to the
    # graph(s) and make every large initializer ONNX external data pointing into it (models.weight_sharing)
    share_weights: bool = False
    # a fused (batch-1) export also writes model.batch.onnx, the plain graph with a dynamic batch axis,
    # and names it in specls.json's batch_onnx_file (nothing extra for plain exports: already batched)
    batch_graph: bool = False
    # quantization of every constant-weight MatMul (LM head included): "none" | "int4" (MatMulNBits)
    # | "int8" (MatMulIntegerToFloat) | "auto" (see resolve_quantize). The library default stays
    # "none" (the bundled pair and the tests); the CLI's default is "auto".
    quantize: str = "none"
    quant_block_size: int = QuantizeOptions.block_size
    quant_accuracy_level: int = QuantizeOptions.accuracy_level
    quantize_embedding: bool = QuantizeOptions.embedding  # GatherBlockQuantized at 4 bits (int4, int8)
    # how a quantized graph is checked against the unquantized one (held-out code, top-1 floor)
    agreement: AgreementOptions = AgreementOptions()
    # "ascii": the LM head scores only ASCII and added tokens, for a draft model (models.head: a
    # cheaper draft step); "full": the whole vocabulary (what a target needs)
    draft_head: str = "full"
    # weights kept in files rather than in memory where that gives the same graph (models.mapped_weights):
    # a GGUF is dequantized tensor by tensor into a scratch file the fp32 torch model maps, packed
    # initializers are spilled to files while tracing, and ONNX Runtime checks the fp32 graph on its
    # mapped external data (no pre-packed copies). The same files and checks at well under the fp32
    # weights' size in memory; False: the plain path (everything in memory)
    low_memory: bool = True


@dataclass(frozen=True)
class VerifyResult:
    """ORT vs torch on one sample: prefill, N=5 with a past, N=1 with a past."""

    max_abs_diff: dict[str, float] = field(default_factory=dict)
    argmax_agree: dict[str, float] = field(default_factory=dict)
    tolerance: float = 0.0

    @property
    def worst(self) -> float:
        return max(self.max_abs_diff.values(), default=0.0)


def _noop(msg: str, frac: float) -> None:
    pass


@dataclass(frozen=True)
class ModelSource:
    """Where an export reads the model: a Hugging Face checkpoint directory (config, safetensors,
    tokenizer.json), or a GGUF file whose metadata holds the config and the tokenizer too."""

    dir: Path  # the checkpoint directory, or the directory holding the GGUF file
    gguf: Path | None = None

    def __str__(self) -> str:
        return str(self.gguf or self.dir)


def resolve_source(source: str, trust_remote_code: bool = False) -> ModelSource:
    """A GGUF file (or a directory holding exactly one ``*.gguf`` and no ``config.json``), a local
    checkpoint dir as is; anything else is a hub id fetched by ``snapshot_download``."""
    p = Path(source).expanduser()
    try:
        gguf = find_gguf(p)
    except GgufError as exc:
        raise ExportError(str(exc)) from None
    if gguf is not None:
        return ModelSource(gguf.parent, gguf)
    if p.is_dir():
        return ModelSource(p)
    if p.exists() or source.startswith((".", "/", "~")) or source.count("/") > 1:
        raise ExportError(
            f"{source}: not a checkpoint directory or GGUF file (and not a Hugging Face hub id)"
        )
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:
        raise ExportError(f"{source}: not a local directory, and huggingface_hub is not installed") from exc
    patterns = ["*.json", "*.safetensors", "*.model", "*.txt"] + (["*.py"] if trust_remote_code else [])
    try:
        return ModelSource(Path(snapshot_download(source, allow_patterns=patterns)))
    except Exception as exc:  # network errors, missing repo, gated repo ...: one clear message
        raise ExportError(
            f"{source}: could not download from the Hugging Face hub ({type(exc).__name__}: {exc})"
        ) from None


def _load_tokenizer(src: ModelSource) -> Tokenizer:
    """The source's tokenizer: its tokenizer.json, or the one transformers builds from GGUF metadata."""
    if src.gguf is not None:
        try:
            return Tokenizer(load_gguf_tokenizer(src.gguf))
        except GgufError as exc:
            raise ExportError(str(exc)) from None
    tok_src = src.dir / TOKENIZER_FILE
    if not tok_src.is_file():
        raise ExportError(f"{tok_src}: missing (a fast tokenizer.json is required next to the checkpoint)")
    try:
        return Tokenizer.from_file(tok_src)
    except Exception as exc:
        raise ExportError(f"{tok_src}: unreadable tokenizer ({exc})") from None


def _write_tokenizer(src: ModelSource, tokenizer: Tokenizer, out_dir: Path) -> None:
    """``out_dir/tokenizer.json``: the checkpoint's file copied byte for byte, or the GGUF's saved."""
    dst = out_dir / TOKENIZER_FILE
    if src.gguf is not None:
        tokenizer.hf.save(str(dst))
        return
    tok_src = src.dir / TOKENIZER_FILE
    if not dst.exists() or not dst.samefile(tok_src):
        shutil.copyfile(tok_src, dst)


def export_model(
    source: str, out_dir: Path, options: ExportOptions, progress: Progress | None = None
) -> Path:
    """Export ``source`` into ``out_dir`` (created; existing files there are replaced). Returns out_dir.

    Steps (each frees what the next does not need, so the peak stays near the torch model plus one
    copy of the weights): load the torch model, compute its reference logits for ``verify``, trace to
    a staging dir inside ``out_dir`` (weights as external data), free the torch model, check ONNX
    Runtime against the reference, then with ``options.quantize`` quantize the weights into a second
    staging dir and compare it with the unquantized graph on held-out code (``models.agreement``).
    ``specls.json`` is written last: a failed export leaves no loadable directory.

    Raises ExportError on a bad source, a failed trace, ONNX Runtime logits further than the
    tolerance from torch's, or a quantized graph below the agreement floor.
    """
    progress = progress or _noop
    fusions, quant_mode, quant = _check_options(options)
    out_dir = Path(out_dir)
    t0 = time.perf_counter()

    progress("resolving source", 0.0)
    ckpt = resolve_source(source, options.trust_remote_code)
    if options.share_weights and (ckpt.gguf is not None or not (ckpt.dir / SAFETENSORS_FILE).is_file()):
        raise ExportError(
            f"{ckpt}: share_weights needs a single {SAFETENSORS_FILE} in the checkpoint (GGUF, sharded "
            "or .bin checkpoints are not supported; export without it)"
        )
    tokenizer = _load_tokenizer(ckpt)
    progress("loading model", 0.05)
    traced = _load_and_trace(ckpt, tokenizer, source, out_dir, options, fusions, progress)
    if options.quantize == "auto" and (traced.n_params < AUTO_MIN_PARAMS or options.share_weights):
        quant_mode, quant = "none", None  # see AUTO_MIN_PARAMS
    spec = traced.spec
    _write_tokenizer(ckpt, tokenizer, out_dir)
    if traced.head_ids is not None:
        np.save(out_dir / HEAD_IDS_FILE, traced.head_ids)
    graphs = [f for f in (spec.onnx_file, spec.batch_onnx_file) if f]
    shared: dict[str, Any] = {}
    if options.share_weights:
        progress("sharing the weights with model.safetensors", 0.55)
        shared = _share_checkpoint_weights(ckpt, out_dir, graphs)
    spec = _add_inputs(out_dir, spec, graphs)

    report: dict[str, Any] = {
        "source": source,
        "ort_fusions": traced.fusions or "none",
        "options": asdict(options),
        "quantize": quant_mode,
    }
    if shared:
        report["shared_weights"] = shared
    fail = functools.partial(_fail, out_dir, report, t0)
    if traced.reference is not None:
        progress("verifying ONNX Runtime vs torch", 0.6)
        _verify_graphs(traced.reference, out_dir, spec, graphs, options, report, fail)
    if quant is not None:
        _quantize_dir(out_dir, spec, graphs, quant, options, report, progress, fail)
    report["export_s"] = round(time.perf_counter() - t0, 2)
    (out_dir / REPORT_FILE).write_text(json.dumps(report, indent=2, default=str) + "\n")
    spec.write(out_dir)  # last: the directory is loadable only now
    _log_memory("done")
    progress("done", 1.0)
    return out_dir


def _check_options(options: ExportOptions) -> tuple[str | None, str, QuantizeOptions | None]:
    """The fusions, the quantize mode and its options an export starts from; raises ExportError on
    an option value or a combination it cannot take."""
    if options.dtype not in ("fp32", "fp16"):
        raise ExportError(f"dtype must be fp32 or fp16, not {options.dtype!r}")
    if options.draft_head not in DRAFT_HEADS:
        raise ExportError(f"draft_head must be one of {DRAFT_HEADS}, not {options.draft_head!r}")
    fusions = _fusions(options)
    quant_mode = resolve_quantize(options.quantize, options.dtype)
    quant = _quantize_options(quant_mode, options)
    if options.quantize != "auto" and quant is not None and options.share_weights:
        raise ExportError(
            f"--share-weights cannot be combined with --quantize {quant_mode}: the quantized MatMul "
            "weights are not tensors of the checkpoint's model.safetensors (export with one of them)"
        )
    return fusions, quant_mode, quant


@dataclass(frozen=True)
class _Traced:
    """What tracing leaves once the torch model is freed: the graphs are in the output directory."""

    spec: ModelSpec
    fusions: str | None  # None: the plain graph (no fusions, or the fused export failed)
    head_ids: np.ndarray | None  # the draft head's token ids (``draft_head="ascii"``)
    reference: TorchReference | None  # the torch logits ``verify`` compares with
    n_params: int


def _load_and_trace(
    ckpt: ModelSource,
    tokenizer: Tokenizer,
    source: str,
    out_dir: Path,
    options: ExportOptions,
    fusions: str | None,
    progress: Progress,
) -> _Traced:
    """Load the torch model, keep its reference logits, trace it into ``out_dir`` and free it
    (``_reference_and_trace``, whose local it is: ``del model`` frees it before ONNX Runtime loads).

    With ``low_memory`` and a GGUF source (fp32) the weights stay in a scratch file the model maps
    (``models.gguf.load_gguf_model_mapped``), packed initializers are spilled beside it while tracing,
    and a ``PageEvictor`` drops their pages as they are read: the same model and graph, resident
    memory near one layer's weights plus what the exporter itself holds."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        scratch: Path | None = None
        if options.low_memory and ckpt.gguf is not None and options.dtype == "fp32":
            scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=out_dir, prefix=".weights-")))
        return _reference_and_trace(
            ckpt, tokenizer, source, out_dir, options, fusions, progress, scratch, stack
        )


def _reference_and_trace(
    ckpt: ModelSource,
    tokenizer: Tokenizer,
    source: str,
    out_dir: Path,
    options: ExportOptions,
    fusions: str | None,
    progress: Progress,
    scratch: Path | None,
    stack: contextlib.ExitStack,
) -> _Traced:
    """Load the model (mapped from ``scratch`` when given: its page evictor and the spilling of packed
    initializers go on ``stack``, left before ``scratch`` goes), compute the reference logits, trace;
    the model is a local of this frame only."""
    import torch
    from specls.models.mapped_weights import PageEvictor, spill_large_initializers

    model, spec, head_ids, weights = _load_model(ckpt, tokenizer, source, options, scratch)
    if scratch is not None:  # the evictor keeps the maps it drops alive until it is left
        evictor = stack.enter_context(PageEvictor(arrays=weights))
        stack.enter_context(spill_large_initializers(scratch, evictor))
    del weights
    n_params = sum(p.numel() for p in model.parameters())
    reference = torch_reference(model, spec) if options.verify else None
    _log_memory("torch model loaded")

    progress("tracing to ONNX", 0.15)
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".export-") as tmp, torch.no_grad():
        if options.dtype == "fp16":
            del model  # the fp32 copy was only needed for the reference logits
            release_freed_memory(collect=True)
            model = _load_torch_model(ckpt, options, dtype=torch.float16)[0]
            if head_ids is not None:
                slice_head(model, _text_config(model.config), head_ids)
        spec, fusions = _trace_graphs(model, spec, Path(tmp), options, fusions, progress)
        del model  # the graph's weights are on disk now: free the torch copy before ONNX Runtime loads
        release_freed_memory(collect=True)
        _log_memory("traced")
        progress("writing files", 0.5)
        for f in [*out_dir.glob(f"{ONNX_FILE}*"), *out_dir.glob(f"{BATCH_ONNX_FILE}*")]:
            f.unlink()
        (out_dir / SPEC_FILE).unlink(missing_ok=True)  # loadable again only once everything passed
        (out_dir / HEAD_IDS_FILE).unlink(missing_ok=True)
        for f in Path(tmp).iterdir():
            shutil.move(str(f), out_dir / f.name)
    return _Traced(spec, fusions, head_ids, reference, n_params)


def _load_model(
    ckpt: ModelSource, tokenizer: Tokenizer, source: str, options: ExportOptions, scratch: Path | None
) -> tuple[Any, ModelSpec, np.ndarray | None, list[np.ndarray]]:
    """The fp32 torch model, its spec, for an ASCII draft head the token ids its head keeps, and the
    memory maps its weights are views of (a GGUF dequantized into ``scratch``; none without it)."""
    maps: list[np.ndarray] = []
    if scratch is not None and ckpt.gguf is not None:
        try:
            model, config, weight_file = load_gguf_model_mapped(
                ckpt.gguf, scratch / "weights.bin", options.attn_implementation
            )
        except GgufError as exc:
            raise ExportError(str(exc)) from None
        maps = list(weight_file.arrays().values())
        weight_file.close()
        _log_memory("GGUF dequantized into a mapped file")
    else:
        model, config = _load_torch_model(ckpt, options)
    fim = _pick_fim(tokenizer, options.fim_family)
    spec = _make_spec(config, model, tokenizer, fim, options, source)
    if options.draft_head != "ascii":
        return model, spec, None, maps
    head_ids = ascii_token_ids(tokenizer, spec.vocab_size, spec.eos_token_ids)
    slice_head(model, _text_config(model.config), head_ids)
    log.info("draft head: %d of %d tokens (ASCII and added tokens)", head_ids.size, spec.vocab_size)
    return model, replace(spec, head_ids_file=HEAD_IDS_FILE), head_ids, maps


def _trace_graphs(
    model: Any, spec: ModelSpec, tmp: Path, options: ExportOptions, fusions: str | None, progress: Progress
) -> tuple[ModelSpec, str | None]:
    """Trace ``model`` into ``tmp``: the fused graph when ``fusions`` (the plain one where that
    fails), plus the dynamic-batch graph for ``batch_graph``. Returns the spec and the fusions used."""
    tmp_onnx = tmp / ONNX_FILE
    if fusions is not None:
        try:
            _trace_fused(model, spec, tmp_onnx, options, fusions)
        except Exception as exc:  # transformers' exporter is young: fall back to the plain graph
            log.warning("fused export (ort_fusions=%s) failed, exporting the plain graph: %s", fusions, exc)
            for f in tmp.iterdir():
                f.unlink()
            fusions = None
        else:
            if options.batch_graph:
                progress("tracing the dynamic-batch graph", 0.45)
                _trace(model, spec, tmp / BATCH_ONNX_FILE, options)
                spec = replace(spec, batch_onnx_file=BATCH_ONNX_FILE)
            return spec, fusions
    _trace(model, spec, tmp_onnx, options)
    return spec, None


def _share_checkpoint_weights(ckpt: ModelSource, out_dir: Path, graphs: list[str]) -> dict[str, Any]:
    """Copy the checkpoint's safetensors (and config files) beside ``graphs`` and make the graphs
    read their weights from it; returns what ``share_weights`` did per graph, for the report."""
    from specls.models.weight_sharing import share_weights  # it imports ExportError from here

    for name in (SAFETENSORS_FILE, *HF_FILES):
        src, dst = ckpt.dir / name, out_dir / name
        if src.is_file() and not (dst.exists() and dst.samefile(src)):
            shutil.copyfile(src, dst)
    shared: dict[str, Any] = {}
    for graph in graphs:
        r = share_weights(out_dir / graph, out_dir / SAFETENSORS_FILE)
        shared[graph] = {
            "externalized": len(r.expressions),
            "unmatched": list(r.unmatched),
            "bytes": [r.bytes_before, r.bytes_after],
        }
    return shared


def _add_inputs(out_dir: Path, spec: ModelSpec, graphs: list[str]) -> ModelSpec:
    """Add ``logits_to_keep`` to every graph (or none) and the shared KV buffer to the main one."""
    if graphs and all(add_logits_to_keep(out_dir / g, spec.logits_name, check_only=True) for g in graphs):
        for g in graphs:  # every graph or none: specls.json names one set of inputs
            add_logits_to_keep(out_dir / g, spec.logits_name)
        spec = replace(spec, input_names=(*spec.input_names, LOGITS_TO_KEEP))
    if share_kv_buffer(out_dir / spec.onnx_file, spec):  # the batch graph keeps its own pasts
        spec = replace(spec, shared_kv_buffer=True)
    return spec


def _fail(out_dir: Path, report: dict[str, Any], t0: float, message: str) -> ExportError:
    """Record a failed export in ``export.json`` (what the user reads) and return its error."""
    report["export_s"] = round(time.perf_counter() - t0, 2)
    report["failed"] = message
    (out_dir / REPORT_FILE).write_text(json.dumps(report, indent=2, default=str) + "\n")
    return ExportError(message)


def _verify_graphs(
    reference: TorchReference,
    out_dir: Path,
    spec: ModelSpec,
    graphs: list[str],
    options: ExportOptions,
    report: dict[str, Any],
    fail: Callable[[str], ExportError],
) -> None:
    """Check each graph's ONNX Runtime logits against torch's; raises through ``fail`` past the
    tolerance."""
    for graph in graphs:
        result = verify_export(reference, out_dir, spec, options, onnx_file=graph)
        report["verify" if graph == spec.onnx_file else "verify_batch"] = asdict(result)
        tol = result.tolerance
        log.info("verify %s: max abs diff %s (tolerance %g)", graph, result.max_abs_diff, tol)
        if result.worst > tol or not np.isfinite(result.worst):
            raise fail(
                f"{out_dir / graph}: ONNX Runtime logits differ from torch by {result.worst:.3g} "
                f"(tolerance {tol:g}); per check: {result.max_abs_diff}. {SPEC_FILE} was not kept; "
                f"re-export with a larger --tolerance (or --no-verify) to accept this graph"
            )
    _log_memory("verified against torch")


# "auto" quantizes only models with at least this many weights: below it int4 saves a few MB and
# the flat distributions of tiny models (the test checkpoints) fall under the agreement floor
AUTO_MIN_PARAMS = 50_000_000


def resolve_quantize(mode: str, dtype: str) -> str:
    """The ``--quantize`` mode an export uses (before the size rule, AUTO_MIN_PARAMS): "auto" is int8
    for fp32 and none for fp16 (the CUDA graph: never measured on a GPU; ``--dtype fp16 --quantize
    int4`` builds it). int8 over int4 on the CPU: a much faster prefill, a one-token pass as fast or
    faster, a verify pass that costs little more than a one-token one, and closer agreement with
    fp32, for a somewhat larger file (docs/quantization.md)."""
    if mode == "auto":
        return "int8" if dtype == "fp32" else "none"
    if mode not in QUANTIZE_MODES:
        raise ExportError(f"quantize must be auto or one of {QUANTIZE_MODES}, not {mode!r}")
    if mode == "int8" and dtype != "fp32":
        raise ExportError(
            f"--quantize int8 takes --dtype fp32 (its integer kernel computes in fp32), not {dtype}"
        )
    return mode


def _quantize_options(mode: str, options: ExportOptions) -> QuantizeOptions | None:
    base = options_for(mode)
    if base is None:
        return None
    return replace(
        base,
        block_size=options.quant_block_size,
        accuracy_level=options.quant_accuracy_level,
        embedding=options.quantize_embedding and (base.bits == 4 or base.kernel == "integer"),
        # the int8 kernel computes in fp32: an fp16 graph (the CUDA one) keeps MatMulNBits for its head
        head_kernel=base.head_kernel if options.dtype == "fp32" else None,
    )


def _quantize_dir(
    out_dir: Path,
    spec: ModelSpec,
    graphs: list[str],
    quant: QuantizeOptions,
    options: ExportOptions,
    report: dict[str, Any],
    progress: Progress,
    fail: Callable[[str], ExportError],
) -> None:
    """Quantize ``graphs`` of ``out_dir`` into a staging dir, check the main graph's agreement with
    the unquantized one on held-out code, then replace the unquantized graphs by the quantized ones."""
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".quantize-") as tmp:
        stage = Path(tmp)
        for i, graph in enumerate(graphs):
            progress(f"quantizing {graph} to {quant.bits} bits", 0.65 + 0.05 * i)
            try:
                r = quantize_graph(out_dir / graph, stage / graph, quant, spec.logits_name)
            except QuantizeError as exc:
                raise fail(str(exc)) from None
            report.setdefault("quantized", {})[graph] = asdict(r)
            release_freed_memory(collect=True)
            _log_memory(f"quantized {graph}")
        kept = [TOKENIZER_FILE, *([spec.head_ids_file] if spec.head_ids_file else [])]
        for name in kept:
            shutil.copyfile(out_dir / name, stage / name)
        spec.write(stage)
        if options.verify:
            result = _measure_agreement(out_dir, stage, spec, options, progress, fail)
            below = _hold_the_floor(result, options.agreement.min_top1, quant.bits, graphs, out_dir, report)
            if below is not None:
                raise fail(below)
        for graph in graphs:
            for f in out_dir.glob(f"{graph}*"):
                f.unlink()
        for f in stage.iterdir():
            if f.name != SPEC_FILE and f.name not in kept:
                shutil.move(str(f), out_dir / f.name)


def _measure_agreement(
    out_dir: Path,
    stage: Path,
    spec: ModelSpec,
    options: ExportOptions,
    progress: Progress,
    fail: Callable[[str], ExportError],
) -> AgreementResult:
    """The staged quantized graph against the unquantized one on held-out code: the unquantized
    graph's logits first, then the quantized graph alone, never both sessions."""
    from specls.models.agreement import agreement_of_dirs

    agree = options.agreement
    progress("the unquantized graph's logits on held-out code", 0.75)

    def step(phase: str, n: int) -> None:
        what = "the unquantized graph's logits" if phase == "reference" else "comparing with it"
        progress(
            f"{what} on held-out code ({n}/{agree.positions})",
            0.75 + 0.1 * (phase != "reference") + 0.1 * min(1.0, n / max(1, agree.positions)),
        )

    ref: Any = ReferenceGraph(out_dir / spec.onnx_file, spec)
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".reference-") as spill:
        try:
            if options.low_memory:
                ref = _stored_reference(ref, stage, agree, step, Path(spill))
            result = agreement_of_dirs(ref, stage, agree, step, spill_dir=out_dir)
        except ValueError as exc:
            raise fail(f"{stage / spec.onnx_file}: {exc}") from None
    release_freed_memory(collect=True)
    _log_memory("agreement measured")
    log.info("%s vs unquantized: %s", spec.onnx_file, result.summary())
    return result


def _hold_the_floor(
    result: AgreementResult, floor: float, bits: int, graphs: list[str], out_dir: Path, report: dict[str, Any]
) -> str | None:
    """Record ``result``; below ``floor`` neither the unquantized nor the quantized graphs stay, and
    the reason is returned (the caller fails with it)."""
    report["agreement"] = asdict(result)
    report["agreement_floor"] = floor
    if result.worst_top1 >= floor:
        return None
    for graph in graphs:
        for f in out_dir.glob(f"{graph}*"):
            f.unlink()
    where = "FIM-prompt" if result.worst_top1 != result.top1 else "held-out"
    npos = result.fim_positions if where == "FIM-prompt" else result.positions
    return (
        f"{out_dir}: the {bits}-bit graph agrees with the unquantized one on only "
        f"{100 * result.worst_top1:.1f}% of {npos} {where} positions (floor "
        f"{100 * floor:.0f}%; mean KL {result.mean_kl:.4f}, mean |Δlogit| "
        f"{result.mean_abs_dlogit:.3f}); {SPEC_FILE} was not written"
    )


def _stored_reference(
    ref: ReferenceGraph,
    stage: Path,
    agree: AgreementOptions,
    step: Callable[[str, int], None],
    spill: Path,
) -> StoredLogits:
    """The unquantized graph's logits on the agreement windows (those ``agreement_of_dirs`` scores
    the staged candidate on), computed by a session that reads the graph's weights from its mapped
    external data (``low_memory``) and freed before the candidate loads."""
    from specls.models.agreement import agreement_windows, graph_logits

    tokenizer = Tokenizer.from_file(stage / ref.spec.tokenizer_file)
    windows = [ids for _, ids in agreement_windows(tokenizer.encode, agree, ref.spec.fim)]
    logits = graph_logits(ref.graph, ref.spec, agree.threads, prepacking=False)
    with _mapped_pages_dropped(ref.graph, True):  # left before the session goes with ``logits``
        stored = StoredLogits(logits, windows, spill, lambda n: step("reference", n))
    del logits
    release_freed_memory(collect=True)
    return stored


def _log_memory(stage: str) -> None:
    """Log the process' resident memory now and its peak so far (what an export's budget is measured by)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    now = resident_bytes()
    log.info("export: %s (RSS %.2f GB now, peak RSS so far %.2f GB)", stage, now / 1e9, peak * 1024 / 1e9)


def _load_torch_model(
    ckpt: ModelSource, options: ExportOptions, dtype: torch.dtype | None = None
) -> tuple[Any, Any]:
    import torch

    if ckpt.gguf is not None:
        try:
            return load_gguf_model(ckpt.gguf, dtype or torch.float32, options.attn_implementation)
        except GgufError as exc:
            raise ExportError(str(exc)) from None
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(ckpt.dir, trust_remote_code=options.trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(
            ckpt.dir,
            config=config,
            dtype=dtype or torch.float32,
            trust_remote_code=options.trust_remote_code,
            attn_implementation=options.attn_implementation,
        )
    except Exception as exc:
        raise ExportError(
            f"{ckpt}: cannot load the checkpoint with transformers ({type(exc).__name__}: {exc})"
        ) from None
    model.eval()
    return model, config


def _pick_fim(tokenizer: Tokenizer, family: str | None) -> FimTemplate | None:
    """The FIM template for specls.json: detected from the vocab (None), none at all (NO_FIM: the
    engine builds prefix-only prompts), or the named preset fitted to the vocab."""
    if family is None:
        fim = detect_template(tokenizer.get_vocab())
        log.info("FIM template: %s", fim.family if fim else "none in the vocab (prefix-only prompts)")
        return fim
    if family == NO_FIM:
        return None
    if family not in PRESETS:
        raise ExportError(f"unknown FIM family {family!r} (known: {sorted(PRESETS)} or {NO_FIM!r})")
    fim = PRESETS[family]
    missing = [t for t in (fim.prefix, fim.suffix, fim.middle) if tokenizer.token_to_id(t) is None]
    if missing:
        raise ExportError(f"FIM family {family!r}: tokenizer lacks {missing}")
    return fit_template(fim, tokenizer.get_vocab())


def _text_config(config: Any) -> Any:
    get = getattr(config, "get_text_config", None)
    return get(decoder=True) if callable(get) else config


def _make_spec(
    config: Any,
    model: Any,
    tokenizer: Tokenizer,
    fim: FimTemplate | None,
    options: ExportOptions,
    source: str,
) -> ModelSpec:
    tc = _text_config(config)
    heads = int(tc.num_attention_heads)
    kv_heads = int(getattr(tc, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(tc, "head_dim", None) or tc.hidden_size // heads)
    vocab = int(model.get_output_embeddings().weight.shape[0])
    eos: list[int] = []
    for src in (getattr(tc, "eos_token_id", None), getattr(model.generation_config, "eos_token_id", None)):
        for e in src if isinstance(src, list) else [src]:
            if isinstance(e, int) and e not in eos:
                eos.append(e)
    for s in fim.eos if fim else ():
        i = tokenizer.token_to_id(s)
        if i is not None and i not in eos:
            eos.append(i)
    eos = [e for e in eos if 0 <= e < vocab]
    bos = getattr(tc, "bos_token_id", None)
    pk, pv, ok, ov = kv_names(int(tc.num_hidden_layers))
    archs = getattr(config, "architectures", None) or [type(model).__name__]
    return ModelSpec(
        model_type=str(config.model_type),
        architecture=str(archs[0]),
        vocab_size=vocab,
        num_layers=int(tc.num_hidden_layers),
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        hidden_size=int(tc.hidden_size),
        dtype=options.dtype,
        onnx_file=ONNX_FILE,
        tokenizer_file=TOKENIZER_FILE,
        input_names=("input_ids", "attention_mask", "position_ids"),
        past_key_names=pk,
        past_value_names=pv,
        present_key_names=ok,
        present_value_names=ov,
        logits_name="logits",
        eos_token_ids=tuple(eos),
        fim=fim,
        max_context=int(getattr(tc, "max_position_embeddings", None) or 4096),
        bos_token_id=bos if isinstance(bos, int) and 0 <= bos < vocab else None,
        source=source,
        next_edit_layout=options.next_edit_layout or layout_for_model(source),
    )


def _kv_wrapper(model: Any, num_layers: int) -> Any:
    """An nn.Module with a flat signature: (ids, mask, positions, [k0, v0, k1, v1, ...]) ->
    (logits, [present k0, v0, ...]); builds the transformers DynamicCache from the flat tensors."""
    import torch
    from transformers import DynamicCache

    params = inspect.signature(model.forward).parameters
    cache_kw = "cache" if "cache" in params else "past_key_values"
    config = model.config

    class KVWrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(
            self,
            input_ids: torch.Tensor,  # [batch, new]
            attention_mask: torch.Tensor,  # [batch, past+new]
            position_ids: torch.Tensor,  # [batch, new]
            past_kv: list[torch.Tensor],  # 2*layers x [batch, kv_heads, past, head_dim]
        ) -> tuple[torch.Tensor, list[torch.Tensor]]:
            pairs = [(past_kv[2 * i], past_kv[2 * i + 1]) for i in range(num_layers)]
            cache = DynamicCache(ddp_cache_data=pairs, config=config)
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=True,
                **{cache_kw: cache},
            )
            present: list[torch.Tensor] = []
            layers: list[Any] = list(cache.layers)
            for layer in layers:
                present += [layer.keys, layer.values]
            return out.logits, present  # logits: [batch, new, vocab]

    return KVWrapper().eval()


def _trace(model: Any, spec: ModelSpec, onnx_path: Path, options: ExportOptions) -> None:
    import torch

    dtype = torch.float16 if options.dtype == "fp16" else torch.float32
    batch, new, past = 2, 3, 7  # distinct sizes so the tracer cannot conflate dims
    ids = torch.randint(0, spec.vocab_size, (batch, new), dtype=torch.int64)
    mask = torch.ones((batch, past + new), dtype=torch.int64)
    pos = torch.arange(past, past + new, dtype=torch.int64).unsqueeze(0).expand(batch, new).contiguous()
    kv = [
        torch.randn(batch, spec.num_kv_heads, past, spec.head_dim, dtype=dtype)
        for _ in range(2 * spec.num_layers)
    ]
    dyn = torch.export.Dim.DYNAMIC
    dynamic_shapes = {
        "input_ids": {0: dyn, 1: dyn},
        "attention_mask": {0: dyn, 1: dyn},
        "position_ids": {0: dyn, 1: dyn},
        "past_kv": [{0: dyn, 2: dyn} for _ in kv],
    }
    past_names = [n for pair in zip(spec.past_key_names, spec.past_value_names, strict=True) for n in pair]
    present_names = [
        n for pair in zip(spec.present_key_names, spec.present_value_names, strict=True) for n in pair
    ]
    wrapper = _kv_wrapper(model, spec.num_layers)
    try:
        program = torch.onnx.export(
            wrapper,
            (ids, mask, pos, kv),
            dynamo=True,
            input_names=[*spec.input_names, *past_names],
            output_names=[spec.logits_name, *present_names],
            dynamic_shapes=dynamic_shapes,
            opset_version=options.opset,
            optimize=True,
            external_data=True,
        )
    except Exception as exc:
        raise ExportError(f"tracing to ONNX failed ({type(exc).__name__}: {str(exc)[:2000]})") from exc
    if program is None:
        raise ExportError("torch.onnx.export returned no program")
    _name_dims(program.model, spec)
    program.save(str(onnx_path), external_data=_needs_external_data(program))
    _drop_ir_weights(program.model.graph)


def _fusions(options: ExportOptions) -> str | None:
    if options.ort_fusions not in ("auto", "cpu", "cuda", "none"):
        raise ExportError(f"ort_fusions must be auto, cpu, cuda or none, not {options.ort_fusions!r}")
    if options.ort_fusions == "none":
        return None
    if options.ort_fusions == "auto":
        return "cuda" if options.dtype == "fp16" else "cpu"
    return options.ort_fusions


def _trace_fused(model: Any, spec: ModelSpec, onnx_path: Path, options: ExportOptions, fusions: str) -> None:
    """transformers' ONNX exporter with ONNX Runtime fusions, on a batch-1 sample with a past (GQA fuses
    multi-token steps after a past only for batch 1). Its I/O is renamed to the spec's names."""
    import onnx_ir as ir
    import torch
    from transformers import DynamicCache
    from transformers.exporters.exporter_onnx import OnnxConfig, OnnxExporter

    dtype = torch.float16 if options.dtype == "fp16" else torch.float32
    new, past = 3, 7
    kv = [
        (
            torch.randn(1, spec.num_kv_heads, past, spec.head_dim, dtype=dtype),
            torch.randn(1, spec.num_kv_heads, past, spec.head_dim, dtype=dtype),
        )
        for _ in range(spec.num_layers)
    ]
    sample: dict[str, Any] = {
        "input_ids": torch.randint(0, spec.vocab_size, (1, new), dtype=torch.int64),
        "attention_mask": torch.ones((1, past + new), dtype=torch.int64),
        "position_ids": torch.arange(past, past + new, dtype=torch.int64)[None, :],
        "past_key_values": DynamicCache(ddp_cache_data=kv, config=model.config),
        "use_cache": True,
    }
    fuse: Any = fusions  # one of "cpu" | "cuda" (checked by _fusions)
    config = OnnxConfig(dynamic=True, ort_fusions=fuse, opset_version=max(options.opset, 18))
    exported = OnnxExporter().export(model, sample, config=config)
    program = exported.program
    g = program.graph
    ins, outs = list(g.inputs), list(g.outputs)
    want_in, want_out = list(spec.graph_inputs), list(spec.graph_outputs)
    if len(ins) != len(want_in) or len(outs) != len(want_out):
        raise ExportError(
            f"fused graph has inputs {[v.name for v in ins]} and outputs {[v.name for v in outs]}, "
            f"expected {len(want_in)} inputs and {len(want_out)} outputs"
        )
    # transformers names them input_ids, attention_mask, position_ids, past_key_values.layers.{i}.keys/values
    # -> logits, cache.layers.{i}.keys/values: same order as ours; check the layer indices before renaming.
    for values, wanted in ((ins, want_in), (outs, want_out)):
        for v, name in zip(values, wanted, strict=True):
            if v.name != name and _layer_key(v.name) != _layer_key(name):
                raise ExportError(f"fused graph I/O {v.name!r} does not line up with {name!r}")
            v.name = name
    _name_dims(program, spec)
    ir.save(
        program,
        str(onnx_path),
        external_data=f"{onnx_path.name}.data" if _ir_bytes(program) > 1_800_000_000 else None,
    )
    _drop_ir_weights(program.graph)


def _drop_ir_weights(graph: Any) -> None:
    """Drop the tensors of a saved ONNX IR graph. onnxscript's rewrite rules are module-level pattern
    matchers that keep a reference to the last graph they matched, so an exported graph outlives the
    export, and through its initializers (TorchTensors wrapping the parameters) so does every torch
    weight: a freed model's parameters stayed in memory through verification, quantization and the
    agreement check, and set the export's peak.

    The initializers are not all: the exporter first makes each parameter a graph input, then an
    initializer, and onnx_ir's input list counts its members in a ``collections.Counter`` that keeps
    a removed value under a count of 0 (onnx-ir 1.1). Those stale inputs still hold most of the
    parameters once the initializers are dropped, so their tensors are dropped too and the stale
    keys removed. ``_ref_counter`` is private to onnx_ir: where a version lacks it there is nothing
    stale to drop there."""
    for value in list(graph.initializers.values()):
        value.const_value = None
    graph.initializers.clear()
    for members in (graph.inputs, graph.outputs):
        counter = getattr(members, "_ref_counter", None)  # onnx_ir internals, see above
        if not isinstance(counter, collections.Counter):
            continue
        for value, count in list(counter.items()):
            if count <= 0:
                value.const_value = None
                del counter[value]


def _layer_key(name: str) -> tuple[str, ...]:
    """("3", "key") for past_key_values.layers.3.keys / present.3.key / ...; (name,) otherwise."""
    import re

    m = re.search(r"\.(\d+)\.(key|value)s?$", name)
    return (m.group(1), m.group(2)) if m else (name,)


def _ir_bytes(model: Any) -> int:
    total = 0
    for value in model.graph.initializers.values():
        tensor = value.const_value
        if tensor is not None:
            total += tensor.nbytes
    return total


def _needs_external_data(program: Any) -> bool:
    total = 0
    for value in program.model.graph.initializers.values():
        tensor = value.const_value
        if tensor is not None:
            total += tensor.nbytes
    return total > 1_800_000_000  # protobuf's 2 GB limit


def _name_dims(model: Any, spec: ModelSpec) -> None:
    """Give the dynamic dims readable names (batch/new/total/past/past_new)."""
    import onnx_ir as ir

    def rename(value: Any, names: dict[int, str]) -> None:
        if value.shape is None:
            return
        # transformers' exporter names some fixed sizes as symbols ("2"): make them plain ints
        dims: list[Any] = [
            int(d.value) if isinstance(getattr(d, "value", None), str) and d.value.isdigit() else d
            for d in value.shape
        ]
        for axis, name in names.items():
            if axis < len(dims) and not isinstance(dims[axis], int):
                dims[axis] = ir.SymbolicDim(name)
        value.shape = ir.Shape(dims)

    g = model.graph
    inputs = {v.name: v for v in g.inputs}
    outputs = {v.name: v for v in g.outputs}
    for n in ("input_ids", "position_ids"):
        if n in inputs:
            rename(inputs[n], {0: "batch", 1: "new"})
    if "attention_mask" in inputs:
        rename(inputs["attention_mask"], {0: "batch", 1: "total"})
    for n in (*spec.past_key_names, *spec.past_value_names):
        if n in inputs:
            rename(inputs[n], {0: "batch", 2: "past"})
    if spec.logits_name in outputs:
        rename(outputs[spec.logits_name], {0: "batch", 1: "new"})
    for n in (*spec.present_key_names, *spec.present_value_names):
        if n in outputs:
            rename(outputs[n], {0: "batch", 2: "past_plus_new"})


# ops a vocabulary projection runs as (a float MatMul, or an int8 export's integer product)
PROJECTION_OPS = ("MatMul", "FusedMatMul", "Gemm", "MatMulNBits", "MatMulInteger", "MatMulIntegerToFloat")
# the graph value ``add_logits_to_keep`` negates the kept count into (its Slice's start)
KEEP_START = f"{LOGITS_TO_KEEP}_neg"


def projection_node(graph: Any, logits_name: str) -> Any | None:
    """The vocabulary projection node behind ``logits_name`` (through any Cast or Identity), or None."""
    producer = {out: node for node in graph.node for out in node.output}
    node = producer.get(logits_name)
    while node is not None and node.op_type in ("Cast", "Identity"):
        node = producer.get(node.input[0])
    return node if node is not None and node.op_type in PROJECTION_OPS else None


def add_logits_to_keep(onnx_path: Path, logits_name: str, check_only: bool = False) -> bool:
    """Give the graph a ``logits_to_keep`` input ([1] int64): the vocabulary projection (the MatMul
    behind ``logits_name``, through any Cast) then runs on the last ``logits_to_keep`` positions only,
    so a prefill computes one row of logits instead of n (a noticeable share of a CPU prefill, and
    [n, vocab] of memory at a large vocabulary). Results for the kept rows are unchanged (the
    rows of a MatMul are independent). Weights stored as external data stay where they are. False
    (and the graph untouched) when the projection is not found; ``check_only``: only say whether it
    would be added."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(onnx_path), load_external_data=False)
    graph = model.graph
    if any(i.name == LOGITS_TO_KEEP for i in graph.input):
        return True
    node = projection_node(graph, logits_name)
    if node is None:
        log.warning("%s: no projection found behind %r; logits_to_keep not added", onnx_path, logits_name)
        return False
    if check_only:
        return True
    hidden, kept = node.input[0], f"{node.input[0]}_kept"
    neg, end, axis = KEEP_START, f"{LOGITS_TO_KEEP}_end", f"{LOGITS_TO_KEEP}_axis"
    at = list(graph.node).index(node)
    graph.node.insert(at, helper.make_node("Slice", [hidden, neg, end, axis], [kept]))  # [b, keep, h]
    graph.node.insert(at, helper.make_node("Neg", [LOGITS_TO_KEEP], [neg]))
    node.input[0] = kept
    graph.initializer.extend(
        [
            helper.make_tensor(end, TensorProto.INT64, [1], [2**62]),
            helper.make_tensor(axis, TensorProto.INT64, [1], [1]),
        ]
    )
    graph.input.append(helper.make_tensor_value_info(LOGITS_TO_KEEP, TensorProto.INT64, [1]))
    for out in graph.output:
        if out.name == logits_name and len(out.type.tensor_type.shape.dim) == 3:
            dim = out.type.tensor_type.shape.dim[1]
            dim.ClearField("dim_value")
            dim.dim_param = "kept"
    onnx.save(model, str(onnx_path))
    return True


@dataclass(frozen=True)
class TorchReference:
    """The fp32 torch model's logits for one random sequence (what ``verify_export`` compares with),
    computed before the torch model is freed."""

    ids: np.ndarray  # [total] int64
    logits: np.ndarray  # [total, vocab] float32


def torch_reference(model: Any, spec: ModelSpec, total: int = 13) -> TorchReference:
    """Full-sequence forward (no cache) of a seeded random sequence of ``total`` tokens."""
    import torch

    rng = np.random.default_rng(0)
    seq = rng.integers(0, spec.vocab_size, size=total).astype(np.int64)
    with torch.no_grad():
        ref = model(input_ids=torch.from_numpy(seq[None, :])).logits[0].float().numpy()  # [total, vocab]
    return TorchReference(ids=seq, logits=ref)


def verify_export(
    reference: TorchReference,
    out_dir: Path,
    spec: ModelSpec,
    options: ExportOptions,
    onnx_file: str | None = None,
) -> VerifyResult:
    """Run the exported graph (``onnx_file``, default ``spec.onnx_file``) with ONNX Runtime against the
    fp32 torch model's ``reference`` on one sequence: a 7-token prefill, then N=5 and N=1 with the past
    fed back; compare logits position by position with torch's full-sequence forward (no cache) so
    cache handling is checked too."""
    import onnxruntime as ort
    from specls.models import runtime

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    graph = out_dir / (onnx_file or spec.onnx_file)
    if options.low_memory:
        so.add_session_config_entry(runtime.NO_PREPACKING, "1")
    sess = ort.InferenceSession(str(graph), so, providers=["CPUExecutionProvider"])
    with _mapped_pages_dropped(graph, options.low_memory):
        diffs, agree = _verify_runs(sess, reference, spec)
    del sess
    tol = options.tolerance
    if spec.dtype == "fp16":
        # fp16 rounding error grows with the logits' magnitude: the tolerance is per 10 units of it
        tol = options.fp16_tolerance * max(1.0, float(np.abs(reference.logits).max()) / 10.0)
    return VerifyResult(max_abs_diff=diffs, argmax_agree=agree, tolerance=tol)


def _mapped_pages_dropped(graph: Path, low_memory: bool) -> contextlib.AbstractContextManager[Any]:
    """While a session of ``graph`` runs: drop the pages of its mapped external data as they are
    read (``low_memory``), so the fp32 weights are never all resident."""
    from specls.models.mapped_weights import PageEvictor

    return PageEvictor(roots=[graph.parent]) if low_memory else contextlib.nullcontext()


def _verify_runs(
    sess: Any, reference: TorchReference, spec: ModelSpec
) -> tuple[dict[str, float], dict[str, float]]:
    """The prefill, N=5 and N=1 passes of ``verify_export``: max |diff| and argmax agreement each."""
    seq, ref = reference.ids, reference.logits
    np_dtype = np.float16 if spec.dtype == "fp16" else np.float32
    past = [
        np.zeros((1, spec.num_kv_heads, 0, spec.head_dim), dtype=np_dtype) for _ in range(2 * spec.num_layers)
    ]
    past_names = [n for pair in zip(spec.past_key_names, spec.past_value_names, strict=True) for n in pair]
    diffs: dict[str, float] = {}
    agree: dict[str, float] = {}
    start = 0
    for label, n in (("prefill_7", 7), ("n5_past7", 5), ("n1_past12", 1)):
        feed: dict[str, np.ndarray] = {
            "input_ids": seq[None, start : start + n],
            "attention_mask": np.ones((1, start + n), dtype=np.int64),
            "position_ids": np.arange(start, start + n, dtype=np.int64)[None, :],
        }
        if spec.keeps_logits:
            feed[LOGITS_TO_KEEP] = np.array([n], dtype=np.int64)  # all of them: compared below
        feed.update(zip(past_names, past, strict=True))
        outs = sess.run(None, feed)
        logits = np.asarray(outs[0][0], dtype=np.float32)  # [n, vocab]
        want = ref[start : start + n]
        diffs[label] = float(np.max(np.abs(logits - want)))
        agree[label] = float(np.mean(np.argmax(logits, -1) == np.argmax(want, -1)))
        past = list(outs[1:])
        start += n
    return diffs, agree


def read_report(model_dir: Path) -> dict[str, Any]:
    """The export report (``export.json``) of a model dir, or {} when absent/unreadable."""
    try:
        data = json.loads((Path(model_dir) / REPORT_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


__all__ = [
    "ExportError",
    "ExportOptions",
    "TorchReference",
    "VerifyResult",
    "export_model",
    "read_report",
    "resolve_quantize",
    "SPEC_FILE",
]
