"""A reduced LM head for draft models (``specls export --draft-head ascii``, ``models.head``): which ids
it keeps, how the runtime scatters its logits into the vocabulary, the spec and load-time checks, and
on tiny exports that the kept logits are the full head's and speculation with such a draft stays exact."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from specls.decoder.api import DecodeSettings
from specls.decoder.drafters import DraftModelDrafter, PromptLookupDrafter
from specls.decoder.loop import generate
from specls.decoder.planned import PlannedDrafter, PolicyState
from specls.decoder.policy import PassCosts
from specls.models.agreement import AgreementOptions
from specls.models.export import ExportError, ExportOptions, export_model, read_report
from specls.models.head import HEAD_FILL, HEAD_IDS_FILE, ascii_token_ids, load_head_ids, scatter_head
from specls.models.runtime import BoundKVCache, OnnxCausalLM, RuntimeSettings
from specls.models.spec import GraphIO, ModelLoadError, check_graph_io, load_spec
from specls.models.tokenizer import Tokenizer

from tests.models.conftest import build_checkpoint
from tests.models.test_spec import _io, make_spec, write_dir

CPU = RuntimeSettings(threads=1, provider="cpu")
CHEAP_STEPS = PassCosts(step=0.05, catchup=0.001)  # the policy then drafts with the model
TINY = AgreementOptions(positions=1024, min_top1=0.5, threads=1)  # see test_quantize.TINY


def _word_tokenizer(vocab: dict[str, int], added: list[str]) -> Tokenizer:
    from tokenizers import AddedToken
    from tokenizers import Tokenizer as HF
    from tokenizers.models import WordLevel

    hf = HF(WordLevel(vocab, unk_token="a"))
    hf.add_special_tokens([AddedToken(t, special=True) for t in added])
    return Tokenizer(hf)


def test_ascii_token_ids_table() -> None:
    tok = _word_tokenizer({"a": 0, "é": 1, "\n": 2}, ["<eos>"])  # <eos> gets id 3
    # the docstring's example: row 4 of a 5-row head is no token
    assert ascii_token_ids(tok, 5).tolist() == [0, 2, 3]  # Not [0, 1, 2, 3, 4]
    assert ascii_token_ids(tok, 5, keep=[1]).tolist() == [0, 1, 2, 3]  # an eos id is kept, ASCII or not
    assert ascii_token_ids(tok, 3).tolist() == [0, 2]  # Not [0, 2, 3]: the added token is past the head
    tok = _word_tokenizer({"日本": 0, "x": 1, "✓": 2}, [])
    assert ascii_token_ids(tok, 3, keep=[7]).tolist() == [1]  # an id past the vocab is never kept


def test_ascii_token_ids_of_a_byte_level_bpe(tmp_path: Path) -> None:
    from tests.models.conftest import build_tokenizer

    tok = Tokenizer.from_file(build_tokenizer(tmp_path))
    ids = ascii_token_ids(tok, 300)
    texts = {i: tok.decode([i]) for i in range(tok.vocab_size)}
    assert all(texts[i].isascii() for i in ids.tolist())
    dropped = [i for i in range(tok.vocab_size) if i not in set(ids.tolist())]
    # bytes >= 0x80 alone decode to U+FFFD, and merges of "é", "—", "日本" are not ASCII either
    assert dropped and all(not texts[i].isascii() for i in dropped)
    assert set(tok.special_ids) <= set(ids.tolist())  # FIM markers and end-of-text stay
    assert tok.encode("def add(a, b):") and all(i in set(ids.tolist()) for i in tok.encode("def add(a, b):"))


def test_scatter_head_table() -> None:
    got = scatter_head(np.array([[1.0, 2.0]], dtype=np.float16), np.array([0, 2]), 3)
    assert got.dtype == np.float32 and got.tolist() == [[1.0, HEAD_FILL, 2.0]]  # Not [[1, 2, fill]]
    full = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert scatter_head(full, None, 3) is full  # a full head: nothing copied
    assert np.isfinite(HEAD_FILL) and HEAD_FILL < -1e30
    row = scatter_head(np.array([[-50.0]], dtype=np.float32), np.array([1]), 4)[0]
    z = row - row.max()
    assert np.isfinite(z - np.log(np.exp(z).sum())).all()  # log-softmax stays finite (not NaN)


@pytest.mark.parametrize(
    "ids,needle",
    [
        (np.array([0, 5, 5]), "strictly increasing"),
        (np.array([2, 1]), "strictly increasing"),
        (np.array([0, 300]), "below vocab_size 300"),
        (np.array([-1, 2]), "strictly increasing"),
        (np.zeros((2, 2), dtype=np.int64), "1-D"),
        (np.array([], dtype=np.int64), "non-empty"),
        (np.array([0.5, 1.5]), "integer"),
    ],
)
def test_load_head_ids_rejects_malformed_files(tmp_path: Path, ids: np.ndarray, needle: str) -> None:
    spec = make_spec(head_ids_file=HEAD_IDS_FILE)
    np.save(write_dir(tmp_path, spec) / HEAD_IDS_FILE, ids)
    with pytest.raises(ModelLoadError, match=needle):
        load_head_ids(tmp_path, load_spec(tmp_path))


def test_head_ids_file_in_the_spec(tmp_path: Path) -> None:
    spec = make_spec(head_ids_file=HEAD_IDS_FILE)
    d = write_dir(tmp_path, spec)
    with pytest.raises(ModelLoadError, match=f"{HEAD_IDS_FILE}: missing"):
        load_spec(d)
    (d / HEAD_IDS_FILE).write_bytes(b"not an npy file")
    assert load_spec(d) == spec  # round trip
    with pytest.raises(ModelLoadError, match="unreadable head ids"):
        load_head_ids(d, spec)
    np.save(d / HEAD_IDS_FILE, np.array([0, 3, 7]))
    assert load_head_ids(d, spec).tolist() == [0, 3, 7]  # type: ignore[union-attr]
    assert load_head_ids(d, make_spec()) is None
    (tmp_path / "b").mkdir()
    bad = write_dir(tmp_path / "b", make_spec())
    raw = (bad / "specls.json").read_text().replace('"head_ids_file": null', '"head_ids_file": "../x.npy"')
    (bad / "specls.json").write_text(raw)
    with pytest.raises(ModelLoadError, match="head_ids_file"):
        load_spec(bad)


def test_check_graph_io_with_a_reduced_head() -> None:
    spec = make_spec(head_ids_file=HEAD_IDS_FILE)
    ins, outs = _io(spec)
    narrow = [GraphIO("logits", "tensor(float)", (1, 1, 120)), *outs[1:]]
    check_graph_io(spec, Path("m.onnx"), ins, narrow, head_size=120)
    with pytest.raises(ModelLoadError, match="the 121 ids"):
        check_graph_io(spec, Path("m.onnx"), ins, narrow, head_size=121)
    with pytest.raises(ModelLoadError, match="vocab"):
        check_graph_io(spec, Path("m.onnx"), ins, narrow)  # Not accepted as a full head


# --- tiny exports -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tied(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2 whose LM head is its input embedding (as Qwen2.5-Coder 0.5B's)."""
    return build_checkpoint(tmp_path_factory.mktemp("tied") / "qwen2", "qwen2", tie=True)


@pytest.fixture(scope="module")
def heads(tied: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("heads")
    full = ExportOptions(tolerance=1e-4)
    return {
        "full": export_model(str(tied), root / "full", full),
        "ascii": export_model(str(tied), root / "ascii", replace(full, draft_head="ascii", batch_graph=True)),
        "ascii-int8": export_model(
            str(tied), root / "ascii-int8", replace(full, draft_head="ascii", quantize="int8", agreement=TINY)
        ),
    }


@pytest.mark.slow
def test_ascii_head_logits_are_the_full_heads_at_the_kept_ids(heads: dict[str, Path]) -> None:
    full, ascii_ = OnnxCausalLM(heads["full"], CPU), OnnxCausalLM(heads["ascii"], CPU)
    ids = ascii_.head_ids
    assert ids is not None and full.head_ids is None
    assert 100 < ids.size < 300 and load_spec(heads["ascii"]).head_ids_file == HEAD_IDS_FILE
    assert ids.tolist() == ascii_token_ids(full.tokenizer, 300, full.eos_token_ids).tolist()
    assert ascii_.logits_width == ids.size and full.logits_width == 300
    dropped = np.setdiff1d(np.arange(300), ids)
    prompt = ascii_.tokenizer.encode("naïve café\ndef add(a, b):")  # non-ASCII input ids embed as before
    assert any(i in set(dropped.tolist()) for i in prompt)
    want = full.new_cache().forward(prompt)  # [n, 300]
    caches = {"host": ascii_.new_cache(), "device": BoundKVCache(ascii_, "cpu")}
    for name, cache in caches.items():
        got = cache.forward(prompt)  # [n, 300]
        assert got.shape == want.shape, name
        np.testing.assert_allclose(got[:, ids], want[:, ids], atol=1e-4, err_msg=name)
        assert (got[:, dropped] == HEAD_FILL).all(), name
        nxt = [int(np.argmax(got[-1]))]
        assert nxt[0] in set(ids.tolist())
        last = cache.forward_last(nxt)  # [300]
        assert last.shape == (300,) and (last[dropped] == HEAD_FILL).all(), name
        greedy = cache.forward_greedy([int(np.argmax(last)), 7])  # ids, mapped back from head positions
        np.testing.assert_array_equal(greedy, np.argmax(cache_copy_logits(ascii_, prompt, nxt, last), -1))


def cache_copy_logits(lm: OnnxCausalLM, prompt: list[int], nxt: list[int], last: np.ndarray) -> np.ndarray:
    """The logits forward_greedy's two positions have, recomputed on a fresh cache."""
    c = lm.new_cache()
    c.forward([*prompt, *nxt])
    return c.forward([int(np.argmax(last)), 7])


@pytest.mark.slow
def test_batched_passes_of_an_ascii_head_scatter_like_single_ones(heads: dict[str, Path]) -> None:
    lm = OnnxCausalLM(heads["ascii"], CPU)
    assert lm.enable_batching()  # model.batch.onnx: its logits are as narrow as the main graph's
    seqs = [lm.tokenizer.encode("def add(a, b):"), lm.tokenizer.encode("naïve")]
    got = lm.forward_batch([lm.new_cache(), lm.new_cache()], seqs)
    for ids, logits in zip(seqs, got, strict=True):
        want = lm.new_cache().forward(ids)  # [n, 300]
        assert logits.shape == want.shape == (len(ids), 300)
        np.testing.assert_allclose(logits, want, atol=1e-4)  # the fill value included: never mixed up


@pytest.mark.slow
def test_ascii_head_int8_export_keeps_the_head_through_quantization(heads: dict[str, Path]) -> None:
    d = heads["ascii-int8"]
    report = read_report(d)
    assert report["quantize"] == "int8" and report["agreement"]["top1"] >= TINY.min_top1
    assert report["options"]["draft_head"] == "ascii"
    assert (d / HEAD_IDS_FILE).is_file() and not list(d.glob(".quantize-*"))
    lm = OnnxCausalLM(d, CPU)
    assert lm.head_ids is not None and lm.logits_width == lm.head_ids.size < 300
    logits = lm.new_cache().forward([5, 17, 42, 99])
    assert logits.shape == (4, 300) and np.isfinite(logits).all()


@pytest.mark.slow
@pytest.mark.parametrize("draft_dir", ["ascii", "ascii-int8"])
def test_speculative_with_an_ascii_head_draft_equals_plain_greedy(
    heads: dict[str, Path], draft_dir: str
) -> None:
    target = OnnxCausalLM(heads["full"], CPU)
    draft = OnnxCausalLM(heads[draft_dir], CPU)
    tok = target.tokenizer
    settings = DecodeSettings(max_new_tokens=24)
    accepted = 0
    for text in ("def add(a, b):\n", "naïve café — ", "class Point:"):
        prompt = tok.encode(text)
        plain = generate(target.new_cache(), prompt, None, settings, frozenset())
        for drafter in (
            DraftModelDrafter(draft),
            # both combined as the default path combines them (the drafting policy); cheap draft
            # steps so that the policy drafts with the model too
            PlannedDrafter(
                PromptLookupDrafter(None), DraftModelDrafter(draft), PolicyState(costs=CHEAP_STEPS)
            ),
        ):
            spec = generate(target.new_cache(), prompt, drafter, settings, frozenset())
            assert spec.tokens == plain.tokens, (draft_dir, text)
            accepted += spec.accepted
    assert accepted > 0  # the reduced-head draft's proposals were accepted


@pytest.mark.slow
def test_export_rejects_an_unknown_draft_head(tied: Path, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="draft_head"):
        export_model(str(tied), tmp_path / "x", ExportOptions(draft_head="cjk"))


@pytest.mark.slow
def test_a_full_export_over_an_ascii_dir_drops_the_head_file(tied: Path, tmp_path: Path) -> None:
    d = tmp_path / "m"
    export_model(str(tied), d, ExportOptions(tolerance=1e-4, draft_head="ascii"))
    assert (d / HEAD_IDS_FILE).is_file()
    export_model(str(tied), d, ExportOptions(tolerance=1e-4))
    assert not (d / HEAD_IDS_FILE).exists() and load_spec(d).head_ids_file is None
    assert OnnxCausalLM(d, CPU).logits_width == 300


@pytest.mark.slow
def test_a_target_with_a_reduced_head_is_warned_about(
    heads: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    from specls.models.loader import check_pair

    full, ascii_ = OnnxCausalLM(heads["full"], CPU), OnnxCausalLM(heads["ascii"], CPU)
    with caplog.at_level("WARNING", logger="specls.models.loader"):
        check_pair(full, ascii_)  # the draft's option: no warning
        assert "reduced LM head" not in caplog.text
        check_pair(ascii_, full)
    assert "the target has a reduced LM head" in caplog.text
