"""In-place KV (``models.kv_buffer`` + ``SharedKVCache``): the rewrite is applied to fused exports and
only to them, and an in-place cache computes bitwise what a host-array cache computes, asserted on
every call of a random walk through forward / forward_last / append / forward_greedy / truncate."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from specls.models.kv_buffer import share_kv_buffer
from specls.models.runtime import OnnxCausalLM, OrtKVCache, SharedKVCache
from specls.models.spec import load_spec

from tests.models.split_check import small_steps


class CheckedPair:
    """Every call runs on an in-place cache and a host-array cache of the same model; asserts equal
    outputs, lengths and real-position KV each time."""

    def __init__(self, lm: OnnxCausalLM) -> None:
        self.fast, self.ref = small_steps(SharedKVCache(lm)), OrtKVCache(lm)
        self.capacities: set[int] = set()

    def check(self) -> None:
        assert self.fast.length == self.ref.length
        assert self.fast.capacity >= self.fast.length
        self.capacities.add(self.fast.capacity)
        for a, b in zip(self.fast._kv(), self.ref._kv(), strict=True):
            assert np.array_equal(a, b)

    def call(self, op: str, arg: list[int] | int) -> None:
        if op == "truncate":
            assert isinstance(arg, int)
            self.fast.truncate(arg)
            self.ref.truncate(arg)
        else:
            assert isinstance(arg, list)
            got, want = getattr(self.fast, op)(arg), getattr(self.ref, op)(arg)
            assert (got is None and want is None) or np.array_equal(got, want), op
        self.check()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_fused_exports_write_their_kv_in_place(exported: dict[str, Path], arch: str) -> None:
    import onnx

    lm = OnnxCausalLM(exported[arch])
    assert lm.spec.shared_kv_buffer and type(lm.new_cache()) is SharedKVCache
    graph = onnx.load(str(exported[arch] / "model.onnx"), load_external_data=False).graph
    pasts = {*lm.spec.past_key_names, *lm.spec.past_value_names}
    # the pasts reach only the attention: their length is no longer read from their shape
    assert {n.op_type for n in graph.node if pasts & set(n.input)} == {"GroupQueryAttention"}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_in_place_cache_equals_host_cache_on_every_call(exported: dict[str, Path], seed: int) -> None:
    lm = OnnxCausalLM(exported["qwen2" if seed % 2 else "llama"])
    pair, rng = CheckedPair(lm), np.random.default_rng(seed)
    pair.call("append", [int(t) for t in rng.integers(0, 300, 9)])
    for _ in range(30):
        op = str(rng.choice(["forward", "forward_last", "append", "forward_greedy", "truncate"]))
        if op == "truncate":
            pair.call(op, int(rng.integers(0, pair.ref.length + 2)))  # past the end included: a no-op
        else:
            pair.call(op, [int(t) for t in rng.integers(0, 300, int(rng.integers(1, 8)))])
    assert len(pair.capacities) >= 3  # grown twice: the walk covered the growing copy too


def test_a_rollback_and_a_pass_that_fits_copy_no_kv(exported: dict[str, Path]) -> None:
    cache = SharedKVCache(OnnxCausalLM(exported["llama"]))
    cache.forward([5, 6, 7])  # odd: padded, the pad's KV written at position 3
    bufs = list(cache._past)
    cache.truncate(1)
    cache.forward([8, 9])
    assert all(a is b for a, b in zip(cache._past, bufs, strict=True))  # Not re-allocated
    assert cache.length == 3 and cache.capacity == SharedKVCache.CAPACITY_STEP


def test_graphs_that_cannot_share_are_left_alone(exported: dict[str, Path], tmp_path: Path) -> None:
    import onnx
    from onnx import helper

    d = tmp_path / "m"
    shutil.copytree(exported["llama"], d)
    spec = load_spec(d)
    path = d / spec.onnx_file
    before = path.read_bytes()
    assert share_kv_buffer(path, spec)  # already rewritten by the export: nothing to do
    assert path.read_bytes() == before
    model = onnx.load(str(path), load_external_data=False)
    past = spec.past_key_names[0]
    model.graph.node.append(helper.make_node("Shape", [past], ["past_dims"]))  # reads more than its length
    model.graph.output.append(helper.make_tensor_value_info("past_dims", onnx.TensorProto.INT64, [4]))
    onnx.save(model, str(path))
    before = path.read_bytes()
    assert not share_kv_buffer(path, spec)
    assert path.read_bytes() == before


def test_unfused_graphs_keep_host_arrays(tiny_checkpoints: dict[str, Path], tmp_path: Path) -> None:
    from specls.models.export import ExportOptions, export_model

    out = export_model(str(tiny_checkpoints["llama"]), tmp_path / "plain", ExportOptions(ort_fusions="none"))
    lm = OnnxCausalLM(out)
    assert not lm.spec.shared_kv_buffer and type(lm.new_cache()) is OrtKVCache
