"""What one ONNX Runtime MatMulNBits costs per pass size on this CPU: a [M, K] x [K, N] product with
random weights quantized by onnxruntime's MatMulNBitsQuantizer (4 and 8 bits, accuracy_level 0 and
4), next to the fp32 MatMul, for M = 1, 2, 4, 8, 16 rows (the tokens of a verify pass); and whether
each row's output equals the one-row pass's, and the same row's in a 16-row pass (max |difference|).

ORT 1.32, this CPU, K=1536 N=8960: 4 bits at level 4 computes rows in pairs; the last row of an odd
pass (M = 1, 3, 5, ...) goes through the one-row kernel and differs by ~1e-6, every row of an even
pass equals the 16-row pass's exactly. That is why the runtime pads odd passes
(``RuntimeSettings.even_passes``).

The last line is ``--quantize int8`` (``models.quantize``: per-channel int8 weights x per-row int8
activations through MatMulInteger): every row equals the 16-row pass's, and its cost barely grows
with M. ``--layers 24`` chains 24 distinct weights (K->N, N->K, ...) so that they stream from memory
as a model's do instead of sitting in the cache; there, 1 thread: int4 level 4 32 / 46 / 70 / 116 ms
at M = 2 / 4 / 8 / 16, int8 27 / 28 / 28 / 39 ms (fp32 MatMul 103 / 116 / 145 / 164 ms).

    .venv/bin/python bench/scripts/matmulnbits_rows.py                  # K=1536, N=8960: the 1.5B's MLP
    .venv/bin/python bench/scripts/matmulnbits_rows.py --k 8960 --n 1536 --threads 2
    .venv/bin/python bench/scripts/matmulnbits_rows.py --layers 24

A diagnostic (run it on an otherwise idle machine), not a test.
"""

from __future__ import annotations

import argparse
import copy
import logging
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import ModelProto, TensorProto, helper, numpy_helper
from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

ROWS = (1, 2, 4, 8, 16)


def fp32_model(k: int, n: int, rng: np.random.Generator, layers: int = 1) -> ModelProto:
    """Y = A @ W0 @ W1 ... over ``layers`` distinct weights, [k, n] then [n, k] alternately."""
    nodes, inits, x = [], [], "A"
    for i in range(layers):
        shape = (k, n) if i % 2 == 0 else (n, k)
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * 0.02).astype(np.float32), f"W{i}"))
        y = "Y" if i == layers - 1 else f"h{i}"
        nodes.append(helper.make_node("MatMul", [x, f"W{i}"], [y], name=f"proj{i}"))
        x = y
    a = helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", k])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", n if layers % 2 else k])
    graph = helper.make_graph(nodes, "g", [a], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def int8_model(base: ModelProto) -> ModelProto:
    """``base`` quantized as ``specls export --quantize int8`` does it."""
    import onnx
    from specls.models.quantize import options_for, quantize_graph

    with tempfile.TemporaryDirectory() as tmp:
        onnx.save(base, f"{tmp}/fp32.onnx")
        options = options_for("int8")
        assert options is not None
        quantize_graph(Path(f"{tmp}/fp32.onnx"), Path(f"{tmp}/int8.onnx"), options, logits_name="Y")
        return onnx.load(f"{tmp}/int8.onnx")


def measure(model: ModelProto, label: str, k: int, threads: int, rng: np.random.Generator) -> None:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    x = rng.standard_normal((max(ROWS), k)).astype(np.float32)
    one_row = np.concatenate([session.run(None, {"A": x[i : i + 1]})[0] for i in range(max(ROWS))])
    many = session.run(None, {"A": x[: max(ROWS)]})[0]
    cells, drift, odd = [], 0.0, []
    for m in (*ROWS, 3, 5):
        feed = {"A": x[:m]}
        for _ in range(3):
            out = session.run(None, feed)[0]
        if np.abs(out - many[:m]).max() > 0:
            odd.append(m)
        if m not in ROWS:
            continue
        drift = max(drift, float(np.abs(out - one_row[:m]).max()))
        runs = 30
        t0 = time.perf_counter()
        for _ in range(runs):
            session.run(None, feed)
        cells.append(f"M{m} {(time.perf_counter() - t0) / runs * 1e3:6.2f}")
    print(
        f"{label:18s} ms: {'  '.join(cells)}   rows vs one-row passes: max |d| {drift:.1e};"
        f" M whose rows differ from a {max(ROWS)}-row pass: {odd or 'none'}",
        flush=True,
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--k", type=int, default=1536)
    p.add_argument("--n", type=int, default=8960)
    p.add_argument("--block", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--layers", type=int, default=1, help="distinct weights in a chain (24: stream from memory)"
    )
    args = p.parse_args()
    logging.disable(logging.INFO)  # the quantizer logs every node
    rng = np.random.default_rng(0)
    base = fp32_model(args.k, args.n, rng, args.layers)
    measure(base, "fp32 MatMul", args.k, args.threads, rng)
    for bits in (4, 8):
        for level in (0, 4) if args.layers == 1 else (4,):  # level 0 is 8-12x slower: not chained
            config = DefaultWeightOnlyQuantConfig(
                block_size=args.block, is_symmetric=True, accuracy_level=level, bits=bits
            )
            quantizer = MatMulNBitsQuantizer(copy.deepcopy(base), algo_config=config)  # it edits in place
            quantizer.process()
            measure(quantizer.model.model, f"{bits}-bit level {level}", args.k, args.threads, rng)
    measure(int8_model(base), "int8 MatMulInteger", args.k, args.threads, rng)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
