"""Does a quantized graph still compute its model? A max-|diff| tolerance means nothing at 4 bits, so
a candidate graph is compared with its reference (the unquantized export) on held-out code: how often
their greedy tokens agree (what speculative decoding and the user see), the mean KL divergence of the
candidate's next-token distribution from the reference's, and the mean |Δlogit|.

Held-out code: the stdlib test files (``models.data.split_corpus().heldout``), cut into windows by
``models.evaluate.heldout_windows``; every position of a window after the first is scored with the
window's earlier tokens as context. For a model with a FIM template, half of the positions come from
fill-in-the-middle prompts built from the same files (``fim_windows``), scored on their own too and
held to the same floor. Known blind spot: this is teacher-forced scoring. A 4-bit LM head on
Qwen2.5-Coder-1.5B scored 90.0% here (FIM 90.0%; the shipped 8-bit head: 90.2% / 90.4%) yet turned
one greedy FIM completion that fp32 got right into ``<|fim_pad|>``; a check on generated text would
be needed to see such flips (not built).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from specls.models import data as D
from specls.models.evaluate import EvalOptions, LogitsFn, heldout_windows
from specls.models.fim import FimTemplate, fim_prompt_text
from specls.models.spec import LOGITS_TO_KEEP, ModelSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgreementOptions:
    positions: int = 2048  # scored positions (the issue asks for >= 2,000: ~1% resolution on top-1)
    window: int = 256  # tokens per window: long enough for real context, short enough for 2 cores
    seed: int = 0
    threads: int = 2
    corpus_root: Path | None = None  # None = the running interpreter's stdlib
    # The floor: an export whose top-1 agreement with its reference (plain code or FIM prompts, the
    # lower) falls below it fails. Measured with int4 (block 32, 8-bit head) on Qwen2.5-Coder: 0.5B
    # 85.8% (FIM 86.6%), 1.5B 91.5%; tiny random models with flat distributions 70-77%, zeroed
    # scales ~0%. 0.80 passes the smallest real model measured with a margin of ~6 points and fails
    # what is broken rather than merely lossy; raise it (--agreement-floor) for larger models.
    min_top1: float = 0.80


@dataclass(frozen=True)
class AgreementResult:
    positions: int
    windows: int
    top1: float  # fraction of positions where argmax(candidate) == argmax(reference)
    mean_kl: float  # mean KL(reference || candidate) in nats
    mean_abs_dlogit: float  # mean over positions and vocabulary of |candidate - reference|
    wall_s: float
    fim_positions: int = 0  # of ``positions``, those in FIM prompts
    fim_top1: float | None = None  # top-1 agreement on those alone

    @property
    def worst_top1(self) -> float:
        """What the floor is checked against: the lower of overall and FIM-only agreement."""
        return min(self.top1, self.fim_top1) if self.fim_top1 is not None else self.top1

    def summary(self) -> str:
        fim = f" (FIM prompts: {100 * self.fim_top1:.1f}%)" if self.fim_top1 is not None else ""
        return (
            f"top-1 agreement {100 * self.top1:.1f}%{fim}, mean KL {self.mean_kl:.4f} nats, "
            f"mean |Δlogit| {self.mean_abs_dlogit:.3f} over {self.positions} held-out positions"
        )


def _log_softmax(x: np.ndarray) -> np.ndarray:
    z = x - x.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def compare_logits(ref: np.ndarray, got: np.ndarray, chunk: int = 64) -> tuple[int, float, float]:
    """For logits ``ref`` and ``got`` of the same positions ([n, vocab]): (positions whose argmax
    agree, sum over positions of KL(softmax(ref) || softmax(got)), sum over positions of the mean
    |got - ref| across the vocabulary). Computed in float64, ``chunk`` rows at a time (a 150k
    vocabulary makes [n, vocab] float64 large).

    Example: ref = [[2, 0], [0, 1]], got = [[2, 0], [1, 0]] -> argmax agree on row 0 only (1);
    KL: row 0 is 0, row 1 is KL([e^-1, 1]/z || [1, e^-1]/z) = (1 - e^-1)/(1 + e^-1) * 1 = 0.462...;
    |Δ|: row 0 mean 0, row 1 mean (1 + 1) / 2 = 1 -> (1, 0.462..., 1.0).
    """
    if ref.shape != got.shape or ref.ndim != 2:
        raise ValueError(f"logits must be the same [n, vocab] shape, got {ref.shape} and {got.shape}")
    agree, kl, absd = 0, 0.0, 0.0
    for s in range(0, ref.shape[0], chunk):
        r = ref[s : s + chunk].astype(np.float64)
        g = got[s : s + chunk].astype(np.float64)
        agree += int((r.argmax(-1) == g.argmax(-1)).sum())
        lr, lg = _log_softmax(r), _log_softmax(g)
        kl += float((np.exp(lr) * (lr - lg)).sum())
        absd += float(np.abs(g - r).mean(axis=-1).sum())
    return agree, kl, absd


def fim_windows(
    tokenize: Callable[[str], list[int]], template: FimTemplate, options: AgreementOptions, positions: int
) -> Iterator[tuple[list[int], int]]:
    """(ids, positions to score) of FIM prompts until ``positions`` are scored: each held-out file's
    first ~3 window-lengths of characters, cut at line ends into prefix (40%), middle (20%) and suffix
    (40%), as ``fim_prompt_text(prefix, suffix) + middle``, at most ``window`` tokens."""
    split = D.split_corpus(options.corpus_root)
    files = list(split.heldout)
    random.Random(options.seed + 1).shuffle(files)  # other files than the plain windows start with
    left = positions
    for _, text in D.iter_documents(files, split.root):
        lines = D.chunk_lines(text, 3 * options.window)[0].splitlines(keepends=True)
        if len(lines) < 5:
            continue
        a, b = (2 * len(lines)) // 5, (3 * len(lines)) // 5
        prompt = fim_prompt_text(template, "".join(lines[:a]), "".join(lines[b:]))
        ids = tokenize(prompt + "".join(lines[a:b]))[: options.window + 1]
        if len(ids) < 2:
            continue
        k = min(len(ids) - 1, left)
        yield ids[: k + 1], k
        left -= k
        if left <= 0:
            return


def measure_agreement(
    reference: LogitsFn,
    candidate: LogitsFn,
    tokenize: Callable[[str], list[int]],
    options: AgreementOptions = AgreementOptions(),
    progress: Callable[[int], None] | None = None,
    fim: FimTemplate | None = None,
) -> AgreementResult:
    """Score ``candidate`` against ``reference`` over ``options.positions`` held-out positions (half
    of them in FIM prompts when ``fim`` is given). ``progress`` gets the number of positions scored so
    far after each window. Raises ValueError when there is no held-out text or a graph returns
    non-finite logits."""
    fim_n = options.positions // 2 if fim is not None else 0
    eval_opts = EvalOptions(
        target=Path(),
        draft=Path(),
        tokens=options.positions - fim_n,
        window=options.window,
        seed=options.seed,
        corpus_root=options.corpus_root,
    )
    plain = ((ids, k) for _, ids, k in heldout_windows(tokenize, eval_opts))
    sources: list[tuple[bool, Iterator[tuple[list[int], int]]]] = [(False, plain)]
    if fim is not None:
        sources.append((True, fim_windows(tokenize, fim, options, fim_n)))
    t0 = time.perf_counter()
    n = windows = agree = fim_pos = fim_agree = 0
    kl = absd = 0.0
    for is_fim, source in sources:
        for ids, k in source:
            inputs = ids[:k]
            r, g = reference(inputs), candidate(inputs)
            if not np.isfinite(g).all():
                raise ValueError(f"the candidate graph returned non-finite logits (window {windows})")
            a, d_kl, d_abs = compare_logits(r, g)
            agree, kl, absd, n, windows = agree + a, kl + d_kl, absd + d_abs, n + k, windows + 1
            if is_fim:
                fim_pos, fim_agree = fim_pos + k, fim_agree + a
            if progress is not None:
                progress(n)
    if n == 0:
        raise ValueError("no held-out positions to score")
    return AgreementResult(
        positions=n,
        windows=windows,
        top1=agree / n,
        mean_kl=kl / n,
        mean_abs_dlogit=absd / n,
        wall_s=time.perf_counter() - t0,
        fim_positions=fim_pos,
        fim_top1=fim_agree / fim_pos if fim_pos else None,
    )


def graph_logits(graph: Path, spec: ModelSpec, threads: int) -> LogitsFn:
    """ids -> logits [n, vocab] of a fresh sequence through ONNX Runtime on one graph file described by
    ``spec`` (no ``specls.json`` needed: the reference graph of an export before it is finished)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = max(0, threads)
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(graph), so, providers=["CPUExecutionProvider"])
    np_dtype = np.float16 if spec.dtype == "fp16" else np.float32
    empty = np.zeros((1, spec.num_kv_heads, 0, spec.head_dim), dtype=np_dtype)
    past = dict.fromkeys((*spec.past_key_names, *spec.past_value_names), empty)

    def fn(ids: Sequence[int]) -> np.ndarray:
        n = len(ids)
        feed: dict[str, np.ndarray] = {
            "input_ids": np.asarray(ids, dtype=np.int64)[None, :],
            "attention_mask": np.ones((1, n), dtype=np.int64),
        }
        if spec.uses_position_ids:
            feed["position_ids"] = np.arange(n, dtype=np.int64)[None, :]
        if spec.keeps_logits:
            feed[LOGITS_TO_KEEP] = np.array([n], dtype=np.int64)  # every position is scored
        feed.update(past)
        (logits,) = sess.run([spec.logits_name], feed)
        return np.asarray(logits[0], dtype=np.float32)  # [n, vocab]

    return fn


def agreement_of_dirs(
    reference: LogitsFn | Path,
    candidate_dir: Path,
    options: AgreementOptions = AgreementOptions(),
    progress: Callable[[int], None] | None = None,
) -> AgreementResult:
    """``measure_agreement`` of the exported model dir ``candidate_dir``, loaded by the runtime (so
    the dir must load), against ``reference``: a model dir or a logits function. Text is tokenized
    with the candidate's tokenizer."""
    from specls.models.runtime import OnnxCausalLM, RuntimeSettings

    settings = RuntimeSettings(threads=options.threads, provider="cpu")
    if isinstance(reference, Path):
        ref_lm = OnnxCausalLM(reference, settings)

        def ref_fn(ids: Sequence[int]) -> np.ndarray:
            return np.asarray(ref_lm.new_cache().forward(list(ids)), dtype=np.float32)

        reference = ref_fn
    lm = OnnxCausalLM(candidate_dir, settings)

    def cand(ids: Sequence[int]) -> np.ndarray:
        return np.asarray(lm.new_cache().forward(list(ids)), dtype=np.float32)  # [n, vocab]

    return measure_agreement(reference, cand, lm.tokenizer.encode, options, progress, lm.spec.fim)


__all__ = [
    "AgreementOptions",
    "AgreementResult",
    "agreement_of_dirs",
    "compare_logits",
    "measure_agreement",
    "graph_logits",
]
