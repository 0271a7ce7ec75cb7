"""Quantization of an exported graph's constant-weight MatMuls (projections and the LM head).

int4 (``kernel="nbits"``): each becomes a ``com.microsoft.MatMulNBits`` node (ORT's
``MatMulNBitsQuantizer``) holding 4- or 8-bit blocks (the LM head: 8 bits by default) of
``block_size`` weights along K with one scale per block; activations stay in the graph's dtype (fp32
on CPU, fp16 for CUDA). int8 (``kernel="integer"``, fp32 graphs): per-channel int8 weights and
per-row int8 activations through ``MatMulIntegerToFloat`` (``_integer_matmul``), built here
because ORT's quantizers only offer per-tensor activation scales (``DynamicQuantizeLinear``), which
would make a row's result depend on the other rows of its pass. With ``embedding``
the token-embedding Gather becomes ``GatherBlockQuantized`` (4 bits only: ORT has no 8-bit kernel for
it), which dequantizes only the looked-up rows at run time.

A MatMul whose weight reaches it through a Transpose of an initializer (tied embeddings traced as
``embed.T``) gets the transpose folded into a new initializer first, so the LM head is quantized too.

onnx/onnxruntime are imported inside the functions: this module is importable without them.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specls.api import EngineError

log = logging.getLogger(__name__)

QUANTIZE_MODES = ("none", "int4", "int8")
_PROTOBUF_LIMIT = 1_800_000_000  # protobuf's 2 GB message limit, with headroom for the graph itself


class QuantizeError(EngineError):
    """The graph could not be quantized; the message names the file and why."""


@dataclass(frozen=True)
class QuantizeOptions:
    bits: int = 4  # 4 | 8
    # "nbits": MatMulNBits (weight blocks along K, activations rounded to int8 per block inside the
    # kernel). "integer" (8 bits only): per-channel int8 weights x per-row int8 activations through
    # MatMulIntegerToFloat (MLAS' packed u8s8 GEMM), see ``_integer_matmul``. MatMulNBits at level 4 costs a
    # row-sized slice of a pass per extra row, where the GEMM reads the weights once for all rows: a
    # many-token verify pass costs little more than a one-token one (docs/quantization.md).
    kernel: str = "nbits"
    # Weights per int4 block (one scale each). 64 over 32: faster and smaller for the same agreement
    # with fp32 (within noise); 128 is faster still but loses agreement. A small draft loses a little
    # more at 64 (its agreement moves acceptance, never the output). The sweep: docs/quantization.md.
    block_size: int = 64
    # 4 = int8 activations x int4 weights in the MLAS kernels (integer dot products). 0 (fp32 compute
    # on dequantized blocks) decodes many times slower for the same top-1 agreement.
    accuracy_level: int = 4
    # symmetric blocks (no zero points): smaller and what MLAS' fastest int4 kernels take
    symmetric: bool = True
    # the embedding table as GatherBlockQuantized (4 bits only); False keeps it in the graph's dtype.
    # Quantized by default: a much smaller file for the same agreement and no measurable speed
    # difference.
    embedding: bool = True
    # bits of the LM head (the MatMul behind the logits): None = ``bits``; 0 = keep it unquantized.
    # int4 uses 8: Qwen2.5-Coder-1.5B-Instruct sits near a <|fim_pad|> attractor at some FIM points
    # (its fp32 graph emits <|fim_pad|> at some of them too); a 4-bit head tipped one completion fp32
    # got right into <|fim_pad|>, the 8-bit head kept fp32's text. Held-out agreement barely differs,
    # and the 8-bit head costs a little size.
    head_bits: int | None = None
    # kernel of an 8-bit LM head: None = ``kernel``; "integer" puts the head of an int4 (nbits) graph
    # through MatMulIntegerToFloat (``_integer_matmul``; fp32 graphs only), what ``--quantize int4`` does for
    # fp32: a bit faster, most of all on many-token passes (an 8-bit MatMulNBits head's cost grows
    # per row like the body's), for the same agreement within noise.
    head_kernel: str | None = None


@dataclass(frozen=True)
class QuantizeReport:
    """What ``quantize_graph`` did: quantized node counts by new op type, the MatMuls left as they
    were (non-constant weights: attention's Q.K^T and P.V), and the weight bytes before/after."""

    graph: str
    bits: int
    block_size: int  # of MatMulNBits and the embedding's blocks (the integer kernel: the embedding's)
    accuracy_level: int  # of MatMulNBits (unused by the integer kernel)
    kernel: str = "nbits"
    quantized: dict[str, int] = field(default_factory=dict)
    left_matmuls: int = 0
    bytes_before: int = 0
    bytes_after: int = 0


def options_for(mode: str) -> QuantizeOptions | None:
    """The options of a ``--quantize`` mode ("none" -> None). Raises QuantizeError on an unknown one."""
    if mode not in QUANTIZE_MODES:
        raise QuantizeError(f"quantize must be one of {QUANTIZE_MODES}, not {mode!r}")
    if mode == "none":
        return None
    if mode == "int8":
        return QuantizeOptions(bits=8, kernel="integer", head_bits=8)
    return QuantizeOptions(bits=4, head_bits=8, head_kernel="integer")


# ONNX data type -> bytes per element (for the weight bytes before quantization, read from dims)
_ITEMSIZE = {1: 4, 10: 2, 16: 2, 11: 8, 7: 8, 6: 4}


def _fold_weight_transposes(model: Any) -> int:
    """Replace ``MatMul(x, Transpose(W))`` (W a 2-D initializer) by ``MatMul(x, W_T)`` with W_T a new
    initializer, so the quantizer sees a constant weight. Returns how many were folded."""
    from onnx import numpy_helper

    g = model.graph
    inits = {t.name: t for t in g.initializer}
    producer = {out: node for node in g.node for out in node.output}
    folded: dict[str, str] = {}
    count = 0
    for node in g.node:
        if node.op_type != "MatMul" or len(node.input) < 2:
            continue
        t = producer.get(node.input[1])
        if t is None or t.op_type != "Transpose" or t.input[0] not in inits:
            continue
        src = inits[t.input[0]]
        perm = next((list(a.ints) for a in t.attribute if a.name == "perm"), None)
        if len(src.dims) != 2 or perm not in (None, [1, 0]):
            continue
        if src.name not in folded:
            arr = numpy_helper.to_array(src)
            name = f"{src.name}_transposed"
            g.initializer.append(numpy_helper.from_array(np.ascontiguousarray(arr.T), name))
            folded[src.name] = name
        node.input[1] = folded[src.name]
        count += 1
    return count


def _import_quantizer() -> Any:
    """ORT's quantizer module calls ``logging.basicConfig(level=INFO)`` on import (a stderr handler on
    the root logger of whoever imports it): undo that, and keep its per-node INFO lines out of logs."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    for h in root.handlers:
        if h not in handlers:
            root.removeHandler(h)
    root.setLevel(level)
    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    return MatMulNBitsQuantizer


# The int8 kernel's weights stay within 7 bits so that no x86 CPU's u8 x s8 kernel saturates
# (``_integer_matmul``).
WEIGHT_MAX = 63


def _integer_matmul(node: Any, weight: np.ndarray) -> tuple[list[Any], list[Any]]:
    """``MatMul(x, W)`` -> (nodes, initializers) computing it as per-row int8 x per-channel int8:

        s_w[n] = max|W[:, n]| / 63,   W_q = round(W / s_w)                       # [K, N] in [-63, 63]
        s_x = max(max|x[..., :]|, eps) / 127                                      # [..., 1] one per row
        x_q = round(x / s_x) + 128                                                # uint8 in [1, 255]
        y = (float(x_q @ W_q - 128 * sum(W_q)) * s_w) * s_x                       # [..., N]

    Each output row depends on its own input row only, in exact integer arithmetic, so a row's
    result is bitwise the same whatever else is in the pass. The activations are unsigned with a
    zero point of 128 because MLAS has fast integer dot-product kernels for u8 x s8, not s8 x s8.
    |x / s_x| <= 127 (up to a rounding of the division), so no clip is needed before the cast.
    The weights use 7 bits (``WEIGHT_MAX``, ORT's "reduce_range"): on an x86 CPU without dot-product
    instructions, MLAS multiplies u8 x s8 with ``vpmaddubsw``, which adds each pair of products into a
    saturating int16; 255 * 127 * 2 overflows it, 255 * 63 * 2 = 32,130 does not. With 8-bit weights such a CPU puts
    many outputs off the integer formula, and a model's agreement with fp32 falls with them.

    Few nodes, because a pass of many rows (a prefill, a next edit's region copy) spends more in
    the elementwise ops around the integer product than in it: x_q comes from one blocked
    ``QuantizeLinear`` (one block per row, opset 21), and ``MatMulIntegerToFloat`` applies s_w as it
    writes its output (a per-row scale it cannot take: s_x is one ``Mul`` after it).
    """
    from onnx import helper, numpy_helper

    s_w, q = _quantize_columns(weight)
    p = f"{node.name or node.output[0]}_i8"
    x, y = node.input[0], node.output[0]
    inits = [
        numpy_helper.from_array(q, f"{p}_w"),
        numpy_helper.from_array(s_w.astype(np.float32), f"{p}_w_scale"),
        numpy_helper.from_array(np.array(1e-30, np.float32), f"{p}_eps"),
        numpy_helper.from_array(np.array(1.0 / 127.0, np.float32), f"{p}_inv127"),
        numpy_helper.from_array(np.array(1.0, np.float32), f"{p}_one"),
        numpy_helper.from_array(np.array(128, np.uint8), f"{p}_zp"),
        numpy_helper.from_array(np.array([-1], np.int64), f"{p}_axes"),
    ]
    nodes = [
        helper.make_node("Abs", [x], [f"{p}_abs"]),
        helper.make_node("ReduceMax", [f"{p}_abs", f"{p}_axes"], [f"{p}_amax"], keepdims=1),  # [..., 1]
        helper.make_node("Max", [f"{p}_amax", f"{p}_eps"], [f"{p}_amax_pos"]),
        helper.make_node("Mul", [f"{p}_amax_pos", f"{p}_inv127"], [f"{p}_x_scale"]),  # s_x: [..., 1]
        # a blocked QuantizeLinear takes a zero point of its scale's shape
        helper.make_node("Shape", [f"{p}_x_scale"], [f"{p}_x_scale_shape"]),
        helper.make_node("Expand", [f"{p}_zp", f"{p}_x_scale_shape"], [f"{p}_x_zp"]),
        helper.make_node(
            "QuantizeLinear",
            [x, f"{p}_x_scale", f"{p}_x_zp"],
            [f"{p}_x_q"],
            axis=-1,
            block_size=int(q.shape[0]),
        ),
        helper.make_node(
            "MatMulIntegerToFloat",
            [f"{p}_x_q", f"{p}_w", f"{p}_one", f"{p}_w_scale", f"{p}_zp"],
            [f"{p}_col"],
            domain="com.microsoft",
            name=f"{p}_matmul",
        ),
        helper.make_node("Mul", [f"{p}_col", f"{p}_x_scale"], [y]),
    ]
    return nodes, inits


_BLOCK_ELEMENTS = 1 << 24  # weights quantized per block of columns: a few blocks' temporaries at most


def _quantize_columns(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(s_w [N] float32, W_q [K, N] int8) of ``_integer_matmul``, a block of columns at a time: every
    value depends on its own column only, so the result is the whole-matrix one, while the fp32
    temporaries stay a block's size (``weight`` may be a memory map: read a block at a time)."""
    k, n = weight.shape
    step = max(1, _BLOCK_ELEMENTS // max(1, k))
    s_w = np.empty(n, dtype=np.float32)
    q = np.empty((k, n), dtype=np.int8)
    for c in range(0, n, step):
        w = np.asarray(weight[:, c : c + step]).astype(np.float32)  # [K, block]
        s = np.maximum(np.abs(w).max(axis=0), np.float32(1e-30)) / np.float32(WEIGHT_MAX)
        s_w[c : c + step] = s
        q[:, c : c + step] = np.clip(np.rint(w / s), -WEIGHT_MAX, WEIGHT_MAX).astype(np.int8)
    return s_w, q


def _mapped_array(tensor: Any, base_dir: Path) -> np.ndarray | None:
    """A read-only memory map of an fp32 initializer stored as external data, or None (inline, or
    another type): the integer kernel reads its weight from there instead of loading it whole."""
    from onnx import TensorProto

    if tensor.data_location != TensorProto.EXTERNAL or tensor.data_type != TensorProto.FLOAT:
        return None
    info = {kv.key: kv.value for kv in tensor.external_data}
    shape = tuple(int(d) for d in tensor.dims)
    offset = int(info.get("offset", 0))
    n = int(np.prod(shape)) if shape else 1
    if "length" in info and int(info["length"]) != 4 * n:
        return None
    path = base_dir / info["location"]
    return np.memmap(path, dtype=np.float32, mode="r", offset=offset, shape=shape)


class _IntegerQuantizer:
    """``_integer_matmul`` behind the interface of ORT's ``DefaultWeightOnlyQuantizer``:
    ``quantize(node, graph_stack)`` returns the new nodes and adds their initializers to the innermost
    graph (which holds the node's weight: loaded, or with ``base_dir`` its external data reference,
    read through a memory map a block of columns at a time)."""

    def __init__(self, base_dir: Path | None = None) -> None:
        self.base_dir = base_dir

    def quantize(self, node: Any, graph_stack: list[Any]) -> list[Any]:
        from onnx import numpy_helper

        graph = graph_stack[-1]
        tensor = next(t for t in graph.initializer if t.name == node.input[1])
        if tensor.data_type != 1 or len(tensor.dims) != 2:  # FLOAT, [K, N]
            raise QuantizeError(f"the integer kernel takes fp32 [K, N] weights ({node.name})")
        weight = _mapped_array(tensor, self.base_dir) if self.base_dir is not None else None
        if weight is None:
            weight = numpy_helper.to_array(tensor)
        nodes, inits = _integer_matmul(node, weight)
        del weight
        graph.initializer.extend(inits)
        return nodes


def _head_matmul(model: Any, logits_name: str) -> str | None:
    """The name of the MatMul behind ``logits_name`` (through Cast/Identity/Reshape), or None."""
    producer = {out: node for node in model.graph.node for out in node.output}
    node = producer.get(logits_name)
    while node is not None and node.op_type in ("Cast", "Identity", "Reshape"):
        node = producer.get(node.input[0])
    if node is None or node.op_type != "MatMul":
        return None
    if not node.name:
        node.name = f"{logits_name}_head"  # nodes_to_exclude matches by name
    return str(node.name)


def _load_tensor(tensor: Any, base_dir: Path) -> None:
    """Read one initializer's external data into the proto (and mark it inline)."""
    from onnx import TensorProto
    from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

    if uses_external_data(tensor):
        load_external_data_for_tensor(tensor, str(base_dir))
        tensor.data_location = TensorProto.DEFAULT
        del tensor.external_data[:]


def quantize_graph(
    src: Path, dst: Path, options: QuantizeOptions, logits_name: str = "logits"
) -> QuantizeReport:
    """Quantize the graph ``src`` (with its external data) into ``dst`` (a new file; weights as
    ``dst.name + '.data'`` beside it when they pass the protobuf limit). ``src`` is left untouched.

    Streams: the graph is read without its weights, and each weight is read, quantized by ORT's
    ``DefaultWeightOnlyQuantizer`` (what ``MatMulNBitsQuantizer`` runs per node) and dropped in
    turn, so memory holds the quantized weights plus one fp32 tensor, not every fp32 weight at once
    as ``MatMulNBitsQuantizer`` on the whole model would (docs/quantization.md).

    Raises QuantizeError when the graph cannot be read or written, or when no MatMul was quantized.
    """
    import onnx

    src, dst = Path(src), Path(dst)
    head_bits, head_kernel = _check_options(options)
    try:
        model = onnx.load(str(src), load_external_data=False)
    except Exception as exc:
        raise QuantizeError(f"{src}: cannot load the ONNX graph ({type(exc).__name__}: {exc})") from None
    g = model.graph
    before = sum(int(np.prod(t.dims)) * _ITEMSIZE.get(t.data_type, 4) for t in g.initializer)
    _fold_tied_head(model, src)
    head = _head_matmul(model, logits_name)
    quantizers = _Quantizers(model, options, head_bits, head_kernel, src.parent)
    try:
        gather_quantized = _quantize_nodes(g, src.parent, options, head, quantizers)
    except Exception as exc:
        raise QuantizeError(f"{src}: quantization failed ({type(exc).__name__}: {exc})") from None
    counts = Counter(n.op_type for n in model.graph.node)
    _set_opsets(model, gather_quantized or counts["MatMulIntegerToFloat"] > 0)
    quantized = {
        op: counts[op] for op in ("MatMulNBits", "MatMulIntegerToFloat", "GatherBlockQuantized") if counts[op]
    }
    if not (quantized.get("MatMulNBits") or quantized.get("MatMulIntegerToFloat")):
        raise QuantizeError(f"{src}: no MatMul with a constant weight was found to quantize")
    after = sum(len(t.raw_data) for t in model.graph.initializer)
    _save(model, dst, external=after > _PROTOBUF_LIMIT)
    report = QuantizeReport(
        graph=dst.name,
        bits=options.bits,
        block_size=options.block_size,
        accuracy_level=options.accuracy_level,
        kernel=options.kernel,
        quantized=quantized,
        left_matmuls=counts["MatMul"],
        bytes_before=before,
        bytes_after=after,
    )
    log.info(
        "%s -> %s: %s, %d MatMuls left (activation x activation), weights %d -> %d bytes",
        src,
        dst,
        quantized,
        report.left_matmuls,
        before,
        after,
    )
    return report


def _check_options(options: QuantizeOptions) -> tuple[int, str]:
    """The LM head's bits and kernel; raises QuantizeError on options no kernel takes."""
    if options.bits not in (4, 8):
        raise QuantizeError(f"bits must be 4 or 8, not {options.bits}")
    if options.kernel not in ("nbits", "integer"):
        raise QuantizeError(f"kernel must be 'nbits' or 'integer', not {options.kernel!r}")
    if options.kernel == "integer" and options.bits != 8:
        raise QuantizeError("the integer kernel (MatMulIntegerToFloat) takes 8-bit weights only")
    if options.embedding and options.bits != 4 and options.kernel == "nbits":
        raise QuantizeError("the embedding table can only be quantized to 4 bits (GatherBlockQuantized)")
    head_bits = options.bits if options.head_bits is None else options.head_bits
    if head_bits not in (0, 4, 8):
        raise QuantizeError(f"head_bits must be 0, 4 or 8, not {head_bits}")
    head_kernel = options.kernel if options.head_kernel is None else options.head_kernel
    if head_kernel not in ("nbits", "integer"):
        raise QuantizeError(f"head_kernel must be 'nbits' or 'integer', not {head_kernel!r}")
    if head_kernel == "integer" and head_bits not in (0, 8):
        raise QuantizeError("the integer kernel (MatMulIntegerToFloat) takes an 8-bit head only")
    return head_bits, head_kernel


def _fold_tied_head(model: Any, src: Path) -> None:
    """A tied head traced as ``MatMul(x, Transpose(embed))``: load the embedding's data (the fold
    needs it) and fold the transposes into initializers."""
    g = model.graph
    producer = {out: node for node in g.node for out in node.output}
    for node in g.node:
        t = producer.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) > 1 else None
        if t is not None and t.op_type == "Transpose":
            for init in g.initializer:
                if init.name == t.input[0]:
                    _load_tensor(init, src.parent)
    folded = _fold_weight_transposes(model)
    if folded:
        log.info("%s: folded %d weight transposes into initializers", src, folded)


class _Quantizers:
    """The quantizer of each weight: the body's MatMuls, the LM head's (None: kept), the embedding's."""

    def __init__(
        self, model: Any, options: QuantizeOptions, head_bits: int, head_kernel: str, base_dir: Path
    ) -> None:
        _import_quantizer()
        self.options = options
        self.body: Any = (
            _IntegerQuantizer(base_dir) if options.kernel == "integer" else self._nbits(options.bits)
        )
        self.head: Any = None
        if head_bits and head_kernel == options.kernel and head_bits == options.bits:
            self.head = self.body
        elif head_bits:
            self.head = _IntegerQuantizer(base_dir) if head_kernel == "integer" else self._nbits(head_bits)
        # the embedding goes through GatherBlockQuantized at 4 bits whatever the kernel (ORT has no 8-bit
        # kernel for it; an 8-bit MatMulNBits export keeps it, checked above)
        self.gather: Any = self._nbits(4)

    def _nbits(self, bits: int) -> Any:
        from onnxruntime.quantization.matmul_nbits_quantizer import (
            DefaultWeightOnlyQuantConfig,
            DefaultWeightOnlyQuantizer,
        )

        return DefaultWeightOnlyQuantizer(
            DefaultWeightOnlyQuantConfig(
                block_size=self.options.block_size,
                is_symmetric=self.options.symmetric,
                accuracy_level=self.options.accuracy_level or None,
                # axis of the blocks: MatMul weights [K, N] along K; the embedding [vocab, hidden] along hidden
                quant_axes=(("MatMul", 0), ("Gather", 1)),
                bits=bits,
            )
        )


def _quantize_nodes(
    g: Any, base_dir: Path, options: QuantizeOptions, head: str | None, quantizers: _Quantizers
) -> bool:
    """Replace each constant-weight MatMul (and the embedding Gather) of ``g`` by its quantized nodes,
    one weight in memory at a time; the rest goes inline. True when the embedding was quantized."""
    import onnx

    inits = {t.name: t for t in g.initializer}
    uses = Counter(i for n in g.node for i in n.input)
    new_nodes: list[Any] = []
    gather_quantized = False
    for node in list(g.node):
        q, weight = None, None
        if node.op_type == "MatMul" and len(node.input) > 1 and node.input[1] in inits:
            q, weight = (quantizers.head if node.name == head else quantizers.body), node.input[1]
        elif node.op_type == "Gather" and options.embedding and node.input[0] in inits:
            if len(inits[node.input[0]].dims) == 2:
                q, weight = quantizers.gather, node.input[0]
        if q is None or weight is None:
            new_nodes.append(node)
            continue
        tensor = inits[weight]
        # the fp32 data goes into a scratch graph freed after this node: protobuf keeps a
        # message's memory until its root is freed, so loading into ``g`` would hold every weight
        scratch = onnx.GraphProto()
        scratch.initializer.add().CopyFrom(tensor)
        if not isinstance(q, _IntegerQuantizer):  # it maps external data itself
            _load_tensor(scratch.initializer[0], base_dir)
        out_nodes = q.quantize(node, [scratch])
        g.initializer.extend(t for t in scratch.initializer if t.name != weight)
        del scratch
        new_nodes.extend(out_nodes)
        if out_nodes != [node]:
            gather_quantized |= node.op_type == "Gather"
            uses[weight] -= 1
            if uses[weight] == 0:  # the fp32 weight is gone from the graph: free it now
                g.initializer.remove(tensor)
                del inits[weight]
    for t in g.initializer:  # what stays unquantized (norms, biases, a kept embedding) goes inline
        _load_tensor(t, base_dir)
    g.ClearField("node")
    g.node.extend(new_nodes)
    return gather_quantized


def _set_opsets(model: Any, opset_21: bool) -> None:
    """The opsets the quantized nodes need: com.microsoft, and for int4 tensors (GatherBlockQuantized's
    data) or a blocked QuantizeLinear (the int8 kernel's) opset 21 and IR 10."""
    from onnx import helper

    domains = {o.domain: o for o in model.opset_import}
    if "com.microsoft" not in domains:
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    if opset_21:
        for o in model.opset_import:
            if o.domain in ("", "ai.onnx") and o.version < 21:
                o.version = 21
        model.ir_version = max(model.ir_version, 10)


def _save(model: Any, dst: Path, external: bool) -> None:
    """Write the quantized graph to ``dst`` (weights in ``dst.name + '.data'`` when ``external``)."""
    import onnx

    dst.parent.mkdir(parents=True, exist_ok=True)
    data = dst.with_name(f"{dst.name}.data")
    data.unlink(missing_ok=True)  # onnx appends to an existing data file
    try:
        onnx.save_model(
            model, str(dst), save_as_external_data=external, location=data.name, size_threshold=1_000_000
        )
    except Exception as exc:
        dst.unlink(missing_ok=True)
        data.unlink(missing_ok=True)
        raise QuantizeError(f"{dst}: cannot write the quantized graph ({exc})") from None


__all__ = [
    "QUANTIZE_MODES",
    "QuantizeError",
    "QuantizeOptions",
    "QuantizeReport",
    "options_for",
    "quantize_graph",
]
