"""OnnxCausalLM.forward_batch: one ORT pass over several caches == each cache's own pass."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from specls.models.runtime import BoundKVCache, OnnxCausalLM, OrtKVCache


@pytest.fixture(scope="module")
def plain_dir(tiny_checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama exported without fusions: its own graph has a dynamic batch axis."""
    from specls.models.export import ExportOptions, export_model

    out = tmp_path_factory.mktemp("plain") / "llama"
    return export_model(
        str(tiny_checkpoints["llama"]), out, ExportOptions(tolerance=1e-4, ort_fusions="none")
    )


@pytest.fixture(scope="module")
def fused_with_batch_graph(
    exported: dict[str, Path], plain_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The fused (batch-1) export plus the plain graph as its ``batch_onnx_file``."""
    d = tmp_path_factory.mktemp("fusedb") / "llama"
    shutil.copytree(exported["llama"], d)
    shutil.copy(plain_dir / "model.onnx", d / "model.batch.onnx")
    spec = json.loads((d / "specls.json").read_text())
    spec["batch_onnx_file"] = "model.batch.onnx"
    (d / "specls.json").write_text(json.dumps(spec))
    return d


def _copy(cache: OrtKVCache, lm: OnnxCausalLM) -> OrtKVCache:
    twin = lm.new_cache()
    twin._load_kv([p.copy() for p in cache._kv()])  # the real positions: a pad goes before a pass anyway
    return twin


def _check_batch(lm: OnnxCausalLM, prompts: list[list[int]], steps: list[list[list[int]]]) -> None:
    """Prefill each cache alone, then run ``steps`` (ids per cache per step) batched and compare each
    cache's logits and KV against the same steps run one cache at a time."""
    caches = [lm.new_cache() for _ in prompts]
    for c, p in zip(caches, prompts, strict=True):
        c.forward(p)
    refs = [_copy(c, lm) for c in caches]
    for step in steps:
        got = lm.forward_batch(caches, step)
        for c, r, ids, g in zip(caches, refs, step, got, strict=True):
            want = r.forward(ids) if ids else np.zeros((0, lm.vocab_size), dtype=np.float32)
            assert g.shape == want.shape == (len(ids), lm.vocab_size)
            if ids:
                assert np.abs(g - want).max() < 1e-4
                assert (g.argmax(-1) == want.argmax(-1)).all()
            assert c.length == r.length
            for a, b in zip(c._kv(), r._kv(), strict=True):  # the real positions
                assert a.shape == b.shape
                assert np.abs(a - b).max() < 1e-4


PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31], [40]]
STEPS = [
    [[1, 2, 3], [4], [5, 6, 7, 8, 9, 10], [11, 12]],  # different past and new lengths
    [[13], [14, 15, 16], [], [17]],  # an empty entry advances nothing
    [[18, 19], [20], [21], [22, 23, 24, 25]],
]


def test_dynamic_main_graph_batches(plain_dir: Path) -> None:
    lm = OnnxCausalLM(plain_dir)
    assert lm.batch_graph() == plain_dir / "model.onnx"
    assert lm.enable_batching()
    _check_batch(lm, PROMPTS, STEPS)


def test_fused_graph_batches_through_its_batch_graph(fused_with_batch_graph: Path) -> None:
    lm = OnnxCausalLM(fused_with_batch_graph)
    assert lm.batch_graph() == fused_with_batch_graph / "model.batch.onnx"
    assert lm.enable_batching()
    _check_batch(lm, PROMPTS, STEPS)  # batched passes on one graph == single passes on the fused one


def test_fused_graph_alone_cannot_batch(exported: dict[str, Path]) -> None:
    lm = OnnxCausalLM(exported["llama"])
    assert lm.batch_graph() is None
    assert not lm.enable_batching()
    with pytest.raises(RuntimeError, match="enable_batching"):
        lm.forward_batch([lm.new_cache()], [[1]])


def test_bad_batch_input_changes_nothing(plain_dir: Path) -> None:
    lm = OnnxCausalLM(plain_dir)
    assert lm.enable_batching()
    a, b = lm.new_cache(), lm.new_cache()
    a.forward([1, 2, 3])
    before = [p.copy() for p in a._past]
    with pytest.raises(ValueError, match="out of range"):
        lm.forward_batch([a, b], [[4], [lm.vocab_size]])  # Not a partial pass over a
    assert a.length == 3 and b.length == 0
    assert all(np.array_equal(x, y) for x, y in zip(a._past, before, strict=True))
    with pytest.raises(ValueError, match="twice"):
        lm.forward_batch([a, a], [[4], [5]])
    with pytest.raises(TypeError):
        lm.forward_batch([object()], [[4]])
    with pytest.raises(ValueError, match="caches but"):
        lm.forward_batch([a], [[4], [5]])


def test_batching_micro_benchmark_times_both_paths(plain_dir: Path, exported: dict[str, Path]) -> None:
    from specls.team.batching import BatchBenchSettings, format_table, measure_batching

    lm = OnnxCausalLM(plain_dir)
    rows = measure_batching(
        lm, BatchBenchSettings(batch_sizes=(1, 2), new_tokens=(1, 3), past_len=5, repeats=1)
    )
    assert [(r.batch, r.new_tokens) for r in rows] == [(1, 1), (2, 1), (1, 3), (2, 3)]
    assert all(r.single_ms > 0 and r.batched_ms > 0 for r in rows)
    assert len(format_table(rows).splitlines()) == 5
    with pytest.raises(ValueError, match="no dynamic-batch graph"):
        measure_batching(OnnxCausalLM(exported["llama"]), BatchBenchSettings(repeats=1))


def test_compact_drops_views_into_the_batch(plain_dir: Path) -> None:
    """After a batched pass a cache's KV are views of the whole batch's presents; compact() copies
    its own positions so an idle document does not keep B sequences' KV alive."""
    lm = OnnxCausalLM(plain_dir)
    assert lm.enable_batching()
    a, b = lm.new_cache(), lm.new_cache()
    a.forward([1, 2, 3])
    b.forward([4])
    lm.forward_batch([a, b], [[5], [6, 7]])
    assert all(p.base is not None for p in a._past)  # views (Not copies: that is the point)
    before = [p.copy() for p in a._past]
    a.compact()
    assert all(p.flags.owndata and p.flags.c_contiguous for p in a._past)
    assert all(np.array_equal(x, y) for x, y in zip(a._past, before, strict=True))
    twin = _copy(a, lm)
    assert np.array_equal(a.forward([8]), twin.forward([8]))


def _bound_pair(lm: OnnxCausalLM, prompt: list[int]) -> tuple[BoundKVCache, BoundKVCache]:
    """Two device-style caches holding the same prompt (device "cpu": the CUDA code path on the CPU)."""
    a, b = BoundKVCache(lm, "cpu"), BoundKVCache(lm, "cpu")
    a.forward(prompt)
    b.forward(prompt)
    return a, b


@pytest.mark.parametrize("model", ["plain", "fused"])
def test_device_caches_batch_on_the_device(model: str, plain_dir: Path, fused_with_batch_graph: Path) -> None:
    """BoundKVCache batches through IOBinding with gather/split graphs on the device; each cache's
    logits and KV equal its own single passes (on the same device path)."""
    lm = OnnxCausalLM(plain_dir if model == "plain" else fused_with_batch_graph)
    assert lm.enable_batching()
    pairs = [_bound_pair(lm, p) for p in PROMPTS]
    caches, refs = [a for a, _ in pairs], [b for _, b in pairs]
    for step in STEPS:
        got = lm.forward_batch(caches, step)
        for c, r, ids, g in zip(caches, refs, step, got, strict=True):
            assert g.shape == (len(ids), lm.vocab_size)
            if ids:
                want = r.forward(ids)
                assert np.abs(g - want).max() < 1e-4
                assert (g.argmax(-1) == want.argmax(-1)).all()
            assert c.length == r.length
            for x, y in zip(c._dev, r._dev, strict=True):  # the real positions (r may hold a pad)
                a, b = x.numpy()[:, :, : c.length], y.numpy()[:, :, : r.length]
                assert a.shape == b.shape
                assert np.abs(a - b).max() < 1e-4
    # truncate and a lone pass still work on caches that came out of a batch
    caches[0].truncate(3)
    refs[0].truncate(3)
    assert np.abs(caches[0].forward([9, 9]) - refs[0].forward([9, 9])).max() < 1e-4


def test_mixed_cache_kinds_are_refused(plain_dir: Path) -> None:
    lm = OnnxCausalLM(plain_dir)
    assert lm.enable_batching()
    with pytest.raises(TypeError, match="one kind"):
        lm.forward_batch([lm.new_cache(), BoundKVCache(lm, "cpu")], [[1], [2]])


def test_corrupt_batch_graph_is_a_clear_error_and_the_engine_serves_unbatched(
    fused_with_batch_graph: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from specls.decoder.batching import BatchSettings
    from specls.models.spec import ModelLoadError

    from specls.engine_batching import EngineBatching

    d = tmp_path / "broken"
    shutil.copytree(fused_with_batch_graph, d)
    (d / "model.batch.onnx").write_bytes(b"not an onnx graph")
    lm = OnnxCausalLM(d)  # the main graph still loads
    with pytest.raises(ModelLoadError, match="model.batch.onnx"):
        lm.enable_batching()
    assert EngineBatching.start(lm, BatchSettings(max_batch=4)) is None  # logged, run one at a time
    assert "batching off" in caplog.text
    assert lm.new_cache().forward([1, 2]).shape == (2, lm.vocab_size)


def test_append_keeps_kv_and_drops_logits(plain_dir: Path) -> None:
    """``append`` (a prefill) leaves exactly the KV ``forward`` would, on host and device caches;
    ``forward_last`` is the last row of ``forward``. The export gave the graph ``logits_to_keep``."""
    lm = OnnxCausalLM(plain_dir)
    assert lm.spec.keeps_logits
    for make in (lm.new_cache, lambda: BoundKVCache(lm, "cpu")):
        a, b = make(), make()
        a.append([3, 4, 5, 6])
        b.forward([3, 4, 5, 6])
        assert a.length == b.length == 4
        assert np.array_equal(a.forward([7]), b.forward([7]))
        c = make()
        last = c.forward_last([3, 4, 5, 6, 7])  # one row, computed alone (logits_to_keep = 1)
        assert last.shape == (lm.vocab_size,)
        d = make()
        assert np.abs(d.forward([3, 4, 5, 6, 7])[-1] - last).max() < 1e-5  # the last row of a full pass
