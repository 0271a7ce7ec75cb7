"""Train a feature draft head (``models.feature_head``) for an exported target, on this machine.

Three steps (``specls head train`` runs them; ``--features`` keeps the first one's output):

1. ``extract_features``: the target reads code in chunks (one fresh sequence each); per position it
   keeps the hidden state its vocabulary projection reads (fp16), the token and the target's own
   argmax there (``features.npz``). Needs the graph's hidden output (``models.hidden_output``).
2. ``train_heads``: K chained heads, head k mapping the hidden state at t and the tokens t+1..t+k
   (the one the target commits from t, then the earlier heads' guesses) to the target's argmax at
   t + k: a residual SiLU block whose output goes through the target's own projection rows for a
   reduced vocabulary (frozen, so only the blocks learn). A position counts for head k only where the
   text agrees with the target's argmax at t+1..t+k, so each head learns what a greedy decode would
   see there.
3. ``models.feature_head.write_head_graph``: one ONNX graph (hidden state and token -> the K heads'
   token ids and probabilities), int8 by ONNX Runtime's dynamic quantization, with
   ``feature_head.json``.

Torch is needed for step 2-3 only (the ``export`` extra).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

REPORT_S = 30.0  # collecting takes minutes to hours: a line this often says it is moving


@dataclass(frozen=True)
class FeatureSet:
    """hidden: [N, d] fp16; tokens, argmax: [N] int32; chunk: [N] int32 (positions of one chunk share
    it: a head's label must lie in the same chunk)."""

    hidden: np.ndarray
    tokens: np.ndarray
    argmax: np.ndarray
    chunk: np.ndarray

    def save(self, path: Path) -> None:
        np.savez(path, hidden=self.hidden, tokens=self.tokens, argmax=self.argmax, chunk=self.chunk)

    @classmethod
    def load(cls, path: Path) -> FeatureSet:
        z = np.load(path)
        return cls(z["hidden"], z["tokens"], z["argmax"], z["chunk"])

    @classmethod
    def concat(cls, parts: Sequence[FeatureSet], seed: int = 0) -> FeatureSet:
        """Several corpora's features as one set. Chunks are numbered anew in a seeded random order, so
        the held-out share (the highest-numbered chunks) samples every corpus, not only the last one.

        >>> a = FeatureSet(np.zeros((3, 1)), np.arange(3), np.arange(3), np.array([0, 0, 1]))
        >>> b = FeatureSet(np.ones((2, 1)), np.arange(2), np.arange(2), np.array([0, 0]))
        >>> c = FeatureSet.concat([a, b])
        >>> sorted(set(c.chunk.tolist())), c.tokens.tolist()   # Not chunk 0 twice: b's is its own
        ([0, 1, 2], [0, 1, 2, 0, 1])
        """
        ids, offset = [], 0
        for f in parts:
            ids.append(f.chunk.astype(np.int64) + offset)
            offset += int(f.chunk.max()) + 1 if f.chunk.size else 0
        order = np.random.default_rng(seed).permutation(offset).astype(np.int32)  # old chunk -> new
        return cls(
            np.concatenate([f.hidden for f in parts]),
            np.concatenate([f.tokens for f in parts]),
            np.concatenate([f.argmax for f in parts]),
            order[np.concatenate(ids)],
        )


def extract_features(
    lm: Any,
    texts: Sequence[str],
    encode: Callable[[str], list[int]],
    max_tokens: int,
    chunk: int = 512,
    seed: int = 0,
    report: Callable[[int, float], None] | None = None,
) -> FeatureSet:
    """Run ``lm`` (an ``OnnxCausalLM`` whose graph outputs its hidden state) over ``texts`` (shuffled
    with ``seed``) in fresh ``chunk``-token sequences until ``max_tokens`` positions are kept;
    ``report(positions, per_second)`` every ``REPORT_S`` seconds and once at the end."""
    order = list(range(len(texts)))
    random.Random(seed).shuffle(order)
    hidden: list[np.ndarray] = []
    tokens: list[np.ndarray] = []
    argmax: list[np.ndarray] = []
    chunks: list[np.ndarray] = []
    total, n_chunk, t0 = 0, 0, time.perf_counter()
    reported = t0
    for i in order:
        ids = encode(texts[i])
        for start in range(0, len(ids) - 16, chunk):  # a tail under 16 tokens teaches little
            part = ids[start : start + chunk]
            cache = lm.new_cache()
            logits = cache.forward(part)  # [n, vocab]
            rows = np.stack([cache.hidden_at(p) for p in range(len(part))])  # [n, d]
            hidden.append(rows.astype(np.float16))
            tokens.append(np.asarray(part, dtype=np.int32))
            argmax.append(np.argmax(logits, axis=-1).astype(np.int32))
            chunks.append(np.full(len(part), n_chunk, dtype=np.int32))
            n_chunk += 1
            total += len(part)
            now = time.perf_counter()
            if now - reported >= REPORT_S:
                reported = now
                log.info("features: %d positions (%.0f a second)", total, total / (now - t0))
                if report is not None:
                    report(total, total / (now - t0))
            if total >= max_tokens:
                break
        if total >= max_tokens:
            break
    if report is not None:
        report(total, total / max(1e-9, time.perf_counter() - t0))
    return FeatureSet(
        np.concatenate(hidden), np.concatenate(tokens), np.concatenate(argmax), np.concatenate(chunks)
    )


def head_samples(f: FeatureSet, k: int) -> np.ndarray:
    """Positions t that teach head k (1-based): t + k in t's chunk, and the text at t+1..t+k is what
    the target's greedy argmax at t..t+k-1 would have written, so the hidden state at t is one a greedy
    decode reaches with the next tokens as its own. The label is ``f.argmax[t + k]``.

    >>> f = FeatureSet(np.zeros((5, 1)), np.array([0, 1, 2, 9, 4]), np.array([1, 2, 3, 4, 5]), np.zeros(5))
    >>> head_samples(f, 1).tolist()   # Not [0, 1, 2, 3]: the text at 3 is 9, the argmax at 2 said 3
    [0, 1, 3]
    """
    n = f.tokens.shape[0]
    ok = np.ones(max(0, n - k), dtype=bool)
    for j in range(1, k + 1):
        ok &= f.tokens[j : n - k + j] == f.argmax[j - 1 : n - k + j - 1]
        ok &= f.chunk[j : n - k + j] == f.chunk[: n - k]
    return np.nonzero(ok)[0]


def projection_rows(model_dir: Path, ids: np.ndarray) -> np.ndarray:
    """The target's vocabulary projection for tokens ``ids``: [len(ids), hidden] float32, read from its
    graph (a float MatMul weight [hidden, vocab], or the int8 export's weight with its per-token
    scale). Raises ValueError for a projection stored another way."""
    import onnx
    from onnx import numpy_helper
    from specls.models.spec import load_spec

    spec = load_spec(model_dir)
    model = onnx.load(str(Path(model_dir) / spec.onnx_file))
    inits = {t.name: t for t in model.graph.initializer}
    producer = {out: node for node in model.graph.node for out in node.output}
    scale: np.ndarray | None = None
    node = producer.get(spec.logits_name)
    while node is not None and node.op_type not in ("MatMul", "MatMulInteger", "MatMulIntegerToFloat"):
        for name in node.input:
            t = inits.get(name)
            if node.op_type == "Mul" and t is not None and list(t.dims) == [spec.vocab_size]:
                scale = numpy_helper.to_array(t).astype(np.float32)  # [vocab]: per-token weight scale
        node = next((producer[i] for i in node.input if i in producer), None)
    weight = inits.get(node.input[1]) if node is not None else None
    if weight is None or list(weight.dims)[-1] != spec.vocab_size:
        raise ValueError(f"{model_dir}: vocabulary projection weight not found")
    w = numpy_helper.to_array(weight)[:, ids].astype(np.float32)  # [hidden, len(ids)]
    if node is not None and node.op_type == "MatMulIntegerToFloat":  # its B scale: [vocab]
        scale = numpy_helper.to_array(inits[node.input[3]]).astype(np.float32)
    if node is not None and node.op_type in ("MatMulInteger", "MatMulIntegerToFloat"):
        if scale is None:
            raise ValueError(f"{model_dir}: int8 projection without a per-token scale")
        w *= scale[ids][None, :]
    return np.ascontiguousarray(w.T)  # [len(ids), hidden]


@dataclass(frozen=True)
class HeadTraining:
    """One run's knobs. Defaults: a few heads (each later one is right less often given the earlier
    ones), a vocabulary that covers nearly every token code is written in, a few passes over the
    data, a little weight decay (the heads are large for the positions a CPU collects)."""

    heads: int = 4
    vocab: int = 8192
    epochs: int = 3
    batch: int = 256
    lr: float = 2e-3
    weight_decay: float = 0.01
    holdout: float = 0.1  # the last chunks' share, for the accuracy report
    seed: int = 0


@dataclass
class TrainedHeads:
    ids: np.ndarray  # [vocab] int64: the reduced vocabulary, by frequency
    blocks: list[tuple[np.ndarray, np.ndarray]]  # per head k: weight [(k + 1) * d, d], bias [d]
    rows: np.ndarray  # [vocab, d] the projection rows (frozen; also the token embeddings)
    accuracy: list[float]  # per head, on the held-out chunks, the earlier tokens right
    base_accuracy: list[float]  # the same before training (the projection of h_t itself)
    samples: list[int]  # training positions per head
    coverage: float  # share of labels inside the reduced vocabulary
    train_s: float


def _vocab(f: FeatureSet, size: int) -> np.ndarray:
    counts = np.bincount(f.argmax.astype(np.int64))
    order = np.argsort(-counts, kind="stable")[:size]
    return np.sort(order[counts[order] > 0]).astype(np.int64)


@dataclass
class _HeadData:
    """Head k's positions: the hidden state at t, the tokens t+1..t+k (reduced indices; the vocabulary
    size for a token outside it, a zero embedding) and the label (the argmax at t + k)."""

    at: np.ndarray  # [n]
    tokens: np.ndarray  # [n, k]
    labels: np.ndarray  # [n]
    train: np.ndarray  # [n] bool: not held out


def _head_data(f: FeatureSet, k: int, index: np.ndarray, cut: int) -> _HeadData:
    at = head_samples(f, k)
    labels = index[f.argmax[at + k]]
    at, labels = at[labels >= 0], labels[labels >= 0]
    toks = np.stack([index[f.tokens[at + j]] for j in range(1, k + 1)], axis=1)  # [n, k]
    toks[toks < 0] = index.max() + 1  # the zero row
    return _HeadData(at, toks, labels, f.chunk[at] <= cut)


def train_heads(
    f: FeatureSet,
    rows_of: Callable[[np.ndarray], np.ndarray],
    cfg: HeadTraining,
    report: Callable[[int, float], None] | None = None,
) -> TrainedHeads:
    """Train ``cfg.heads`` chained heads on ``f``; ``rows_of(ids)`` gives the projection rows;
    ``report(k, held-out top-1)`` after head k.

    Head k reads the hidden state at t and the embeddings (the projection rows: tied in the models
    this is for, and a fine start otherwise) of the tokens t+1..t+k: the one the target commits from t,
    then the earlier heads' guesses (when decoding; the true ones here, which is what a guess that
    verifies is). Knowing the tokens in between is what makes a later head right more often."""
    import torch

    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    ids = _vocab(f, cfg.vocab)
    index = np.full(int(max(f.argmax.max(), f.tokens.max())) + 1, -1, dtype=np.int64)
    index[ids] = np.arange(ids.size)
    coverage = float(np.mean(index[f.argmax] >= 0))
    rows = rows_of(ids)
    proj = torch.from_numpy(rows)  # [V, d]
    emb = torch.cat([proj, torch.zeros(1, rows.shape[1])])  # [V + 1, d]: the last row for other tokens
    hidden = torch.from_numpy(f.hidden)  # [N, d] fp16
    cut = int(f.chunk.max() * (1 - cfg.holdout))
    out = TrainedHeads(ids, [], rows, [], [], [], coverage, 0.0)
    for k in range(1, cfg.heads + 1):
        data = _head_data(f, k, index, cut)
        block = torch.nn.Linear((k + 1) * rows.shape[1], rows.shape[1])
        torch.nn.init.zeros_(block.weight)  # starts as the projection of h_t itself
        torch.nn.init.zeros_(block.bias)
        head = _Head(block, proj, emb, hidden)
        test = np.nonzero(~data.train)[0]
        out.base_accuracy.append(head.accuracy(data, test))
        head.fit(data, np.nonzero(data.train)[0], cfg)
        out.accuracy.append(head.accuracy(data, test))
        out.samples.append(int(data.train.sum()))
        out.blocks.append((block.weight.detach().numpy().T.copy(), block.bias.detach().numpy().copy()))
        log.info(
            "head %d: %d samples, held-out top-1 %.3f (untrained %.3f)",
            k,
            out.samples[-1],
            out.accuracy[-1],
            out.base_accuracy[-1],
        )
        if report is not None:
            report(k, out.accuracy[-1])
    out.train_s = time.perf_counter() - t0
    return out


class _Head:
    """One head in training: ``x = h + SiLU(W [h, e(t+1), ..., e(t+k)] + b)``, logits ``x @ rows^T``."""

    def __init__(self, block: Any, proj: Any, emb: Any, hidden: Any) -> None:
        self.block, self.proj, self.emb, self.hidden = block, proj, emb, hidden

    def logits(self, data: _HeadData, rows: np.ndarray) -> Any:
        import torch

        h = self.hidden[torch.from_numpy(data.at[rows])].float()  # [B, d]
        e = self.emb[torch.from_numpy(data.tokens[rows])].flatten(1)  # [B, k * d]
        return (h + torch.nn.functional.silu(self.block(torch.cat([h, e], -1)))) @ self.proj.T  # [B, V]

    def accuracy(self, data: _HeadData, rows: np.ndarray) -> float:
        import torch

        if rows.size == 0:
            return 0.0
        with torch.no_grad():
            hits = sum(
                int((self.logits(data, b).argmax(-1) == torch.from_numpy(data.labels[b])).sum())
                for b in np.array_split(rows, max(1, rows.size // 1024))
            )
        return hits / rows.size

    def fit(self, data: _HeadData, rows: np.ndarray, cfg: HeadTraining) -> None:
        import torch

        opt = torch.optim.AdamW(self.block.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        steps = max(1, cfg.epochs * (rows.size // cfg.batch))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1.0 - s / steps))
        gen = np.random.default_rng(cfg.seed)
        for _ in range(cfg.epochs):
            order = gen.permutation(rows)
            for i in range(0, order.size - cfg.batch + 1, cfg.batch):
                b = order[i : i + cfg.batch]
                y = torch.from_numpy(data.labels[b])
                loss = torch.nn.functional.cross_entropy(self.logits(data, b), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                sched.step()
