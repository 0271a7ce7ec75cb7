"""``specls.json``: what an exported model directory holds and how its ONNX graph is wired.

Written by ``specls.models.export`` next to the graph; read and validated by the runtime before any
session is created, so a bad directory fails with one clear ``ModelLoadError`` naming the file.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specls.models.fim import FimTemplate

from specls.api import EngineError

SPEC_FILE = "specls.json"
FORMAT_VERSION = 1
KV_LAYOUT = "batch,kv_heads,seq,head_dim"
LOGITS_TO_KEEP = "logits_to_keep"  # optional graph input: logits only for the last k new positions
DTYPES = ("fp32", "fp16")


class ModelLoadError(EngineError):
    """A model directory that cannot be used; the message names the file and what is wrong."""


@dataclass(frozen=True)
class ModelSpec:
    """An exported causal LM: architecture numbers, file names, graph I/O names, tokenizer facts.

    Graph contract: inputs ``input_ids`` [batch, new] int64, ``attention_mask`` [batch, total] int64,
    ``position_ids`` [batch, new] int64 (when listed in ``input_names``), ``logits_to_keep`` [1] int64
    (when listed: logits only for the last that many new positions), and per layer
    ``past_key_names[i]`` / ``past_value_names[i]`` [batch, kv_heads, past, head_dim]; outputs
    ``logits_name`` [batch, new (or kept), vocab] and ``present_*_names[i]`` [batch, kv_heads, past+new,
    head_dim].
    """

    model_type: str
    architecture: str
    vocab_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    dtype: str  # "fp32" | "fp16": the dtype of logits and KV tensors at the graph boundary
    onnx_file: str
    tokenizer_file: str
    input_names: tuple[str, ...]
    past_key_names: tuple[str, ...]
    past_value_names: tuple[str, ...]
    present_key_names: tuple[str, ...]
    present_value_names: tuple[str, ...]
    logits_name: str
    eos_token_ids: tuple[int, ...]
    fim: FimTemplate | None
    max_context: int
    kv_layout: str = KV_LAYOUT
    bos_token_id: int | None = None
    source: str = ""
    format_version: int = FORMAT_VERSION
    # a second graph with the same I/O but a dynamic batch axis, for passes over several sequences at
    # once (fused exports fix the batch to 1); None: batched passes use ``onnx_file`` if its batch axis
    # is dynamic, else the model cannot batch
    batch_onnx_file: str | None = None
    # the graph reads the past length from attention_mask (models.kv_buffer): a past may be a buffer
    # with spare capacity that its present is bound to, so the KV is written in place
    shared_kv_buffer: bool = False
    # a reduced LM head (a draft model's, ``specls export --draft-head``): this .npy file holds the
    # sorted token ids the graph's logits cover ([batch, new, len(ids)]); the runtime scatters them
    # into the vocabulary and fills the rest with HEAD_FILL (models.head)
    head_ids_file: str | None = None
    # the prompt layout of next-edit suggestions (specls.next_edit.layouts), written at export from the
    # source's name; None (an older export): the engine picks by the source's name
    next_edit_layout: str | None = None
    # the graph also outputs the hidden state its vocabulary projection reads, [batch, new (or kept),
    # hidden], under this name (``models.hidden_output``), for a feature-level draft head; None: not
    hidden_name: str | None = None

    @property
    def uses_position_ids(self) -> bool:
        return "position_ids" in self.input_names

    @property
    def keeps_logits(self) -> bool:
        """The graph takes ``logits_to_keep``: a prefill can skip the vocabulary projection."""
        return LOGITS_TO_KEEP in self.input_names

    @property
    def graph_inputs(self) -> tuple[str, ...]:
        return (*self.input_names, *_interleave(self.past_key_names, self.past_value_names))

    @property
    def graph_outputs(self) -> tuple[str, ...]:
        return (self.logits_name, *_interleave(self.present_key_names, self.present_value_names))

    def to_dict(self) -> dict[str, Any]:
        return {
            "format_version": self.format_version,
            "model_type": self.model_type,
            "architecture": self.architecture,
            "vocab_size": self.vocab_size,
            "num_layers": self.num_layers,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_size": self.hidden_size,
            "dtype": self.dtype,
            "onnx_file": self.onnx_file,
            "tokenizer_file": self.tokenizer_file,
            "input_names": list(self.input_names),
            "past_key_names": list(self.past_key_names),
            "past_value_names": list(self.past_value_names),
            "present_key_names": list(self.present_key_names),
            "present_value_names": list(self.present_value_names),
            "logits_name": self.logits_name,
            "kv_layout": self.kv_layout,
            "eos_token_ids": list(self.eos_token_ids),
            "bos_token_id": self.bos_token_id,
            "fim": self.fim.to_dict() if self.fim else None,
            "max_context": self.max_context,
            "source": self.source,
            "batch_onnx_file": self.batch_onnx_file,
            "shared_kv_buffer": self.shared_kv_buffer,
            "head_ids_file": self.head_ids_file,
            "next_edit_layout": self.next_edit_layout,
            "hidden_name": self.hidden_name,
        }

    def write(self, model_dir: Path) -> Path:
        path = Path(model_dir) / SPEC_FILE
        path.write_text(json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        return path


def _interleave(a: Sequence[str], b: Sequence[str]) -> tuple[str, ...]:
    out: list[str] = []
    for x, y in zip(a, b, strict=True):
        out += [x, y]
    return tuple(out)


def kv_names(num_layers: int) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """The standard names: past_key_values.{i}.key/value in, present.{i}.key/value out."""
    r = range(num_layers)
    return (
        tuple(f"past_key_values.{i}.key" for i in r),
        tuple(f"past_key_values.{i}.value" for i in r),
        tuple(f"present.{i}.key" for i in r),
        tuple(f"present.{i}.value" for i in r),
    )


def _err(path: Path, what: str) -> ModelLoadError:
    return ModelLoadError(f"{path}: {what}")


class _Fields:
    """Typed reads of a parsed ``specls.json``, each raising ModelLoadError naming the file and field."""

    def __init__(self, d: dict[str, Any], path: Path) -> None:
        self.d = d
        self.path = path

    def get_int(self, key: str, minimum: int = 1) -> int:
        v = self.d.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
            raise _err(self.path, f"field {key!r} must be an integer >= {minimum}, got {v!r}")
        return v

    def get_str(self, key: str) -> str:
        v = self.d.get(key)
        if not isinstance(v, str) or not v:
            raise _err(self.path, f"field {key!r} must be a non-empty string, got {v!r}")
        return v

    def get_names(self, key: str, n: int | None = None) -> tuple[str, ...]:
        v = self.d.get(key)
        if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
            raise _err(self.path, f"field {key!r} must be a list of names")
        if n is not None and len(v) != n:
            raise _err(self.path, f"field {key!r} has {len(v)} names, expected one per layer ({n})")
        if len(set(v)) != len(v):
            raise _err(self.path, f"field {key!r} has duplicate names")
        return tuple(v)

    def get_file(self, key: str) -> str | None:
        """An optional plain file name (no directory part), or None."""
        v = self.d.get(key)
        if v is not None and (not isinstance(v, str) or Path(v).name != v):
            raise _err(self.path, f"field {key!r} must be a plain file name or null, got {v!r}")
        return v


def spec_from_dict(d: object, path: Path) -> ModelSpec:
    """Validate a parsed ``specls.json``; raises ModelLoadError naming ``path`` and the bad field."""
    if not isinstance(d, dict):
        raise _err(path, "not a JSON object")
    f = _Fields(d, path)
    version = d.get("format_version")
    if version != FORMAT_VERSION:
        raise _err(path, f"format_version {version!r} is not supported (expected {FORMAT_VERSION})")
    num_layers = f.get_int("num_layers")
    dtype = f.get_str("dtype")
    if dtype not in DTYPES:
        raise _err(path, f"field 'dtype' must be one of {DTYPES}, got {dtype!r}")
    kv_layout = d.get("kv_layout", KV_LAYOUT)
    if kv_layout != KV_LAYOUT:
        raise _err(path, f"field 'kv_layout' must be {KV_LAYOUT!r}, got {kv_layout!r}")
    input_names = _input_names(f)
    eos, bos = _special_tokens(f)
    fim = _fim(f)
    for key in ("onnx_file", "tokenizer_file"):
        name = f.get_str(key)
        if Path(name).name != name:
            raise _err(path, f"field {key!r} must be a plain file name, got {name!r}")
    batch_file, head_file = f.get_file("batch_onnx_file"), f.get_file("head_ids_file")
    shared_kv = d.get("shared_kv_buffer", False)
    if not isinstance(shared_kv, bool):
        raise _err(path, f"field 'shared_kv_buffer' must be true or false, got {shared_kv!r}")
    source = d.get("source", "")
    layout = _next_edit_layout(d.get("next_edit_layout"), path)
    spec = ModelSpec(
        format_version=version,
        model_type=f.get_str("model_type"),
        architecture=f.get_str("architecture"),
        vocab_size=f.get_int("vocab_size"),
        num_layers=num_layers,
        num_kv_heads=f.get_int("num_kv_heads"),
        head_dim=f.get_int("head_dim"),
        hidden_size=f.get_int("hidden_size"),
        dtype=dtype,
        onnx_file=f.get_str("onnx_file"),
        tokenizer_file=f.get_str("tokenizer_file"),
        input_names=input_names,
        past_key_names=f.get_names("past_key_names", num_layers),
        past_value_names=f.get_names("past_value_names", num_layers),
        present_key_names=f.get_names("present_key_names", num_layers),
        present_value_names=f.get_names("present_value_names", num_layers),
        logits_name=f.get_str("logits_name"),
        eos_token_ids=eos,
        fim=fim,
        max_context=f.get_int("max_context"),
        kv_layout=kv_layout,
        bos_token_id=bos,
        source=source if isinstance(source, str) else "",
        batch_onnx_file=batch_file,
        shared_kv_buffer=shared_kv,
        head_ids_file=head_file,
        next_edit_layout=layout,
        hidden_name=_optional_name(d.get("hidden_name"), "hidden_name", path),
    )
    _check_names(spec, path)
    return spec


def _optional_name(value: object, key: str, path: Path) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise _err(path, f"field {key!r} must be a non-empty string or null, got {value!r}")
    return value


def _next_edit_layout(value: object, path: Path) -> str | None:
    """A known layout's name, or None; an unknown one is an error naming the known ones."""
    from specls.next_edit.layouts import LAYOUTS

    if value is None:
        return None
    if not isinstance(value, str) or value not in LAYOUTS:
        raise _err(path, f"field 'next_edit_layout' must be one of {sorted(LAYOUTS)}, got {value!r}")
    return value


def _input_names(f: _Fields) -> tuple[str, ...]:
    input_names = f.get_names("input_names")
    for required in ("input_ids", "attention_mask"):
        if required not in input_names:
            raise _err(f.path, f"field 'input_names' lacks {required!r}")
    unknown = set(input_names) - {"input_ids", "attention_mask", "position_ids", LOGITS_TO_KEEP}
    if unknown:
        raise _err(f.path, f"field 'input_names' has unknown inputs {sorted(unknown)}")
    return input_names


def _special_tokens(f: _Fields) -> tuple[tuple[int, ...], int | None]:
    """The end-of-sequence token ids and the beginning-of-sequence one (or None)."""
    eos = f.d.get("eos_token_ids")
    if not isinstance(eos, list) or not all(isinstance(x, int) and x >= 0 for x in eos):
        raise _err(f.path, "field 'eos_token_ids' must be a list of token ids")
    bos = f.d.get("bos_token_id")
    if bos is not None and (not isinstance(bos, int) or bos < 0):
        raise _err(f.path, f"field 'bos_token_id' must be a token id or null, got {bos!r}")
    return tuple(eos), bos


def _fim(f: _Fields) -> FimTemplate | None:
    fim_raw = f.d.get("fim")
    if fim_raw is None:
        return None
    try:
        return FimTemplate.from_dict(fim_raw)
    except ValueError as exc:
        raise _err(f.path, str(exc)) from None


def _check_names(spec: ModelSpec, path: Path) -> None:
    """What holds across fields: distinct graph I/O names, end-of-sequence ids inside the vocabulary."""
    if len(set(spec.graph_inputs)) != len(spec.graph_inputs):
        raise _err(path, "graph input names overlap")
    if len(set(spec.graph_outputs)) != len(spec.graph_outputs):
        raise _err(path, "graph output names overlap")
    if any(e >= spec.vocab_size for e in spec.eos_token_ids):
        raise _err(path, f"eos_token_ids {list(spec.eos_token_ids)} outside vocab_size {spec.vocab_size}")


def load_spec(model_dir: str | Path) -> ModelSpec:
    """Read and validate ``<model_dir>/specls.json`` and check the files it names exist."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ModelLoadError(f"{model_dir}: not a model directory (does not exist or is not a directory)")
    path = model_dir / SPEC_FILE
    if not path.is_file():
        raise _err(path, "missing; not an exported specls model (run `specls export MODEL --out DIR`)")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _err(path, f"unreadable JSON ({exc})") from None
    spec = spec_from_dict(raw, path)
    for name in (spec.onnx_file, spec.tokenizer_file, spec.batch_onnx_file, spec.head_ids_file):
        if name is None:
            continue
        f = model_dir / name
        if not f.is_file():
            raise _err(f, f"missing (named by {SPEC_FILE})")
    return spec


@dataclass(frozen=True)
class GraphIO:
    """A graph boundary value as the runtime reports it: name, element type string, shape."""

    name: str
    type: str
    shape: tuple[int | str | None, ...]


def _int_dims(io: GraphIO) -> GraphIO:
    """Fixed sizes some exporters write as symbols ("8") read as ints."""
    shape = tuple(int(d) if isinstance(d, str) and d.isdigit() else d for d in io.shape)
    return GraphIO(io.name, io.type, shape)


_ORT_TYPES = {"fp32": "tensor(float)", "fp16": "tensor(float16)"}


def check_graph_io(
    spec: ModelSpec,
    onnx_path: Path,
    inputs: Sequence[GraphIO],
    outputs: Sequence[GraphIO],
    head_size: int | None = None,
) -> None:
    """Check the graph's inputs/outputs (as reported by an ORT session) against the spec; ``head_size``:
    the logits width of a reduced LM head (``models.head``), None for the whole vocabulary."""
    inputs = [_int_dims(i) for i in inputs]
    outputs = [_int_dims(o) for o in outputs]
    in_by_name = {i.name: i for i in inputs}
    out_by_name = {o.name: o for o in outputs}
    missing_in = [n for n in spec.graph_inputs if n not in in_by_name]
    if missing_in:
        raise _err(
            onnx_path,
            f"graph lacks inputs {missing_in} named by {SPEC_FILE} (graph has {sorted(in_by_name)})",
        )
    extra_in = [n for n in in_by_name if n not in spec.graph_inputs]
    if extra_in:
        raise _err(onnx_path, f"graph has inputs {extra_in} that {SPEC_FILE} does not name")
    hidden = () if spec.hidden_name is None else (spec.hidden_name,)
    missing_out = [n for n in (*spec.graph_outputs, *hidden) if n not in out_by_name]
    if missing_out:
        raise _err(
            onnx_path,
            f"graph lacks outputs {missing_out} named by {SPEC_FILE} (graph has {sorted(out_by_name)})",
        )
    kv_type = _ORT_TYPES[spec.dtype]
    for name in spec.input_names:
        io = in_by_name[name]
        if name == LOGITS_TO_KEEP:
            if io.type != "tensor(int64)" or len(io.shape) != 1:
                raise _err(onnx_path, f"input {name!r} must be int64 [1], graph has {io.type} {io.shape}")
            continue
        if io.type != "tensor(int64)" or len(io.shape) != 2:
            raise _err(
                onnx_path, f"input {name!r} must be int64 [batch, seq], graph has {io.type} {io.shape}"
            )
    kv_all = [in_by_name[n] for n in (*spec.past_key_names, *spec.past_value_names)]
    kv_all += [out_by_name[n] for n in (*spec.present_key_names, *spec.present_value_names)]
    for io in kv_all:
        if io.type != kv_type or len(io.shape) != 4:
            raise _err(
                onnx_path, f"KV tensor {io.name!r} must be {kv_type} rank 4, graph has {io.type} {io.shape}"
            )
        heads, hd = io.shape[1], io.shape[3]
        if (isinstance(heads, int) and heads != spec.num_kv_heads) or (
            isinstance(hd, int) and hd != spec.head_dim
        ):
            raise _err(
                onnx_path,
                f"KV tensor {io.name!r} has shape {io.shape}, spec says "
                f"[batch, {spec.num_kv_heads}, seq, {spec.head_dim}]",
            )
    logits = out_by_name[spec.logits_name]
    if len(logits.shape) != 3 or logits.type not in _ORT_TYPES.values():
        raise _err(
            onnx_path, f"logits {logits.name!r} must be float [batch, new, vocab], graph has {logits.shape}"
        )
    v = logits.shape[2]
    if head_size is not None:
        if isinstance(v, int) and v != head_size:
            raise _err(onnx_path, f"logits dim {v} != the {head_size} ids of {spec.head_ids_file}")
    elif isinstance(v, int) and v != spec.vocab_size:
        raise _err(onnx_path, f"logits vocab dim {v} != vocab_size {spec.vocab_size} in {SPEC_FILE}")
