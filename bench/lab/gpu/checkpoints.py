"""Random-weight checkpoints (transformers) with a byte-level tokenizer, and the stamps and export facts
that let a later run reuse them."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from bench.lab.gpu.shapes import SPECIAL_TOKENS, BenchError, GpuBenchSettings, ModelShape


def write_tokenizer(out_dir: Path, vocab_size: int) -> Path:
    """A byte-level BPE over the 256 byte symbols (no merges) plus Qwen2.5-Coder's special tokens; its
    ids (< 263) all lie inside the model's larger vocab. Writes tokenizer.json and tokenizer_config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    if vocab_size < len(alphabet) + len(SPECIAL_TOKENS):
        raise BenchError(f"vocab {vocab_size} is too small for a byte-level tokenizer (needs >= 263)")
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "tokenizer.json"
    tok.save(str(path))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": SPECIAL_TOKENS[0],
        "pad_token": SPECIAL_TOKENS[0],
        "model_max_length": 32768,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return path


def eos_id() -> int:
    return 256  # the first special token after the 256 byte symbols


def build_checkpoint(shape: ModelShape, out_dir: Path, seed: int) -> Path:
    """A random-weight transformers checkpoint (safetensors, fp32) plus tokenizer in ``out_dir``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    common: dict[str, Any] = {
        "vocab_size": shape.vocab,
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "max_position_embeddings": shape.max_positions,
        "tie_word_embeddings": shape.tie_embeddings,
        "bos_token_id": eos_id(),
        "eos_token_id": eos_id(),
        "pad_token_id": eos_id(),
    }
    model: Any
    torch.manual_seed(seed)
    if shape.arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common, use_sliding_window=False))
    elif shape.arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        raise BenchError(f"unknown arch {shape.arch!r} (qwen2 | llama)")
    model.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir))
    write_tokenizer(out_dir, shape.vocab)
    return out_dir


STAMP = "bench-build.json"


def export_options(settings: GpuBenchSettings, dtype: str) -> Any:
    from specls.models.export import ExportOptions

    options = ExportOptions(dtype=dtype, verify=settings.verify_export)
    if settings.ort_fusions is not None:
        if "ort_fusions" not in getattr(ExportOptions, "__dataclass_fields__", {}):
            raise BenchError("--ort-fusions: this export has no ort_fusions option")
        options = replace(options, ort_fusions=settings.ort_fusions)
    return options


def export_facts(onnx_dir: Path) -> dict[str, Any]:
    """What the export recorded (export.json): time, fused graph or not, options."""
    from specls.models.export import read_report

    rep = read_report(onnx_dir)
    opts = rep.get("options") if isinstance(rep.get("options"), dict) else {}
    return {
        "export_s": rep.get("export_s"),
        "ort_fusions": rep.get("ort_fusions", "none"),
        "dtype": opts.get("dtype") if isinstance(opts, dict) else None,
    }


def build_stamp(shape: ModelShape, seed: int, dtype: str | None) -> dict[str, Any]:
    return {"shape": asdict(shape), "seed": seed, "dtype": dtype}


def reusable(path: Path, stamp: dict[str, Any]) -> bool:
    try:
        return bool(json.loads((path / STAMP).read_text()) == stamp)
    except (OSError, ValueError):
        return False
