"""Tiny random checkpoints (Llama, Qwen2) with a tiny byte-level BPE tokenizer, and their ONNX exports.

Session-scoped: each architecture is built and exported once per test run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from specls.models.fim import BUNDLED

VOCAB = 300
TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "for i in range(10):\n    print(i * i)\n",
    "import os\nimport sys\n\nprint(os.path.join('a', 'b'))\n",
    "naïve café — résumé ✓ 日本語\n",
]


def build_tokenizer(out: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=list(BUNDLED.special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TEXTS * 20, trainer)
    path = out / "tokenizer.json"
    tok.save(str(path))
    return path


def build_checkpoint(out: Path, arch: str, tie: bool = False) -> Path:
    """A tiny random ``arch`` ("llama" | "qwen2") checkpoint; ``tie``: the LM head is the input embedding
    (as Qwen2.5-Coder 0.5B's)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    torch.manual_seed(0 if arch == "llama" else 1)
    common: dict[str, Any] = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=3,
        bos_token_id=None,
        tie_word_embeddings=tie,
    )
    config = LlamaConfig(**common) if arch == "llama" else Qwen2Config(**common)
    model = AutoModelForCausalLM.from_config(config)
    # scale weights up a little so logits are not all ~0 (a meaningful comparison)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(3.0)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    build_tokenizer(out)
    return out


@pytest.fixture(scope="session", autouse=True)
def _one_thread() -> None:
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ckpt")
    return {arch: build_checkpoint(root / arch, arch) for arch in ("llama", "qwen2")}


@pytest.fixture(scope="session")
def exported(tiny_checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """arch -> exported fp32 model dir (verified against torch at 1e-4)."""
    from specls.models.export import ExportOptions, export_model

    root = tmp_path_factory.mktemp("onnx")
    opts = ExportOptions(tolerance=1e-4)
    return {arch: export_model(str(ckpt), root / arch, opts) for arch, ckpt in tiny_checkpoints.items()}
