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
    assert "GroupQueryAttention" in _op_types(d)  # the fused graph, not the fallback
    report = read_report(d)
    assert report["ort_fusions"] == "cpu"
    diffs = report["verify"]["max_abs_diff"]
    assert set(diffs) == {"prefill_7", "n5_past7", "n1_past12"}
    assert all(0 <= v < 1e-4 for v in diffs.values()), diffs


def _feed(batch: int, past: int, new: int, dtype: type = np.float32) -> dict[str, np.ndarray]:
    feed = {
        "input_ids": np.zeros((batch, new), np.int64),
        "attention_mask": np.ones((batch, past + new), np.int64),
        "position_ids": np.tile(np.arange(past, past + new), (batch, 1)),
        "logits_to_keep": np.array([new], np.int64),  # all of them
    }
    for i in range(2):
        for kv in ("key", "value"):
            feed[f"past_key_values.{i}.{kv}"] = np.zeros((batch, 2, past, 8), dtype)
    return feed


def _session(d: Path):  # -> onnxruntime.InferenceSession
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(str(d / "model.onnx"), so, providers=["CPUExecutionProvider"])


def _op_types(d: Path) -> set[str]:
    import onnx

    return {n.op_type for n in onnx.load(str(d / "model.onnx"), load_external_data=False).graph.node}


def test_export_graph_io_fused(exported: dict[str, Path]) -> None:
    d = exported["llama"]
    assert read_report(d)["ort_fusions"] == "cpu"
    assert "GroupQueryAttention" in _op_types(d)
    sess = _session(d)
    ins = {i.name: i.shape for i in sess.get_inputs()}
    outs = {o.name: o.shape for o in sess.get_outputs()}
    # the fused graph is batch 1 (GroupQueryAttention takes several new tokens after a past only then)
    assert ins["input_ids"] == [1, "new"]
    assert ins["attention_mask"] == [1, "total"]
    assert ins["position_ids"] == [1, "new"]
    assert ins["past_key_values.1.value"] == [1, 2, "past", 8]
    assert ins["logits_to_keep"] == [1]
    assert outs["logits"] == [1, "kept", 300]  # the last logits_to_keep positions
    assert outs["present.0.key"] == [1, 2, "past_plus_new", 8]
    res = sess.run(None, _feed(1, 4, 2))
    assert res[0].shape == (1, 2, 300) and res[1].shape == (1, 2, 6, 8)
    last = sess.run(None, {**_feed(1, 4, 2), "logits_to_keep": np.array([1], np.int64)})
    assert last[0].shape == (1, 1, 300) and np.array_equal(last[0][0, 0], res[0][0, 1])  # Not row 0
    assert all(np.array_equal(x, y) for x, y in zip(last[1:], res[1:], strict=True))  # same KV


@pytest.fixture(scope="module")
def plain_and_fp16(
    tiny_checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("variants")
    src = str(tiny_checkpoints["llama"])
    return {
        "plain": export_model(src, root / "plain", ExportOptions(ort_fusions="none", tolerance=1e-4)),
        "fp16": export_model(src, root / "fp16", ExportOptions(dtype="fp16")),
    }


def test_export_plain_graph_any_batch(plain_and_fp16: dict[str, Path]) -> None:
    d = plain_and_fp16["plain"]
    report = read_report(d)
    assert report["ort_fusions"] == "none"
    assert all(v < 1e-4 for v in report["verify"]["max_abs_diff"].values())
    assert "GroupQueryAttention" not in _op_types(d)
    assert not (d / "model.onnx.data").exists()
    sess = _session(d)
    ins = {i.name: i.shape for i in sess.get_inputs()}
    assert ins["input_ids"] == ["batch", "new"] and ins["attention_mask"] == ["batch", "total"]
    assert ins["past_key_values.0.key"] == ["batch", 2, "past", 8]
    res = sess.run(None, _feed(3, 4, 2))  # dynamic batch and past
    assert res[0].shape == (3, 2, 300) and res[1].shape == (3, 2, 6, 8)


def test_export_fp16(plain_and_fp16: dict[str, Path], exported: dict[str, Path]) -> None:
    from specls.models.runtime import OnnxCausalLM, RuntimeSettings

    d = plain_and_fp16["fp16"]
    spec = load_spec(d)
    assert spec.dtype == "fp16"
    report = read_report(d)
    assert report["ort_fusions"] == "cuda"  # fp16 graphs are fused for the CUDA provider
    assert report["verify"]["tolerance"] >= ExportOptions().fp16_tolerance
    assert all(v <= report["verify"]["tolerance"] for v in report["verify"]["max_abs_diff"].values())
    cpu = RuntimeSettings(provider="cpu")
    lm16, lm32 = OnnxCausalLM(d, cpu), OnnxCausalLM(exported["llama"], cpu)
    assert lm16.session.get_inputs()[3].type == "tensor(float16)"
    ids = [5, 17, 42, 99, 3, 250, 7, 7, 120, 64, 11, 290, 33, 8, 150, 201]
    c16, c32 = lm16.new_cache(), lm32.new_cache()
    a = np.concatenate([c16.forward(ids[:10]), c16.forward(ids[10:15]), c16.forward(ids[15:])])
    b = np.concatenate([c32.forward(ids[:10]), c32.forward(ids[10:15]), c32.forward(ids[15:])])
    assert a.dtype == np.float32 and np.isfinite(a).all()
    assert np.abs(a - b).max() < 0.1
    assert np.mean(a.argmax(-1) == b.argmax(-1)) >= 0.9


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
    with pytest.raises(ExportError, match="ort_fusions"):
        export_model(str(tiny_checkpoints["llama"]), tmp_path / "o", ExportOptions(ort_fusions="tpu"))
    with pytest.raises(ExportError, match="FIM family"):
        export_model(str(tiny_checkpoints["llama"]), tmp_path / "o", ExportOptions(fim_family="nope"))


def test_fused_failure_falls_back_to_plain(
    tiny_checkpoints: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import specls.models.export as export_mod

    def broken(model: object, spec: object, onnx_path: Path, *args: object) -> None:
        onnx_path.write_bytes(b"half-written graph")  # must not survive into the result
        (onnx_path.parent / "model.onnx.data").write_bytes(b"junk")
        raise RuntimeError("fusion exploded")

    monkeypatch.setattr(export_mod, "_trace_fused", broken)
    (tmp_path / "out").mkdir()
    d = export_model(str(tiny_checkpoints["llama"]), tmp_path / "out", ExportOptions(tolerance=1e-4))
    report = read_report(d)
    assert report["ort_fusions"] == "none"
    assert all(v < 1e-4 for v in report["verify"]["max_abs_diff"].values())
    assert "GroupQueryAttention" not in _op_types(d)
    assert not (d / "model.onnx.data").exists()


@pytest.mark.parametrize("fusions", ["cpu", "none"])
def test_torch_parameters_are_freed_after_tracing(
    tiny_checkpoints: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fusions: str
) -> None:
    """Once traced, no torch parameter outlives the model (Not: the exporter's graph, kept by
    onnxscript's module-level pattern matchers, holding them through ONNX Runtime's load: 6.5 GiB of
    the 1.5B's int4 export peak, 23 of the 27 parameters of this tiny Qwen2 on the fused path)."""
    import gc
    import logging
    import weakref

    import specls.models.export as export_mod

    params: list[tuple[str, weakref.ref[object]]] = []
    alive_after_trace: list[str] = []
    real_load, real_log = export_mod._load_torch_model, export_mod._log_memory

    def load(*args: object, **kw: object) -> tuple[object, object]:
        model, config = real_load(*args, **kw)  # type: ignore[arg-type]
        params.extend((n, weakref.ref(p)) for n, p in model.named_parameters())  # type: ignore[attr-defined]
        return model, config

    def log_memory(stage: str) -> None:
        if stage == "traced":  # right after `del model`, before ONNX Runtime loads the graph
            gc.collect()
            alive_after_trace.extend(n for n, r in params if r() is not None)
        real_log(stage)

    monkeypatch.setattr(export_mod, "_load_torch_model", load)
    monkeypatch.setattr(export_mod, "_log_memory", log_memory)
    # pytest's log capture keeps every record of a test, and one that torch.onnx.export logs with
    # its exception keeps the export's frames, and the model, alive: outside pytest nothing keeps them
    logging.disable(logging.CRITICAL)
    try:
        d = export_model(
            str(tiny_checkpoints["qwen2"]), tmp_path / "o", ExportOptions(tolerance=1e-4, ort_fusions=fusions)
        )
    finally:
        logging.disable(logging.NOTSET)
    assert read_report(d)["ort_fusions"] == fusions  # the path under test really ran
    assert len(params) > 20
    assert alive_after_trace == []


def test_verify_failure_leaves_no_loadable_dir(tiny_checkpoints: dict[str, Path], tmp_path: Path) -> None:
    from specls.models.spec import SPEC_FILE, ModelLoadError

    out = tmp_path / "strict"
    # a negative tolerance fails whatever the diff: the export must refuse the graph
    with pytest.raises(ExportError, match="differ from torch") as ei:
        export_model(str(tiny_checkpoints["llama"]), out, ExportOptions(tolerance=-1.0, ort_fusions="none"))
    assert "--tolerance" in str(ei.value)
    assert (out / "model.onnx").is_file() and not (out / SPEC_FILE).exists()
    assert "verify" in read_report(out)
    with pytest.raises(ModelLoadError, match=SPEC_FILE):
        load_spec(out)


def test_cli_console_is_the_bar_and_one_summary_line(
    tiny_checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    """`specls export` prints the progress bar (stderr) and one summary line (stdout); torch.export's
    warnings and our log records go to the log file the summary names."""
    import os
    import subprocess
    import sys

    out = tmp_path / "cli"
    proc = subprocess.run(
        [sys.executable, "-m", "specls", "export", str(tiny_checkpoints["llama"]), "--out", str(out)]
        + ["--quantize", "none", "--tolerance", "1e-4"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"exported {tiny_checkpoints['llama']} -> {out}"), lines
    log_path = tmp_path / "cli.export.log"
    assert f"log: {log_path}" in lines[0] and "peak RSS" in lines[0]
    bar = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert bar and all(ln.startswith("[") and "%" in ln for ln in bar), bar[:5]  # Not torch's warnings
    text = log_path.read_text()
    assert "specls.models.export" in text and "peak RSS so far" in text  # our records went there
    assert "[torch.onnx]" in text  # and the exporter's own prints (fd-level redirect)
    assert load_spec(out).dtype == "fp32"
