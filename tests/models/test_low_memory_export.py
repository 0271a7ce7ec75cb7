"""The low-memory export (``ExportOptions.low_memory``: a GGUF dequantized tensor by tensor into a mapped
scratch file, packed initializers spilled to files, ONNX Runtime checks on mapped weights) writes the
same graphs, weights and spec as the plain path, and its building blocks keep values while dropping
resident pages."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from specls.models.agreement import AgreementOptions
from specls.models.export import ExportOptions, export_model, read_report
from specls.models.mapped_weights import PageEvictor, WeightFile

from tests.models.tiny_gguf import NO_FIM, QWEN_PARTIAL_FIM, write_tiny_gguf


def _rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096


def test_weight_file_round_trip_in_chunks(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((37, 5), dtype=np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    w = WeightFile(tmp_path / "w.bin")
    w.add("a", a.shape, np.dtype(np.float32), iter([a[:10], a[10:11], a[11:]]))
    w.add("b", b.shape, np.dtype(np.float32), iter([b]))
    with pytest.raises(ValueError, match="wrote 2 values"):
        w.add("c", (3,), np.dtype(np.float32), iter([b[:2]]))
    got = w.arrays()
    assert np.array_equal(got["a"], a) and np.array_equal(got["b"], b)
    assert not got["a"].flags.writeable
    assert got["a"].ctypes.data % 64 == 0 and got["b"].ctypes.data % 64 == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/statm and madvise")
def test_page_evictor_drops_resident_pages_and_keeps_values(tmp_path: Path) -> None:
    data = np.arange(16 << 20, dtype=np.float32)  # 64 MB
    data.tofile(tmp_path / "x.bin")
    checksum = float(data.sum(dtype=np.float64))
    del data
    mapped = np.memmap(tmp_path / "x.bin", dtype=np.float32, mode="r")
    before = _rss()
    assert float(mapped.sum(dtype=np.float64)) == checksum  # every page read: resident
    touched = _rss()
    assert touched - before > 48 << 20
    with PageEvictor(arrays=[mapped[1000:]]) as evictor:
        evictor.evict()
        assert _rss() - before < 16 << 20
        assert float(mapped.sum(dtype=np.float64)) == checksum  # read back from the page cache
    assert _rss() - before < 16 << 20  # dropped once more on leaving
    other = np.memmap(tmp_path / "x.bin", dtype=np.float32, mode="r")
    other.sum()
    with PageEvictor(roots=[tmp_path]) as evictor:  # found by path in /proc/self/maps
        evictor.evict()
        assert _rss() - before < 16 << 20


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


def _graph_and_weights(path: Path) -> tuple[bytes, dict[str, np.ndarray]]:
    """The graph without its weights (serialized), and every initializer's values by name."""
    import onnx
    from onnx import numpy_helper

    bare = onnx.load(str(path), load_external_data=False)
    for t in bare.graph.initializer:
        t.ClearField("raw_data")
        t.ClearField("external_data")
        t.ClearField("data_location")
    full = onnx.load(str(path))
    return bare.SerializeToString(), {t.name: numpy_helper.to_array(t) for t in full.graph.initializer}


def _spec(d: Path) -> dict[str, object]:
    return json.loads((d / "specls.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize(
    ("arch", "quantize"), [("qwen2", "none"), ("llama", "none"), ("qwen2", "int8"), ("qwen2", "int4")]
)
def test_low_memory_export_writes_what_the_plain_path_writes(
    arch: str, quantize: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import specls.models.gguf as gguf_mod
    import specls.models.mapped_weights as mapped_mod

    # small thresholds so the tiny model goes through the row blocks and the spilled initializers
    monkeypatch.setattr(gguf_mod, "_CHUNK_ELEMENTS", 1000)
    monkeypatch.setattr(mapped_mod, "SPILL_MIN_BYTES", 1024)
    specials = QWEN_PARTIAL_FIM if arch == "qwen2" else NO_FIM
    tiny = write_tiny_gguf(tmp_path / f"tiny-{arch}.gguf", arch, specials, seed=2, quantize=True)
    opts = ExportOptions(
        tolerance=1e-4,
        quantize=quantize,
        agreement=AgreementOptions(positions=96, window=48, min_top1=0.0),
        draft_head="ascii" if quantize == "int4" else "full",
    )
    plain = export_model(str(tiny.path), tmp_path / "plain", replace(opts, low_memory=False))
    low = export_model(str(tiny.path), tmp_path / "low", opts)

    assert not [p for p in low.iterdir() if p.name.startswith(".")]  # scratch and staging dirs gone
    assert _spec(low) == _spec(plain)
    files_low, files_plain = _files(low), _files(plain)
    assert files_low.keys() == files_plain.keys()
    for name in files_low.keys() - {"export.json"}:
        if not name.endswith((".onnx", ".data")):
            assert files_low[name] == files_plain[name], name
    graph_low, weights_low = _graph_and_weights(low / "model.onnx")
    graph_plain, weights_plain = _graph_and_weights(plain / "model.onnx")
    assert graph_low == graph_plain
    assert weights_low.keys() == weights_plain.keys()
    for name, value in weights_low.items():
        assert value.dtype == weights_plain[name].dtype and np.array_equal(value, weights_plain[name]), name

    report_low, report_plain = read_report(low), read_report(plain)
    assert report_low["options"]["low_memory"] and not report_plain["options"]["low_memory"]
    assert max(report_low["verify"]["max_abs_diff"].values()) <= 1e-4
    if quantize != "none":
        assert report_low["quantized"] == report_plain["quantized"]
        for key in ("positions", "windows", "fim_positions"):
            assert report_low["agreement"][key] == report_plain["agreement"][key]
        assert abs(report_low["agreement"]["top1"] - report_plain["agreement"]["top1"]) <= 0.02


def test_integer_kernel_quantizes_mapped_external_weights_like_loaded_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The int8 kernel reads an external weight through a memory map, a block of columns at a time:
    the same initializers as from a weight held inline, whole."""
    import onnx
    import specls.models.quantize as quantize_mod
    from onnx import TensorProto, helper, numpy_helper
    from specls.models.quantize import options_for, quantize_graph

    rng = np.random.default_rng(3)
    w = rng.standard_normal((48, 300)).astype(np.float32)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 48])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 300])
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["logits"], name="head")],
        "g",
        [x],
        [y],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    (tmp_path / "inline").mkdir()
    (tmp_path / "external").mkdir()
    onnx.save_model(model, str(tmp_path / "inline" / "m.onnx"))
    onnx.save_model(
        model,
        str(tmp_path / "external" / "m.onnx"),
        save_as_external_data=True,
        location="m.onnx.data",
        size_threshold=0,
    )
    options = options_for("int8")
    assert options is not None
    monkeypatch.setattr(quantize_mod, "_BLOCK_ELEMENTS", 48 * 7)  # blocks of 7 columns, a ragged last one
    mapped: list[np.ndarray] = []
    real_map = quantize_mod._mapped_array

    def spy(tensor: object, base_dir: Path) -> np.ndarray | None:
        a = real_map(tensor, base_dir)
        if a is not None:
            mapped.append(a)
        return a

    monkeypatch.setattr(quantize_mod, "_mapped_array", spy)
    quantize_graph(tmp_path / "inline" / "m.onnx", tmp_path / "inline" / "q.onnx", options)
    quantize_graph(tmp_path / "external" / "m.onnx", tmp_path / "external" / "q.onnx", options)
    got = {
        t.name: numpy_helper.to_array(t)
        for t in onnx.load(str(tmp_path / "external" / "q.onnx")).graph.initializer
    }
    want = {
        t.name: numpy_helper.to_array(t)
        for t in onnx.load(str(tmp_path / "inline" / "q.onnx")).graph.initializer
    }
    assert [a.shape for a in mapped] == [(48, 300)]  # the external weight, and only it, was mapped
    assert got.keys() == want.keys() and any(v.dtype == np.int8 for v in got.values())
    for name, value in want.items():
        assert value.dtype == got[name].dtype and np.array_equal(value, got[name]), name
    monkeypatch.setattr(quantize_mod, "_BLOCK_ELEMENTS", 1 << 24)  # one block: the same again
    quantize_graph(tmp_path / "external" / "m.onnx", tmp_path / "external" / "q1.onnx", options)
    whole = {
        t.name: numpy_helper.to_array(t)
        for t in onnx.load(str(tmp_path / "external" / "q1.onnx")).graph.initializer
    }
    for name, value in whole.items():
        assert np.array_equal(value, got[name]), name
