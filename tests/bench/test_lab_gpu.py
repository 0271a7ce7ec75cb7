"""bench/lab/gpu (`python -m bench.lab.gpu`): the cost model, the forced-acceptance drafter, and the small-shape path end to end
(random-weight pair built, exported, loaded, timed, predicted, real loop == plain greedy)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from specls.decoder.api import DecodeSettings
from specls.decoder.loop import generate

from bench.lab import gpu
from bench.lab.gpu import (
    BenchError,
    ForcedDrafter,
    GpuBenchSettings,
    ModelShape,
    alpha_from_counts,
    best_gamma,
    expected_tokens,
    interp_cost,
    load_acceptance,
    predicted_speedup,
)
from tests.decoder.fakes import FakeLM, FakeLMConfig

torch.set_num_threads(1)

TINY_TARGET = ModelShape(
    hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64, vocab=300, max_positions=256
)
TINY_DRAFT = ModelShape(
    hidden=16, layers=1, heads=2, kv_heads=1, intermediate=32, vocab=300, max_positions=256
)


def tiny_settings(backend: str, **kw: object) -> GpuBenchSettings:
    base = GpuBenchSettings(
        target=TINY_TARGET,
        draft=TINY_DRAFT,
        shape_name="tiny",
        backend=backend,
        provider="cpu",
        threads=1,
        past_lengths=(8, 24),
        ns=(1, 2, 4),
        warmup=0,
        repeats=1,
        loop_alphas=(0.6,),
        loop_repeats=1,
        gen_tokens=12,
        seed=3,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


# --- the cost model --------------------------------------------------------------------------------


def test_expected_tokens_matches_the_closed_form_and_its_limits() -> None:
    assert expected_tokens(0.0, 5) == pytest.approx(1.0)
    assert expected_tokens(1.0, 5) == pytest.approx(6.0)
    assert expected_tokens(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tokens(0.7, 0) == pytest.approx(1.0)
    # monotone in alpha and gamma
    assert expected_tokens(0.8, 4) > expected_tokens(0.6, 4) > expected_tokens(0.6, 2)


def test_interp_cost_is_exact_on_points_linear_between_and_extended_beyond() -> None:
    curve = {1: 10.0, 2: 11.0, 4: 13.0, 8: 21.0}
    assert interp_cost(curve, 4) == 13.0
    assert interp_cost(curve, 3) == pytest.approx(12.0)
    assert interp_cost(curve, 6) == pytest.approx(17.0)
    assert interp_cost(curve, 10) == pytest.approx(25.0)  # last segment's slope (2 per token)


def test_predicted_speedup_lookup_vs_draft() -> None:
    flat = {1: 10.0, 16: 10.0}  # verify as cheap as one step (memory-bound GPU regime)
    # lookup with free drafts and a flat curve: speedup == tokens per pass
    assert predicted_speedup(flat, 0.0, 0.7, 4, "lookup") == pytest.approx(expected_tokens(0.7, 4))
    # the draft model pays g*c*T(1) on top
    s = predicted_speedup(flat, 0.25, 0.7, 4, "draft")
    assert s == pytest.approx(expected_tokens(0.7, 4) / (1 + 4 * 0.25))
    # a compute-bound curve (T(N) = N*T(1)) never pays for lookup
    linear = {1: 1.0, 2: 2.0, 4: 4.0, 8: 8.0, 16: 16.0}
    g, best = best_gamma(linear, 0.0, 0.9, "lookup", 15)
    assert best < 1.0 + 1e-9 and g == 1


def test_loop_overhead_moves_the_prediction_towards_tokens_per_pass() -> None:
    # a fixed cost per pass is paid once per committed token by greedy but once per pass by speculation
    curve = {1: 10.0, 2: 10.5, 4: 11.0, 8: 13.0, 16: 18.0}
    plain = predicted_speedup(curve, 0.1, 0.8, 4, "draft")
    assert gpu.predicted_speedup_with_overhead(curve, 0.1, 0.8, 4, "draft", 0.0) == pytest.approx(plain)
    some = gpu.predicted_speedup_with_overhead(curve, 0.1, 0.8, 4, "draft", 5.0)
    huge = gpu.predicted_speedup_with_overhead(curve, 0.1, 0.8, 4, "draft", 1e6)
    assert plain < some < huge < expected_tokens(0.8, 4)
    # a rollback cost on speculative passes only lowers it
    assert gpu.predicted_speedup_with_overhead(curve, 0.1, 0.8, 4, "draft", 5.0, 2.0) < some
    assert huge == pytest.approx(expected_tokens(0.8, 4), rel=1e-3)


def test_best_gamma_grows_with_alpha_on_a_cheap_verify_curve() -> None:
    curve = {1: 10.0, 2: 10.2, 4: 10.6, 8: 11.5, 16: 14.0}
    g_low, s_low = best_gamma(curve, 0.0, 0.3, "lookup", 15)
    g_high, s_high = best_gamma(curve, 0.0, 0.9, "lookup", 15)
    assert g_high > g_low and s_high > s_low > 1.0
    for g in range(1, 16):  # it really is the best
        assert predicted_speedup(curve, 0.0, 0.9, g, "lookup") <= s_high + 1e-12


def test_alpha_from_counts_inverts_the_standard_model() -> None:
    for alpha in (0.2, 0.5, 0.75, 0.9):
        g = 5
        per_proposal = expected_tokens(alpha, g) - 1.0  # accepted drafts per proposal
        got = alpha_from_counts(drafted=g * 100, accepted=per_proposal * 100, proposals=100)
        assert got == pytest.approx(alpha, abs=1e-3)
    assert alpha_from_counts(0, 0, 0) is None
    assert alpha_from_counts(10, 0, 5) == 0.0


def test_load_acceptance_plain_mapping_and_decode_bench_counts(tmp_path: Path) -> None:
    plain = tmp_path / "a.json"
    plain.write_text(json.dumps({"alpha": {"lookup": 0.55, "draft": [0.7, 0.8]}}))
    assert load_acceptance(plain) == {"lookup": (0.55,), "draft": (0.7, 0.8)}
    # decode-bench style: per-drafter counts under method names; alpha from the inverted model
    g, a = 4, 0.6
    accepted = (expected_tokens(a, g) - 1.0) * 50
    counts = tmp_path / "b.json"
    counts.write_text(
        json.dumps(
            {
                "runs": [
                    {"per_drafter": {"lookup": {"drafted": g * 50, "accepted": accepted, "proposals": 50}}}
                ]
            }
        )
    )
    got = load_acceptance(counts)
    assert set(got) == {"lookup"} and got["lookup"][0] == pytest.approx(a, abs=1e-3)
    # `specls bench decode --json`: methods.<name> with tokens, target_passes, acceptance = acc/drafted
    passes, gamma = 200, 4
    rows: dict[str, dict[str, float | None]] = {}
    for name, alpha in (("lookup", 0.45), ("draft", 0.75)):
        acc = (expected_tokens(alpha, gamma) - 1.0) * passes
        rows[name] = {"tokens": acc + passes, "target_passes": passes, "acceptance": acc / (gamma * passes)}
    rows["plain"] = {"tokens": 500, "target_passes": 500, "acceptance": None}
    decode = tmp_path / "decode.json"
    decode.write_text(json.dumps({"provider": "cpu", "methods": rows, "gamma_sweep": []}))
    got = load_acceptance(decode)
    assert set(got) == {"lookup", "draft"}
    assert got["lookup"][0] == pytest.approx(0.45, abs=1e-3) and got["draft"][0] == pytest.approx(
        0.75, abs=1e-3
    )
    bad = tmp_path / "c.json"
    bad.write_text('{"nothing": 1}')
    with pytest.raises(BenchError, match="no acceptance rates"):
        load_acceptance(bad)
    (tmp_path / "d.json").write_text("{not json")
    with pytest.raises(BenchError, match="unreadable"):
        load_acceptance(tmp_path / "d.json")


# --- the forced-acceptance drafter -----------------------------------------------------------------


@pytest.mark.parametrize("alpha", [0.0, 0.5, 0.9, 1.0])
def test_forced_drafter_keeps_greedy_output_and_hits_its_rate(alpha: float) -> None:
    lm = FakeLM(FakeLMConfig(vocab=64, seed=1))
    prompt = list(range(12))
    n = 400
    ref = lm.greedy(prompt, n)
    drafter = ForcedDrafter(prompt, ref, alpha, 64, seed=5)
    gamma = 4
    settings = DecodeSettings(max_new_tokens=n, draft_length=gamma)
    res = generate(lm.new_cache(), prompt, drafter, settings, frozenset())
    assert res.tokens == ref
    stats = res.per_drafter["lookup"]
    realized = alpha_from_counts(stats.drafted, stats.accepted, stats.proposals)
    assert realized is not None
    if alpha in (0.0, 1.0):
        assert stats.accepted == (0 if alpha == 0.0 else stats.drafted)
    else:
        assert realized == pytest.approx(alpha, abs=0.08)
        # the first drafted token of a pass is accepted with probability alpha
        assert res.accept_hist[0] / stats.proposals == pytest.approx(alpha, abs=0.08)


def test_forced_drafter_pays_for_the_draft_model() -> None:
    target = FakeLM(FakeLMConfig(vocab=64, seed=1))
    draft = FakeLM(FakeLMConfig(vocab=64, seed=2))
    prompt = list(range(10))
    ref = target.greedy(prompt, 40)
    drafter = ForcedDrafter(prompt, ref, 0.7, 64, seed=1, draft_lm=draft)
    drafter.prime(prompt)
    settings = DecodeSettings(max_new_tokens=40, draft_length=3)
    before = draft.counter.calls
    res = generate(target.new_cache(), prompt, drafter, settings, frozenset())
    assert res.tokens == ref
    proposals = res.per_drafter["draft"].proposals
    # one draft-model forward per drafted token (catch-up pass + steps), as the cost model assumes
    assert draft.counter.calls - before == res.drafted
    assert proposals > 0


def test_forced_drafter_off_script_proposes_nothing() -> None:
    d = ForcedDrafter([1, 2, 3], [4, 5, 6], 1.0, 10, seed=0)
    assert d.propose([1, 2, 3], 2) == [4, 5]
    assert d.propose([1, 2, 9], 2) == []
    assert d.propose([1, 2, 3, 4, 5, 6], 3) == []  # past the reference
    assert d.propose([1, 2, 3], 0) == []


# --- settings and CLI ------------------------------------------------------------------------------


def test_require_cuda_fails_loudly_without_cuda() -> None:
    settings = tiny_settings("ort", require_cuda=True, provider="cpu")
    with pytest.raises(BenchError, match="require-cuda"):
        gpu.run_bench(settings)


def test_bad_settings_are_clear_errors() -> None:
    with pytest.raises(BenchError, match="must hold 1"):
        gpu.run_bench(tiny_settings("torch", ns=(2, 4)))
    with pytest.raises(BenchError, match="share the vocab"):
        gpu.run_bench(tiny_settings("torch", draft=ModelShape(16, 1, 2, 1, 32, vocab=400)))
    with pytest.raises(BenchError, match="exceeds"):
        gpu.run_bench(tiny_settings("torch", past_lengths=(8, 1000)))
    with pytest.raises(BenchError, match="too small"):
        gpu.run_bench(
            tiny_settings(
                "torch", target=replace(TINY_TARGET, vocab=200), draft=replace(TINY_DRAFT, vocab=200)
            )
        )
    with pytest.raises(BenchError, match="too small"):
        gpu.write_tokenizer(Path("/nonexistent-never-written"), 100)
    with pytest.raises(BenchError, match="--batch-sizes must hold 1"):
        gpu.run_bench(tiny_settings("torch", batch_sizes=(2, 4)))
    with pytest.raises(BenchError, match="--batch-ns must be positive"):
        gpu.run_bench(tiny_settings("torch", batch_ns=(0, 6)))
    with pytest.raises(BenchError, match="batched past length 300 exceeds"):
        gpu.run_bench(tiny_settings("torch", batch_past_length=300))


def test_cli_reports_bad_input_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert gpu.main(["--acceptance", str(tmp_path / "missing.json")]) == 2
    assert "unreadable acceptance JSON" in capsys.readouterr().err
    assert gpu.main(["--shape", "small", "--ns", "2,4"]) == 2
    assert "must hold 1" in capsys.readouterr().err


def test_cli_acceptance_file_sets_the_rates(tmp_path: Path) -> None:
    f = tmp_path / "acc.json"
    f.write_text(json.dumps({"lookup": [0.4, 0.65]}))
    s = gpu.settings_from_args(gpu.build_parser().parse_args(["--acceptance", str(f)]))
    assert s.alpha_map() == {"lookup": (0.4, 0.65), "draft": gpu.DEFAULT_ALPHAS["draft"]}
    assert str(f) in s.alpha_source


def test_cli_registers_and_parses_the_small_shape() -> None:
    args = gpu.build_parser().parse_args(["--shape", "small", "--ns", "1,2,8", "--alphas", "0.5,0.9"])
    assert args.func is gpu.run_command
    s = gpu.settings_from_args(args)
    assert s.target == gpu.SMALL_TARGET and s.draft == gpu.SMALL_DRAFT
    assert s.ns == (1, 2, 8) and s.alpha_map() == {"lookup": (0.5, 0.9), "draft": (0.5, 0.9)}
    full = gpu.settings_from_args(gpu.build_parser().parse_args([]))
    assert full.target.hidden == 1536 and full.target.layers == 28 and full.target.vocab == 151936
    assert full.draft.hidden == 896 and full.draft.layers == 24 and full.past_lengths == (512, 2048)


# --- batched target passes ------------------------------------------------------------------------


def test_torch_batch_cache_rows_equal_single_sequence_passes(tmp_path: Path) -> None:
    """One forward over B sequences gives each row the logits a single-sequence cache gives it."""
    ckpt = gpu.build_checkpoint(TINY_TARGET, tmp_path / "ckpt", seed=4)
    lm = gpu.TorchCausalLM(ckpt, "cpu", "fp32")
    rng = np.random.default_rng(0)
    seqs = rng.integers(0, TINY_TARGET.vocab, size=(3, 13)).tolist()  # [B=3, 10 past + 3 new]
    batch = lm.new_batch_cache(3)
    batch.prefill([row[:10] for row in seqs], chunk=4)  # chunks of 4, 4, 2
    assert batch.length == 10
    logits = batch.forward([row[10:13] for row in seqs])  # logits: [3, 3, vocab]
    assert logits.shape == (3, 3, TINY_TARGET.vocab) and batch.length == 13
    for b, row in enumerate(seqs):
        single = lm.new_cache()
        single.forward(row[:10])
        np.testing.assert_allclose(logits[b], single.forward(row[10:13]), atol=1e-4, rtol=1e-4)
    # truncate is exact: the same new tokens again give the same logits
    batch.truncate(10)
    np.testing.assert_allclose(batch.forward([row[10:13] for row in seqs]), logits, atol=1e-5)
    with pytest.raises(ValueError, match="3 rows"):
        batch.forward([[1, 2], [3], [4, 5]])
    with pytest.raises(ValueError, match="truncate"):
        batch.truncate(99)


def test_batching_speedup_and_its_table() -> None:
    report = gpu.GpuBenchReport(
        date="2026-01-01 00:00 UTC", gpu="test", backend="torch", provider="torch-cpu",
        draft_provider="torch-cpu", dtype="fp32", shape="tiny", target={"describe": "t"},
        draft={"describe": "d"}, past_lengths=[8], ns=[1], warmup=0, repeats=1,
        batch_past_length=8, batched_ms={1: {1: 2.0, 6: 3.0}, 4: {1: 4.0, 6: 12.0}},
    )  # fmt: skip
    sp = report.batching_speedup()
    assert sp[1] == {1: pytest.approx(1.0), 6: pytest.approx(1.0)}
    assert sp[4] == {1: pytest.approx(4 * 2.0 / 4.0), 6: pytest.approx(4 * 3.0 / 12.0)}
    md = gpu.render_markdown(report)
    assert "## Batched target passes (one target forward over B sequences, L=8)" in md
    assert "| 4 | 4.000 | 2.00x | 12.000 | 1.00x |" in md
    assert report.to_dict()["batching_speedup"]["4"] == {"1": 2.0, "6": 1.0}
    failed = replace(report, batched_ms={}, batched_error="RuntimeError: out of memory")
    assert "## Batched target passes: failed (RuntimeError: out of memory)" in gpu.render_markdown(failed)


def test_small_shape_run_reports_batched_passes(tmp_path: Path) -> None:
    """`--shape small` on the torch backend: the batched table has a positive ms and speedup for every
    (B, N) in B = 1, 2, 4, 8 and N = 1, 6, at the preset's smallest past length."""
    out = tmp_path / "out"
    rc = gpu.main(
        [
            "--shape", "small", "--backend", "torch", "--provider", "cpu", "--no-loop",
            "--warmup", "1", "--repeats", "2", "--out", str(out),
        ]
    )  # fmt: skip
    assert rc == 0
    (js,) = out.glob("results-*-torch.json")
    data = json.loads(js.read_text())
    assert data["batch_past_length"] == gpu.SHAPES["small"].past_lengths[0] == 64
    for key in ("batched_ms", "batching_speedup"):
        assert set(data[key]) == {"1", "2", "4", "8"}
        for row in data[key].values():
            assert set(row) == {"1", "6"} and all(v > 0 for v in row.values())
    assert data["batching_speedup"]["1"] == {"1": 1.0, "6": 1.0}
    md = js.with_suffix(".md").read_text()
    table = md.split("## Batched target passes (one target forward over B sequences, L=64)")[1]
    rows = [line for line in table.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [r.split(" | ")[0] for r in rows] == ["| 1", "| 2", "| 4", "| 8"]
    for r in rows:
        cells = [c.strip() for c in r.strip("| ").split("|")][1:]  # ms, speedup, ms, speedup
        assert len(cells) == 4 and all(float(c.rstrip("x")) > 0 for c in cells)


# --- end to end ------------------------------------------------------------------------------------


def _check_report(report: gpu.GpuBenchReport, settings: GpuBenchSettings) -> None:
    assert report.past_lengths == [8, 24] and report.ns == [1, 2, 4]
    for L in (8, 24):
        assert sorted(report.target_ms[L]) == [1, 2, 4]
        assert all(t > 0 for t in report.target_ms[L].values())
        assert report.draft_ms[L] > 0 and report.truncate_ms[L] >= 0
        assert report.c[L] == pytest.approx(report.draft_ms[L] / report.target_ms[L][1])
        assert report.verify_curve()[L][1] == pytest.approx(1.0)
    n_alphas = sum(len(v) for _, v in settings.alphas)
    assert len(report.predictions) == 2 * n_alphas
    for p in report.predictions:
        assert 1 <= p.gamma <= 3  # N = gamma + 1 <= max measured N
        assert p.tokens_per_pass == pytest.approx(expected_tokens(p.alpha, p.gamma))
    assert report.greedy_matches
    assert [(m.method, m.alpha) for m in report.loop] == [("lookup", 0.6), ("draft", 0.6)]
    assert report.loop_overhead_ms is not None and report.loop_overhead_ms >= 0.0
    for m in report.loop:
        assert m.matches_greedy
        assert m.realized_alpha is not None and m.predicted_with_overhead is not None
        assert m.new_tokens == 12 and m.target_passes >= 12 / (m.gamma + 1)
        assert 0 <= m.accepted <= m.drafted
    md = gpu.render_markdown(report)
    assert "| L | N=1 | N=2 | N=4 | draft step ms | c | truncate ms |" in md
    assert md.count("| lookup |") == len(settings.alpha_map()["lookup"]) + 1  # predictions + the loop row
    assert "## Real decode loop vs prediction" in md


def test_end_to_end_torch_backend_through_the_cli(tmp_path: Path) -> None:
    out = tmp_path / "out"
    rc = gpu.main(
        [
            "--shape", "small", "--backend", "torch", "--provider", "cpu",
            "--target-dims", "32,1,2,1,64", "--draft-dims", "16,1,2,1,32", "--vocab", "300",
            "--past-lengths", "8,24", "--ns", "1,2,4", "--warmup", "0", "--repeats", "1",
            "--gen-tokens", "12", "--loop-alphas", "0.6", "--loop-repeats", "1", "--out", str(out),
        ]
    )  # fmt: skip
    assert rc == 0
    files = sorted(p.name for p in out.iterdir())  # the early (pre-loop) write used the same names
    assert len(files) == 2 and files[0].startswith("results-") and files[0].endswith("-torch.json")
    data = json.loads((out / files[0]).read_text())
    assert data["backend"] == "torch" and data["provider"] == "torch-cpu" and data["dtype"] == "fp32"
    assert set(data["target_ms"]) == {"8", "24"} and set(data["target_ms"]["8"]) == {"1", "2", "4"}
    assert data["verify_curve"]["24"]["1"] == 1.0
    assert all(m["matches_greedy"] for m in data["loop"]) and len(data["loop"]) == 2
    assert (out / files[1]).read_text().startswith("# bench.lab.gpu")
    # the batched sweep ran at the smallest past length with the default B and N
    assert data["batch_past_length"] == 8 and data["batched_error"] is None
    assert set(data["batched_ms"]) == {"1", "2", "4", "8"}
    assert all(set(row) == {"1", "6"} for row in data["batched_ms"].values())


@pytest.mark.slow
def test_end_to_end_torch_then_ort_reusing_the_checkpoints(tmp_path: Path) -> None:
    """Random-weight pair -> torch run; then the same checkpoints -> ONNX export -> runtime -> passes,
    predictions, real loop == greedy."""
    work = tmp_path / "work"
    torch_settings = tiny_settings("torch", work_dir=work, reuse=True)
    report = gpu.run_bench(torch_settings)
    assert report.provider == "torch-cpu"
    assert {"build_target", "build_draft"} <= set(report.phases_s)
    _check_report(report, torch_settings)

    settings = tiny_settings(
        "ort", work_dir=work, reuse=True, alphas=(("lookup", (0.5, 0.9)), ("draft", (0.7,)))
    )
    report = gpu.run_bench(settings)
    assert report.backend == "ort" and report.provider == "cpu" and report.dtype == "fp32"
    assert "build_target" not in report.phases_s and "export_target" in report.phases_s  # reused
    assert set(report.exports) == {"target", "draft"} and report.exports["target"]["dtype"] == "fp32"
    assert "- exports: target ort_fusions=" in gpu.render_markdown(report)
    # the ORT sweep goes through the runtime's own batched path (batch graph exported for the target)
    assert report.batched_error is None and set(report.batched_ms) == {1, 2, 4, 8}
    assert all(t > 0 for row in report.batched_ms.values() for t in row.values())
    assert "## Batched target passes" in gpu.render_markdown(report)
    assert (work / "target-onnx" / "model.onnx").is_file()
    assert (work / "draft-onnx" / "specls.json").is_file()
    _check_report(report, settings)
    # the exported target computes the same greedy continuation as the torch checkpoint
    prompt = np.random.default_rng(settings.seed + 7).integers(0, 300, size=8).tolist()
    from specls.models.runtime import OnnxCausalLM, RuntimeSettings

    lm = OnnxCausalLM(work / "target-onnx", RuntimeSettings(threads=1, provider="cpu"))
    ref = gpu.greedy_reference(lm, prompt, 12)
    torch_lm = gpu.TorchCausalLM(work / "target-ckpt", "cpu", "fp32")
    assert gpu.greedy_reference(torch_lm, prompt, 12) == ref
    res = generate(
        lm.new_cache(), prompt, None, DecodeSettings(max_new_tokens=12, draft_length=0), frozenset()
    )
    assert res.tokens == ref
    js, md = gpu.write_report(report, tmp_path / "out")
    assert js.name.endswith("-ort.json") and md.name.endswith("-ort.md")
    assert json.loads(js.read_text())["c"].keys() == {"8", "24"}
    # a third run reuses the exports too
    again = gpu.run_bench(replace(settings, loop=False))
    assert not any(k.startswith(("build_", "export_")) for k in again.phases_s)
