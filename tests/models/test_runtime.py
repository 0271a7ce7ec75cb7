"""OnnxCausalLM / OrtKVCache on exported tiny checkpoints: logits vs torch, exact truncate, load errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from specls.decoder.api import CausalLM, KVCache, PassInterrupted
from specls.models.runtime import BoundKVCache, OnnxCausalLM, OrtKVCache, RuntimeSettings, SharedKVCache
from specls.models.spec import SPEC_FILE, ModelLoadError

from tests.models.split_check import assert_split_invariant

pytestmark = pytest.mark.slow

SEQ = [5, 17, 42, 99, 3, 250, 7, 7, 120, 64, 11, 290, 33, 8, 150, 201, 77]


def torch_logits(ckpt: Path, ids: list[int]) -> np.ndarray:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].numpy()  # [n, vocab]


@pytest.fixture(scope="module")
def lms(exported: dict[str, Path]) -> dict[str, OnnxCausalLM]:
    return {arch: OnnxCausalLM(d, RuntimeSettings(threads=1, provider="cpu")) for arch, d in exported.items()}


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_logits_match_torch(
    lms: dict[str, OnnxCausalLM], tiny_checkpoints: dict[str, Path], arch: str
) -> None:
    lm = lms[arch]
    assert isinstance(lm, CausalLM) and lm.provider == "cpu" and lm.vocab_size == 300
    ref = torch_logits(tiny_checkpoints[arch], SEQ)  # [17, vocab]
    cache = lm.new_cache()
    assert isinstance(cache, KVCache)
    got = [cache.forward(SEQ[:11])]  # prefill
    got.append(cache.forward(SEQ[11:16]))  # N=5 with a past of 11
    got.append(cache.forward(SEQ[16:17]))  # N=1 with a past of 16
    assert cache.length == 17
    for g, (a, b) in zip(got, [(0, 11), (11, 16), (16, 17)], strict=True):
        assert g.shape == (b - a, 300) and g.dtype == np.float32
        np.testing.assert_allclose(g, ref[a:b], atol=1e-4, rtol=0)
    assert np.abs(ref).max() > 0.1  # the comparison is not between near-zero logits


def test_truncate_is_exact(lms: dict[str, OnnxCausalLM]) -> None:
    lm = lms["llama"]
    other = [9, 8, 7]
    a = lm.new_cache()
    a.forward(SEQ[:12])
    rejected = a.forward(SEQ[12:15])
    a.truncate(12)
    assert a.length == 12
    after = a.forward(other)
    b = lm.new_cache()
    b.forward(SEQ[:12])
    fresh = b.forward(other)
    assert np.array_equal(after, fresh)
    assert not np.array_equal(rejected, after)
    # truncate to 0 behaves like a new cache; past the length is a no-op
    a.truncate(0)
    assert a.length == 0
    assert np.array_equal(a.forward(SEQ[:12]), lm.new_cache().forward(SEQ[:12]))
    a.truncate(100)
    assert a.length == 12


def test_bad_calls(lms: dict[str, OnnxCausalLM]) -> None:
    cache = lms["llama"].new_cache()
    assert cache.forward([]).shape == (0, 300) and cache.length == 0
    with pytest.raises(ValueError, match="out of range"):
        cache.forward([300])
    with pytest.raises(ValueError, match="out of range"):
        cache.forward([-1])
    with pytest.raises(ValueError, match="negative"):
        cache.truncate(-1)
    assert cache.length == 0
    # the tiny models have max_position_embeddings 256
    from specls.models.runtime import ContextFullError

    cache.forward([1] * 250)
    with pytest.raises(ContextFullError, match="256"):
        cache.forward([1] * 7)
    assert cache.length == 250 and cache.forward([1] * 6).shape == (6, 300)


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_corrupt_dirs(exported: dict[str, Path], tmp_path: Path) -> None:
    src = exported["llama"]
    cpu = RuntimeSettings(provider="cpu")

    d = _copy(src, tmp_path / "nospec")
    (d / SPEC_FILE).unlink()
    with pytest.raises(ModelLoadError, match=SPEC_FILE):
        OnnxCausalLM(d, cpu)

    d = _copy(src, tmp_path / "noonnx")
    (d / "model.onnx").unlink()
    with pytest.raises(ModelLoadError, match="model.onnx"):
        OnnxCausalLM(d, cpu)

    d = _copy(src, tmp_path / "truncated")
    data = (d / "model.onnx").read_bytes()
    (d / "model.onnx").write_bytes(data[: len(data) // 3])
    with pytest.raises(ModelLoadError, match="model.onnx"):
        OnnxCausalLM(d, cpu)

    d = _copy(src, tmp_path / "wrongkv")
    raw = json.loads((d / SPEC_FILE).read_text())
    raw["past_key_names"] = [f"past.{i}.k" for i in range(2)]
    (d / SPEC_FILE).write_text(json.dumps(raw))
    with pytest.raises(ModelLoadError, match=r"model\.onnx.*past\.0\.k"):
        OnnxCausalLM(d, cpu)

    d = _copy(src, tmp_path / "badtok")
    (d / "tokenizer.json").write_text("{oops")
    with pytest.raises(ModelLoadError, match="tokenizer.json"):
        OnnxCausalLM(d, cpu)

    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "readme.txt").write_text("hello")
    (junk / "weights.bin").write_bytes(b"\0" * 100)
    with pytest.raises(ModelLoadError, match=f"junk.*{SPEC_FILE}"):
        OnnxCausalLM(junk, cpu)

    with pytest.raises(ModelLoadError, match="provider"):
        OnnxCausalLM(src, RuntimeSettings(provider="tpu"))


def test_loader(exported: dict[str, Path], tmp_path: Path) -> None:
    from specls.models.loader import bundled_dir, check_pair, load_model, load_pair, resolve_model_dir
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    assert bundled_dir("draft").parts[-2:] == ("bundled", "draft")
    with pytest.raises(ValueError, match="role"):
        bundled_dir("critic")
    assert resolve_model_dir(str(exported["llama"]), "target") == exported["llama"]
    with pytest.raises(ModelLoadError, match="does not exist"):
        resolve_model_dir(str(tmp_path / "nope"), "draft")

    cpu = RuntimeSettings(provider="cpu")
    target, draft = load_pair(str(exported["llama"]), str(exported["qwen2"]), cpu)
    assert target.spec.model_type == "llama" and draft.spec.model_type == "qwen2"

    # a draft with another tokenizer is refused, naming the draft's tokenizer file
    other = _copy(exported["qwen2"], tmp_path / "othertok")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=280, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(["zzz yyy xxx www"] * 50, trainer)
    tok.save(str(other / "tokenizer.json"))
    with pytest.raises(ModelLoadError, match=r"othertok/tokenizer\.json.*same tokenizer"):
        check_pair(target, load_model(other, cpu))


def test_cli_export(
    tiny_checkpoints: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from specls.cli import main

    out = tmp_path / "cli-out"
    rc = main(["export", str(tiny_checkpoints["qwen2"]), "--out", str(out), "--tolerance", "1e-4"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "n5_past7" in captured.out and "exported" in captured.out
    assert "100%" in captured.err  # progress bar reached the end
    lm = OnnxCausalLM(out, RuntimeSettings(provider="cpu"))
    assert lm.new_cache().forward([1, 2, 3]).shape == (3, 300)
    # a failing export is an exit code and a message, not a traceback
    rc = main(["export", str(tmp_path / "no" / "such" / "dir"), "--out", str(tmp_path / "x")])
    assert rc == 1 and "not a checkpoint directory" in capsys.readouterr().err


@pytest.mark.parametrize("host_fallback", [False, True])
def test_iobinding_cache_matches_numpy_cache(lms: dict[str, OnnxCausalLM], host_fallback: bool) -> None:
    """The CUDA cache's code (OrtValues + IOBinding + on-device Slice), run with device="cpu"."""
    from specls.models.runtime import BoundKVCache, _DeviceOps

    lm = lms["qwen2"]
    if host_fallback:
        ops = _DeviceOps(lm, "cpu")
        ops._slice = ops._argmax = None  # as without the onnx package
        lm._device_ops["cpu"] = ops
    try:
        bound, plain = BoundKVCache(lm, "cpu"), OrtKVCache(lm)
        for cache in (bound, plain):
            assert cache.length == 0
        steps: list[tuple[str, object]] = [
            ("fwd", SEQ[:9]),
            ("fwd", SEQ[9:14]),
            ("trunc", 11),
            ("fwd", [1, 2]),
            ("fwd", [3]),
            ("trunc", 0),
            ("fwd", SEQ[:4]),
        ]
        for op, arg in steps:
            if op == "trunc":
                assert isinstance(arg, int)
                bound.truncate(arg)
                plain.truncate(arg)
            else:
                assert isinstance(arg, list)
                a, b = bound.forward(arg), plain.forward(arg)
                assert a.shape == (len(arg), 300) and np.array_equal(a, b)
                # the same step again as a greedy step (argmax on the device): same ids, same cache
                bound.truncate(bound.length - len(arg))
                plain.truncate(plain.length - len(arg))
                ga, gb = bound.forward_greedy(arg), plain.forward_greedy(arg)
                assert ga.dtype == np.int64 and np.array_equal(ga, gb) and np.array_equal(ga, a.argmax(-1))
            assert bound.length == plain.length
        assert bound.forward([]).shape == (0, 300) and bound.forward_greedy([]).shape == (0,)
    finally:
        lm._device_ops.pop("cpu", None)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_logits_do_not_depend_on_how_the_tokens_are_split_into_passes(
    lms: dict[str, OnnxCausalLM], arch: str
) -> None:
    """Speculative == plain greedy rests on this: a verify pass of k tokens must compute each row
    exactly as k one-token passes would (ORT's one-row kernels differ: RuntimeSettings.even_passes)."""
    assert_split_invariant(lms[arch], SEQ[:11], [*SEQ[11:], *SEQ[:6]])


@pytest.mark.parametrize("spinning", [True, False])
def test_threads_spin_within_a_run_and_stop_after_it(spinning: bool) -> None:
    """Spinning (the default) is on between a run's ops and forced off at the run's end: an idle
    server or the other model's session has no thread spinning."""
    from specls.models.runtime import session_options

    so = session_options(RuntimeSettings(threads=2, spinning=spinning))
    flag = "1" if spinning else "0"
    assert so.get_session_config_entry("session.intra_op.allow_spinning") == flag
    assert so.get_session_config_entry("session.force_spinning_stop") == flag
    assert so.get_session_config_entry("session.inter_op.allow_spinning") == "0"
    assert RuntimeSettings().spinning  # Not off: the 1.5B's one-token pass 12-18% slower at 2 threads


@pytest.mark.parametrize("kind", ["in place", "host", "bound"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_an_interrupted_pass_keeps_nothing_and_the_next_one_is_exact(
    lms: dict[str, OnnxCausalLM], arch: str, kind: str
) -> None:
    lm = lms[arch]
    a = {"in place": lm.new_cache, "host": lambda: OrtKVCache(lm), "bound": lambda: BoundKVCache(lm, "cpu")}[
        kind
    ]()
    assert kind != "in place" or isinstance(a, SharedKVCache)
    a.forward(SEQ[:9])  # an odd pass: a pad row the next pass drops first
    lm.interrupt()  # no pass in flight: the next one stops at its first operator
    with pytest.raises(PassInterrupted):
        a.forward(SEQ[9:15])
    assert a.length == 9  # Not 15: the stopped pass committed nothing
    after = a.forward(SEQ[9:15])  # the flag is cleared: this pass runs
    b = lm.new_cache()
    b.forward(SEQ[:9])
    assert np.array_equal(after, b.forward(SEQ[9:15]))  # Not stale KV from the stopped pass
    # a prefill run is not stopped (its KV is what the next request shares); the flag waits for the
    # next verify pass
    lm.interrupt()
    a.append(SEQ[15:16])
    assert a.length == 16
    with pytest.raises(PassInterrupted):
        a.forward(SEQ[16:17])
    assert a.length == 16


def test_an_error_that_is_not_an_interrupt_is_raised_as_it_is(lms: dict[str, OnnxCausalLM]) -> None:
    lm = lms["llama"]

    def failing(options: object) -> None:
        raise RuntimeError("some other failure")

    with pytest.raises(RuntimeError, match="some other failure"):
        lm.run_pass(failing)
