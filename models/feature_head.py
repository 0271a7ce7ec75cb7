"""A feature draft head: K small heads that guess the target's next tokens from its own hidden state.

The target's verify pass already computes the hidden state its vocabulary projection reads
(``models.hidden_output``); a head maps the one at the last accepted position t to the target's argmax
at t + k (Medusa-style: ``x = h + SiLU(W_k h + b_k)``, then the target's own projection rows for a
reduced vocabulary). All K guesses come from one small graph run, no draft model and no KV: a step
costs a few percent of a target pass where a separate small draft model costs a third, so it pays on
code with nothing to copy. Every guess is still verified by the target, so the output stays exactly
its greedy output.

On disk, beside the target (``<model>/feature_head/``): ``head.onnx`` (int8, ONNX Runtime's dynamic
quantization) and ``feature_head.json`` (shape and how it was trained). ``specls head train`` makes one
(``models.feature_head_train``).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from specls.models.spec import ModelLoadError

log = logging.getLogger(__name__)

HEAD_DIR = "feature_head"
HEAD_GRAPH = "head.onnx"
HEAD_INFO = "feature_head.json"


@dataclass(frozen=True)
class HeadInfo:
    """``feature_head.json``: the head's shape and provenance (accuracy: held-out top-1 per head)."""

    heads: int
    vocab: int
    hidden_size: int
    corpus: str = ""
    positions: int = 0
    accuracy: tuple[float, ...] = ()
    train_s: float = 0.0

    @classmethod
    def read(cls, path: Path) -> HeadInfo:
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
            return cls(
                heads=int(d["heads"]),
                vocab=int(d["vocab"]),
                hidden_size=int(d["hidden_size"]),
                corpus=str(d.get("corpus", "")),
                positions=int(d.get("positions", 0)),
                accuracy=tuple(float(x) for x in d.get("accuracy", ())),
                train_s=float(d.get("train_s", 0.0)),
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ModelLoadError(f"{path}: unreadable feature head description ({exc})") from None

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2) + "\n", encoding="utf-8")


def head_dir(model_dir: Path) -> Path:
    return Path(model_dir) / HEAD_DIR


def has_feature_head(model_dir: Path) -> bool:
    return (head_dir(model_dir) / HEAD_INFO).is_file()


class FeatureHead:
    """A loaded head: ``guess(hidden)`` -> (ids [K] int64, probs [K] float32), the K heads' top tokens
    and their probabilities under the reduced vocabulary."""

    def __init__(self, model_dir: Path, hidden_size: int, threads: int = 1) -> None:
        import onnxruntime as ort

        folder = head_dir(model_dir)
        self.info = HeadInfo.read(folder / HEAD_INFO)
        if self.info.hidden_size != hidden_size:
            raise ModelLoadError(
                f"{folder}: the head reads hidden size {self.info.hidden_size}, the target has {hidden_size}"
            )
        opts = ort.SessionOptions()
        # one thread: a few small matrix-vector products, over before a second thread would start
        opts.intra_op_num_threads = max(1, threads)
        opts.inter_op_num_threads = 1
        try:
            self.session = ort.InferenceSession(
                str(folder / HEAD_GRAPH), opts, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:
            raise ModelLoadError(
                f"{folder / HEAD_GRAPH}: cannot load ({type(exc).__name__}: {exc})"
            ) from None
        self.ms = 0.0  # time spent guessing, for the stats

    @property
    def heads(self) -> int:
        return self.info.heads

    def guess(self, hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """hidden: [d] -> (ids [K] int64, probs [K] float32)."""
        t0 = time.perf_counter()
        ids, probs = self.session.run(None, {"hidden": hidden.astype(np.float32, copy=False)[None, :]})
        self.ms += (time.perf_counter() - t0) * 1e3
        return ids, probs


def write_head_graph(
    folder: Path,
    blocks: list[tuple[np.ndarray, np.ndarray]],
    rows: np.ndarray,
    ids: np.ndarray,
    info: HeadInfo,
) -> Path:
    """Write the head as one ONNX graph, int8 by ONNX Runtime's dynamic quantization.

    hidden [1, d] -> z = hidden @ W + b ([1, K*d], the K blocks side by side) -> x = hidden + SiLU(z)
    ([K, d]) -> logits = x @ rows^T ([K, V]) -> ids [K] (the reduced vocabulary's token ids), probs [K].
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    k, d = len(blocks), rows.shape[1]
    w = np.concatenate([wb[0] for wb in blocks], axis=1).astype(np.float32)  # [d, K*d]
    b = np.concatenate([wb[1] for wb in blocks]).astype(np.float32)  # [K*d]
    inits = [
        numpy_helper.from_array(w, "W"),
        numpy_helper.from_array(b, "B"),
        numpy_helper.from_array(np.ascontiguousarray(rows.T.astype(np.float32)), "P"),  # [d, V]
        numpy_helper.from_array(ids.astype(np.int64), "ids_table"),
        numpy_helper.from_array(np.array([k, d], dtype=np.int64), "kd"),
    ]
    nodes = [
        helper.make_node("MatMul", ["hidden", "W"], ["z0"]),
        helper.make_node("Add", ["z0", "B"], ["z1"]),
        helper.make_node("Reshape", ["z1", "kd"], ["z"]),  # [K, d]
        helper.make_node("Sigmoid", ["z"], ["sig"]),
        helper.make_node("Mul", ["z", "sig"], ["silu"]),
        helper.make_node("Add", ["hidden", "silu"], ["x"]),  # [K, d] (hidden broadcasts)
        helper.make_node("MatMul", ["x", "P"], ["logits"]),  # [K, V]
        helper.make_node("Softmax", ["logits"], ["p"], axis=-1),
        helper.make_node("ArgMax", ["p"], ["best"], axis=-1, keepdims=0),  # [K]
        helper.make_node("ReduceMax", ["p"], ["probs"], keepdims=0, axes=[-1]),  # [K]
        helper.make_node("Gather", ["ids_table", "best"], ["ids"]),
    ]
    graph = helper.make_graph(
        nodes,
        "feature_head",
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [1, d])],
        [
            helper.make_tensor_value_info("ids", TensorProto.INT64, [k]),
            helper.make_tensor_value_info("probs", TensorProto.FLOAT, [k]),
        ],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    folder.mkdir(parents=True, exist_ok=True)
    fp32 = folder / "head.fp32.onnx"
    onnx.save(model, str(fp32))
    out = folder / HEAD_GRAPH
    quantize_dynamic(str(fp32), str(out), weight_type=QuantType.QInt8)
    fp32.unlink()
    info.write(folder / HEAD_INFO)
    log.info("wrote %s (%d heads, vocabulary %d)", out, k, ids.size)
    return out


def load_feature_head(model_dir: Path, hidden_size: int) -> FeatureHead | None:
    """The target's head, or None when it has none; a broken one is logged and left out (a head only
    ever speeds decoding up)."""
    if not has_feature_head(model_dir):
        return None
    try:
        return FeatureHead(model_dir, hidden_size)
    except ModelLoadError as exc:
        log.warning("feature head not used: %s", exc)
        return None


def describe(head: FeatureHead | None) -> dict[str, Any]:
    if head is None:
        return {}
    return {"heads": head.heads, "vocab": head.info.vocab, "accuracy": list(head.info.accuracy)}
