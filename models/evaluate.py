"""Held-out evaluation of the bundled pair: next-token top-1 accuracy of target and draft, and how often
the draft's greedy token equals the target's (the quantity that drives speculative acceptance).

Held-out text: the stdlib test files (``data.split_corpus().heldout``), never seen in training. Files are
shuffled with ``seed``; each file is tokenized as a plain document (``{text}<|endoftext|>``) and cut into
non-overlapping windows of ``window`` tokens; every position after the first in a window is scored (with
the window's earlier tokens as context) until ``tokens`` positions are scored.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from specls.models import data as D

log = logging.getLogger(__name__)

Backend = Literal["onnx", "torch"]
# ids: [n] -> logits: [n, vocab]
LogitsFn = Callable[[Sequence[int]], np.ndarray]


@dataclass(frozen=True)
class EvalOptions:
    target: Path  # bundled ONNX dir (backend "onnx") or HF checkpoint dir (backend "torch")
    draft: Path
    tokens: int = 100_000  # scored positions
    window: int = 512
    seed: int = 0
    backend: Backend = "onnx"
    threads: int = 2
    corpus_root: Path | None = None  # None = the running interpreter's stdlib


@dataclass(frozen=True)
class EvalResult:
    backend: str
    positions: int
    files: int
    windows: int
    target_top1: float
    draft_top1: float
    agreement: float  # argmax draft == argmax target
    target_nll: float  # mean negative log-likelihood (nats/token)
    draft_nll: float
    wall_s: float

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def heldout_windows(
    tokenize: Callable[[str], list[int]], options: EvalOptions
) -> Iterator[tuple[str, list[int], int]]:
    """(file, window ids, positions to score in it) until ``options.tokens`` positions are scored."""
    split = D.split_corpus(options.corpus_root)
    files = list(split.heldout)
    random.Random(options.seed).shuffle(files)
    left = options.tokens
    for rel, text in D.iter_documents(files, split.root):
        ids = tokenize(text + D.EOT)
        for start in range(0, len(ids) - 1, options.window):
            win = ids[start : start + options.window]
            if len(win) < 2:
                continue
            n = min(len(win) - 1, left)
            yield rel, win[: n + 1], n
            left -= n
            if left <= 0:
                return


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    m = logits.max(axis=-1, keepdims=True)
    z = logits - m
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def score(
    target: LogitsFn,
    draft: LogitsFn,
    windows: Iterator[tuple[list[int], int]],
) -> dict[str, float]:
    """Accumulate the metrics over ``windows``."""
    n = hit_t = hit_d = agree = 0
    nll_t = nll_d = 0.0
    n_windows = 0
    for ids, k in windows:
        inputs = ids[:-1][:k]
        gold = np.asarray(ids[1 : k + 1])
        lt = target(inputs)  # [k, vocab]
        ld = draft(inputs)  # [k, vocab]
        at, ad = lt.argmax(-1), ld.argmax(-1)
        hit_t += int((at == gold).sum())
        hit_d += int((ad == gold).sum())
        agree += int((at == ad).sum())
        rows = np.arange(k)
        nll_t -= float(_log_softmax(lt.astype(np.float64))[rows, gold].sum())
        nll_d -= float(_log_softmax(ld.astype(np.float64))[rows, gold].sum())
        n += k
        n_windows += 1
    if n == 0:
        return {"positions": 0}
    return {
        "positions": n,
        "windows": n_windows,
        "target_top1": hit_t / n,
        "draft_top1": hit_d / n,
        "agreement": agree / n,
        "target_nll": nll_t / n,
        "draft_nll": nll_d / n,
    }


def _torch_logits(path: Path, threads: int) -> LogitsFn:
    import torch
    from transformers import LlamaForCausalLM

    if not (path / "config.json").is_file():
        raise ValueError(f"{path} is not a Hugging Face checkpoint (no config.json)")
    torch.set_num_threads(threads)
    model = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()

    def fn(ids: Sequence[int]) -> np.ndarray:
        with torch.no_grad():
            x = torch.tensor([list(ids)], dtype=torch.long)  # [1, n]
            return model(input_ids=x).logits[0].float().numpy()  # [n, vocab]

    return fn


def _onnx_logits(path: Path, threads: int) -> LogitsFn:
    from specls.models.runtime import OnnxCausalLM, RuntimeSettings

    lm = OnnxCausalLM(path, RuntimeSettings(threads=threads, provider="cpu"))

    def fn(ids: Sequence[int]) -> np.ndarray:
        cache = lm.new_cache()
        return np.asarray(cache.forward(list(ids)), dtype=np.float32)  # [n, vocab]

    return fn


def evaluate(options: EvalOptions) -> EvalResult:
    from tokenizers import Tokenizer

    tok_file = options.target / "tokenizer.json"
    if not tok_file.is_file():
        raise ValueError(f"no tokenizer.json in {options.target}")
    tok = Tokenizer.from_file(str(tok_file))
    make = _onnx_logits if options.backend == "onnx" else _torch_logits
    target, draft = make(options.target, options.threads), make(options.draft, options.threads)

    def tokenize(text: str) -> list[int]:
        return list(tok.encode(text, add_special_tokens=False).ids)

    t0 = time.perf_counter()
    files_seen: set[str] = set()

    def counted() -> Iterator[tuple[list[int], int]]:
        for rel, ids, n in heldout_windows(tokenize, options):
            files_seen.add(rel)
            yield ids, n

    m = score(target, draft, counted())
    if not m.get("positions"):
        raise ValueError("no held-out positions to score")
    return EvalResult(
        backend=options.backend,
        positions=int(m["positions"]),
        files=len(files_seen),
        windows=int(m["windows"]),
        target_top1=m["target_top1"],
        draft_top1=m["draft_top1"],
        agreement=m["agreement"],
        target_nll=m["target_nll"],
        draft_nll=m["draft_nll"],
        wall_s=time.perf_counter() - t0,
    )
