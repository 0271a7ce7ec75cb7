"""The target's last hidden state as a graph output, for draft heads that read it (``models.feature_head``).

A feature-level draft head (Medusa/EAGLE-style) proposes the next tokens from the hidden state the
target's own vocabulary projection reads, which the verify pass computes anyway. ``add_hidden_output``
names that tensor (the final norm's output, after the ``logits_to_keep`` slice, so its rows are the
logits' rows) as the graph output ``hidden_states`` [batch, new (or kept), hidden] and records it in
``specls.json`` (``ModelSpec.hidden_name``). Logits and KV are unchanged: no node is added.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import Path

from specls.models.spec import ModelLoadError, load_spec

log = logging.getLogger(__name__)

HIDDEN_NAME = "hidden_states"


def find_projection_input(graph: object, logits_name: str) -> str | None:
    """The float tensor the vocabulary projection behind ``logits_name`` reads: the ``logits_to_keep``
    slice's output when the graph has one, else the first float input of the projection."""
    from specls.models.export import KEEP_START, projection_node

    for node in graph.node:  # type: ignore[attr-defined]
        if node.op_type == "Slice" and len(node.input) > 1 and node.input[1] == KEEP_START:
            return str(node.output[0])
    node = projection_node(graph, logits_name)
    return None if node is None else str(node.input[0])


def add_hidden_output(model_dir: Path) -> str:
    """Give ``model_dir``'s graph the output ``hidden_states`` and name it in ``specls.json``; returns
    the name. Idempotent. Raises ModelLoadError when no projection input is found (a graph exported by
    another tool) or when the graph keeps its weights in external data files (not rewritten here)."""
    import onnx
    from onnx import TensorProto, helper

    model_dir = Path(model_dir)
    spec = load_spec(model_dir)
    if spec.hidden_name is not None:
        return spec.hidden_name
    path = model_dir / spec.onnx_file
    model = onnx.load(str(path), load_external_data=False)
    if any(t.data_location == TensorProto.EXTERNAL for t in model.graph.initializer):
        raise ModelLoadError(f"{path}: weights in external data files; re-export to add {HIDDEN_NAME}")
    source = find_projection_input(model.graph, spec.logits_name)
    if source is None:
        raise ModelLoadError(f"{path}: no vocabulary projection found behind {spec.logits_name!r}")
    elem = TensorProto.FLOAT16 if spec.dtype == "fp16" else TensorProto.FLOAT
    model.graph.node.append(helper.make_node("Identity", [source], [HIDDEN_NAME]))
    model.graph.output.append(
        helper.make_tensor_value_info(HIDDEN_NAME, elem, ["batch", "kept", spec.hidden_size])
    )
    tmp = path.with_suffix(".hidden.tmp")
    onnx.save(model, str(tmp))
    os.replace(tmp, path)  # whole or not at all
    replace(spec, hidden_name=HIDDEN_NAME).write(model_dir)
    log.info("%s: added graph output %s (from %s)", path, HIDDEN_NAME, source)
    return HIDDEN_NAME
