"""One copy of the weights: ONNX graphs whose initializers are external data inside the HF
model.safetensors (``share_weights``, ``specls export --share-weights --batch-graph``), on tiny random
Llama checkpoints and on the bundled pair (against torch loading the same directory)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from specls.models.export import ExportError, ExportOptions, export_model
from specls.models.spec import ModelSpec, load_spec
from specls.models.weight_sharing import read_safetensors_index, share_weights

REPO = Path(__file__).resolve().parents[2]
BUNDLED = REPO / "models" / "bundled"
STEPS = ((7, "prefill"), (5, "n5 after a past"), (1, "n1 after a past"))


def _session(path: Path) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _run_steps(sess: Any, spec: ModelSpec, seqs: np.ndarray) -> list[list[np.ndarray]]:
    """seqs: [batch, 13] -> per step (prefill 7, then 5 and 1 with the past fed back) the outputs
    [logits [batch, n, vocab], present k0, v0, ...]."""
    batch = seqs.shape[0]
    past_names = [n for kv in zip(spec.past_key_names, spec.past_value_names, strict=True) for n in kv]
    past = [np.zeros((batch, spec.num_kv_heads, 0, spec.head_dim), np.float32) for _ in past_names]
    outs: list[list[np.ndarray]] = []
    start = 0
    for n, _label in STEPS:
        feed = {
            "input_ids": seqs[:, start : start + n],
            "attention_mask": np.ones((batch, start + n), np.int64),
            "position_ids": np.tile(np.arange(start, start + n, dtype=np.int64), (batch, 1)),
            **dict(zip(past_names, past, strict=True)),
        }
        if spec.keeps_logits:
            feed["logits_to_keep"] = np.array([n], np.int64)  # all positions
        out = [np.asarray(o) for o in sess.run(None, feed)]
        outs.append(out)
        past = out[1:]
        start += n
    return outs


def _bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.array_equal(a.view(np.uint32), b.view(np.uint32)))


def _inline_float_bytes(onnx_path: Path) -> tuple[int, list[Any]]:
    """(bytes of float initializers stored in the graph file, the external initializers)."""
    import onnx
    from onnx import TensorProto

    m = onnx.load(str(onnx_path), load_external_data=False)
    inline, external = 0, []
    for t in m.graph.initializer:
        if t.data_location == TensorProto.EXTERNAL:
            external.append(t)
        elif t.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16):
            inline += len(t.raw_data) + 4 * len(t.float_data)
    return inline, external


def _check_external(onnx_path: Path, safetensors: Path) -> int:
    """Every external initializer points at exactly one safetensors tensor (offset, length, dtype,
    shape). Returns how many there are."""
    index = {(e.offset, e.length): e for e in read_safetensors_index(safetensors).values()}
    _, external = _inline_float_bytes(onnx_path)
    for t in external:
        kv = {x.key: x.value for x in t.external_data}
        assert kv["location"] == safetensors.name
        e = index[(int(kv["offset"]), int(kv["length"]))]
        assert tuple(t.dims) == e.shape, t.name
        assert t.data_type == {"F16": 10, "F32": 1, "BF16": 16}[e.dtype]
    return len(external)


# ---------------------------------------------------------------------------------------------
# tiny random checkpoints
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fp16_checkpoint(tiny_checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama saved as fp16 safetensors (like the bundled pair): the fp32 graph's weights are
    its values cast up, so share_weights needs Cast nodes."""
    import torch
    from transformers import AutoModelForCausalLM

    out = tmp_path_factory.mktemp("fp16ckpt")
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoints["llama"], dtype=torch.float16)
    model.save_pretrained(out)
    shutil.copy(tiny_checkpoints["llama"] / "tokenizer.json", out / "tokenizer.json")
    return out


@pytest.fixture(scope="module")
def fused_plain(fp16_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fused export of the fp16 checkpoint with the weights inline (the reference)."""
    out = tmp_path_factory.mktemp("fused") / "m"
    return export_model(str(fp16_checkpoint), out, ExportOptions(tolerance=1e-4))


@pytest.fixture(scope="module")
def shared_export(fp16_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("shared") / "m"
    return export_model(
        str(fp16_checkpoint), out, ExportOptions(tolerance=1e-4, share_weights=True, batch_graph=True)
    )


def _copy_with_safetensors(src: Path, ckpt: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    shutil.copy(ckpt / "model.safetensors", dst / "model.safetensors")
    return dst


def test_share_weights_is_bit_identical_and_keeps_no_weights(
    fused_plain: Path, fp16_checkpoint: Path, tmp_path: Path
) -> None:
    d = _copy_with_safetensors(fused_plain, fp16_checkpoint, tmp_path / "m")
    before, _ = _inline_float_bytes(d / "model.onnx")
    report = share_weights(d / "model.onnx", d / "model.safetensors", min_elements=64)
    after, _ = _inline_float_bytes(d / "model.onnx")
    assert report.unmatched == ()
    # the fused graph packs q/k/v and gate/up into one transposed MatMul weight each
    assert any(
        e.startswith("concat0(") and e.endswith(".T") and "q_proj" in e for e in report.expressions.values()
    )
    assert any("gate_proj" in e and "up_proj" in e for e in report.expressions.values())
    assert any(e.endswith("o_proj.weight.T") for e in report.expressions.values())
    assert after < before / 20, (before, after)
    assert _check_external(d / "model.onnx", d / "model.safetensors") > 0

    spec = load_spec(fused_plain)
    seqs = np.random.default_rng(3).integers(0, spec.vocab_size, size=(1, 13)).astype(np.int64)
    ref = _run_steps(_session(fused_plain / "model.onnx"), spec, seqs)
    got = _run_steps(_session(d / "model.onnx"), spec, seqs)
    for r_step, g_step in zip(ref, got, strict=True):
        for r, g in zip(r_step, g_step, strict=True):
            assert _bits_equal(r, g)

    # a second run finds nothing left to share and leaves the graph as it is
    again = share_weights(d / "model.onnx", d / "model.safetensors", min_elements=64)
    assert again.expressions == {}
    assert again.bytes_after == report.bytes_after


def test_share_weights_only_uses_exact_matches(
    fused_plain: Path, fp16_checkpoint: Path, tmp_path: Path
) -> None:
    """A safetensors tensor that differs from the graph's weight in one value is not used: that
    weight stays inline and the outputs stay exact."""
    d = _copy_with_safetensors(fused_plain, fp16_checkpoint, tmp_path / "m")
    st = d / "model.safetensors"
    entry = read_safetensors_index(st)["model.layers.1.self_attn.o_proj.weight"]
    data = bytearray(st.read_bytes())
    value = np.frombuffer(bytes(data[entry.offset : entry.offset + 2]), np.float16)[0]
    data[entry.offset : entry.offset + 2] = np.float16(value * 2 + 1).tobytes()
    st.write_bytes(bytes(data))

    report = share_weights(d / "model.onnx", st, min_elements=64)
    assert len(report.unmatched) == 1
    assert all("layers.1.self_attn.o_proj" not in e for e in report.expressions.values())
    assert any("layers.0.self_attn.o_proj" in e for e in report.expressions.values())

    spec = load_spec(fused_plain)
    seqs = np.random.default_rng(4).integers(0, spec.vocab_size, size=(1, 13)).astype(np.int64)
    ref = _run_steps(_session(fused_plain / "model.onnx"), spec, seqs)
    got = _run_steps(_session(d / "model.onnx"), spec, seqs)
    assert all(
        _bits_equal(r, g) for rs, gs in zip(ref, got, strict=True) for r, g in zip(rs, gs, strict=True)
    )


def test_share_weights_bad_inputs(fused_plain: Path, fp16_checkpoint: Path, tmp_path: Path) -> None:
    d = tmp_path / "m"
    shutil.copytree(fused_plain, d)
    with pytest.raises(ExportError, match="missing"):
        share_weights(d / "model.onnx", d / "model.safetensors")
    (tmp_path / "elsewhere").mkdir()
    other = shutil.copy(fp16_checkpoint / "model.safetensors", tmp_path / "elsewhere" / "model.safetensors")
    with pytest.raises(ExportError, match="graph's directory"):
        share_weights(d / "model.onnx", Path(other))
    (d / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}......")
    with pytest.raises(ExportError, match="not a safetensors file"):
        share_weights(d / "model.onnx", d / "model.safetensors")
    (d / "model.safetensors").write_bytes(b"\x01\x02")
    with pytest.raises(ExportError, match="not a safetensors file"):
        share_weights(d / "model.onnx", d / "model.safetensors")
    # the graph was not touched by the failed attempts
    assert (d / "model.onnx").read_bytes() == (fused_plain / "model.onnx").read_bytes()


def test_export_share_weights_and_batch_graph(
    shared_export: Path, fused_plain: Path, fp16_checkpoint: Path
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    d = shared_export
    spec = load_spec(d)
    assert spec.batch_onnx_file == "model.batch.onnx"
    for name in ("config.json", "model.safetensors", "model.onnx", "model.batch.onnx", "tokenizer.json"):
        assert (d / name).is_file(), name
    st_bytes = (d / "model.safetensors").stat().st_size
    for graph in ("model.onnx", "model.batch.onnx"):
        assert _check_external(d / graph, d / "model.safetensors") > 0
        inline, _ = _inline_float_bytes(d / graph)
        assert inline < st_bytes / 4, (graph, inline, st_bytes)
    report = json.loads((d / "export.json").read_text())
    assert set(report["shared_weights"]) == {"model.onnx", "model.batch.onnx"}
    assert report["verify_batch"]["tolerance"] > 0

    # the dir is also the HF checkpoint (same weights as the source)
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    src = AutoModelForCausalLM.from_pretrained(fp16_checkpoint, dtype=torch.float32)
    for (n1, p1), (n2, p2) in zip(model.state_dict().items(), src.state_dict().items(), strict=True):
        assert n1 == n2 and torch.equal(p1, p2)

    # fused graph == the plain fused export bit for bit (same trace, weights read from safetensors)
    seqs = np.random.default_rng(5).integers(0, spec.vocab_size, size=(2, 13)).astype(np.int64)
    fused = _run_steps(_session(d / "model.onnx"), spec, seqs[:1])
    ref = _run_steps(_session(fused_plain / "model.onnx"), spec, seqs[:1])
    assert all(
        _bits_equal(r, g) for rs, gs in zip(ref, fused, strict=True) for r, g in zip(rs, gs, strict=True)
    )
    _check_batch_graph(d, spec, seqs)


def _check_batch_graph(d: Path, spec: ModelSpec, seqs: np.ndarray) -> None:
    """model.batch.onnx: close to the fused graph (argmax equal) at batch 1, and a batch-2 pass equals
    the two batch-1 passes."""
    assert spec.batch_onnx_file is not None
    batch_sess = _session(d / spec.batch_onnx_file)
    fused_sess = _session(d / spec.onnx_file)
    both = _run_steps(batch_sess, spec, seqs)
    for i in range(seqs.shape[0]):
        one = _run_steps(batch_sess, spec, seqs[i : i + 1])
        fused = _run_steps(fused_sess, spec, seqs[i : i + 1])
        for step, (n, label) in enumerate(STEPS):
            logits = one[step][0]  # [1, n, vocab]
            assert logits.shape == (1, n, spec.vocab_size)
            assert np.abs(logits - fused[step][0]).max() <= 1e-4, label
            assert np.array_equal(logits.argmax(-1), fused[step][0].argmax(-1)), label
            for a, b in zip(one[step][1:], fused[step][1:], strict=True):
                assert np.abs(a - b).max() <= 1e-4, label
            for a, b in zip(one[step], both[step], strict=True):
                assert np.abs(a[0] - b[i]).max() <= 1e-5, label
            assert np.array_equal(one[step][0].argmax(-1)[0], both[step][0].argmax(-1)[i])


def test_share_weights_needs_a_single_safetensors(tiny_checkpoints: dict[str, Path], tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoints["llama"], ckpt)
    (ckpt / "model.safetensors").rename(ckpt / "model-00001-of-00001.safetensors")
    with pytest.raises(ExportError, match="single model.safetensors"):
        export_model(str(ckpt), tmp_path / "out", ExportOptions(share_weights=True))
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------
# the bundled pair
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("role", ["target", "draft"])
def test_bundled_graphs_read_the_one_copy_of_the_weights(role: str) -> None:
    d = BUNDLED / role
    spec = load_spec(d)
    assert spec.dtype == "fp32"
    assert not (REPO / "models" / "checkpoints").exists()
    graphs = [spec.onnx_file] + ([spec.batch_onnx_file] if spec.batch_onnx_file else [])
    assert graphs == (["model.onnx", "model.batch.onnx"] if role == "target" else ["model.onnx"])
    st = d / "model.safetensors"
    for graph in graphs:
        assert _check_external(d / graph, st) > 0
        inline, _ = _inline_float_bytes(d / graph)
        assert inline < st.stat().st_size / 100, (graph, inline)
        assert not list(d.glob(f"{graph}.data"))


@pytest.mark.slow
@pytest.mark.parametrize("role", ["target", "draft"])
def test_bundled_onnx_matches_torch_from_the_same_dir(role: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    d = BUNDLED / role
    spec = load_spec(d)
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    seq = np.random.default_rng(6).integers(0, spec.vocab_size, size=(1, 13)).astype(np.int64)
    with torch.no_grad():
        ref = model(input_ids=torch.from_numpy(seq)).logits[0].numpy()  # [13, vocab]
    outs = _run_steps(_session(d / spec.onnx_file), spec, seq)
    start = 0
    for (n, label), out in zip(STEPS, outs, strict=True):
        logits = out[0][0]  # [n, vocab]
        want = ref[start : start + n]
        assert np.abs(logits - want).max() <= 1e-4, label
        assert np.array_equal(logits.argmax(-1), want.argmax(-1)), label
        start += n


@pytest.mark.slow
def test_bundled_batch_graph() -> None:
    d = BUNDLED / "target"
    spec = load_spec(d)
    seqs = np.random.default_rng(7).integers(0, spec.vocab_size, size=(2, 13)).astype(np.int64)
    _check_batch_graph(d, spec, seqs)
