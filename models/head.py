"""A reduced LM head for a draft model: the graph scores only the tokens code is written in.

The vocabulary projection is a large share of a small draft's step: Qwen2.5-Coder 0.5B multiplies its
896-wide hidden state by a [896, 151936] head, about a quarter of its weights. Most of those tokens
are ASCII text (the rest are other scripts, emoji, partial UTF-8 bytes and unused rows), and code is
written almost entirely in them. ``specls export --draft-head ascii`` keeps only them (plus every
added token: FIM markers, end-of-text): a bit faster per draft step, for the same argmax on code
(scattering the row back into the vocabulary costs little).

A draft with such a head simply cannot propose the other tokens; every proposal is still verified by
the target, so the output stays exactly the target's greedy output. Never give a target one: its
greedy output would be restricted too.

The graph's logits are [batch, new, len(ids)]; ``specls.json`` names the .npy file of the ids
(``ModelSpec.head_ids_file``) and the runtime scatters each row into the vocabulary (``scatter_head``),
every other token getting ``HEAD_FILL``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from specls.models.spec import ModelLoadError, ModelSpec
from specls.models.tokenizer import Tokenizer

HEAD_IDS_FILE = "head_ids.npy"
DRAFT_HEADS = ("full", "ascii")
# the logit of a token a reduced head does not cover: finite, so log-softmax, KL and top-2 margins stay
# finite (-inf - -inf is NaN), and far below any real logit, so it is never an argmax
HEAD_FILL = float(np.finfo(np.float32).min)


def ascii_token_ids(tokenizer: Tokenizer, vocab_size: int, keep: Sequence[int] = ()) -> np.ndarray:
    """The ids a ``--draft-head ascii`` keeps: every token whose text alone is non-empty ASCII, every
    added token, and ``keep`` (the end-of-sequence ids); sorted, all below ``vocab_size``.

    Example: tokens "a"=0, "é"=1, "\\n"=2, added "<eos>"=3, model vocab 5 (row 4 has no token) ->
    [0, 2, 3]  # Not [0, 1, 2, 3, 4]: "é" is not ASCII and row 4 is no token at all
    """
    hf = tokenizer.hf
    n = min(vocab_size, tokenizer.vocab_size)
    texts = hf.decode_batch([[i] for i in range(n)], skip_special_tokens=False)
    ids = {i for i, t in enumerate(texts) if t and t.isascii()}
    ids |= {i for i in hf.get_added_tokens_decoder() if i < vocab_size}
    ids |= {i for i in keep if 0 <= i < vocab_size}
    return np.array(sorted(ids), dtype=np.int64)


def slice_head(model: Any, text_config: Any, ids: np.ndarray) -> None:
    """Replace a transformers causal LM's output projection by its rows ``ids`` (untied from the input
    embedding, which keeps the whole vocabulary, in its config and ``text_config``, the decoder's):
    its logits become [..., len(ids)]."""
    import torch

    head = model.get_output_embeddings()  # nn.Linear: weight [vocab, hidden]
    index = torch.from_numpy(ids)
    new = torch.nn.Linear(
        head.in_features, int(ids.size), bias=head.bias is not None, dtype=head.weight.dtype
    )
    with torch.no_grad():
        new.weight.copy_(head.weight[index])
        if head.bias is not None:
            new.bias.copy_(head.bias[index])
    model.config.tie_word_embeddings = False
    text_config.tie_word_embeddings = False
    model.set_output_embeddings(new)


def load_head_ids(model_dir: Path, spec: ModelSpec) -> np.ndarray | None:
    """A reduced head's token ids ([head] int64, strictly increasing, below ``spec.vocab_size``), or
    None for a full head; raises ModelLoadError naming the file when it is unreadable or malformed."""
    if spec.head_ids_file is None:
        return None
    path = Path(model_dir) / spec.head_ids_file
    try:
        ids = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise ModelLoadError(f"{path}: unreadable head ids ({exc})") from None
    if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise ModelLoadError(
            f"{path}: head ids must be a non-empty 1-D integer array, got {ids.dtype} {ids.shape}"
        )
    ids = ids.astype(np.int64)
    if ids[0] < 0 or ids[-1] >= spec.vocab_size or bool(np.any(np.diff(ids) <= 0)):
        raise ModelLoadError(
            f"{path}: head ids must be strictly increasing token ids below vocab_size {spec.vocab_size}"
        )
    return ids


def scatter_head(logits: np.ndarray, ids: np.ndarray | None, vocab_size: int) -> np.ndarray:
    """A graph's logits [n, head] as float32 logits over the vocabulary [n, vocab]: column j goes to
    token ``ids[j]``, every other token gets HEAD_FILL; ``ids`` None: the head is the vocabulary.

    Example: logits [[1.0, 2.0]], ids [0, 2], vocab 3 -> [[1.0, HEAD_FILL, 2.0]]
    """
    if ids is None:
        return logits if logits.dtype == np.float32 else logits.astype(np.float32)
    out = np.full((logits.shape[0], vocab_size), HEAD_FILL, dtype=np.float32)  # [n, vocab]
    out[:, ids] = logits
    return out
