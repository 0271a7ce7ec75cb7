"""A tiny random Llama or Qwen2 written as a GGUF file, with a small byte-level BPE tokenizer in its
metadata, for the GGUF export tests.

transformers reads GGUF but does not write it, and llama.cpp's converter is not installed here, so this
writes one with the ``gguf`` package's ``GGUFWriter`` the way llama.cpp's converter lays it out: the
tensor names from ``gguf.get_tensor_name_map``, Llama's Q/K rows permuted into llama.cpp's rotary
order (transformers permutes them back), the vocabulary, token types and merges under
``tokenizer.ggml.*``. ``quantize`` stores the 2-D weights as Q8_0 (what a real file holds: blocks
that transformers must dequantize).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

VOCAB = 300
HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, CONTEXT = 32, 64, 2, 4, 2, 256
RMS_EPS = 1e-6
ROPE_THETA = 10000.0
TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "for i in range(10):\n    print(i * i)\n",
    "import os\nimport sys\n\nprint(os.path.join('a', 'b'))\n",
    "naïve café — résumé ✓ 日本語\n",
]
# a Qwen2 vocabulary with Qwen's three FIM tokens but no <|file_sep|> / <|repo_name|> (a partial one)
QWEN_PARTIAL_FIM = ("<|endoftext|>", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")
NO_FIM = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


@dataclass
class TinyGguf:
    path: Path
    model: Any  # the torch model the file was written from
    tokenizer: Any  # the tokenizers.Tokenizer whose vocabulary the file holds
    specials: tuple[str, ...]


def build_tokenizer(specials: Sequence[str]) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TEXTS * 20, trainer)
    return tok


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's rotary row order for a Q or K projection (its converter's ``permute``)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(
    path: Path, arch: str, specials: Sequence[str], seed: int = 0, quantize: bool = False
) -> TinyGguf:
    """Build a tiny random ``arch`` ("llama" | "qwen2") model and write it to ``path`` as GGUF (F32,
    or Q8_0 for the 2-D weights with ``quantize``). Token 0 (``specials[0]``) is EOS."""
    import gguf
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    tok = build_tokenizer(specials)
    vocab: dict[str, int] = tok.get_vocab(with_added_tokens=True)
    assert len(vocab) == VOCAB and sorted(vocab.values()) == list(range(VOCAB))
    tokens = sorted(vocab, key=vocab.__getitem__)
    merges = json.loads(tok.to_str())["model"]["merges"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]

    torch.manual_seed(seed)
    common: dict[str, Any] = dict(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=CONTEXT,
        rms_norm_eps=RMS_EPS,
        rope_theta=ROPE_THETA,
        eos_token_id=0,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    config = LlamaConfig(**common) if arch == "llama" else Qwen2Config(**common)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # peaky logits: a meaningful comparison, few near-ties
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(3.0)

    gguf_arch = {"llama": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2}[arch]
    names = gguf.get_tensor_name_map(gguf_arch, LAYERS)
    w = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[gguf_arch])
    w.add_name(f"tiny-{arch}")
    w.add_context_length(CONTEXT)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_rope_freq_base(ROPE_THETA)
    w.add_rope_dimension_count(HIDDEN // HEADS)
    w.add_vocab_size(VOCAB)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if quantize else gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    special = set(specials)
    w.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens])
    w.add_token_merges(merges)
    w.add_eos_token_id(0)
    w.add_add_bos_token(False)
    for hf_name, tensor in model.state_dict().items():
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert name is not None, hf_name
        a = tensor.detach().numpy().astype(np.float32)
        if arch == "llama" and hf_name.endswith("q_proj.weight"):
            a = _permute(a, HEADS)
        elif arch == "llama" and hf_name.endswith("k_proj.weight"):
            a = _permute(a, KV_HEADS)
        if quantize and a.ndim == 2:
            q = gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(name, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return TinyGguf(Path(path), model, tok, tuple(specials))
