"""Export a Hugging Face causal LM (hub id or local checkpoint dir) to an ONNX graph with KV cache in/out,
plus ``tokenizer.json`` and ``specls.json``, then verify ONNX Runtime against torch.

Graph (see ``ModelSpec``): input_ids [batch, new], attention_mask [batch, total], position_ids
[batch, new], past_key_values.{i}.key/value [batch, kv_heads, past, head_dim] -> logits
[batch, new, vocab], present.{i}.key/value [batch, kv_heads, past+new, head_dim]; batch/new/past dynamic.

torch/transformers/onnx are imported inside the functions: this module is importable without them.
"""

from __future__ import annotations

import inspect
import json
import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from specls.decoder.api import EngineError
from specls.models.fim import PRESETS, FimTemplate, detect_template
from specls.models.spec import SPEC_FILE, ModelSpec, kv_names
from specls.models.tokenizer import Tokenizer

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

ONNX_FILE = "model.onnx"
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
    fim_family: str | None = None  # None = detect from the tokenizer's vocab
    attn_implementation: str = "sdpa"  # what transformers traces ("sdpa" | "eager")
    # ONNX Runtime op fusions through transformers' own exporter (GroupQueryAttention, RotaryEmbedding,
    # SkipSimplifiedLayerNormalization; batch fixed to 1): "auto" = "cpu" for fp32, "cuda" for fp16;
    # "none" = plain torch.onnx.export of our KV wrapper (any batch). A failed fusion export falls back
    # to "none" with a warning.
    ort_fusions: str = "auto"  # "auto" | "cpu" | "cuda" | "none"


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


def resolve_source(source: str, trust_remote_code: bool = False) -> Path:
    """A local checkpoint dir as is; anything else is a hub id fetched by ``snapshot_download``."""
    p = Path(source).expanduser()
    if p.is_dir():
        return p
    if p.exists() or source.startswith((".", "/", "~")) or source.count("/") > 1:
        raise ExportError(f"{source}: not a checkpoint directory (and not a Hugging Face hub id)")
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:
        raise ExportError(f"{source}: not a local directory, and huggingface_hub is not installed") from exc
    patterns = ["*.json", "*.safetensors", "*.model", "*.txt"] + (["*.py"] if trust_remote_code else [])
    try:
        return Path(snapshot_download(source, allow_patterns=patterns))
    except Exception as exc:  # network errors, missing repo, gated repo ...: one clear message
        raise ExportError(
            f"{source}: could not download from the Hugging Face hub ({type(exc).__name__}: {exc})"
        ) from None


def export_model(
    source: str, out_dir: Path, options: ExportOptions, progress: Progress | None = None
) -> Path:
    """Export ``source`` into ``out_dir`` (created; existing files there are replaced). Returns out_dir.

    Raises ExportError on a bad source, a failed trace, or (with ``options.verify``) ORT logits
    further than the tolerance from torch's.
    """
    import torch

    progress = progress or _noop
    if options.dtype not in ("fp32", "fp16"):
        raise ExportError(f"dtype must be fp32 or fp16, not {options.dtype!r}")
    fusions = _fusions(options)
    out_dir = Path(out_dir)
    t0 = time.perf_counter()

    progress("resolving source", 0.0)
    ckpt = resolve_source(source, options.trust_remote_code)
    tok_src = ckpt / TOKENIZER_FILE
    if not tok_src.is_file():
        raise ExportError(f"{tok_src}: missing (a fast tokenizer.json is required next to the checkpoint)")
    try:
        tokenizer = Tokenizer.from_file(tok_src)
    except Exception as exc:
        raise ExportError(f"{tok_src}: unreadable tokenizer ({exc})") from None

    progress("loading model", 0.05)
    model, config = _load_torch_model(ckpt, options)
    fim = _pick_fim(tokenizer, options.fim_family)
    spec = _make_spec(config, model, tokenizer, fim, options, source)

    progress("tracing to ONNX", 0.15)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".export-") as tmp, torch.no_grad():
        tmp_onnx = Path(tmp) / ONNX_FILE
        if options.dtype == "fp16":
            trace_model = _load_torch_model(ckpt, options, dtype=torch.float16)[0]
        else:
            trace_model = model
        traced = False
        if fusions is not None:
            try:
                _trace_fused(trace_model, spec, tmp_onnx, options, fusions)
                traced = True
            except Exception as exc:  # transformers' exporter is young: fall back to the plain graph
                log.warning(
                    "fused export (ort_fusions=%s) failed, exporting the plain graph: %s", fusions, exc
                )
                for f in Path(tmp).iterdir():
                    f.unlink()
        if not traced:
            fusions = None
            _trace(trace_model, spec, tmp_onnx, options)
        del trace_model
        progress("writing files", 0.7)
        for f in out_dir.glob(f"{ONNX_FILE}*"):
            f.unlink()
        for f in Path(tmp).iterdir():
            shutil.move(str(f), out_dir / f.name)
    if not (out_dir / TOKENIZER_FILE).exists() or not (out_dir / TOKENIZER_FILE).samefile(tok_src):
        shutil.copyfile(tok_src, out_dir / TOKENIZER_FILE)
    spec_path = spec.write(out_dir)

    report: dict[str, Any] = {
        "source": source,
        "ort_fusions": fusions or "none",
        "options": asdict(options),
        "export_s": round(time.perf_counter() - t0, 2),
    }
    if options.verify:
        progress("verifying ONNX Runtime vs torch", 0.8)
        result = verify_export(model, out_dir, spec, options)
        report["verify"] = asdict(result)
        tol = result.tolerance
        log.info("verify: max abs diff %s (tolerance %g)", result.max_abs_diff, tol)
        if result.worst > tol or not np.isfinite(result.worst):
            # not loadable by mistake: the runtime needs specls.json
            spec_path.unlink()
            (out_dir / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n")
            raise ExportError(
                f"{out_dir / ONNX_FILE}: ONNX Runtime logits differ from torch by {result.worst:.3g} "
                f"(tolerance {tol:g}); per check: {result.max_abs_diff}. {SPEC_FILE} was not kept; "
                f"re-export with a larger --tolerance (or --no-verify) to accept this graph"
            )
    (out_dir / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n")
    progress("done", 1.0)
    return out_dir


def _load_torch_model(
    ckpt: Path, options: ExportOptions, dtype: torch.dtype | None = None
) -> tuple[Any, Any]:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(ckpt, trust_remote_code=options.trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(
            ckpt,
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
    if family is None:
        fim = detect_template(tokenizer.get_vocab())
        log.info("FIM template: %s", fim.family if fim else "none found in the vocab")
        return fim
    if family not in PRESETS:
        raise ExportError(f"unknown FIM family {family!r} (known: {sorted(PRESETS)})")
    fim = PRESETS[family]
    missing = [t for t in (fim.prefix, fim.suffix, fim.middle) if tokenizer.token_to_id(t) is None]
    if missing:
        raise ExportError(f"FIM family {family!r}: tokenizer lacks {missing}")
    return fim


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


def verify_export(model: Any, out_dir: Path, spec: ModelSpec, options: ExportOptions) -> VerifyResult:
    """Run the exported graph with ONNX Runtime against the fp32 torch model on one sequence:
    a 7-token prefill, then N=5 and N=1 with the past fed back; compare logits position by position
    with torch's full-sequence forward (no cache) so cache handling is checked too."""
    import onnxruntime as ort
    import torch

    rng = np.random.default_rng(0)
    total = 13
    seq = rng.integers(0, spec.vocab_size, size=total).astype(np.int64)
    with torch.no_grad():
        ref = model(input_ids=torch.from_numpy(seq[None, :])).logits[0].float().numpy()  # [total, vocab]

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(out_dir / spec.onnx_file), so, providers=["CPUExecutionProvider"])
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
        feed.update(zip(past_names, past, strict=True))
        outs = sess.run(None, feed)
        logits = np.asarray(outs[0][0], dtype=np.float32)  # [n, vocab]
        want = ref[start : start + n]
        diffs[label] = float(np.max(np.abs(logits - want)))
        agree[label] = float(np.mean(np.argmax(logits, -1) == np.argmax(want, -1)))
        past = list(outs[1:])
        start += n
    tol = options.tolerance
    if spec.dtype == "fp16":
        # fp16 rounding error grows with the logits' magnitude: the tolerance is per 10 units of it
        tol = options.fp16_tolerance * max(1.0, float(np.abs(ref).max()) / 10.0)
    return VerifyResult(max_abs_diff=diffs, argmax_agree=agree, tolerance=tol)


def read_report(model_dir: Path) -> dict[str, Any]:
    """The export report (``export.json``) of a model dir, or {} when absent/unreadable."""
    try:
        data = json.loads((Path(model_dir) / REPORT_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


__all__ = ["ExportError", "ExportOptions", "VerifyResult", "export_model", "read_report", "SPEC_FILE"]
