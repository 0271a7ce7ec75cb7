"""int4/int8 weight-only quantization of exported tiny Llama/Qwen2 graphs: MatMulNBits in the graph,
the runtime loads it, speculative == plain greedy on it, and the agreement check catches a broken
quantization."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from specls.decoder.api import DecodeSettings
from specls.decoder.drafters import DraftModelDrafter, PromptLookupDrafter
from specls.decoder.loop import generate
from specls.decoder.margin import describe_margin, first_difference, plain_greedy_margin
from specls.decoder.planned import PlannedDrafter, PolicyState
from specls.decoder.policy import PassCosts
from specls.models.agreement import AgreementOptions, agreement_of_dirs, compare_logits
from specls.models.export import ExportError, ExportOptions, export_model, read_report, resolve_quantize
from specls.models.quantize import QuantizeError, QuantizeOptions, options_for, quantize_graph
from specls.models.runtime import OnnxCausalLM, RuntimeSettings
from specls.models.spec import SPEC_FILE, ModelLoadError, load_spec

from tests.models.split_check import assert_split_invariant

pytestmark = pytest.mark.slow

# Tiny random models have nearly flat next-token distributions (mean KL to their int4 graph ~0.002
# nats), so many argmax flips are near-ties: their int4 top-1 agreement is 70-77%, where a real model's
# is 90%+. The floor for them is 0.5; a broken quantization lands far below (zeroed scales: ~0%).
TINY = AgreementOptions(positions=2048, min_top1=0.5, threads=1)
CPU = RuntimeSettings(threads=1, provider="cpu")
CHEAP_STEPS = PassCosts(step=0.05, catchup=0.001)  # the policy then drafts with the model


def _ops(path: Path) -> dict[str, int]:
    import onnx

    counts: dict[str, int] = {}
    for n in onnx.load(str(path), load_external_data=False).graph.node:
        counts[n.op_type] = counts.get(n.op_type, 0) + 1
    return counts


@pytest.fixture(scope="module")
def int4(tiny_checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("int4")
    # block 32: the tiny models' K is 32, so the default block of 64 would be half zero padding
    opts = ExportOptions(tolerance=1e-4, quantize="int4", agreement=TINY, quant_block_size=32)
    return {arch: export_model(str(ckpt), root / arch, opts) for arch, ckpt in tiny_checkpoints.items()}


@pytest.fixture(scope="module")
def int8(tiny_checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("int8")
    opts = ExportOptions(tolerance=1e-4, quantize="int8", agreement=TINY, quant_block_size=32)
    return {arch: export_model(str(ckpt), root / arch, opts) for arch, ckpt in tiny_checkpoints.items()}


@pytest.fixture(params=["int4", "int8"])
def quantized(request: pytest.FixtureRequest) -> dict[str, Path]:
    return request.getfixturevalue(request.param)  # type: ignore[no-any-return]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_int8_export_has_matmulinteger_and_loads(int8: dict[str, Path], arch: str) -> None:
    d = int8[arch]
    ops = _ops(d / "model.onnx")
    assert ops.get("MatMulIntegerToFloat", 0) >= 9, ops  # the 9 fused projections + lm_head, as int4's
    assert "MatMulNBits" not in ops and "MatMul" not in ops, ops  # Not int4's kernel, nothing left fp32
    assert ops.get("GatherBlockQuantized") == 1, ops  # the embedding at 4 bits, as int4's
    assert "GroupQueryAttention" in ops
    report = read_report(d)
    assert report["quantize"] == "int8"
    q = report["quantized"]["model.onnx"]
    assert q["bits"] == 8 and q["kernel"] == "integer" and q["bytes_after"] < q["bytes_before"] / 3
    a = report["agreement"]
    assert a["positions"] >= 2000 and min(a["top1"], a["fim_top1"]) >= TINY.min_top1
    spec = load_spec(d)
    assert spec.keeps_logits and spec.shared_kv_buffer  # the rewrites after quantization still apply
    logits = OnnxCausalLM(d, CPU).new_cache().forward([5, 17, 42, 99])
    assert logits.shape == (4, 300) and np.isfinite(logits).all()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_int4_export_has_matmulnbits_and_loads(int4: dict[str, Path], arch: str) -> None:
    d = int4[arch]
    ops = _ops(d / "model.onnx")
    # 2 layers x (q, k, v, o, gate, up, down) + lm_head = 15 projections; fused q/k/v -> 9 on the fused
    # graph (transformers' exporter packs QKV and gate/up)
    assert ops.get("MatMulNBits", 0) >= 8, ops
    assert ops.get("MatMulIntegerToFloat") == 1, ops  # the LM head at 8 bits, integer kernel; the body int4
    assert "MatMul" not in ops, ops  # every MatMul had a constant weight here: none left unquantized
    assert ops.get("GatherBlockQuantized") == 1, ops  # the embedding table
    assert "GroupQueryAttention" in ops  # the fused CPU path is kept
    report = read_report(d)
    assert report["quantize"] == "int4"
    q = report["quantized"]["model.onnx"]
    assert q["bits"] == 4 and q["bytes_after"] < q["bytes_before"] / 4  # Not the fp32 weights
    a = report["agreement"]
    assert a["positions"] >= 2000 and 0 < a["fim_positions"] < a["positions"]
    assert TINY.min_top1 <= min(a["top1"], a["fim_top1"]) and a["top1"] <= 1.0 and a["mean_kl"] >= 0.0
    assert not list(d.glob(".quantize-*")) and not list(d.glob(".export-*"))  # staging dirs gone
    assert load_spec(d).keeps_logits  # logits_to_keep survived quantization (on the integer head)
    lm = OnnxCausalLM(d, CPU)
    logits = lm.new_cache().forward([5, 17, 42, 99])
    assert logits.shape == (4, 300) and np.isfinite(logits).all()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_speculative_equals_plain_greedy_on_quantized(
    quantized: dict[str, Path], exported: dict[str, Path], arch: str
) -> None:
    target = OnnxCausalLM(quantized[arch], CPU)
    draft = OnnxCausalLM(exported[arch], CPU)  # the fp32 graph as the draft: it disagrees sometimes
    tok = target.tokenizer
    prompts = [tok.encode(t) for t in ("def add(a, b):\n", "for i in range(10):\n    print(", "class Point:")]
    settings = DecodeSettings(max_new_tokens=24)
    accepted = 0
    for prompt in prompts:
        plain = generate(target.new_cache(), prompt, None, settings, frozenset())
        for drafter in (
            PromptLookupDrafter(None),
            DraftModelDrafter(draft),
            # both combined as the default path combines them (the drafting policy); cheap draft
            # steps so that the policy drafts with the model too
            PlannedDrafter(
                PromptLookupDrafter(None), DraftModelDrafter(draft), PolicyState(costs=CHEAP_STEPS)
            ),
        ):
            spec = generate(target.new_cache(), prompt, drafter, settings, frozenset())
            assert spec.tokens == plain.tokens, _margin(target, prompt, plain.tokens, spec.tokens)
            accepted += spec.accepted
        assert len(plain.tokens) == 24
    assert accepted > 0  # the drafters really proposed tokens that the quantized target accepted


def _margin(lm: OnnxCausalLM, prompt: list[int], ref: list[int], got: list[int]) -> str:
    j = first_difference(ref, got)
    return f"diverged at token {j}: {describe_margin(plain_greedy_margin(lm, prompt, ref, j))}"


def test_corrupted_quantization_fails_with_the_figure(
    tiny_checkpoints: dict[str, Path],
    exported: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import onnx
    import specls.models.export as export_mod
    from onnx import numpy_helper

    real = export_mod.quantize_graph

    def zero_scales(src: Path, dst: Path, options: QuantizeOptions, logits_name: str):  # type: ignore[no-untyped-def]
        report = real(src, dst, options, logits_name)
        model = onnx.load(str(dst))
        for i, t in enumerate(model.graph.initializer):
            if t.name.endswith("_scales"):
                model.graph.initializer[i].CopyFrom(
                    numpy_helper.from_array(np.zeros_like(numpy_helper.to_array(t)), t.name)
                )
        onnx.save(model, str(dst))
        return report

    monkeypatch.setattr(export_mod, "quantize_graph", zero_scales)
    out = tmp_path / "broken"
    with pytest.raises(ExportError, match=r"agrees with the unquantized one on only (\d+\.\d)%") as ei:
        export_model(
            str(tiny_checkpoints["llama"]),
            out,
            ExportOptions(tolerance=1e-4, quantize="int4", agreement=TINY),
        )
    msg = str(ei.value)
    figure = float(msg.split("on only ")[1].split("%")[0])
    assert figure < 100 * TINY.min_top1  # the figure printed is the failing one
    assert "mean KL" in msg and SPEC_FILE in msg
    with pytest.raises(ModelLoadError):
        load_spec(out)  # no loadable directory
    assert not list(out.glob("model.onnx*"))  # neither graph left behind
    a = read_report(out)["agreement"]
    assert a["fim_positions"] > 0  # the tiny models have a FIM template: FIM prompts were scored too
    assert 100 * min(a["top1"], a["fim_top1"]) == pytest.approx(figure, abs=0.06)


def test_perturbed_scales_lower_agreement(exported: dict[str, Path], tmp_path: Path) -> None:
    """The measure itself: the same int4 graph with one layer's scales doubled agrees less with the
    fp32 graph than the faithful one (Not: any graph passes)."""
    import onnx
    from onnx import numpy_helper

    src = exported["qwen2"]
    good, bad = tmp_path / "good", tmp_path / "bad"
    for d in (good, bad):
        quantize_graph(src / "model.onnx", d / "model.onnx", QuantizeOptions())
        for f in ("tokenizer.json", SPEC_FILE):
            (d / f).write_bytes((src / f).read_bytes())
    model = onnx.load(str(bad / "model.onnx"))
    hit = 0
    for i, t in enumerate(model.graph.initializer):
        if t.name.endswith("_scales") and hit < 3:
            model.graph.initializer[i].CopyFrom(
                numpy_helper.from_array(numpy_helper.to_array(t) * 2.0, t.name)
            )
            hit += 1
    assert hit == 3
    onnx.save(model, str(bad / "model.onnx"))
    opts = replace(TINY, positions=512)
    a_good = agreement_of_dirs(src, good, opts)
    a_bad = agreement_of_dirs(src, bad, opts)
    assert a_good.positions == a_bad.positions >= 512
    assert a_bad.mean_kl > 2 * a_good.mean_kl
    assert a_bad.top1 < a_good.top1


def test_int8_plain_graph(
    exported: dict[str, Path], tiny_checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    """int8 on the plain (unfused) graph: every projection quantized, attention's activation MatMuls
    left alone; the 8-bit MatMuls stay close to fp32 (the embedding kept here: at 4 bits, as int8
    ships it, the tiny model's flat distributions agree 80.6%)."""
    plain = tmp_path / "plain"
    export_model(str(tiny_checkpoints["qwen2"]), plain, ExportOptions(tolerance=1e-4, ort_fusions="none"))
    d = tmp_path / "int8"
    options = replace(options_for("int8") or QuantizeOptions(), embedding=False)
    r = quantize_graph(plain / "model.onnx", d / "model.onnx", options)
    for f in ("tokenizer.json", SPEC_FILE):
        (d / f).write_bytes((plain / f).read_bytes())
    ops = _ops(d / "model.onnx")
    assert r.bits == 8 and ops.get("MatMulIntegerToFloat") == 15, ops  # 2 x 7 projections + lm_head
    assert "MatMulNBits" not in ops and "GatherBlockQuantized" not in ops, ops
    assert ops.get("MatMul") == r.left_matmuls == 4  # Q.K^T and P.V per layer: activations, not weights
    a = agreement_of_dirs(plain, d, replace(TINY, positions=1024))
    assert a.top1 > 0.9 and a.mean_kl < 1e-3  # Not int4-like: 8 bits agree on nearly every position
    lm = OnnxCausalLM(d, CPU)
    out = generate(lm.new_cache(), [5, 6, 7], None, DecodeSettings(max_new_tokens=8), frozenset())
    assert len(out.tokens) == 8


def test_quantize_options_and_errors(exported: dict[str, Path], tmp_path: Path) -> None:
    assert options_for("none") is None
    # Not a 4-bit LM head, nor MatMulNBits for it (its cost grows per row like the body's)
    assert options_for("int4") == QuantizeOptions(bits=4, head_bits=8, head_kernel="integer")
    assert options_for("int8") == QuantizeOptions(bits=8, kernel="integer", head_bits=8)  # Not MatMulNBits
    with pytest.raises(QuantizeError, match="quantize must be"):
        options_for("int3")
    with pytest.raises(QuantizeError, match="only be quantized to 4 bits"):
        quantize_graph(exported["llama"] / "model.onnx", tmp_path / "x.onnx", QuantizeOptions(bits=8))
    with pytest.raises(QuantizeError, match="8-bit weights only"):
        quantize_graph(
            exported["llama"] / "model.onnx", tmp_path / "x.onnx", QuantizeOptions(kernel="integer")
        )
    with pytest.raises(QuantizeError, match="kernel must be"):
        quantize_graph(exported["llama"] / "model.onnx", tmp_path / "x.onnx", QuantizeOptions(kernel="gemm"))
    with pytest.raises(QuantizeError, match="head_kernel must be"):
        quantize_graph(
            exported["llama"] / "model.onnx", tmp_path / "x.onnx", QuantizeOptions(head_kernel="gemm")
        )
    with pytest.raises(QuantizeError, match="8-bit head only"):
        quantize_graph(
            exported["llama"] / "model.onnx",
            tmp_path / "x.onnx",
            QuantizeOptions(head_bits=4, head_kernel="integer"),
        )
    (tmp_path / "junk.onnx").write_bytes(b"not a graph")
    with pytest.raises(QuantizeError, match="cannot load"):
        quantize_graph(tmp_path / "junk.onnx", tmp_path / "y.onnx", QuantizeOptions())
    # auto: int8 on the CPU graph (fp32), none on the CUDA graph (fp16) — Not int8 everywhere
    assert [resolve_quantize("auto", d) for d in ("fp32", "fp16")] == ["int8", "none"]
    with pytest.raises(ExportError, match="int8 takes --dtype fp32"):  # the integer kernel: fp32 activations
        resolve_quantize("int8", "fp16")
    with pytest.raises(ExportError, match="quantize must be"):
        resolve_quantize("int2", "fp32")


def test_quantize_rejects_share_weights(tiny_checkpoints: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="share-weights cannot be combined"):
        export_model(
            str(tiny_checkpoints["llama"]), tmp_path / "o", ExportOptions(quantize="int4", share_weights=True)
        )
    assert not (tmp_path / "o").exists()  # refused before any work


def test_fp16_activations_int4_weights_graph(tiny_checkpoints: dict[str, Path], tmp_path: Path) -> None:
    """The CUDA combination (--dtype fp16 --quantize int4) builds a graph with fp16 MatMulNBits; on the
    CPU provider ORT runs it too, which checks that it is a valid graph."""
    d = export_model(
        str(tiny_checkpoints["llama"]),
        tmp_path / "fp16int4",
        ExportOptions(dtype="fp16", quantize="int4", agreement=TINY),
    )
    ops = _ops(d / "model.onnx")
    assert ops.get("MatMulNBits", 0) >= 9, ops  # the head too: the integer kernel computes in fp32
    assert "MatMulIntegerToFloat" not in ops, ops
    assert load_spec(d).dtype == "fp16"
    report = read_report(d)
    assert report["ort_fusions"] == "cuda" and report["quantize"] == "int4"
    lm = OnnxCausalLM(d, CPU)
    assert lm.session.get_inputs()[3].type == "tensor(float16)"
    out = lm.new_cache().forward([5, 17, 42])
    assert out.shape == (3, 300) and np.isfinite(out).all()


def test_compare_logits_table() -> None:
    # (ref, got, expected (agree, kl, |Δ|)); wrong answers named: KL(got||ref) would differ on row 2,
    # a max instead of mean |Δ| would give 2.0 on row 3
    cases = [
        ([[2.0, 0.0]], [[2.0, 0.0]], (1, 0.0, 0.0)),  # identical
        ([[0.0, 1.0]], [[1.0, 0.0]], (0, (np.e - 1) / (np.e + 1), 1.0)),  # flipped: KL = tanh(1/2)
        ([[0.0, 0.0, 3.0]], [[0.0, 0.0, 1.0]], (1, None, 2.0 / 3.0)),  # same argmax, softer
        ([[5.0, 5.0, 5.0]], [[7.0, 7.0, 7.0]], (1, 0.0, 2.0)),  # a shift: same distribution
    ]
    for ref, got, (agree, kl, absd) in cases:
        a, k, d = compare_logits(np.array(ref, np.float32), np.array(got, np.float32))
        assert a == agree
        if kl is not None:
            assert k == pytest.approx(kl, abs=1e-9)
        else:
            assert k > 0.0
        assert d == pytest.approx(absd)
    with pytest.raises(ValueError, match="same"):
        compare_logits(np.zeros((2, 3)), np.zeros((3, 3)))


def test_agreement_frees_the_reference_before_the_candidate_loads(
    exported: dict[str, Path], int4: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The export's two-pass check: the fp32 graph's logits for every window are computed, and its
    session collected, before the int4 graph loads (Not: both sessions in memory together, the old
    peak), and the figures are exactly those of scoring the two graphs side by side."""
    import gc
    import weakref

    from specls.models import agreement as A
    from specls.models import runtime as R

    src, cand = exported["qwen2"], int4["qwen2"]
    spec = load_spec(src)
    opts = replace(TINY, positions=512)
    side_by_side = agreement_of_dirs(A.graph_logits(src / spec.onnx_file, spec, 1), cand, opts)

    events: list[tuple[str, object]] = []
    sessions: list[weakref.ref[object]] = []
    real_graph_logits, real_lm = A.graph_logits, R.OnnxCausalLM

    class Reference:  # a weakly referenceable wrapper: alive as long as the reference session is
        def __init__(self, graph: Path, s: object, threads: int) -> None:
            self.fn = real_graph_logits(graph, spec, threads)

        def __call__(self, ids: list[int]) -> np.ndarray:
            events.append(("reference", len(ids)))
            return self.fn(ids)

    def spy_graph_logits(graph: Path, s: object, threads: int) -> Reference:
        ref = Reference(graph, s, threads)
        sessions.append(weakref.ref(ref))
        return ref

    class SpyLM(real_lm):  # type: ignore[misc, valid-type]
        def __init__(self, model_dir: Path, settings: RuntimeSettings) -> None:
            gc.collect()
            events.append(("load", (Path(model_dir), [s() is None for s in sessions])))
            super().__init__(model_dir, settings)

    monkeypatch.setattr(A, "graph_logits", spy_graph_logits)
    monkeypatch.setattr(R, "OnnxCausalLM", SpyLM)
    phases: list[str] = []
    spill = tmp_path / "spill"
    spill.mkdir()
    two_pass = agreement_of_dirs(
        A.ReferenceGraph(src / spec.onnx_file, spec),
        cand,
        opts,
        lambda phase, n: phases.append(phase),
        spill_dir=spill,
    )
    loads = [i for i, (kind, _) in enumerate(events) if kind == "load"]
    assert loads == [len(events) - 1], events  # one load, the candidate's, after every reference call
    assert events[-1][1] == (cand, [True])  # the reference session was already collected then
    assert sum(int(n) for kind, n in events[:-1] if kind == "reference") == two_pass.positions  # type: ignore[call-overload]
    assert phases == ["reference"] * two_pass.windows + ["candidate"] * two_pass.windows
    assert not list(spill.iterdir())  # the spilled logits are gone
    fields = ("positions", "windows", "fim_positions", "top1", "fim_top1", "mean_kl", "mean_abs_dlogit")
    assert [getattr(two_pass, f) for f in fields] == [getattr(side_by_side, f) for f in fields]


def test_stored_logits_replay_in_order(tmp_path: Path) -> None:
    """StoredLogits gives back the reference's arrays, spilled or not, and refuses a window it was
    not computed for or out of order (Not: another window's logits scored silently)."""
    from specls.models.agreement import StoredLogits

    def ref(ids: Sequence[int]) -> np.ndarray:
        return np.arange(len(ids) * 3, dtype=np.float32).reshape(len(ids), 3) + ids[0]

    windows = [[1, 2], [7, 8, 9]]
    for spill in (None, tmp_path):
        stored = StoredLogits(ref, windows, spill)
        with pytest.raises(ValueError, match="out of order"):
            stored([7, 8, 9])
        np.testing.assert_array_equal(stored([1, 2]), ref([1, 2]))
        np.testing.assert_array_equal(stored([7, 8, 9]), ref([7, 8, 9]))
        with pytest.raises(ValueError, match="out of order"):
            stored([1, 2])
    assert len(list(tmp_path.glob("*.npy"))) == 2


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_quantized_logits_do_not_depend_on_how_the_tokens_are_split_into_passes(
    quantized: dict[str, Path], arch: str
) -> None:
    """The int8-activation MatMulNBits path computes the last row of an odd pass with its one-row
    kernel: without even passes a verify pass and plain greedy differ here (up to 0.5 on the Qwen
    int4 graphs), so speculative decoding would not equal plain greedy. int8's integer product rows
    are independent, but its activations' int8 rounding would still carry GroupQueryAttention's
    one-token path into every later layer."""
    lm = OnnxCausalLM(quantized[arch], CPU)
    ids = lm.tokenizer.encode("def add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(i * i)\n")
    assert_split_invariant(lm, ids[:11], ids[11:23])


def _one_matmul(tmp_path: Path, w: np.ndarray) -> Path:
    """A graph computing ``Y = MatMul(A, W)``, A: [1, M, K] (the exporter's [batch, seq, hidden])."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    a = helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, "M", w.shape[0]])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, "M", w.shape[1]])
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["A", "W"], ["Y"], name="proj")],
        "g",
        [a],
        [y],
        [numpy_helper.from_array(w, "W")],
    )
    path = tmp_path / "one.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return path


def test_integer_matmul_is_the_formula_and_rows_are_independent(tmp_path: Path) -> None:
    """int8's MatMul: per-channel int8 weights x per-row int8 activations. ORT's output is the
    docstring's formula computed in numpy, bitwise; a row's output is the same whatever other rows
    share its pass (Not: one scale for the whole pass, as DynamicQuantizeLinear has); a zero row
    gives zeros (Not NaN from a zero scale)."""
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((96, 40)) * 0.05).astype(np.float32)  # [K, N]
    r = quantize_graph(
        _one_matmul(tmp_path, w), tmp_path / "q.onnx", options_for("int8") or QuantizeOptions()
    )
    assert r.quantized == {"MatMulIntegerToFloat": 1} and r.left_matmuls == 0
    sess = ort.InferenceSession(str(tmp_path / "q.onnx"), providers=["CPUExecutionProvider"])
    x = rng.standard_normal((1, 9, 96)).astype(np.float32) * np.arange(1, 10, dtype=np.float32)[None, :, None]
    x[0, 4] = 0.0
    full = sess.run(None, {"A": x})[0]  # [1, 9, 40]

    s_w = np.abs(w).max(axis=0) / np.float32(63.0)  # [N]: 7-bit weights (Not 127: AVX2 saturates)
    q_w = np.rint(w / s_w).astype(np.int32)  # [K, N]
    s_x = np.maximum(np.abs(x).max(axis=-1, keepdims=True), np.float32(1e-30)) * np.float32(1.0 / 127.0)
    q_x = (np.rint(x / s_x) + np.float32(128.0)).astype(np.int32) - 128  # [1, 9, K]
    want = ((q_x @ q_w).astype(np.float32) * s_w) * s_x  # [1, 9, N]: s_w first, in the kernel
    np.testing.assert_array_equal(full, want)
    assert np.abs(full - x @ w).max() < 0.02 * np.abs(x @ w).max()  # and it is still the product
    assert not full[0, 4].any()
    for m in range(1, 10):  # every pass size, odd ones included: rows computed alone
        np.testing.assert_array_equal(sess.run(None, {"A": x[:, :m]})[0], full[:, :m])
        np.testing.assert_array_equal(sess.run(None, {"A": x[:, m - 1 : m]})[0], full[:, m - 1 : m])
