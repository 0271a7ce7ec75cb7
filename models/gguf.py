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


# tensors of more elements than this are dequantized a block of rows at a time
_CHUNK_ELEMENTS = 1 << 24


def load_gguf_model_mapped(path: Path, scratch: Path, attn_implementation: str) -> tuple[Any, Any, Any]:
    """(model, config, weights): what ``load_gguf_model(path, torch.float32, ...)`` returns, bit for bit,
    without the fp32 weights ever being in memory together. Each GGUF tensor is dequantized (large
    ones a block of rows at a time) and appended to ``scratch`` (a ``WeightFile``); the model is built
    without weights and its parameters become read-only views of the file's memory map. ``weights``
    (the ``WeightFile``) must outlive the model; its pages are dropped by a ``PageEvictor`` over
    ``scratch``'s directory. Raises GgufError as ``load_gguf_model`` does."""
    import torch
    from specls.models.mapped_weights import WeightFile

    path = Path(path)
    info = read_gguf_info(path)
    log.info("GGUF %s: %s (%s), streamed to %s", path.name, info.name or "?", info.architecture, scratch)
    try:
        from accelerate import init_empty_weights
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
        with init_empty_weights(include_buffers=False):  # parameters on "meta", buffers computed
            model = AutoModelForCausalLM.from_config(
                config, attn_implementation=attn_implementation, dtype=torch.float32
            )
        weights = WeightFile(scratch)
        _dequantize_into(path, model, weights)
    except GgufError:
        raise
    except Exception as exc:
        raise GgufError(
            f"{path}: transformers cannot load this GGUF (architecture {info.architecture!r}; "
            f"{type(exc).__name__}: {exc})"
        ) from None
    import warnings

    with warnings.catch_warnings():  # read-only views: nothing writes to an inference model's weights
        warnings.simplefilter("ignore", UserWarning)
        state = {k: torch.from_numpy(v) for k, v in weights.arrays().items()}
        result = model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    missing = [k for k, p in model.state_dict().items() if p.is_meta]
    if missing or result.unexpected_keys:
        raise GgufError(
            f"{path}: the GGUF tensors do not fill the model (missing {missing[:8]}, unexpected "
            f"{list(result.unexpected_keys)[:8]})"
        )
    model.eval()
    return model, config, weights


def _dequantize_into(path: Path, model: Any, weights: Any) -> None:
    """Dequantize every tensor of ``path`` the way transformers' ``load_gguf_checkpoint`` does (same
    name map, same per-architecture processing) into ``weights``, one tensor at a time."""
    from gguf import GGUFReader
    from specls.models.mapped_weights import PageEvictor
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        LlamaTensorProcessor,
        TensorProcessor,
        get_gguf_hf_weights_map,
        load_gguf_checkpoint,
        read_field,
    )

    parsed = load_gguf_checkpoint(str(path), return_tensors=False)
    reader = GGUFReader(str(path))
    arch = read_field(reader, "general.architecture")[0]
    processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=parsed.get("config", {}))
    key_map = get_gguf_hf_weights_map(model, processor)
    # row blocks give the same values as whole tensors where processing leaves the tensor as is
    # (the base processor; Llama's permutes only the Q and K rows)
    rowwise = type(processor) in (TensorProcessor, LlamaTensorProcessor)
    with PageEvictor(arrays=[reader.data]):  # the file's pages, once dequantized
        for tensor in reader.tensors:
            _dequantize_one(tensor, processor, key_map, parsed, weights, rowwise)
    del reader


def _dequantize_one(
    tensor: Any, processor: Any, key_map: dict[str, str], parsed: dict[str, Any], weights: Any, rowwise: bool
) -> None:
    """One GGUF tensor into ``weights`` under its Hugging Face name (skipped when it has none)."""
    import numpy as np
    from gguf import dequantize

    name, data, qtype = tensor.name, tensor.data, tensor.tensor_type
    big = int(tensor.n_elements) > _CHUNK_ELEMENTS and data.ndim == 2
    if big and rowwise and not name.endswith(("attn_q.weight", "attn_k.weight")):
        if name not in key_map:
            return
        rows = int(data.shape[0])
        step = max(1, _CHUNK_ELEMENTS * rows // int(tensor.n_elements))
        shape = (rows, *dequantize(data[:1], qtype).shape[1:])
        chunks = (dequantize(data[i : i + step], qtype) for i in range(0, shape[0], step))
        weights.add(key_map[name], shape, np.dtype(np.float32), chunks)
        return
    result = processor.process(
        weights=dequantize(data, qtype), name=name, tensor_key_mapping=key_map, parsed_parameters=parsed
    )
    if result.name not in key_map:
        return
    w = np.asarray(result.weights)  # the model's parameters are fp32: cast as loading them would
    weights.add(key_map[result.name], w.shape, np.dtype(np.float32), iter([w]))


__all__ = [
    "GGUF_SUFFIX",
    "GgufError",
    "GgufInfo",
    "find_gguf",
    "load_gguf_model",
    "load_gguf_model_mapped",
    "load_gguf_tokenizer",
    "read_gguf_info",
]
