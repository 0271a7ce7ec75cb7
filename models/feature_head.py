"""A feature draft head: K small heads that guess the target's next tokens from its own hidden state.

The target's verify pass already computes the hidden state its vocabulary projection reads
(``models.hidden_output``); a head maps the one at the last accepted position t to the target's argmax
at t + k (chained Medusa-style heads: ``x = h + SiLU(W_k [h, e_1, ..., e_k] + b_k)``, e_1 the embedding of
the token the target committed from t and e_j the earlier heads' guesses, then the target's own
projection rows for a reduced vocabulary). All K guesses come from one small graph run, no draft model and no KV: a step
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

from specls.memory import resident_bytes

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
    """A loaded head: ``guess(hidden, token)`` -> (ids [K] int64, probs [K] float32), the K chained
    heads' top tokens and their probabilities under the reduced vocabulary."""

    def __init__(self, model_dir: Path, hidden_size: int, threads: int = 1) -> None:
        import onnxruntime as ort

        t0, rss0 = time.perf_counter(), resident_bytes()
        folder = head_dir(model_dir)
        self.info = HeadInfo.read(folder / HEAD_INFO)
        if self.info.hidden_size != hidden_size:
            raise ModelLoadError(
                f"{folder}: the head reads hidden size {self.info.hidden_size}, the target has {hidden_size}"
            )
        opts = ort.SessionOptions()
        # the target's threads, idle between its passes: its matrix-vector products split well
        opts.intra_op_num_threads = max(0, threads)  # 0: ONNX Runtime's default, as the target
        opts.inter_op_num_threads = 1
        # never spinning: a worker left spinning after a guess takes a core from the next target pass
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            self.session = ort.InferenceSession(
                str(folder / HEAD_GRAPH), opts, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:
            raise ModelLoadError(
                f"{folder / HEAD_GRAPH}: cannot load ({type(exc).__name__}: {exc})"
            ) from None
        # what loading it cost (the start-up and memory a user pays for the head)
        self.load_ms = (time.perf_counter() - t0) * 1e3
        self.rss_mib = max(0, resident_bytes() - rss0) / 2**20

    @property
    def heads(self) -> int:
        return self.info.heads

    def guess(self, hidden: np.ndarray, token: int) -> tuple[np.ndarray, np.ndarray]:
        """hidden: [d] at a position, token: the one the target committed from it -> (ids [K] int64,
        probs [K] float32): the guesses for the tokens after ``token``."""
        feed = {
            "hidden": hidden.astype(np.float32, copy=False)[None, :],
            "token": np.array([token], dtype=np.int64),
        }
        ids, probs = self.session.run(None, feed)
        return ids, probs


def _step_nodes(k: int) -> list[Any]:
    """Head k's nodes: its input (the hidden state and e_1..e_k), its block, its guess (the token id,
    its probability) and the guess's embedding e_{k+1} for the next head."""
    from onnx import helper

    embs = [f"e{j}" for j in range(1, k + 1)]
    return [
        helper.make_node("Concat", ["hidden", *embs], [f"in{k}"], axis=1),  # [1, (k + 1) d]
        helper.make_node("MatMul", [f"in{k}", f"W{k}"], [f"z{k}a"]),
        helper.make_node("Add", [f"z{k}a", f"B{k}"], [f"z{k}"]),  # [1, d]
        helper.make_node("Sigmoid", [f"z{k}"], [f"s{k}"]),
        helper.make_node("Mul", [f"z{k}", f"s{k}"], [f"silu{k}"]),
        helper.make_node("Add", ["hidden", f"silu{k}"], [f"x{k}"]),
        helper.make_node("MatMul", [f"x{k}", "P"], [f"l{k}"]),  # [1, V]
        helper.make_node("Softmax", [f"l{k}"], [f"p{k}"], axis=-1),
        helper.make_node("ArgMax", [f"p{k}"], [f"best{k}"], axis=-1, keepdims=0),  # [1]
        helper.make_node("ReduceMax", [f"p{k}"], [f"prob{k}"], keepdims=0, axes=[-1]),  # [1]
        helper.make_node("Gather", ["ids_table", f"best{k}"], [f"id{k}"]),  # [1]
        *_embedding(f"best{k}", f"e{k + 1}"),  # [1, d]
    ]


def _embedding(index: str, out: str) -> list[Any]:
    """A row of the fp16 embedding table E as float32 (half the table's memory; rows are only read)."""
    from onnx import TensorProto, helper

    return [
        helper.make_node("Gather", ["E", index], [f"{out}h"]),
        helper.make_node("Cast", [f"{out}h"], [out], to=TensorProto.FLOAT),
    ]


def head_model(
    blocks: list[tuple[np.ndarray, np.ndarray]], rows: np.ndarray, ids: np.ndarray, vocab_size: int
) -> Any:
    """The chained heads as one float ONNX model.

    hidden [1, d], token [1] (the token the target committed from that position) -> for k = 1..K:
    ``x = hidden + SiLU([hidden, e_1, ..., e_k] @ W_k + b_k)``, the guess ``argmax(x @ rows^T)``, whose
    embedding (its projection row) is e_{k+1}; e_1 is the token's (zero outside the vocabulary) ->
    ids [K] (token ids), probs [K] (each guess's probability under the reduced vocabulary).
    """
    from onnx import TensorProto, helper, numpy_helper

    d, v, k = rows.shape[1], rows.shape[0], len(blocks)
    id_map = np.full(vocab_size, v, dtype=np.int64)  # token id -> row of E (v: the zero row)
    id_map[ids] = np.arange(v)
    inits = [
        numpy_helper.from_array(id_map, "id_map"),
        numpy_helper.from_array(np.concatenate([rows, np.zeros((1, d))]).astype(np.float16), "E"),
        numpy_helper.from_array(np.ascontiguousarray(rows.T.astype(np.float32)), "P"),  # [d, V]
        numpy_helper.from_array(ids.astype(np.int64), "ids_table"),
    ]
    nodes = [helper.make_node("Gather", ["id_map", "token"], ["r1"]), *_embedding("r1", "e1")]
    for j, (w, b) in enumerate(blocks, start=1):
        inits += [
            numpy_helper.from_array(w.astype(np.float32), f"W{j}"),
            numpy_helper.from_array(b.astype(np.float32), f"B{j}"),
        ]
        nodes += _step_nodes(j)
    nodes += [
        helper.make_node("Concat", [f"id{j}" for j in range(1, k + 1)], ["ids"], axis=0),
        helper.make_node("Concat", [f"prob{j}" for j in range(1, k + 1)], ["probs"], axis=0),
    ]
    inputs = [
        helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [1, d]),
        helper.make_tensor_value_info("token", TensorProto.INT64, [1]),
    ]
    outputs = [
        helper.make_tensor_value_info("ids", TensorProto.INT64, [k]),
        helper.make_tensor_value_info("probs", TensorProto.FLOAT, [k]),
    ]
    graph = helper.make_graph(nodes, "feature_head", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def write_head_graph(
    folder: Path,
    blocks: list[tuple[np.ndarray, np.ndarray]],
    rows: np.ndarray,
    ids: np.ndarray,
    info: HeadInfo,
    vocab_size: int,
) -> Path:
    """Write ``head_model`` into ``folder``, int8 by ONNX Runtime's dynamic quantization, with its
    description."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = head_model(blocks, rows, ids, vocab_size)
    onnx.checker.check_model(model)
    folder.mkdir(parents=True, exist_ok=True)
    fp32 = folder / "head.fp32.onnx"
    onnx.save(model, str(fp32))
    out = folder / HEAD_GRAPH
    # the MatMul weights only: the embedding table is read a row at a time
    quantize_dynamic(str(fp32), str(out), weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"])
    fp32.unlink()
    info.write(folder / HEAD_INFO)
    log.info("wrote %s (%d heads, vocabulary %d)", out, len(blocks), ids.size)
    return out


def guess_cost(target: Any, guess: Any, rounds: int = 5, prefix: int = 64) -> dict[str, float]:
    """ms of a one-token pass of ``target`` (an ``OnnxCausalLM`` with the hidden output) and of one
    ``guess`` after a ``prefix``-token context, each the fastest of ``rounds`` (a busy host only adds
    time), and their ratio: what the drafting policy charges for a guess."""
    cache = target.new_cache()
    cache.forward([(7 * i + 3) % target.vocab_size for i in range(prefix)])
    hidden = cache.hidden_at(prefix - 1)
    pass_ms, guess_ms = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        cache.forward([11])
        pass_ms.append((time.perf_counter() - t0) * 1e3)
        cache.truncate(prefix)
        t0 = time.perf_counter()
        guess(hidden, 11)
        guess_ms.append((time.perf_counter() - t0) * 1e3)
    p, g = min(pass_ms), min(guess_ms)
    return {"pass_ms": round(p, 2), "guess_ms": round(g, 3), "guess_per_pass": round(g / max(p, 1e-9), 4)}


def load_feature_head(model_dir: Path, hidden_size: int, threads: int = 1) -> FeatureHead | None:
    """The target's head, or None when it has none; a broken one is logged and left out (a head only
    ever speeds decoding up)."""
    if not has_feature_head(model_dir):
        return None
    try:
        return FeatureHead(model_dir, hidden_size, threads)
    except ModelLoadError as exc:
        log.warning("feature head not used: %s", exc)
        return None


def describe(head: FeatureHead) -> dict[str, Any]:
    """What the stats and the benchmarks report of a loaded head."""
    return {
        "heads": head.heads,
        "vocab": head.info.vocab,
        "accuracy": list(head.info.accuracy),
        "load_ms": round(head.load_ms, 1),
        "rss_mib": round(head.rss_mib, 1),
    }
