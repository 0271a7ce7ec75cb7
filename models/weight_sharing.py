"""One copy of the weights: an exported graph reads its large initializers from the checkpoint's
``model.safetensors`` as ONNX external data (``share_weights``), so a model directory holds the
weights once for ONNX Runtime and for ``from_pretrained``.

Each rewritten initializer is matched by value against the safetensors tensors (bit for bit, after
a cast, a transpose or a row concatenation), so the graph computes exactly what it did.

onnx is imported inside the functions: this module is importable without it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from specls.models.export import ExportError

log = logging.getLogger(__name__)

# safetensors dtype -> numpy dtype name and ONNX TensorProto data type (BF16 is read as raw uint16)
_ST_DTYPES: dict[str, tuple[str, int]] = {
    "F32": ("float32", 1),
    "F16": ("float16", 10),
    "BF16": ("uint16", 16),
}
# ONNX data type -> numpy dtype name for the initializers we try to match
_ONNX_FLOATS: dict[int, str] = {1: "float32", 10: "float16"}
_PROTOBUF_LIMIT = 1_800_000_000


@dataclass(frozen=True)
class SafetensorsEntry:
    """One tensor of a safetensors file: where its bytes are (absolute file offset)."""

    name: str
    dtype: str  # safetensors dtype: "F16" | "F32" | "BF16" | ...
    shape: tuple[int, ...]
    offset: int  # 8 + header length + data_offsets[0]
    length: int  # data_offsets[1] - data_offsets[0]


@dataclass(frozen=True)
class ShareReport:
    """What ``share_weights`` did to one graph: each externalized initializer with its expression
    (e.g. ``concat0(q.weight, k.weight).T``), the float initializers of at least ``min_elements``
    elements left inline (no exact match), and the graph file's size before/after."""

    graph: str
    expressions: dict[str, str] = field(default_factory=dict)
    unmatched: tuple[str, ...] = ()
    bytes_before: int = 0
    bytes_after: int = 0


def read_safetensors_index(path: Path) -> dict[str, SafetensorsEntry]:
    """The tensors of a safetensors file (header only). Raises ExportError on a malformed file."""
    import struct

    path = Path(path)
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) != 8:
                raise ExportError(f"{path}: not a safetensors file (shorter than 8 bytes)")
            (n,) = struct.unpack("<Q", head)
            if n <= 0 or 8 + n > size or n > 100_000_000:
                raise ExportError(f"{path}: not a safetensors file (header length {n}, file size {size})")
            header = json.loads(f.read(n))
    except OSError as exc:
        raise ExportError(f"{path}: cannot read ({exc})") from None
    except ValueError as exc:
        raise ExportError(f"{path}: not a safetensors file (header is not JSON: {exc})") from None
    if not isinstance(header, dict):
        raise ExportError(f"{path}: not a safetensors file (header is not a JSON object)")
    base = 8 + n
    out: dict[str, SafetensorsEntry] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = (int(x) for x in meta["data_offsets"])
            entry = SafetensorsEntry(
                name=str(name),
                dtype=str(meta["dtype"]),
                shape=tuple(int(d) for d in meta["shape"]),
                offset=base + begin,
                length=end - begin,
            )
        except (KeyError, TypeError, ValueError):
            raise ExportError(f"{path}: malformed header entry {name!r}: {meta!r}") from None
        if entry.length < 0 or base + end > size:
            raise ExportError(f"{path}: tensor {name!r} lies outside the file")
        out[entry.name] = entry
    return out


class _HfTensors:
    """The float tensors of a safetensors file as read-only numpy views (memory-mapped)."""

    def __init__(self, path: Path, index: dict[str, SafetensorsEntry]) -> None:
        self.index = {k: e for k, e in index.items() if e.dtype in _ST_DTYPES}
        self._mm = np.memmap(path, dtype=np.uint8, mode="r")

    def array(self, name: str) -> np.ndarray:
        e = self.index[name]
        raw = self._mm[e.offset : e.offset + e.length]
        return raw.view(np.dtype(_ST_DTYPES[e.dtype][0])).reshape(e.shape)

    def as_dtype(self, name: str, dtype: np.dtype, transposed: bool) -> np.ndarray:
        """The tensor cast to ``dtype`` the way ONNX Cast does it (BF16 widened exactly)."""
        a = self.array(name)
        if self.index[name].dtype == "BF16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        a = a.T if transposed else a
        return a.astype(dtype, copy=False)


@dataclass(frozen=True)
class _Expr:
    """init = [transpose]( concat_axis0( [transpose](cast(hf_i)) ... ) )"""

    parts: tuple[str, ...]
    parts_transposed: bool
    result_transposed: bool

    def text(self) -> str:
        parts = [f"{p}.T" if self.parts_transposed else p for p in self.parts]
        body = parts[0] if len(parts) == 1 else f"concat0({', '.join(parts)})"
        if self.result_transposed:
            body = f"({body}).T" if len(parts) == 1 else f"{body}.T"
        return body


def _bits(a: np.ndarray) -> np.ndarray:
    """A bitwise view (so -0.0 != 0.0 and NaNs compare by payload)."""
    a = np.ascontiguousarray(a)
    return a.view(np.uint32 if a.dtype.itemsize == 4 else np.uint16)


def _match(value: np.ndarray, hf: _HfTensors) -> _Expr | None:
    """An expression over the safetensors tensors whose value equals ``value`` bit for bit, or None.
    Tried in order: the tensor itself, its transpose, row-concatenations of tensors (or of their
    transposes), and the transpose of such a concatenation."""
    dtype = value.dtype
    forms = [(False, False), (False, True)]
    if value.ndim == 2:
        forms += [(True, False), (True, True)]
    for result_t, parts_t in forms:
        if parts_t and value.ndim != 2:
            continue
        want = value.T if result_t else value
        found = _split_rows(want, hf, dtype, parts_t)
        if found is not None:
            return _Expr(tuple(found), parts_t, result_t)
    return None


def _split_rows(want: np.ndarray, hf: _HfTensors, dtype: np.dtype, transposed: bool) -> list[str] | None:
    """Names whose (transposed) tensors, concatenated on axis 0, equal ``want`` exactly (depth-first)."""
    tail = tuple(want.shape[1:])
    cands: list[tuple[str, int]] = []
    for name, e in hf.index.items():
        shape = tuple(reversed(e.shape)) if transposed else e.shape
        if len(shape) != want.ndim or tuple(shape[1:]) != tail or shape[0] == 0 or shape[0] > want.shape[0]:
            continue
        if transposed and len(e.shape) != 2:
            continue
        cands.append((name, shape[0]))
    if not cands:
        return None
    want_bits = _bits(want)

    def block_equal(name: str, row: int, rows: int) -> bool:
        got = hf.as_dtype(name, dtype, transposed)
        # cheap first-row check before the full comparison
        if not np.array_equal(_bits(got[:1]), want_bits[row : row + 1]):
            return False
        return bool(np.array_equal(_bits(got), want_bits[row : row + rows]))

    def search(row: int, depth: int) -> list[str] | None:
        if row == want.shape[0]:
            return []
        if depth >= 64:
            return None
        for name, rows in cands:
            if row + rows <= want.shape[0] and block_equal(name, row, rows):
                rest = search(row + rows, depth + 1)
                if rest is not None:
                    return [name, *rest]
        return None

    return search(0, 0)


def _external_location(tensor: Any) -> str | None:
    from onnx import TensorProto

    if tensor.data_location != TensorProto.EXTERNAL:
        return None
    return next((kv.value for kv in tensor.external_data if kv.key == "location"), None)


def share_weights(onnx_path: Path, safetensors_path: Path, min_elements: int = 256) -> ShareReport:
    """Rewrite ``onnx_path`` in place so its large float initializers are read from
    ``safetensors_path`` (same directory) as ONNX external data, followed by Cast / Transpose / Concat
    nodes that ONNX Runtime constant-folds at session creation.

    Every rewritten initializer is matched by value: its expression over the safetensors tensors
    equals it bit for bit (after the cast), so the graph computes exactly what it did. Float
    initializers with at least ``min_elements`` elements that match nothing stay inline (logged);
    smaller ones (shape constants, norms) always stay inline. Raises ExportError on unreadable files
    or a safetensors file outside the graph's directory.
    """
    onnx_path, safetensors_path = Path(onnx_path), Path(safetensors_path)
    _check_paths(onnx_path, safetensors_path)
    index = read_safetensors_index(safetensors_path)
    hf = _HfTensors(safetensors_path, index)
    model, old_locations, before = _load_graph(onnx_path, safetensors_path.name)
    rewriter = _Rewriter(model.graph, index, safetensors_path.name)
    keep, unmatched = rewriter.rewrite(hf, min_elements)
    for name in unmatched:
        log.warning(
            "%s: initializer %s matches no tensor of %s; kept inline", onnx_path, name, safetensors_path
        )
    rewriter.install(model, keep)
    data_name = _save_graph(model, onnx_path, keep)
    for loc in old_locations - {safetensors_path.name}:
        if loc != data_name:
            (onnx_path.parent / loc).unlink(missing_ok=True)
    report = ShareReport(
        graph=onnx_path.name,
        expressions=rewriter.expressions,
        unmatched=tuple(unmatched),
        bytes_before=before,
        bytes_after=onnx_path.stat().st_size,
    )
    log.info(
        "%s: %d initializers read from %s, %d large ones inline; %d -> %d bytes",
        onnx_path,
        len(report.expressions),
        safetensors_path.name,
        len(unmatched),
        report.bytes_before,
        report.bytes_after,
    )
    return report


def _check_paths(onnx_path: Path, safetensors_path: Path) -> None:
    if not safetensors_path.is_file():
        raise ExportError(f"{safetensors_path}: missing (share_weights needs the checkpoint's safetensors)")
    if safetensors_path.resolve().parent != onnx_path.resolve().parent:
        raise ExportError(
            f"{safetensors_path}: must be in the graph's directory {onnx_path.parent} (ONNX external data "
            "is resolved relative to the graph)"
        )


def _load_graph(onnx_path: Path, safetensors_name: str) -> tuple[Any, set[str], int]:
    """The graph with every initializer inline except those already read from the safetensors (a
    re-run is a no-op), the external data files it read them from, and the graph file's size."""
    import onnx
    from onnx import TensorProto
    from onnx.external_data_helper import load_external_data_for_tensor

    try:
        before = onnx_path.stat().st_size
        model = onnx.load(str(onnx_path), load_external_data=False)
        old_locations: set[str] = set()
        for t in model.graph.initializer:
            loc = _external_location(t)
            if loc is not None and loc != safetensors_name:
                old_locations.add(loc)
                load_external_data_for_tensor(t, str(onnx_path.parent))
                t.data_location = TensorProto.DEFAULT
                del t.external_data[:]
    except Exception as exc:
        raise ExportError(f"{onnx_path}: cannot load the ONNX graph ({type(exc).__name__}: {exc})") from None
    return model, old_locations, before


class _Rewriter:
    """Replaces a graph's matched initializers by external-data tensors of the safetensors file and
    the Cast / Transpose / Concat / Identity nodes that rebuild them; a value computed once (tied
    weights) is reused."""

    def __init__(self, graph: Any, index: dict[str, SafetensorsEntry], safetensors_name: str) -> None:
        self.graph = graph
        self.index = index
        self.safetensors_name = safetensors_name
        self.taken = {t.name for t in graph.initializer} | {v.name for v in graph.input}
        self.taken |= {v.name for v in graph.output}
        for node in graph.node:
            self.taken.update(node.output)
        self.new_inits: list[Any] = []
        self.new_nodes: list[Any] = []
        self.memo: dict[tuple[str, int, bool], str] = {}  # (hf name, onnx dtype, transposed) -> value name
        self.expressions: dict[str, str] = {}

    def rewrite(self, hf: _HfTensors, min_elements: int) -> tuple[list[Any], list[str]]:
        """Rewrite every matching initializer; returns the initializers kept inline and the names of
        the large ones that matched nothing."""
        from onnx import numpy_helper

        unmatched: list[str] = []
        keep: list[Any] = []
        for init in self.graph.initializer:
            numel = int(np.prod(init.dims)) if len(init.dims) else 1
            if init.data_type not in _ONNX_FLOATS or numel < min_elements or _external_location(init):
                keep.append(init)
                continue
            expr = _match(numpy_helper.to_array(init), hf)
            if expr is None:
                unmatched.append(init.name)
                keep.append(init)
                continue
            self._build(init.name, init.data_type, expr)
        return keep, unmatched

    def install(self, model: Any, keep: list[Any]) -> None:
        """Put the new tensors and nodes in the graph (before the nodes that read them)."""
        from onnx import helper

        g = self.graph
        del g.initializer[:]
        g.initializer.extend([*self.new_inits, *keep])
        nodes = [*self.new_nodes, *g.node]
        del g.node[:]
        g.node.extend(nodes)
        if not any(op.domain in ("", "ai.onnx") for op in model.opset_import):
            model.opset_import.append(helper.make_opsetid("", 18))

    def _build(self, name: str, dt: int, expr: _Expr) -> None:
        from onnx import helper

        if len(expr.parts) == 1 and not expr.result_transposed:
            got = self._value(expr.parts[0], dt, expr.parts_transposed, name)
            if got != name:  # already computed for another initializer (tied weights)
                self.new_nodes.append(helper.make_node("Identity", [got], [name]))
        else:
            parts = [self._value(p, dt, expr.parts_transposed, None) for p in expr.parts]
            if len(parts) > 1:
                cat = name if not expr.result_transposed else self._fresh(f"{name}.concat")
                self.new_nodes.append(helper.make_node("Concat", parts, [cat], axis=0))
            else:
                cat = parts[0]
            if expr.result_transposed:
                self.new_nodes.append(helper.make_node("Transpose", [cat], [name], perm=[1, 0]))
        self.expressions[name] = expr.text()

    def _fresh(self, base: str) -> str:
        name, i = base, 1
        while name in self.taken:
            name, i = f"{base}_{i}", i + 1
        self.taken.add(name)
        return name

    def _source(self, hf_name: str) -> str:
        """The external-data tensor of ``hf_name`` (made once)."""
        from onnx import TensorProto

        key = (hf_name, -1, False)
        if key not in self.memo:
            e = self.index[hf_name]
            t = TensorProto(name=self._fresh(f"safetensors::{hf_name}"), data_type=_ST_DTYPES[e.dtype][1])
            t.dims.extend(e.shape)
            t.data_location = TensorProto.EXTERNAL
            for k, v in (("location", self.safetensors_name), ("offset", e.offset), ("length", e.length)):
                t.external_data.add(key=k, value=str(v))
            self.new_inits.append(t)
            self.memo[key] = t.name
        return self.memo[key]

    def _value(self, hf_name: str, onnx_dtype: int, transposed: bool, out: str | None) -> str:
        """hf_name cast to onnx_dtype (and transposed): an existing value, or new nodes ending in out."""
        from onnx import helper

        key = (hf_name, onnx_dtype, transposed)
        if key in self.memo:
            return self.memo[key]
        if transposed:
            src = self._value(hf_name, onnx_dtype, False, None)
            name = out or self._fresh(f"{src}.T")
            self.new_nodes.append(helper.make_node("Transpose", [src], [name], perm=[1, 0]))
        elif _ST_DTYPES[self.index[hf_name].dtype][1] != onnx_dtype:
            src = self._source(hf_name)
            name = out or self._fresh(f"{src}.cast{onnx_dtype}")
            self.new_nodes.append(helper.make_node("Cast", [src], [name], to=onnx_dtype))
        else:
            name = self._source(hf_name)
        self.memo[key] = name
        return name


def _save_graph(model: Any, onnx_path: Path, keep: list[Any]) -> str | None:
    """Write the rewritten graph over ``onnx_path``; returns the name of the external data file that
    holds what matched nothing, or None when it all fits inline."""
    import onnx

    inline = sum(t.ByteSize() for t in keep)
    external = inline > _PROTOBUF_LIMIT  # what matched nothing still needs a .data file
    data_name = f"{onnx_path.name}.data"
    tmp = onnx_path.with_name(f".{onnx_path.name}.tmp")
    try:
        if external:
            (onnx_path.parent / data_name).unlink(missing_ok=True)  # onnx appends to an existing one
        onnx.save_model(
            model,
            str(tmp),
            save_as_external_data=external,
            location=data_name,
            size_threshold=1_000_000,
        )
        tmp.replace(onnx_path)
    except Exception as exc:
        tmp.unlink(missing_ok=True)
        raise ExportError(f"{onnx_path}: cannot write the shared-weights graph ({exc})") from None
    return data_name if external else None


__all__ = ["SafetensorsEntry", "ShareReport", "read_safetensors_index", "share_weights"]
