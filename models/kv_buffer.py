"""Let a fused graph write its KV in place: the past length read from ``attention_mask``, not the past.

transformers' fused export (``GroupQueryAttention``, ORT's CPU attention) computes every layer's
``seqlens_k`` / ``total_sequence_length`` (and its mask) from ``Shape(past_key_values.i.value)[2]``,
the past tensor's length. Then the past must be exactly as long as the cached positions, and ORT's
attention concatenates past and new KV into a freshly allocated ``present`` on every pass: the
whole cache copied per pass, plus our own copy for each rollback.

``share_kv_buffer`` replaces that Shape by ``Shape(attention_mask)[1] - Shape(input_ids)[1]``: the
same number under the graph contract (the mask spans past + new), but no longer tied to the past
tensor's size. A past may then be a buffer with spare capacity, and when ``present`` is bound to the
same memory ORT's GroupQueryAttention writes only the new positions into it (it compares the
pointers: ``past_present_share_buffer``). A rollback is a length, no copy. Feeding pasts of exactly the
cached length still works, so a rewritten graph loads and runs everywhere the old one did.

Applied by ``specls export`` to its fused batch-1 graph and recorded as ``shared_kv_buffer`` in
``specls.json``; an older model directory is upgraded by exporting its model again.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from specls.models.spec import ModelSpec

log = logging.getLogger(__name__)

SEQ_AXIS = 2  # of [batch, kv_heads, seq, head_dim] (``spec.KV_LAYOUT``)


def share_kv_buffer(onnx_path: Path, spec: ModelSpec) -> bool:
    """Rewrite ``onnx_path`` in place (weights stored as external data stay where they are) so its
    pasts can be capacity buffers shared with its presents (module docstring). Returns whether the
    graph is (now) such a graph; False, and the file untouched, when it is not a fused graph of that
    shape: every present must come from a GroupQueryAttention fed its own layer's past, and the pasts
    may reach nothing else but Shape nodes reading the sequence axis."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    reason = _why_not(model.graph, spec)
    if reason is not None:
        log.info("%s: KV buffer not shared (%s)", onnx_path, reason)
        return False
    if _rewrite(model.graph, {*spec.past_key_names, *spec.past_value_names}):
        onnx.save(model, str(onnx_path))
    return True


def _why_not(graph: Any, spec: ModelSpec) -> str | None:
    """None when the graph can share its KV buffers, else what stands in the way."""
    producer = {out: node for node in graph.node for out in node.output}
    names = (spec.past_key_names, spec.past_value_names, spec.present_key_names, spec.present_value_names)
    pairs = zip(*names, strict=True)
    for past_k, past_v, present_k, present_v in pairs:
        node = producer.get(present_k)
        if node is None or node.op_type != "GroupQueryAttention":
            return f"{present_k} is not written by a GroupQueryAttention"
        if list(node.output[1:3]) != [present_k, present_v] or list(node.input[3:5]) != [past_k, past_v]:
            return f"{present_k}'s attention is not fed {past_k}/{past_v}"
    pasts = {*spec.past_key_names, *spec.past_value_names}
    for node in graph.node:
        for name in node.input:
            if name not in pasts or node.op_type == "GroupQueryAttention":
                continue
            if node.op_type != "Shape" or _shape_range(node) != (SEQ_AXIS, SEQ_AXIS + 1):
                return f"{name} feeds a {node.op_type} ({node.name})"
    return None


def _shape_range(node: Any) -> tuple[int | None, int | None]:
    attrs = {a.name: a.i for a in node.attribute}
    return attrs.get("start"), attrs.get("end")


def _rewrite(graph: Any, pasts: set[str]) -> bool:
    """Replace each Shape(past)[2:3] by Shape(attention_mask)[1:2] - Shape(input_ids)[1:2]; False
    when there was none left (an already rewritten graph)."""
    from onnx import helper

    at = [i for i, node in enumerate(graph.node) if node.op_type == "Shape" and node.input[0] in pasts]
    if not at:
        return False
    for k, i in enumerate(reversed(at)):  # from the back: earlier indices stay valid
        out = graph.node[i].output[0]
        mask_len, new_len = f"specls_mask_len_{k}", f"specls_new_len_{k}"
        del graph.node[i]
        graph.node.insert(i, helper.make_node("Sub", [mask_len, new_len], [out], name=f"specls_past_len_{k}"))
        graph.node.insert(
            i, helper.make_node("Shape", ["input_ids"], [new_len], start=1, end=2, name=new_len)
        )
        graph.node.insert(
            i, helper.make_node("Shape", ["attention_mask"], [mask_len], start=1, end=2, name=mask_len)
        )
    return True
