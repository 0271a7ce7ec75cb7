"""Can one target pass verify a tree of drafts (issue 40, item 2)? gqa_rows.py's GroupQueryAttention
node (no rotary) fed a 4-node tree after a 5-token past: node 0 follows the past, nodes 1 and 2
are two candidates after node 0, node 3 follows node 2. An ``attention_bias`` of [1, 1, S, past + S] that
hides every new position but a node's ancestors should make each node attend to its own branch
only; prints max |ORT - numpy| for the plain causal pass and for the tree, and how far the tree's
outputs are from the causal ones (nonzero: the bias is applied).

    .venv/bin/python bench/scripts/gqa_tree_bias.py

A diagnostic, not a test.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

# the same GroupQueryAttention node as gqa_rows.py (this folder is on sys.path when a script runs)
from gqa_rows import HKV, HQ, D, build

P = 5
PARENT = [-1, 0, 0, 2]  # the tree: each new node's parent among the new nodes (-1: the past)
S = len(PARENT)


def session(bias: bool) -> ort.InferenceSession:
    """gqa_rows.build's node without rotary or position_ids, with or without ``attention_bias``."""
    return ort.InferenceSession(build(False, False, bias), providers=["CPUExecutionProvider"])


def reference(feeds: dict[str, np.ndarray], allowed: np.ndarray) -> np.ndarray:
    """Attention in numpy where ``allowed`` [S, P + S] says which positions each new row sees."""
    k = np.concatenate([feeds["pk"], feeds["k"].reshape(1, S, HKV, D).transpose(0, 2, 1, 3)], 2)
    v = np.concatenate([feeds["pv"], feeds["v"].reshape(1, S, HKV, D).transpose(0, 2, 1, 3)], 2)
    q = feeds["q"].reshape(1, S, HQ, D).transpose(0, 2, 1, 3)
    out = np.zeros((1, HQ, S, D), np.float32)
    for head in range(HQ):
        kv = head // (HQ // HKV)
        scores = np.where(allowed, q[0, head] @ k[0, kv].T / np.sqrt(D), -np.inf)  # [S, P + S]
        w = np.exp(scores - scores.max(-1, keepdims=True))
        out[0, head] = (w / w.sum(-1, keepdims=True)) @ v[0, kv]
    return out.transpose(0, 2, 1, 3).reshape(1, S, HQ * D)


def main() -> int:
    rng = np.random.default_rng(0)
    feeds = {
        "q": rng.standard_normal((1, S, HQ * D)).astype(np.float32),
        "k": rng.standard_normal((1, S, HKV * D)).astype(np.float32),
        "v": rng.standard_normal((1, S, HKV * D)).astype(np.float32),
        "pk": rng.standard_normal((1, HKV, P, D)).astype(np.float32),
        "pv": rng.standard_normal((1, HKV, P, D)).astype(np.float32),
        "seqlens": np.array([P + S - 1], np.int32),
        "total": np.array(P + S, np.int32),
    }
    causal = np.tril(np.ones((S, P + S), bool), P)
    tree = np.zeros((S, P + S), bool)
    tree[:, :P] = True
    for row in range(S):
        node = row
        while node != -1:  # a node sees itself and its ancestors
            tree[row, P + node] = True
            node = PARENT[node]
    bias = np.where(tree, 0.0, -1e9).astype(np.float32)[None, None]  # [1, 1, S, P + S]
    plain = session(False).run(["o"], feeds)[0]
    branched = session(True).run(["o"], {**feeds, "bias": bias})[0]
    print(f"ORT {ort.__version__}: causal pass vs numpy {np.abs(plain - reference(feeds, causal)).max():.1e}")
    print(f"tree pass vs numpy's tree {np.abs(branched - reference(feeds, tree)).max():.1e}")
    print(f"tree pass vs the causal pass {np.abs(branched - plain).max():.1e} (0: the bias was ignored)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
