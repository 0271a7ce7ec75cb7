"""Export of tiny random Llama/Qwen2 checkpoints: graph I/O, spec, verify against torch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from specls.models.export import ExportError, ExportOptions, export_model, read_report
from specls.models.fim import BUNDLED
from specls.models.spec import load_spec

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_export_writes_verified_dir(exported: dict[str, Path], arch: str) -> None:
    d = exported[arch]
    spec = load_spec(d)
    assert spec.model_type == arch
    assert (spec.num_layers, spec.num_kv_heads, spec.head_dim, spec.vocab_size) == (2, 2, 8, 300)
    assert spec.fim == BUNDLED
    assert 3 in spec.eos_token_ids  # config eos
    report = read_report(d)
    diffs = report["verify"]["max_abs_diff"]
    assert set(diffs) == {"prefill_7", "n5_past7", "n1_past12"}
    assert all(0 <= v < 1e-4 for v in diffs.values()), diffs


def test_export_graph_io(exported: dict[str, Path]) -> None:
    import onnxruntime as ort

    d = exported["llama"]
    sess = ort.InferenceSession(str(d / "model.onnx"), providers=["CPUExecutionProvider"])
    ins = {i.name: i.shape for i in sess.get_inputs()}
    outs = {o.name: o.shape for o in sess.get_outputs()}
    assert ins["input_ids"] == ["batch", "new"]
    assert ins["attention_mask"] == ["batch", "total"]
    assert ins["position_ids"] == ["batch", "new"]
    assert ins["past_key_values.1.value"] == ["batch", 2, "past", 8]
    assert outs["logits"] == ["batch", "new", 300]
    assert outs["present.0.key"][1:] == [2, "past_plus_new", 8]
    # dynamic batch and past: batch 3, past 4, new 2
    feed = {
        "input_ids": np.zeros((3, 2), np.int64),
        "attention_mask": np.ones((3, 6), np.int64),
        "position_ids": np.tile(np.arange(4, 6), (3, 1)),
    }
    for i in range(2):
        for kv in ("key", "value"):
            feed[f"past_key_values.{i}.{kv}"] = np.zeros((3, 2, 4, 8), np.float32)
    res = sess.run(None, feed)
    assert res[0].shape == (3, 2, 300) and res[1].shape == (3, 2, 6, 8)


def test_export_bad_sources(tmp_path: Path, tiny_checkpoints: dict[str, Path]) -> None:
    with pytest.raises(ExportError, match="not a checkpoint directory"):
        export_model(str(tmp_path / "missing" / "x" / "y"), tmp_path / "o", ExportOptions())
    # a hub id: no network here, so it must fail with a clear message (not hang or crash)
    with pytest.raises(ExportError, match="Hugging Face hub"):
        export_model("no-such-org/no-such-model-xyz", tmp_path / "o", ExportOptions())
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ExportError, match="tokenizer.json"):
        export_model(str(empty), tmp_path / "o", ExportOptions())
    with pytest.raises(ExportError, match="dtype"):
        export_model(str(tiny_checkpoints["llama"]), tmp_path / "o", ExportOptions(dtype="int3"))
    with pytest.raises(ExportError, match="FIM family"):
        export_model(str(tiny_checkpoints["llama"]), tmp_path / "o", ExportOptions(fim_family="nope"))
