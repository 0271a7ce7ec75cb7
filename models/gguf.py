"""GGUF files (llama.cpp, Ollama, LM Studio) as an export source.

transformers reads them: ``from_pretrained(dir, gguf_file=name)`` dequantizes every tensor to the
requested torch dtype and maps llama.cpp's tensor names (and its Q/K row permutation for Llama) back to
the Hugging Face model; ``AutoTokenizer.from_pretrained(dir, gguf_file=name)`` builds a fast tokenizer
from the vocabulary, merges and token types in the metadata. Both need the ``gguf`` package, the model
also ``accelerate`` (the ``export`` extra installs them). This module only finds the file, reads the
few metadata fields specls reports, and wraps those two calls with one clear error each.

torch/transformers/gguf are imported inside the functions: this module is importable without them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specls.api import EngineError

log = logging.getLogger(__name__)

GGUF_SUFFIX = ".gguf"
# what marks a directory as a Hugging Face checkpoint (which wins over a stray .gguf beside it)
HF_CONFIG = "config.json"


class GgufError(EngineError):
    """A GGUF source that cannot be used; the message names the file and what is wrong."""


@dataclass(frozen=True)
class GgufInfo:
    """The metadata specls reports about a GGUF file (read without touching the tensors)."""

    path: Path
    architecture: str  # llama.cpp's name: "llama", "qwen2", ...
    name: str
    context_length: int | None
    vocab_tokens: int
    tokenizer_model: str | None  # "gpt2" (byte-level BPE), "llama" (sentencepiece), ...
    tensor_types: tuple[str, ...]  # quantization types present, e.g. ("F32", "Q4_K", "Q6_K")


def find_gguf(path: Path) -> Path | None:
    """The GGUF file ``path`` stands for: the file itself, or the only ``*.gguf`` in a directory that
    is not a Hugging Face checkpoint (no ``config.json``). None when ``path`` is no GGUF source.

    Raises GgufError for a directory holding several GGUF files (naming them), or a ``.gguf`` path
    that is not a file."""
    path = Path(path)
    if path.suffix.lower() == GGUF_SUFFIX:
        if not path.is_file():
            raise GgufError(f"{path}: no such GGUF file")
        return path
    if not path.is_dir() or (path / HF_CONFIG).is_file():
        return None
    found = sorted(p for p in path.iterdir() if p.suffix.lower() == GGUF_SUFFIX and p.is_file())
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise GgufError(f"{path}: holds {len(found)} GGUF files ({names}); pass the one to export")
    return found[0] if found else None


def _reader(path: Path) -> Any:
    try:
        from gguf import GGUFReader
    except ImportError as exc:
        raise GgufError(
            f"{path}: reading GGUF needs the gguf package (pip install 'specls[export]')"
        ) from exc
    try:
        return GGUFReader(str(path))
    except Exception as exc:  # a truncated or foreign file: numpy/struct errors of all kinds
        raise GgufError(f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc})") from None


def read_gguf_info(path: Path) -> GgufInfo:
    """Architecture, name, context length and tensor types of a GGUF file (memory-mapped; cheap)."""
    reader = _reader(path)

    def field(key: str) -> Any:
        f = reader.fields.get(key)
        if f is None:
            return None
        try:
            return f.contents()
        except Exception:  # a field of an unexpected type: treat as absent
            return None

    arch = field("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise GgufError(f"{path}: no general.architecture in the GGUF metadata")
    ctx = field(f"{arch}.context_length")
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    model = field("tokenizer.ggml.model")
    return GgufInfo(
        path=Path(path),
        architecture=arch,
        name=str(field("general.name") or ""),
        context_length=int(ctx) if isinstance(ctx, int) else None,
        vocab_tokens=len(tokens.data) if tokens is not None else 0,
        tokenizer_model=model if isinstance(model, str) else None,
        tensor_types=tuple(sorted({t.tensor_type.name for t in reader.tensors})),
    )


def load_gguf_tokenizer(path: Path) -> Any:
    """The ``tokenizers.Tokenizer`` transformers builds from the GGUF metadata (what ``tokenizer.json``
    of the exported directory holds). Raises GgufError when the file has no usable tokenizer."""
    path = Path(path)
    info = read_gguf_info(path)
    if info.vocab_tokens == 0:
        raise GgufError(f"{path}: the GGUF metadata holds no tokenizer (tokenizer.ggml.tokens)")
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        backend = tok.backend_tokenizer
    except Exception as exc:
        raise GgufError(
            f"{path}: transformers cannot build a tokenizer from the GGUF metadata (tokenizer "
            f"{info.tokenizer_model!r}; {type(exc).__name__}: {exc})"
        ) from None
    # tokenizer.json is used as is at serve time: a length limit carried over from transformers'
    # model_max_length would cut long documents silently
    backend.no_truncation()
    backend.no_padding()
    return backend


def load_gguf_model(path: Path, dtype: Any, attn_implementation: str) -> tuple[Any, Any]:
    """(model, config): the GGUF dequantized to ``dtype`` (a torch dtype) by transformers, in eval
    mode. Raises GgufError naming the file, the architecture and transformers' reason."""
    path = Path(path)
    info = read_gguf_info(path)
    log.info(
        "GGUF %s: %s (%s), tensors %s, context %s",
        path.name,
        info.name or "?",
        info.architecture,
        ",".join(info.tensor_types),
        info.context_length,
    )
    try:
        from transformers import AutoConfig, AutoModelForCausalLM

        kw: dict[str, Any] = {"gguf_file": path.name}
        config = AutoConfig.from_pretrained(str(path.parent), **kw)
        model = AutoModelForCausalLM.from_pretrained(
            str(path.parent), config=config, dtype=dtype, attn_implementation=attn_implementation, **kw
        )
    except Exception as exc:
        raise GgufError(
            f"{path}: transformers cannot load this GGUF (architecture {info.architecture!r}; "
            f"{type(exc).__name__}: {exc})"
        ) from None
    model.eval()
    return model, config


__all__ = [
    "GGUF_SUFFIX",
    "GgufError",
    "GgufInfo",
    "find_gguf",
    "load_gguf_model",
    "load_gguf_tokenizer",
    "read_gguf_info",
]
