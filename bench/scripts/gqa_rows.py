"""Is ONNX Runtime's fused attention itself pass-size dependent? One GroupQueryAttention node (the
0.5B's head shape) fed 4 new tokens after a 300-token past in one pass and one token per pass; prints
max |a - b| / max |b| of the outputs with and without its rotary, position_ids and attention_bias
inputs (0 would mean batch-invariant).

    .venv/bin/python bench/scripts/gqa_rows.py [threads]

ORT 1.32, 1 thread, this CPU: 6.0e-7 with rotary, 8.8e-7 without; position_ids and attention_bias
change nothing. So the difference is in the kernel's attention arithmetic, not its inputs. A
diagnostic, not a test.
"""

from __future__ import annotations

import sys

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

HQ, HKV, D, P, S, MAXLEN = 14, 2, 64, 300, 4, 2048


def build(rotary: bool, posids: bool, bias: bool) -> bytes:
    ins = [
        helper.make_tensor_value_info("q", TensorProto.FLOAT, [1, "s", HQ * D]),
        helper.make_tensor_value_info("k", TensorProto.FLOAT, [1, "s", HKV * D]),
        helper.make_tensor_value_info("v", TensorProto.FLOAT, [1, "s", HKV * D]),
        helper.make_tensor_value_info("pk", TensorProto.FLOAT, [1, HKV, "p", D]),
        helper.make_tensor_value_info("pv", TensorProto.FLOAT, [1, HKV, "p", D]),
        helper.make_tensor_value_info("seqlens", TensorProto.INT32, [1]),
        helper.make_tensor_value_info("total", TensorProto.INT32, []),
    ]
    names = ["q", "k", "v", "pk", "pv", "seqlens", "total"]
    if rotary:
        ins += [helper.make_tensor_value_info(n, TensorProto.FLOAT, [MAXLEN, D // 2]) for n in ("cos", "sin")]
        names += ["cos", "sin"]
    else:
        names += ["", ""]
    if posids:
        ins.append(helper.make_tensor_value_info("pos", TensorProto.INT64, [1, "s"]))
        names.append("pos")
    elif bias:
        names.append("")
    if bias:
        ins.append(helper.make_tensor_value_info("bias", TensorProto.FLOAT, [1, 1, "s", "t"]))
        names.append("bias")
    node = helper.make_node(
        "GroupQueryAttention",
        names,
        ["o", "ok", "ov"],
        domain="com.microsoft",
        num_heads=HQ,
        kv_num_heads=HKV,
        do_rotary=int(rotary),
        rotary_interleaved=0,
    )
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("o", "ok", "ov")]
    g = helper.make_graph([node], "g", ins, outs)
    m = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    return m.SerializeToString()


def run(rotary: bool, posids: bool, bias: bool, threads: int) -> float:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(build(rotary, posids, bias), so, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, S, HQ * D)).astype(np.float32)
    k = rng.standard_normal((1, S, HKV * D)).astype(np.float32)
    v = rng.standard_normal((1, S, HKV * D)).astype(np.float32)
    pk = rng.standard_normal((1, HKV, P, D)).astype(np.float32)
    pv = rng.standard_normal((1, HKV, P, D)).astype(np.float32)
    ang = np.outer(np.arange(MAXLEN), 1.0 / 10000 ** (np.arange(D // 2) * 2 / D))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)

    def feed(a: int, b: int, past_k: np.ndarray, past_v: np.ndarray) -> list[np.ndarray]:
        n = b - a
        total = P + b
        f = {
            "q": q[:, a:b],
            "k": k[:, a:b],
            "v": v[:, a:b],
            "pk": past_k,
            "pv": past_v,
            "seqlens": np.array([total - 1], np.int32),
            "total": np.array(total, np.int32),
        }
        if rotary:
            f |= {"cos": cos, "sin": sin}
        if posids:
            f["pos"] = np.arange(P + a, P + b, dtype=np.int64)[None]
        if bias:
            m = np.zeros((1, 1, n, total), np.float32)
            for i in range(n):
                m[0, 0, i, P + a + i + 1 :] = np.finfo(np.float32).min  # causal
            f["bias"] = m
        return list(sess.run(None, f))

    whole = feed(0, S, pk, pv)[0]
    rows, ck, cv = [], pk, pv
    for i in range(S):
        o, ck, cv = feed(i, i + 1, ck, cv)
        rows.append(o)
    one = np.concatenate(rows, axis=1)
    return float(np.max(np.abs(whole - one)) / np.max(np.abs(one)))


if __name__ == "__main__":
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    print("ort", ort.__version__, "threads", threads)
    for rotary in (False, True):
        for posids in (False, True):
            for bias in (False, True):
                if posids and not rotary:
                    continue
                try:
                    d = run(rotary, posids, bias, threads)
                    print(
                        f"rotary={rotary} position_ids={posids} attention_bias={bias}: max rel diff {d:.2e}"
                    )
                except Exception as e:
                    print(
                        f"rotary={rotary} position_ids={posids} attention_bias={bias}: error {str(e)[:200]}"
                    )
