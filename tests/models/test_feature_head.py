"""The feature draft head on exported tiny checkpoints: the hidden-state output leaves logits as they
were and is what the projection reads; a cache serves a row only while it holds its position; a head
trained here drafts through the engine and the completion stays the plain greedy one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from specls.models.feature_head import FeatureHead, HeadInfo, has_feature_head, head_dir, write_head_graph
from specls.models.feature_head_train import (
    HeadTraining,
    extract_features,
    projection_rows,
    train_heads,
)
from specls.models.hidden_output import HIDDEN_NAME, add_hidden_output
from specls.models.runtime import OnnxCausalLM, OrtKVCache, RuntimeSettings
from specls.models.spec import load_spec

from specls.api import CompletionRequest
from specls.engine import OnnxEngine
from specls.engine_settings import EngineSettings

pytestmark = pytest.mark.slow

SEQ = [5, 17, 42, 99, 3, 250, 7, 7, 120, 64, 11, 290, 33, 8, 150, 201, 77]
ONE = RuntimeSettings(threads=1, provider="cpu")


def _rows(cache: object, n: int) -> np.ndarray:
    """The hidden rows of positions 0..n-1 the cache's last pass computed: [n, d]."""
    assert isinstance(cache, OrtKVCache)
    rows = [cache.hidden_at(p) for p in range(n)]
    assert all(r is not None for r in rows)
    return np.stack([r for r in rows if r is not None])


def _with_hidden(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    assert add_hidden_output(dst) == HIDDEN_NAME
    assert add_hidden_output(dst) == HIDDEN_NAME  # idempotent
    assert load_spec(dst).hidden_name == HIDDEN_NAME
    return dst


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_hidden_output_keeps_logits_and_is_what_the_projection_reads(
    exported: dict[str, Path], tmp_path: Path, arch: str
) -> None:
    d = _with_hidden(exported[arch], tmp_path / arch)
    before, after = OnnxCausalLM(exported[arch], ONE), OnnxCausalLM(d, ONE)
    ref = before.new_cache().forward(SEQ)  # [n, vocab]
    cache = after.new_cache()
    logits = cache.forward(SEQ)
    np.testing.assert_array_equal(logits, ref)
    hidden = _rows(cache, len(SEQ))  # [n, d]
    rows = projection_rows(d, np.arange(after.vocab_size))  # [vocab, d]
    np.testing.assert_allclose(hidden @ rows.T, logits, atol=1e-3)


def test_a_cache_serves_a_hidden_row_only_while_it_holds_its_position(
    exported: dict[str, Path], tmp_path: Path
) -> None:
    lm = OnnxCausalLM(_with_hidden(exported["qwen2"], tmp_path / "q"), ONE)
    cache = lm.new_cache()
    cache.forward(SEQ)
    assert cache.hidden_at(16) is not None and cache.hidden_at(17) is None  # Not a row past the end
    cache.truncate(10)
    assert cache.hidden_at(12) is None and cache.hidden_at(9) is not None  # rolled back past 12
    cache.forward([1, 2])
    assert cache.hidden_at(9) is None  # an earlier pass's row: not kept
    assert cache.hidden_at(10) is not None and cache.hidden_at(11) is not None
    cache.append([3, 4, 5])  # a prefill keeps its last row (the one a first draft reads)
    assert cache.hidden_at(14) is not None and cache.hidden_at(13) is None


def test_a_device_cache_keeps_logits_with_the_hidden_output(
    exported: dict[str, Path], tmp_path: Path
) -> None:
    from specls.models.runtime import BoundKVCache

    d = _with_hidden(exported["llama"], tmp_path / "b")
    lm = OnnxCausalLM(d, ONE)
    ref = lm.new_cache().forward(SEQ)
    bound = BoundKVCache(lm, "cpu")  # the CUDA cache's code on the CPU: it fetches no hidden states
    np.testing.assert_allclose(bound.forward(SEQ), ref, atol=1e-5)
    assert bound.hidden_at(len(SEQ) - 1) is None  # so no head proposals there, and no error


def test_int8_projection_rows_give_the_int8_logits(int8_qwen2: Path, tmp_path: Path) -> None:
    d = _with_hidden(int8_qwen2, tmp_path / "q8")
    lm = OnnxCausalLM(d, ONE)
    cache = lm.new_cache()
    logits = cache.forward(SEQ)
    hidden = _rows(cache, len(SEQ))
    approx = hidden @ projection_rows(d, np.arange(lm.vocab_size)).T  # the activation is not quantized
    agree = np.mean(np.argmax(approx, -1) == np.argmax(logits, -1))
    assert agree >= 0.9, agree
    assert np.max(np.abs(approx - logits)) < 0.05 * np.max(np.abs(logits))


@pytest.fixture(scope="module")
def int8_qwen2(tiny_checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    from specls.models.export import ExportOptions, export_model

    from tests.models.test_quantize import TINY

    opts = ExportOptions(tolerance=1e-4, quantize="int8", agreement=TINY, quant_block_size=32)
    return export_model(str(tiny_checkpoints["qwen2"]), tmp_path_factory.mktemp("q8") / "m", opts)


CODE = [
    "def add(a, b):\n    return a + b\n\n",
    "for i in range(10):\n    total += values[i] * weights[i]\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
]


def test_a_trained_head_drafts_and_completions_stay_plain_greedy(
    exported: dict[str, Path], tmp_path: Path
) -> None:
    d = _with_hidden(exported["qwen2"], tmp_path / "m")
    lm = OnnxCausalLM(d, ONE)
    f = extract_features(lm, CODE * 20, lm.tokenizer.encode, max_tokens=2000, chunk=64)
    assert f.hidden.shape[0] == f.tokens.shape[0] == f.argmax.shape[0] > 100
    trained = train_heads(
        f, lambda ids: projection_rows(d, ids), HeadTraining(heads=3, vocab=64, epochs=2, batch=32)
    )
    assert len(trained.blocks) == 3 and len(trained.accuracy) == 3
    info = HeadInfo(
        3, int(trained.ids.size), lm.spec.hidden_size, "test", int(f.tokens.size), tuple(trained.accuracy)
    )
    write_head_graph(head_dir(d), trained.blocks, trained.rows, trained.ids, info, lm.vocab_size)
    assert has_feature_head(d)
    ids, probs = FeatureHead(d, lm.spec.hidden_size).guess(np.zeros(lm.spec.hidden_size, dtype=np.float32), 5)
    assert ids.shape == (3,) and set(ids.tolist()) <= set(trained.ids.tolist()) and np.all(probs <= 1.0)

    base = dict(model=str(d), threads=1, draft_model=False, lookup=False, lru_size=0, costs_cache=False)
    plain = OnnxEngine(EngineSettings(speculation=False, **base))  # type: ignore[arg-type]
    with_head = OnnxEngine(EngineSettings(**base))  # type: ignore[arg-type]
    without = OnnxEngine(EngineSettings(feature_head=False, **base))  # type: ignore[arg-type]
    for e in (plain, with_head, without):
        e.load()
    drafted = 0
    for i, text in enumerate(CODE):
        req = CompletionRequest(doc_id=f"d{i}", prefix=text[: len(text) // 2], suffix="", max_tokens=24)
        want = plain.complete(req).text
        result = with_head.complete(req)
        assert result.text == want, f"text {i}"
        got, off = result.decode, without.complete(req).decode
        assert got is not None and off is not None
        assert off.drafted == 0  # Not the head: turned off
        drafted += got.per_drafter["head"].drafted if "head" in got.per_drafter else 0
    assert drafted > 0


def test_specls_head_train_then_show(
    exported: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from specls.cli import main

    d = tmp_path / "m"
    shutil.copytree(exported["llama"], d)
    corpora = [tmp_path / "corpus", tmp_path / "repo"]
    for corpus in corpora:
        corpus.mkdir()
        for i, text in enumerate(CODE * 4):
            (corpus / f"f{i}.py").write_text(text * 3)
    assert main(["head", "show", "--model", str(d)]) == 1  # none yet
    rc = main(
        [
            "head",
            "train",
            "--model",
            str(d),
            "--from",
            str(corpora[0]),
            "--from",
            str(corpora[1]),
            "--tokens",
            "600",
            "--vocab",
            "64",
            "--heads",
            "2",
            "--epochs",
            "1",
            "--threads",
            "1",
            "--features",
            str(tmp_path / "f.npz"),
        ]
    )
    assert rc == 0
    out = capsys.readouterr()
    report = json.loads(out.out.strip().splitlines()[-1])
    assert report["positions"] > 600 and len(report["accuracy"]) == 2  # Not 600: both corpora read
    # what a user waiting on it sees: each corpus's positions, then each head as it finishes
    assert out.err.count("head: hidden states from") == 2 and "positions (" in out.err
    assert "head 2 of 2 trained, held-out top-1" in out.err
    assert load_spec(d).hidden_name == HIDDEN_NAME and has_feature_head(d) and (tmp_path / "f.npz").is_file()
    assert main(["head", "show", "--model", str(d)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["heads"] == 2 and shown["corpus"] == f"{corpora[0]},{corpora[1]}"
    assert main(["head", "show", "--model", str(tmp_path / "nowhere")]) == 1


def test_head_train_refuses_an_unknown_corpus_before_collecting(
    exported: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from specls.cli import main

    d = tmp_path / "m"
    shutil.copytree(exported["llama"], d)
    rc = main(["head", "train", "--model", str(d), "--from", "stdlib", "--from", str(tmp_path / "nowhere")])
    assert rc == 2
    assert "nowhere" in capsys.readouterr().err
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.bin").write_bytes(b"\x00\x01")
    rc = main(["head", "train", "--model", str(d), "--from", str(tmp_path / "notes")])
    assert rc == 2  # Not a traceback from collecting nothing
    assert "no code files" in capsys.readouterr().err
    assert not has_feature_head(d)


def test_features_of_several_corpora_keep_each_chunk_apart() -> None:
    from specls.models.feature_head_train import FeatureSet, head_samples

    a = FeatureSet(np.zeros((4, 1)), np.array([1, 2, 3, 4]), np.array([2, 3, 4, 5]), np.array([0, 0, 1, 1]))
    b = FeatureSet(np.ones((3, 1)), np.array([5, 6, 7]), np.array([6, 7, 8]), np.array([0, 0, 0]))
    c = FeatureSet.concat([a, b], seed=3)
    assert c.tokens.tolist() == [1, 2, 3, 4, 5, 6, 7] and c.hidden[:, 0].tolist() == [0, 0, 0, 0, 1, 1, 1]
    assert len(set(c.chunk.tolist())) == 3  # Not 2: b's chunk 0 is not a's
    # a label never crosses from one corpus's chunk into another's
    assert head_samples(c, 1).tolist() == [0, 2, 4, 5]  # Not 3: position 4 is b's


def test_head_data_pairs_each_position_with_the_tokens_between_and_the_label() -> None:
    from specls.models.feature_head_train import FeatureSet, _head_data

    f = FeatureSet(
        np.zeros((6, 2), dtype=np.float16),
        tokens=np.array([0, 1, 2, 9, 4, 5]),
        argmax=np.array([1, 2, 3, 4, 5, 6]),
        chunk=np.zeros(6, dtype=np.int32),
    )
    index = np.arange(10)  # every token in the vocabulary, at its own row
    one = _head_data(f, 1, index, cut=0)
    assert one.at.tolist() == [0, 1, 3, 4]  # Not 2: the text after it (9) is not the argmax there (3)
    assert one.tokens[:, 0].tolist() == [1, 2, 4, 5]  # the token committed from t
    assert one.labels.tolist() == [2, 3, 5, 6]  # the argmax at t + 1
    two = _head_data(f, 2, index, cut=0)
    assert two.at.tolist() == [0, 3]  # Not 1: its t + 2 is the 9
    assert two.tokens.tolist() == [[1, 2], [4, 5]] and two.labels.tolist() == [3, 6]


def test_the_head_graph_computes_the_chain_it_describes() -> None:
    import onnxruntime as ort
    from specls.models.feature_head import head_model

    rng = np.random.default_rng(0)
    d, v, vocab, k = 8, 12, 20, 3
    rows = rng.standard_normal((v, d)).astype(np.float16).astype(np.float32)  # E is stored as fp16
    ids = np.sort(rng.choice(vocab, size=v, replace=False))
    blocks = [(rng.standard_normal(((j + 1) * d, d)), rng.standard_normal(d)) for j in range(1, k + 1)]
    sess = ort.InferenceSession(head_model(blocks, rows, ids, vocab).SerializeToString())
    emb = {int(t): rows[i] for i, t in enumerate(ids)}
    for token in (int(ids[3]), int(next(t for t in range(vocab) if t not in emb))):
        h = rng.standard_normal(d).astype(np.float32)
        got, _ = sess.run(None, {"hidden": h[None, :], "token": np.array([token])})
        es, want = [emb.get(token, np.zeros(d, dtype=np.float32))], []
        for w, b in blocks:  # the chain in numpy: each head reads the hidden state and the tokens so far
            z = np.concatenate([h, *es]) @ w + b
            best = int(np.argmax((h + z / (1 + np.exp(-z))) @ rows.T))
            want.append(int(ids[best]))
            es.append(rows[best])
        assert got.tolist() == want, token  # Not the first guess repeated: each reads the last one
