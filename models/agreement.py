"""Does a quantized graph still compute its model? A max-|diff| tolerance means nothing at 4 bits, so
a candidate graph is compared with its reference (the unquantized export) on held-out code: how often
their greedy tokens agree (what speculative decoding and the user see), the mean KL divergence of the
candidate's next-token distribution from the reference's, and the mean |Δlogit|.

Held-out code: the stdlib test files (``models.data.split_corpus().heldout``), cut into windows by
``models.evaluate.heldout_windows``; every position of a window after the first is scored with the
window's earlier tokens as context. For a model with a FIM template, half of the positions come from
fill-in-the-middle prompts built from the same files (``fim_windows``), scored on their own too and
held to the same floor. Known blind spot: this is teacher-forced scoring. A graph can score as
well as another here and still flip a greedy completion the reference got right (a 4-bit LM head
turned one FIM completion into ``<|fim_pad|>``, docs/quantization.md); a check on generated text
would be needed to see such flips (not built).
"""

from __future__ import annotations

import logging
import random
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from specls.models import data as D
from specls.models.evaluate import EvalOptions, LogitsFn, heldout_windows
from specls.models.fim import FimTemplate, fim_prompt_text
from specls.models.head import load_head_ids, scatter_head
from specls.models.spec import LOGITS_TO_KEEP, ModelSpec

from specls.memory import release_freed_memory

if TYPE_CHECKING:
    from specls.decoder.api import CausalLM
    from specls.models.runtime import RuntimeSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgreementOptions:
    positions: int = 2048  # scored positions: enough to tell top-1 agreement to about a point
    window: int = 256  # tokens per window: long enough for real context, short enough for 2 cores
    seed: int = 0
    threads: int = 2
    corpus_root: Path | None = None  # None = the running interpreter's stdlib
    # The floor: an export whose top-1 agreement with its reference (plain code or FIM prompts, the
    # lower) falls below it fails. It sits below what real quantized models score, with a margin,
    # and above tiny random models (flat distributions) and broken graphs (zeroed scales): it fails
    # what is broken rather than merely lossy (the scores: docs/quantization.md); raise it
    # (--agreement-floor) for larger models.
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


def agreement_windows(
    tokenize: Callable[[str], list[int]], options: AgreementOptions, fim: FimTemplate | None = None
) -> Iterator[tuple[bool, list[int]]]:
    """(is a FIM prompt, input ids) of each window ``measure_agreement`` scores, in its order: the
    plain held-out windows, then (with ``fim``) the FIM prompts; every input position is scored."""
    fim_n = options.positions // 2 if fim is not None else 0
    eval_opts = EvalOptions(
        target=Path(),
        draft=Path(),
        tokens=options.positions - fim_n,
        window=options.window,
        seed=options.seed,
        corpus_root=options.corpus_root,
    )
    for _, ids, k in heldout_windows(tokenize, eval_opts):
        yield False, ids[:k]
    if fim is not None:
        for ids, k in fim_windows(tokenize, fim, options, fim_n):
            yield True, ids[:k]


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
    t0 = time.perf_counter()
    n = windows = agree = fim_pos = fim_agree = 0
    kl = absd = 0.0
    for is_fim, inputs in agreement_windows(tokenize, options, fim):
        k = len(inputs)
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


class StoredLogits:
    """The logits of a reference, computed ahead for a known list of windows and replayed in that
    order as a ``LogitsFn``: what lets the agreement check free the reference graph (the fp32 one,
    the largest thing an export holds) before the candidate loads. With ``spill_dir`` each window's
    float32 logits go to a ``.npy`` file there (positions x vocabulary floats: too many to keep in
    memory at a large vocabulary), read back one window at a time; without it they stay in memory. Exact: the replayed arrays are
    the reference's, so the figures are those of scoring both side by side."""

    def __init__(
        self,
        reference: LogitsFn,
        windows: Sequence[Sequence[int]],
        spill_dir: Path | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        self._windows = [list(w) for w in windows]
        self._held: list[np.ndarray | Path] = []
        done = 0
        for i, ids in enumerate(self._windows):
            logits = np.asarray(reference(ids), dtype=np.float32)
            if spill_dir is not None:
                path = spill_dir / f"reference-{i:05d}.npy"
                np.save(path, logits, allow_pickle=False)
                self._held.append(path)
            else:
                self._held.append(logits)
            done += len(ids)
            if progress is not None:
                progress(done)
        self._next = 0

    def __call__(self, ids: Sequence[int]) -> np.ndarray:
        i = self._next
        if i >= len(self._windows) or list(ids) != self._windows[i]:
            raise ValueError(f"stored reference logits replayed out of order (call {i})")
        self._next += 1
        held = self._held[i]
        self._held[i] = np.empty((0, 0), dtype=np.float32)  # each window is read once
        return np.load(held, allow_pickle=False) if isinstance(held, Path) else held


def sequence_logits(lm: CausalLM) -> LogitsFn:
    """ids -> logits [n, vocab] float32 of a fresh sequence (a new KV cache per call) of a loaded model."""

    def fn(ids: Sequence[int]) -> np.ndarray:
        return np.asarray(lm.new_cache().forward(list(ids)), dtype=np.float32)  # [n, vocab]

    return fn


def graph_logits(graph: Path, spec: ModelSpec, threads: int, prepacking: bool = True) -> LogitsFn:
    """ids -> logits [n, vocab] of a fresh sequence through ONNX Runtime on one graph file described by
    ``spec`` (no ``specls.json`` needed: the reference graph of an export before it is finished; a
    reduced head's ids file must lie next to the graph, see ``models.head``). ``prepacking`` False:
    the session reads constant weights in place (a low-memory export's mapped external data)."""
    import onnxruntime as ort
    from specls.models import runtime

    head_ids = load_head_ids(graph.parent, spec)
    so = runtime.session_options(runtime.RuntimeSettings(threads=threads))  # what serving runs with
    if not prepacking:
        so.add_session_config_entry(runtime.NO_PREPACKING, "1")
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
        (logits,) = sess.run([spec.logits_name], feed)  # [1, n, head]
        return scatter_head(np.asarray(logits[0]), head_ids, spec.vocab_size)  # [n, vocab]

    return fn


@dataclass(frozen=True)
class ReferenceGraph:
    """An unquantized graph file and its spec (the reference of an export, before ``specls.json`` is
    written): ``agreement_of_dirs`` loads it only while it computes the reference logits."""

    graph: Path
    spec: ModelSpec


def agreement_of_dirs(
    reference: LogitsFn | Path | ReferenceGraph,
    candidate_dir: Path,
    options: AgreementOptions = AgreementOptions(),
    progress: Callable[[str, int], None] | None = None,
    spill_dir: Path | None = None,
) -> AgreementResult:
    """``measure_agreement`` of the exported model dir ``candidate_dir``, loaded by the runtime (so
    the dir must load), against ``reference``: a model dir, a ``ReferenceGraph`` or a logits function.
    Text is tokenized with the candidate's tokenizer.

    A model dir or ``ReferenceGraph`` is loaded first, alone: its logits for every window are kept
    (``StoredLogits``, in a temporary dir under ``spill_dir`` when given) and it is freed before the
    candidate loads, so the two graphs are never in memory together (side by side, they were an
    export's peak). A logits function is the
    caller's to keep: it is run side by side with the candidate. ``progress`` gets ("reference", n)
    while the reference's logits are computed and ("candidate", n) while the candidate is scored,
    n the positions done in that pass."""
    from specls.models.runtime import OnnxCausalLM, RuntimeSettings
    from specls.models.spec import load_spec
    from specls.models.tokenizer import Tokenizer

    settings = RuntimeSettings(threads=options.threads, provider="cpu")
    cand_spec = load_spec(candidate_dir)
    tokenizer = Tokenizer.from_file(candidate_dir / cand_spec.tokenizer_file)
    fim = cand_spec.fim

    def report(phase: str) -> Callable[[int], None] | None:
        return None if progress is None else (lambda n: progress(phase, n))

    t0 = time.perf_counter()
    spilling = (
        tempfile.TemporaryDirectory(dir=spill_dir, prefix=".agreement-")
        if spill_dir is not None
        else nullcontext(None)
    )
    with spilling as tmp:
        if isinstance(reference, (Path, ReferenceGraph)):
            ref_fn = _load_reference(reference, settings)
            windows = [ids for _, ids in agreement_windows(tokenizer.encode, options, fim)]
            spill = Path(tmp) if tmp is not None else None
            reference = StoredLogits(ref_fn, windows, spill, report("reference"))
            ref_s = time.perf_counter() - t0
            del ref_fn  # the reference session goes before the candidate loads
            release_freed_memory(collect=True)  # the dropped reference session
            log.info("agreement: reference logits of %d windows in %.1f s", len(windows), ref_s)
        cand = sequence_logits(OnnxCausalLM(candidate_dir, settings))
        result = measure_agreement(reference, cand, tokenizer.encode, options, report("candidate"), fim)
    return replace(result, wall_s=time.perf_counter() - t0)  # both passes


def _load_reference(reference: Path | ReferenceGraph, settings: RuntimeSettings) -> LogitsFn:
    """The logits function of a reference model dir or graph file (its session lives in the closure)."""
    if isinstance(reference, ReferenceGraph):
        return graph_logits(reference.graph, reference.spec, settings.threads)
    from specls.models.runtime import OnnxCausalLM

    return sequence_logits(OnnxCausalLM(reference, settings))


__all__ = [
    "AgreementOptions",
    "AgreementResult",
    "ReferenceGraph",
    "StoredLogits",
    "agreement_of_dirs",
    "agreement_windows",
    "compare_logits",
    "measure_agreement",
    "graph_logits",
    "sequence_logits",
]
