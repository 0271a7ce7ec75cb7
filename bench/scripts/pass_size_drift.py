"""Where a graph's output starts to depend on how many tokens a pass feeds (the core invariant's
enemy on int4 graphs at accuracy_level 4): feeds N new tokens after a prompt once in one pass and once
one token per pass, and prints, node by node in graph order, how far the last token's outputs of the
two runs are apart (max |a - b| / max |b|), then the logits'.

    .venv/bin/python bench/scripts/pass_size_drift.py ~/.cache/specls-real/onnx/qwen-0.5b-int4-b64/model.onnx
    .venv/bin/python bench/scripts/pass_size_drift.py MODEL.onnx --accuracy-level 0   # the same graph at level 0

Reads a graph with specls' export inputs (input_ids, attention_mask, position_ids, logits_to_keep,
past_key_values.*). A diagnostic, not a test: it loads the whole graph with every float node output
added as a graph output.
"""

from __future__ import annotations

import argparse

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

FLOAT_OPS = {
    "MatMulNBits",
    "GroupQueryAttention",
    "SkipSimplifiedLayerNormalization",
    "SimplifiedLayerNormalization",
    "GatherBlockQuantized",
    "Sigmoid",
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="model.onnx")
    p.add_argument("--accuracy-level", type=int, default=None, help="rewrite MatMulNBits' accuracy_level")
    p.add_argument("--prompt", type=int, default=40, help="prompt tokens")
    p.add_argument("--new", type=int, default=4, help="tokens fed after the prompt")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--show", type=int, default=12, help="nodes to print from the first that drifts")
    p.add_argument("--min-drift", type=float, default=1e-6, help="what counts as drifting")
    args = p.parse_args()

    model = onnx.load(args.model)
    outputs = {o.name for o in model.graph.output}
    watched: list[tuple[str, str]] = []  # (op, output name), graph order
    for node in model.graph.node:
        if node.op_type == "MatMulNBits" and args.accuracy_level is not None:
            for a in node.attribute:
                if a.name == "accuracy_level":
                    a.i = args.accuracy_level
        if node.op_type in FLOAT_OPS and node.output[0] and node.output[0] not in outputs:
            watched.append((node.op_type, node.output[0]))
            model.graph.output.append(helper.make_tensor_value_info(node.output[0], TensorProto.FLOAT, None))
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    past_inputs = [i for i in session.get_inputs() if i.name.startswith("past_key_values.")]
    heads, head_dim = past_inputs[0].shape[1], past_inputs[0].shape[3]

    def run(ids: list[int], past: dict[str, np.ndarray], start: int) -> tuple[dict, dict]:
        feed = {
            "input_ids": np.array([ids], np.int64),
            "attention_mask": np.ones((1, start + len(ids)), np.int64),
            "position_ids": np.arange(start, start + len(ids), dtype=np.int64)[None],
            "logits_to_keep": np.array([len(ids)], np.int64),
            **past,
        }
        out = dict(zip(names, session.run(None, feed), strict=True))
        present = {i.name: out[i.name.replace("past_key_values.", "present.")] for i in past_inputs}
        return out, present

    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(100, 20_000, args.prompt)]
    new = [int(t) for t in rng.integers(100, 20_000, args.new)]
    empty = {i.name: np.zeros((1, heads, 0, head_dim), np.float32) for i in past_inputs}
    _, cached = run(prompt, empty, 0)
    together, _ = run(new, cached, len(prompt))
    past = cached
    for i, t in enumerate(new):
        alone, past = run([t], past, len(prompt) + i)

    def last_row(x: np.ndarray) -> np.ndarray:
        return x.reshape(-1, x.shape[-1])[-1]

    shown = -1
    for op, name in watched:
        a, b = last_row(together[name]), last_row(alone[name])
        drift = float(np.abs(a - b).max() / max(float(np.abs(b).max()), 1e-12))
        if shown < 0 and drift > args.min_drift:
            shown = 0
        if 0 <= shown < args.show:
            print(f"{op:34s} {name:16s} relative drift {drift:.2e}")
            shown += 1
    logits = np.abs(last_row(together["logits"]) - last_row(alone["logits"])).max()
    print(f"logits: max |dlogit| {logits:.2e} ({args.new} tokens in one pass vs one per pass)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
