"""Training pipeline: corpus split, FIM transforms, packing, a tiny training run that learns and resumes."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from specls.models import data as D


def _fake_stdlib(root: Path) -> Path:
    files = {
        "os.py": "import sys\n\ndef f(x):\n    return x + 1\n" * 20,
        "json/__init__.py": "def dumps(o):\n    return str(o)\n" * 20,
        "json/tests/test_json.py": "def test_a():\n    assert 1\n",
        "test/test_os.py": "import os\n",
        "test/support/helper.py": "X = 1\n",
        "unittest/test/test_case.py": "class T: pass\n",
        "idlelib/idle_test/test_x.py": "y = 2\n",
        "idlelib/editor.py": "class Editor:\n    pass\n" * 20,
        "site-packages/pkg/mod.py": "z = 3\n",
        "latin1.py": None,  # not UTF-8
        "notes.txt": "not python\n",
    }
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if text is None:
            p.write_bytes("s = '\xe9t\xe9'\n".encode("latin-1"))
        else:
            p.write_text(text)
    return root


def test_split_excludes_test_dirs_and_site_packages(tmp_path: Path) -> None:
    root = _fake_stdlib(tmp_path)
    split = D.split_corpus(root)
    train = [p.relative_to(root).as_posix() for p in split.train]
    held = [p.relative_to(root).as_posix() for p in split.heldout]
    assert train == ["idlelib/editor.py", "json/__init__.py", "latin1.py", "os.py"]
    assert held == [
        "idlelib/idle_test/test_x.py",
        "json/tests/test_json.py",
        "test/support/helper.py",
        "test/test_os.py",
        "unittest/test/test_case.py",
    ]
    docs = [rel for rel, _ in D.iter_documents(split.train, root)]
    assert "latin1.py" not in docs and "os.py" in docs


def test_real_stdlib_split_is_disjoint_and_complete() -> None:
    split = D.split_corpus()
    assert split.train and split.heldout
    assert not set(split.train) & set(split.heldout)
    for p in split.train:
        rel = p.relative_to(split.root)
        assert "test" not in rel.parts[:-1] and "tests" not in rel.parts[:-1]
        assert "idle_test" not in rel.parts and "site-packages" not in rel.parts
    for p in split.heldout:
        assert D.is_test_path(p.relative_to(split.root))
    assert list(split.train) == sorted(split.train, key=lambda p: p.relative_to(split.root).as_posix())
    assert split == D.split_corpus()  # deterministic


@pytest.mark.parametrize("mode", ["psm", "spm"])
def test_fim_round_trip(mode: D.FimMode) -> None:
    rng = random.Random(7)
    text = "def add(a, b):\n    return a + b\n\nprint(add(1, 2))\n"
    for _ in range(50):
        pre, mid, suf = D.fim_split(text, rng)
        assert pre + mid + suf == text
        sample = D.format_fim(pre, mid, suf, mode)
        p2, m2, s2, mode2 = D.parse_fim(sample)
        assert mode2 == mode and s2 == suf
        assert p2 + m2 == pre + mid  # SPM folds the prefix into the middle
        assert p2 + m2 + s2 == text
        if mode == "psm":
            assert (p2, m2) == (pre, mid)
            assert sample.startswith(D.FIM_PREFIX + pre + D.FIM_SUFFIX)
        else:
            assert sample.startswith(D.FIM_PREFIX + D.FIM_SUFFIX + suf + D.FIM_MIDDLE + pre)
        assert sample.endswith(mid + D.EOT)


def test_samples_are_deterministic_and_mix_formats() -> None:
    docs = [(f"m{i}.py", f"x{i} = {i}\n" * 30) for i in range(200)]
    opts = D.DataOptions(seed=3)
    a = list(D.make_samples(iter(docs), opts))
    assert a == list(D.make_samples(iter(docs), opts))
    psm = sum(s.startswith(D.FIM_PREFIX) and not s.startswith(D.FIM_PREFIX + D.FIM_SUFFIX) for s in a)
    spm = sum(s.startswith(D.FIM_PREFIX + D.FIM_SUFFIX) for s in a)
    assert psm > 20 and spm > 20 and len(a) - psm - spm > 40
    assert all(s.endswith(D.EOT) for s in a)


def test_pack_rows() -> None:
    rows = D.pack([[1, 2, 3], [4, 5], [6, 7, 8, 9]], 4)
    assert rows.tolist() == [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert D.chunk_lines("a\nbb\nccc\n", 5) == ["a\nbb\n", "ccc\n"]


def _tiny_options(out: Path, corpus: Path, resume: bool = False, max_tokens: int = 6 * 2 * 64) -> Any:
    from specls.models.train import ModelShape, TrainOptions

    shape = ModelShape(hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64, max_positions=128)
    return TrainOptions(
        out_dir=out,
        corpus_root=corpus,
        vocab_size=300,
        seq_len=64,
        batch_size=2,
        max_tokens=max_tokens,
        lr=1e-2,
        draft_lr=1e-2,
        warmup_steps=1,
        save_every=3,
        threads=1,
        seed=5,
        resume=resume,
        target=shape,
        draft=shape,
        progress=False,
    )


def _tiny_corpus(root: Path) -> Path:
    root.mkdir(parents=True)
    rng = random.Random(0)
    for i in range(6):
        lines = [f"def f{j}(x):\n    return x * {rng.randint(0, 9)}\n\n" for j in range(30)]
        (root / f"m{i}.py").write_text("".join(lines))
    return root


@pytest.mark.slow
def test_tiny_training_lowers_loss_and_resumes_deterministically(tmp_path: Path) -> None:
    import torch
    from specls.models.train import load_trained, train

    torch.set_num_threads(1)
    corpus = _tiny_corpus(tmp_path / "corpus")
    full = train(_tiny_options(tmp_path / "full", corpus))
    assert full.steps == 6
    assert 0 < full.long_steps < 6  # the last steps ran on double-length rows
    assert full.target_loss < full.first_target_loss - 0.5
    assert full.draft_loss < full.first_draft_loss - 0.5

    # The same run interrupted after step 3 (its last checkpoint), then resumed: identical weights.
    half = tmp_path / "half"
    cut = dataclasses.replace(_tiny_options(half, corpus), stop_after=3)
    train(cut)
    state = torch.load(half / "state.pt", weights_only=False)
    assert state["step"] == 3
    resumed = train(_tiny_options(half, corpus, resume=True))
    assert resumed.steps == 6
    t_full, d_full, _ = load_trained(tmp_path / "full")
    t_res, d_res, _ = load_trained(half)
    for a, b in zip(t_full.state_dict().values(), t_res.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(d_full.state_dict().values(), d_res.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert resumed.target_loss == pytest.approx(full.target_loss)


@pytest.mark.slow
def test_fp16_rounding_and_checkpoint_roundtrip(tmp_path: Path) -> None:
    import json

    import torch
    from specls.models.train import load_trained, round_to_fp16, save_checkpoint, train
    from transformers import LlamaForCausalLM

    torch.set_num_threads(1)
    corpus = _tiny_corpus(tmp_path / "corpus")
    train(_tiny_options(tmp_path / "run", corpus, max_tokens=2 * 64))
    target, _draft, _ = load_trained(tmp_path / "run")
    round_to_fp16(target)
    for p in target.parameters():
        assert torch.equal(p, p.half().float())
    out = save_checkpoint(target, tmp_path / "run" / "tokenizer.json", tmp_path / "ckpt")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["dtype"] == "float32"
    assert (out / "tokenizer.json").is_file()
    loaded = LlamaForCausalLM.from_pretrained(out, dtype=torch.float32)
    for (name, a), b in zip(target.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    x = torch.tensor([[1, 2, 3, 4]])
    assert torch.equal(target(input_ids=x).logits, loaded(input_ids=x).logits)
    assert np.isfinite(loaded(input_ids=x).logits.detach().numpy()).all()


def test_lr_schedule_and_time_budget() -> None:
    from specls.models.train import decay_fraction, lr_at

    assert lr_at(0, 0.0, 1.0, 10, 0.1) == pytest.approx(0.1)
    assert lr_at(9, 0.0, 1.0, 10, 0.1) == pytest.approx(1.0)
    assert lr_at(10, 0.0, 1.0, 10, 0.1) == pytest.approx(1.0)
    assert lr_at(50, 0.5, 1.0, 10, 0.1) == pytest.approx(0.55)
    assert lr_at(99, 1.0, 1.0, 10, 0.1) == pytest.approx(0.1)
    assert lr_at(99, 3.0, 1.0, 10, 0.1) == pytest.approx(0.1)
    assert decay_fraction(60, 110, 10, wall_s=5.0, time_budget_s=None) == pytest.approx(0.5)
    assert decay_fraction(60, 110, 10, wall_s=5.0, time_budget_s=100.0) == pytest.approx(0.5)
    assert decay_fraction(60, 110, 10, wall_s=80.0, time_budget_s=100.0) == pytest.approx(0.8)


def test_param_count_from_config_matches_model() -> None:
    from specls.models.train import DRAFT_SHAPE, count_params, llama_config, params_from_config
    from transformers import LlamaForCausalLM

    cfg = llama_config(DRAFT_SHAPE, 8192)
    assert params_from_config(cfg.to_dict()) == count_params(LlamaForCausalLM(cfg))
