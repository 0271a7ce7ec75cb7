"""ONNX Runtime execution of an exported model (see ``specls.models.spec`` for the graph contract).

``OnnxCausalLM`` is the ``CausalLM`` of specls.decoder: one InferenceSession shared by every sequence;
``OrtKVCache`` is one sequence's KV cache.

Even passes (``RuntimeSettings.even_passes``, on for a target): a pass over an odd number of tokens
runs with one pad token after them, whose logits are dropped and whose KV position is dropped before
the next pass (or by the decode loop's truncate). ORT's CPU kernels compute rows in pairs and a lone
row another way, so without it a verify pass and plain greedy's one-token passes differ in the last
bits, which int8 activation rounding grows to tenths of a logit. With it a position's logits are a
function of its tokens alone, bitwise, however they were split into passes.

CPU, in place (``SharedKVCache``, for graphs marked ``shared_kv_buffer``: specls' fused exports): per
past input one numpy buffer with spare capacity, bound through IOBinding as both the past and the
present, so ORT's attention writes the new positions into it and no KV is copied by a pass, a
``truncate`` or a pad drop (they move the length). Other CPU graphs (``OrtKVCache``): past KV lives
as numpy arrays; each forward feeds them and keeps the graph's ``present`` outputs (already past+new
long, a copy ORT makes) as the next past; ``truncate`` is a slice on the sequence axis.

CUDA (``BoundKVCache``): past KV stays on the device as OrtValues bound through IOBinding; only
ids/mask/positions go up and logits come down. ``truncate`` runs a tiny Slice graph on the device
(``_DeviceOps``, no host round trip); ``forward_greedy`` (the decode loop's greedy verify passes)
takes the argmax there too, so only n ids come down instead of [n, vocab] logits.

Batched passes (``OnnxCausalLM.forward_batch``): several caches advance in one ORT run of the model's
dynamic-batch graph (``ModelSpec.batch_onnx_file``, or the main graph when its batch axis is dynamic).
Pasts are left-padded to the longest, new tokens right-padded to the most; the attention mask hides
both paddings and position ids are per sequence, so each sequence's logits and KV equal its own single
pass up to float rounding. Host caches keep views of their real positions (one contiguous range thanks
to the left padding) in the batch's presents; device caches are stacked and split back by small
gather/split graphs on the device, so their KV never visits the host.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from specls.decoder.api import CausalLM, KVCache, PassInterrupted
from specls.models.head import load_head_ids, scatter_head
from specls.models.spec import LOGITS_TO_KEEP, GraphIO, ModelLoadError, ModelSpec, check_graph_io, load_spec
from specls.models.tokenizer import Tokenizer

from specls.memory import release_freed_memory

log = logging.getLogger(__name__)

# what ONNX Runtime's error says when a run stopped at its run options' terminate flag
TERMINATED = "terminate flag"


def _run_options() -> Any:
    import onnxruntime as ort

    return ort.RunOptions()


PROVIDERS = ("auto", "cpu", "cuda")
# the session option that keeps constant MatMul weights where they are (a mapped external data file)
# instead of copying them into packed buffers in memory: a low-memory export's checks use it
NO_PREPACKING = "session.disable_prepacking"


@dataclass(frozen=True)
class RuntimeSettings:
    threads: int = 1  # intra-op threads; 0 = ONNX Runtime's default (one per physical core)
    provider: str = "auto"  # "auto" (CUDA when usable) | "cpu" | "cuda"
    # Intra-op worker threads spin between the ops of a pass instead of sleeping, and stop at the end
    # of each run (session.force_spinning_stop), so an idle server, or a draft model's session while
    # the target's runs, has no thread spinning. A bit faster: a pass no longer waits for sleeping
    # threads to wake between its ops (at 1 thread there are no worker threads: no difference).
    spinning: bool = True
    # Pad every odd pass with one row whose logits and KV are dropped. ORT's CPU kernels compute a
    # lone row differently from rows that come in pairs: MatMulNBits at accuracy_level 4 runs the last
    # row of an odd pass through its one-row kernel, and GroupQueryAttention has a one-token path
    # (int8's integer product rows are independent, but that path alone moves an int8 graph's logits
    # through the next layers' int8 rounding).
    # With even passes each position's logits are bitwise the same however its tokens were split
    # into passes, so a verify pass computes what plain greedy computes (docs/quantization.md). It
    # makes a one-token pass dearer; a draft model turns it off (its numbers only move acceptance,
    # never the output).
    even_passes: bool = True


def auto_threads(cpus: int | None = None) -> int:
    """The intra-op threads that ``threads = 0`` ("auto") means in the engine: the CPUs this process
    may run on less one, at least 1 and at most 4. ``cpus``: that CPU count (default: the process's
    affinity mask, which a container or ``taskset`` narrows; ``os.cpu_count()`` where there is none).

    One CPU is left to the editor and its other language servers, which work on every keystroke too.
    A pass waits for its slowest thread: a thread sharing its core with a busy process makes every
    pass slower than one thread fewer would (docs/performance.md). Where nothing else runs, one
    thread per core is the faster choice. The cap: a decoding pass is bound by memory bandwidth,
    which a few cores already use up.

    >>> [auto_threads(n) for n in (1, 2, 3, 4, 8, 64)]   # Not 2 at 2: one CPU stays free
    [1, 1, 2, 3, 4, 4]
    """
    if cpus is None:
        import os

        try:
            cpus = len(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            cpus = os.cpu_count() or 1
    return max(1, min(4, cpus - 1))


def session_options(settings: RuntimeSettings) -> Any:
    """ONNX Runtime session options for ``settings`` (threads, spinning), for every session we create."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.intra_op_num_threads = max(0, settings.threads)
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if settings.spinning else "0")
    so.add_session_config_entry("session.force_spinning_stop", "1" if settings.spinning else "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    so.log_severity_level = 3  # errors only: ORT's own warnings are noise for users
    return so


def _create_session(onnx_path: Path, settings: RuntimeSettings) -> tuple[Any, str]:
    """(session, "cpu"|"cuda"). CUDA when asked for (or auto) and the session really got it."""
    import onnxruntime as ort

    if settings.provider not in PROVIDERS:
        raise ModelLoadError(f"provider must be one of {PROVIDERS}, not {settings.provider!r}")
    so = session_options(settings)
    want_cuda = settings.provider in ("auto", "cuda")
    have_cuda = "CUDAExecutionProvider" in ort.get_available_providers()
    if settings.provider == "cuda" and not have_cuda:
        raise ModelLoadError(
            "provider 'cuda' requested but onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu)"
        )
    if want_cuda and have_cuda:
        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    else:
        providers = ["CPUExecutionProvider"]
    try:
        sess = ort.InferenceSession(str(onnx_path), so, providers=providers)
    except Exception as exc:  # ORT raises its own Fail/InvalidProtobuf/...: report the file
        raise ModelLoadError(f"{onnx_path}: cannot be loaded by onnxruntime ({exc})") from None
    release_freed_memory()
    # ORT silently falls back to CPU when the CUDA libraries are missing: check what we got.
    got = "cuda" if sess.get_providers()[0] == "CUDAExecutionProvider" else "cpu"
    if settings.provider == "cuda" and got != "cuda":
        raise ModelLoadError(f"{onnx_path}: CUDA requested but onnxruntime could not use it (see ORT logs)")
    return sess, got


@dataclass
class _BatchInputs:
    """A batched pass's host inputs: pasts left-padded to ``p_max``, new tokens right-padded to
    ``s_max``; the mask hides both paddings and positions are per sequence."""

    lens: list[int]  # cached positions per sequence
    arrs: list[np.ndarray]  # new ids per sequence, each [n_i]
    even: bool  # pad the new tokens to an even count (RuntimeSettings.even_passes)

    def __post_init__(self) -> None:
        self.news = [a.size for a in self.arrs]
        self.p_max, s_max = max(self.lens), max(self.news)
        s_max += int(self.even and s_max % 2 == 1)
        b = len(self.lens)
        self.input_ids = np.zeros((b, s_max), dtype=np.int64)  # [b, s]; padding: token 0, masked out
        self.mask = np.zeros((b, self.p_max + s_max), dtype=np.int64)  # [b, p_max + s]
        self.positions = np.zeros((b, s_max), dtype=np.int64)  # [b, s]
        for j, (p, arr) in enumerate(zip(self.lens, self.arrs, strict=True)):
            n = arr.size
            self.input_ids[j, :n] = arr
            self.mask[j, self.p_max - p : self.p_max + n] = 1  # the real past ends where the new tokens start
            self.positions[j] = np.arange(p, p + s_max)


class OnnxCausalLM(CausalLM):
    """A loaded exported model: ``new_cache()`` opens one sequence's cache."""

    def __init__(self, model_dir: str | Path, settings: RuntimeSettings = RuntimeSettings()) -> None:
        t0 = time.perf_counter()
        self.model_dir = Path(model_dir)
        self.settings = settings
        self.spec: ModelSpec = load_spec(self.model_dir)
        tok_path = self.model_dir / self.spec.tokenizer_file
        try:
            self.tokenizer = Tokenizer.from_file(tok_path)
        except Exception as exc:
            raise ModelLoadError(f"{tok_path}: unreadable tokenizer ({exc})") from None
        if self.tokenizer.vocab_size > self.spec.vocab_size:
            raise ModelLoadError(
                f"{tok_path}: tokenizer has {self.tokenizer.vocab_size} tokens but the model's "
                f"vocab_size is {self.spec.vocab_size}"
            )
        # a reduced LM head's token ids ([head]; None: the graph's logits cover the whole vocabulary)
        self.head_ids: np.ndarray | None = load_head_ids(self.model_dir, self.spec)
        onnx_path = self.model_dir / self.spec.onnx_file
        self.session, self.provider = _create_session(onnx_path, settings)
        check_graph_io(
            self.spec,
            onnx_path,
            [GraphIO(i.name, i.type, tuple(i.shape)) for i in self.session.get_inputs()],
            [GraphIO(o.name, o.type, tuple(o.shape)) for o in self.session.get_outputs()],
            self.logits_width if self.head_ids is not None else None,
        )
        self.kv_dtype = np.float16 if self.spec.dtype == "fp16" else np.float32
        # graph I/O order for the flat past/present lists: k0, v0, k1, v1, ...
        self.past_names: list[str] = [
            n for kv in zip(self.spec.past_key_names, self.spec.past_value_names, strict=True) for n in kv
        ]
        self.present_names: list[str] = [
            n
            for kv in zip(self.spec.present_key_names, self.spec.present_value_names, strict=True)
            for n in kv
        ]
        self.output_names: list[str] = [self.spec.logits_name, *self.present_names]
        # the hidden state the vocabulary projection reads, fetched after the presents (a feature
        # draft head's input; ``models.hidden_output``)
        if self.spec.hidden_name is not None:
            self.output_names.append(self.spec.hidden_name)
        # the single-sequence passes' run options: ``interrupt`` sets their terminate flag, which
        # stops a pass in flight between two of its operators (batched passes are not interrupted)
        self.run_options: Any = _run_options()
        self._device_ops: dict[str, _DeviceOps] = {}
        self._batch_session: Any = None
        self._batch_lock = threading.Lock()
        if self.provider == "cuda" and self.spec.dtype == "fp32":
            log.warning(
                "%s is an fp32 graph on CUDA: ONNX Runtime's fused CUDA attention needs fp16 "
                "(re-export with `specls export --dtype fp16`)",
                self.model_dir,
            )
        log.info(
            "loaded %s (%s, %d layers, vocab %d, head %d, %s) on %s in %.0f ms",
            self.model_dir,
            self.spec.model_type,
            self.spec.num_layers,
            self.spec.vocab_size,
            self.logits_width,
            self.spec.dtype,
            self.provider,
            1000 * (time.perf_counter() - t0),
        )

    def interrupt(self) -> None:
        """Stop the single-sequence verify pass in flight (from another thread): it raises
        ``PassInterrupted`` within about an operator, the cache as before it; with none in flight,
        the next one does (and its decode runs it again when not cancelled). Prefill runs are not
        stopped: the KV they compute is what the next request's prompt shares."""
        self.run_options.terminate = True

    def run_pass(self, run: Callable[[Any], Any], interruptible: bool = True) -> Any:
        """``run(run_options)``: one single-sequence pass; an interrupted one raises
        ``PassInterrupted`` (the flag cleared for the next pass). Not ``interruptible``: run without
        the run options."""
        if not interruptible:
            return run(None)
        try:
            return run(self.run_options)
        except Exception as exc:
            if TERMINATED not in str(exc):
                raise
            self.run_options.terminate = False
            raise PassInterrupted(str(exc)) from None

    @property
    def vocab_size(self) -> int:
        return self.spec.vocab_size

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.spec.eos_token_ids

    @property
    def logits_width(self) -> int:
        """The graph's logits width: the vocabulary, or the ids of a reduced head."""
        return self.spec.vocab_size if self.head_ids is None else int(self.head_ids.size)

    def to_vocab(self, logits: np.ndarray) -> np.ndarray:
        """The graph's logits [n, width] as float32 logits over the vocabulary [n, vocab]: a reduced
        head's columns are scattered to their token ids (``models.head``)."""
        return scatter_head(logits, self.head_ids, self.spec.vocab_size)

    def to_token_ids(self, idx: np.ndarray) -> np.ndarray:
        """Positions in the graph's logits ([n] int64, e.g. their argmax) as token ids."""
        return idx if self.head_ids is None else self.head_ids[idx]

    @property
    def pass_granularity(self) -> int:
        return 2 if self.settings.even_passes else 1

    def new_cache(self) -> OrtKVCache:
        if self.provider == "cuda":
            return BoundKVCache(self, "cuda")
        return SharedKVCache(self) if self.spec.shared_kv_buffer else OrtKVCache(self)

    def warmup(self) -> None:
        """One tiny forward so the first real request does not pay ORT's lazy initialisation."""
        self.new_cache().forward([0, 0])

    def release_memory(self) -> None:
        """Return freed C-heap memory to the OS (after a burst of concurrent batched requests glibc's
        per-thread heaps keep hundreds of MB of freed KV and activations)."""
        release_freed_memory()

    def batch_graph(self) -> Path | None:
        """The graph that can run a pass over several sequences, or None (see the module docstring)."""
        if self.spec.batch_onnx_file is not None:
            return self.model_dir / self.spec.batch_onnx_file
        batch_dim = self.session.get_inputs()[0].shape[0]
        return None if isinstance(batch_dim, int) else self.model_dir / self.spec.onnx_file

    def enable_batching(self) -> bool:
        """Load the batch graph (once; the main graph is reused when it can batch). False when the
        model cannot batch; a broken batch graph raises ModelLoadError."""
        path = self.batch_graph()
        if path is None:
            return False
        with self._batch_lock:
            if self._batch_session is None:
                if path == self.model_dir / self.spec.onnx_file:
                    self._batch_session = self.session
                else:
                    t0 = time.perf_counter()
                    sess, _ = _create_session(path, self.settings)
                    check_graph_io(
                        self.spec,
                        path,
                        [GraphIO(i.name, i.type, tuple(i.shape)) for i in sess.get_inputs()],
                        [GraphIO(o.name, o.type, tuple(o.shape)) for o in sess.get_outputs()],
                        self.logits_width if self.head_ids is not None else None,
                    )
                    if isinstance(sess.get_inputs()[0].shape[0], int):
                        raise ModelLoadError(f"{path}: its batch axis is fixed; it cannot batch")
                    self._batch_session = sess
                    log.info("loaded batch graph %s in %.0f ms", path, 1000 * (time.perf_counter() - t0))
        return True

    def forward_batch(self, caches: Sequence[Any], ids: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """One pass over several sequences: ``caches[i]`` (this model's caches, all host ``OrtKVCache``
        or all ``BoundKVCache`` on one device) grows by ``ids[i]``; returns each one's logits
        [n_i, vocab] float32, as its own ``forward`` would (up to rounding). Needs
        ``enable_batching()``. Every input is checked before anything runs."""
        if self._batch_session is None:
            raise RuntimeError("forward_batch needs enable_batching() first")
        if len(caches) != len(ids):
            raise ValueError(f"{len(caches)} caches but {len(ids)} id lists")
        spec = self.spec
        seqs: list[OrtKVCache] = []
        arrs: list[np.ndarray] = []
        for cache, seq_ids in zip(caches, ids, strict=True):
            if type(cache) not in (OrtKVCache, SharedKVCache, BoundKVCache) or cache._lm is not self:
                raise TypeError("forward_batch takes this model's caches (host or BoundKVCache)")
            on_device = isinstance(cache, BoundKVCache)
            if seqs and (on_device != isinstance(seqs[0], BoundKVCache) or cache._device != seqs[0]._device):
                raise TypeError("forward_batch takes caches of one kind on one device")
            if any(cache is s for s in seqs):
                raise ValueError("the same cache appears twice in one batch")
            seqs.append(cache)
            arrs.append(_check_ids(seq_ids, spec, cache.length))
        live = [i for i, a in enumerate(arrs) if a.size]
        out = [np.zeros((0, spec.vocab_size), dtype=np.float32) for _ in arrs]  # each [0, vocab]
        if not live:
            return out
        for i in live:
            seqs[i]._drop_pad()
        # the right padding's positions run to max(length) + max(n) - 1; an even pad adds one
        even = (
            self.settings.even_passes
            and max(seqs[i].length for i in live) + max(arrs[i].size for i in live) < spec.max_context
        )
        batch = _BatchInputs([seqs[i].length for i in live], [arrs[i] for i in live], even)
        bound = [c for c in seqs if isinstance(c, BoundKVCache)]
        if bound:  # all of them (checked above)
            logits = self._batch_on_device([bound[i] for i in live], batch)
        else:
            logits = self._batch_on_host([seqs[i] for i in live], batch)
        for j, i in enumerate(live):
            out[i] = self.to_vocab(logits[j, : batch.news[j]])  # [n, vocab]
        return out

    def _batch_feed(self, batch: _BatchInputs) -> dict[str, np.ndarray]:
        feed: dict[str, np.ndarray] = {"input_ids": batch.input_ids, "attention_mask": batch.mask}
        if self.spec.uses_position_ids:
            feed["position_ids"] = batch.positions
        if self.spec.keeps_logits:
            feed[LOGITS_TO_KEEP] = np.array([batch.input_ids.shape[1]], dtype=np.int64)  # all: [1]
        return feed

    def _batch_on_host(self, seqs: list[OrtKVCache], batch: _BatchInputs) -> np.ndarray:
        spec, b, p_max = self.spec, len(seqs), batch.p_max
        feed = self._batch_feed(batch)
        for k, name in enumerate(self.past_names):
            past = np.empty((b, spec.num_kv_heads, p_max, spec.head_dim), dtype=self.kv_dtype)  # [b,kv,p,hd]
            for j, cache in enumerate(seqs):
                pad = p_max - batch.lens[j]
                past[j, :, :pad] = 0  # masked out, but never garbage (0 * NaN would leak through)
                past[j, :, pad:] = cache._kv()[k][0]  # no pad row: forward_batch dropped it
            feed[name] = past
        outs = self._batch_session.run(self.output_names[: 1 + len(self.present_names)], feed)
        logits, presents = outs[0], outs[1:]  # [b, s, vocab]; each [b, kv, p_max + s, hd]
        for j, cache in enumerate(seqs):
            p, n = batch.lens[j], batch.news[j]
            # with left padding the real positions are one contiguous range
            cache._load_kv([pr[j : j + 1, :, p_max - p : p_max + n] for pr in presents], views=True)
        return np.asarray(logits)

    def _batch_on_device(self, seqs: list[BoundKVCache], batch: _BatchInputs) -> np.ndarray:
        """The same pass with KV on the device: a gather graph left-pads and stacks the pasts there, the
        batch graph runs through IOBinding, a split graph slices each sequence's presents back out; only
        ids/mask/positions go up and the logits come down."""
        device = seqs[0]._device
        ops = self.device_ops(device)
        p_max = batch.p_max
        pasts = ops.gather([c._dev for c in seqs], [p_max - p for p in batch.lens])  # each [b,kv,p_max,hd]
        binding = self._batch_session.io_binding()
        for name, value in self._batch_feed(batch).items():
            binding.bind_cpu_input(name, np.ascontiguousarray(value))
        for name, past in zip(self.past_names, pasts, strict=True):
            binding.bind_ortvalue_input(name, past)
        binding.bind_output(self.spec.logits_name, "cpu")
        for name in self.present_names:
            binding.bind_output(name, device, 0)
        self._batch_session.run_with_iobinding(binding)
        outs = binding.get_outputs()  # [logits [b, s, vocab] (host), presents (device) ...]
        starts = [p_max - p for p in batch.lens]
        ends = [p_max + n for n in batch.news]
        for cache, own, p, n in zip(
            seqs, ops.split(list(outs[1:]), starts, ends), batch.lens, batch.news, strict=True
        ):
            cache._dev = own  # each [1, kv, p+n, hd] on the device
            cache._length = p + n
        return np.asarray(outs[0].numpy())

    def device_ops(self, device: str) -> _DeviceOps:
        if device not in self._device_ops:
            self._device_ops[device] = _DeviceOps(self, device)
        return self._device_ops[device]


class ContextFullError(ValueError):
    """A forward would take the sequence past the model's maximum context (``ModelSpec.max_context``)."""


def _check_ids(ids: Sequence[int], spec: ModelSpec, length: int) -> np.ndarray:
    arr = np.asarray(ids, dtype=np.int64)  # [n]
    if arr.ndim != 1:
        raise ValueError(f"ids must be a flat sequence of token ids, got shape {arr.shape}")
    if arr.size and (arr.min() < 0 or arr.max() >= spec.vocab_size):
        raise ValueError(f"token id out of range [0, {spec.vocab_size}): {int(arr.min())}..{int(arr.max())}")
    if length + arr.size > spec.max_context:
        raise ContextFullError(
            f"{length} cached + {arr.size} new tokens exceed the model's context of {spec.max_context}"
        )
    return arr


class OrtKVCache(KVCache):
    """One sequence's KV cache on the CPU: past tensors as numpy [1, kv_heads, length, head_dim]."""

    def __init__(self, lm: OnnxCausalLM) -> None:
        self._lm = lm
        self._device = "host"  # where the KV lives ("cpu"/"cuda" for a BoundKVCache)
        spec = lm.spec
        empty = np.zeros((1, spec.num_kv_heads, 0, spec.head_dim), dtype=lm.kv_dtype)
        self._past: list[np.ndarray] = [empty] * (2 * spec.num_layers)  # each [1, kv, length, hd]
        self._length = 0
        self._pad = 0  # positions past _length that _past still holds: the last pass's pad row
        self._shared = False  # _past are views into a batched pass's presents (see compact)
        # the last pass's hidden states ([rows, hidden] float32, rows ending at position _hidden_end),
        # when the graph outputs them (``hidden_at``)
        self._hidden: np.ndarray | None = None
        self._hidden_end = 0

    @property
    def length(self) -> int:
        return self._length

    def hidden_at(self, position: int) -> np.ndarray | None:
        """The hidden state ([hidden] float32) the last pass computed at ``position`` (the one its
        logits there were projected from), None when that pass did not compute it or the cache has
        since been rolled back past it. Only for a graph with ``ModelSpec.hidden_name``."""
        h = self._hidden
        if h is None or not self._hidden_end - h.shape[0] <= position < min(self._hidden_end, self._length):
            return None
        return h[position - (self._hidden_end - h.shape[0])]

    def _keep_hidden(self, rows: np.ndarray | None) -> None:
        """The pass that just grew the cache computed ``rows`` ([kept, hidden], pad rows dropped)."""
        self._hidden = None if rows is None else np.asarray(rows, dtype=np.float32)
        self._hidden_end = self._length

    def _padded(self, arr: np.ndarray) -> np.ndarray:
        """``arr`` [n], or [n + 1] with a pad token when the pass would be odd and the context has room
        (``RuntimeSettings.even_passes``). The pad sits after every real token, so causal attention
        keeps it out of their rows; its id is immaterial."""
        lm = self._lm
        if not lm.settings.even_passes or arr.size % 2 == 0 or self._length + arr.size >= lm.spec.max_context:
            return arr
        return np.append(arr, arr[-1])

    def _keep(self, n: int) -> None:
        """Keep the KV of the first n positions (exact slice on the sequence axis, no recompute)."""
        # contiguous copies: ORT takes a contiguous buffer as is, a strided view would be copied per call
        self._past = [np.ascontiguousarray(p[:, :, :n, :]) for p in self._past]  # [1, kv, n, hd]
        self._shared = False
        self._pad = 0
        self._length = n

    def _kv(self) -> list[np.ndarray]:
        """The real positions' KV, one [1, kv, length, hd] per past input (views, no copy)."""
        return [p[:, :, : self._length] for p in self._past]

    def _load_kv(self, values: list[np.ndarray], views: bool = False) -> None:
        """Hold ``values`` (one [1, kv, n, hd] per past input) as the whole cache; ``views``: they are
        views into a batched pass's presents (``compact`` copies them out)."""
        self._hidden = None  # a batched pass fetches no hidden states
        self._past = values
        self._shared = views
        self._pad = 0
        self._length = values[0].shape[2]

    def _drop_pad(self) -> None:
        """Drop the last pass's pad position from the KV (a copy of the real ones)."""
        if self._pad:
            self._keep(self._length)

    def _pass_feed(self, arr: np.ndarray, keep: int | None) -> tuple[int, dict[str, np.ndarray]]:
        """(pad tokens appended, feed without the past) of a pass over ``arr`` ([n]); drops the
        previous pass's pad position first."""
        run = self._padded(arr)  # [n (+1 pad)]
        pad = run.size - arr.size
        self._drop_pad()
        return pad, self._feed(run, None if keep is None else keep + pad)

    def _feed(self, arr: np.ndarray, keep: int | None = None) -> dict[str, np.ndarray]:
        """Inputs of a pass over ``arr``; ``keep``: logits for only the last that many positions (a
        graph with ``logits_to_keep`` then skips the vocabulary projection of the others)."""
        n = arr.shape[0]
        total = self._length + n
        feed: dict[str, np.ndarray] = {
            "input_ids": arr[None, :],  # [1, n]
            "attention_mask": np.ones((1, total), dtype=np.int64),  # [1, past+n]
        }
        if self._lm.spec.uses_position_ids:
            feed["position_ids"] = np.arange(self._length, total, dtype=np.int64)[None, :]  # [1, n]
        if self._lm.spec.keeps_logits:
            feed[LOGITS_TO_KEEP] = np.array([n if keep is None else keep], dtype=np.int64)  # [1]
        return feed

    def _forward(self, ids: Sequence[int], keep: int | None) -> np.ndarray:
        arr = _check_ids(ids, self._lm.spec, self._length)
        if arr.size == 0:
            return np.zeros((0, self._lm.spec.vocab_size), dtype=np.float32)
        pad, feed = self._pass_feed(arr, keep)
        for name, past in zip(self._lm.past_names, self._past, strict=True):
            feed[name] = past
        lm = self._lm
        # a prefill run (logits of its last row only) is not stopped midway (``interrupt``)
        run = lambda options: lm.session.run(lm.output_names, feed, options)  # noqa: E731
        outs = lm.run_pass(run, interruptible=keep is None)
        n_kv = len(self._lm.present_names)
        self._past = outs[1 : 1 + n_kv]  # each [1, kv, past+n+pad, hd]; the pad goes before the next pass
        self._shared = False
        self._pad = pad
        self._length += arr.size
        logits = outs[0][0]  # [n (or kept) + pad, width]
        self._keep_hidden(outs[-1][0, : logits.shape[0] - pad] if len(outs) > 1 + n_kv else None)
        return self._lm.to_vocab(logits[: logits.shape[0] - pad])  # [n (or kept), vocab]

    def forward(self, ids: Sequence[int]) -> np.ndarray:
        """ids: [n] -> logits: [n, vocab] float32; the cache grows by n."""
        return self._forward(ids, None)

    def forward_last(self, ids: Sequence[int]) -> np.ndarray:
        """The logits of the last new position only: [vocab] (a catch-up prefill that needs one row;
        graphs with ``logits_to_keep`` compute only that row)."""
        return self._forward(ids, 1)[-1]

    def append(self, ids: Sequence[int]) -> None:
        """``forward`` without the logits (a prefill): the cache grows by len(ids)."""
        self._forward(ids, 1)

    def forward_greedy(self, ids: Sequence[int]) -> np.ndarray:
        """Like ``forward`` but returns only each position's argmax: [n] int64 (ties: the lowest id,
        as ``np.argmax``). On CUDA the argmax runs on the device and only n ids come back."""
        return np.argmax(self.forward(ids), axis=-1).astype(np.int64)  # [n]

    def truncate(self, n: int) -> None:
        """Keep the first n positions (exact slice on the sequence axis, no recompute)."""
        if n < 0:
            raise ValueError(f"cannot truncate to a negative length ({n})")
        if n >= self._length:
            return  # a pad position past the end goes with the next pass
        self._keep(n)

    def compact(self) -> None:
        """Own the KV again after batched passes: their views keep every batched sequence's presents
        alive, so a cache left idle would hold B sequences' worth of memory."""
        if self._shared:
            self._past = [np.array(p, copy=True, order="C") for p in self._past]
            self._shared = False


class SharedKVCache(OrtKVCache):
    """A host cache whose KV the graph writes in place (``ModelSpec.shared_kv_buffer``, see
    ``specls.models.kv_buffer``): per past input one buffer [1, kv, capacity, hd], bound through
    IOBinding as both the past and the present, so a pass copies no KV (ORT's attention writes the new
    positions at the cached length) and a rollback or a pad drop only moves the length. The buffers
    grow by doubling (one copy of the real positions) when a pass would not fit."""

    CAPACITY_STEP = 256  # positions; capacities are multiples of it (a grown buffer at least doubles)

    # _past: the buffers, each [1, kv, capacity, hd]; positions from _length on are stale

    @property
    def capacity(self) -> int:
        return self._past[0].shape[2]

    def _reserve(self, total: int) -> None:
        """Capacity for ``total`` positions, the real ones kept."""
        if total <= self.capacity:
            return
        step = self.CAPACITY_STEP
        want = max(2 * self.capacity, -(-total // step) * step)
        cap = max(total, min(want, self._lm.spec.max_context))
        grown = []
        for buf in self._past:
            new = np.zeros((*buf.shape[:2], cap, buf.shape[3]), dtype=buf.dtype)  # [1, kv, cap, hd]
            new[:, :, : self._length] = buf[:, :, : self._length]
            grown.append(new)
        self._past = grown

    def _load_kv(self, values: list[np.ndarray], views: bool = False) -> None:
        n = values[0].shape[2]
        self._hidden = None  # a batched pass fetches no hidden states
        self._length = 0  # nothing of the old KV is kept
        self._reserve(n)
        for buf, v in zip(self._past, values, strict=True):
            buf[:, :, :n] = v  # a copy: the buffers stay this cache's own
        self._pad = 0
        self._length = n

    def _keep(self, n: int) -> None:
        self._pad = 0  # positions from n on are overwritten by the next pass
        self._length = n

    def _forward(self, ids: Sequence[int], keep: int | None) -> np.ndarray:
        lm = self._lm
        arr = _check_ids(ids, lm.spec, self._length)
        if arr.size == 0:
            return np.zeros((0, lm.spec.vocab_size), dtype=np.float32)
        pad, feed = self._pass_feed(arr, keep)
        self._reserve(self._length + arr.size + pad)
        rows = int(feed[LOGITS_TO_KEEP][0]) if lm.spec.keeps_logits else arr.size + pad
        logits = np.empty((1, rows, lm.logits_width), dtype=lm.kv_dtype)  # [1, n (or kept) + pad, width]
        binding = lm.session.io_binding()
        for name, value in feed.items():
            binding.bind_cpu_input(name, value)
        binding.bind_output(
            lm.spec.logits_name, "cpu", 0, lm.kv_dtype, list(logits.shape), logits.ctypes.data
        )
        hidden = None
        if lm.spec.hidden_name is not None:
            hidden = np.empty((1, rows, lm.spec.hidden_size), dtype=lm.kv_dtype)  # [1, kept + pad, hidden]
            binding.bind_output(
                lm.spec.hidden_name, "cpu", 0, lm.kv_dtype, list(hidden.shape), hidden.ctypes.data
            )
        for past, present, buf in zip(lm.past_names, lm.present_names, self._past, strict=True):
            shape, ptr = list(buf.shape), buf.ctypes.data
            binding.bind_input(past, "cpu", 0, lm.kv_dtype, shape, ptr)
            binding.bind_output(present, "cpu", 0, lm.kv_dtype, shape, ptr)  # the same memory: in place
        # an interrupted pass may have written KV past the length: stale positions, overwritten next
        lm.run_pass(lambda options: lm.session.run_with_iobinding(binding, options), keep is None)
        self._pad = pad  # the pad position is overwritten by the next pass
        self._length += arr.size
        self._keep_hidden(None if hidden is None else hidden[0, : rows - pad])
        return lm.to_vocab(logits[0, : rows - pad])  # [n (or kept), vocab]

    def compact(self) -> None:
        """Nothing to do: batched passes' KV is copied into the buffers (``_load_kv``)."""


class BoundKVCache(OrtKVCache):
    """KV kept as OrtValues on ``device`` and fed back through IOBinding (the CUDA cache; ``device="cpu"``
    runs the same code on the CPU, which is how the tests exercise it without a GPU).

    Per forward: bind ids/mask/positions from host arrays (a few bytes), bind each past OrtValue (no
    copy), let ORT allocate the presents on the device, copy only the logits to the host. The presents
    become the next past. ``truncate`` slices on the device (``_DeviceOps``), no host round trip.
    """

    def __init__(self, lm: OnnxCausalLM, device: str = "cuda") -> None:
        import onnxruntime as ort

        super().__init__(lm)
        self._device = device
        spec = lm.spec
        shape = [1, spec.num_kv_heads, 0, spec.head_dim]
        self._dev: list[Any] = [
            ort.OrtValue.ortvalue_from_shape_and_type(shape, lm.kv_dtype, device, 0)
            for _ in range(2 * spec.num_layers)
        ]  # each [1, kv, length, hd] on the device
        self._past = []  # unused: the host copies of the CPU cache

    def _keep(self, n: int) -> None:
        self._dev = self._lm.device_ops(self._device).slice(self._dev, n)  # on the device, no host trip
        self._pad = 0
        self._length = n

    def _run(self, arr: np.ndarray, logits_device: str, keep: int | None = None) -> tuple[Any, int]:
        """One step; returns (the logits OrtValue [1, n (or keep) + pad, vocab] on ``logits_device``,
        pad): the last ``pad`` rows belong to the pad token (``_padded``)."""
        lm = self._lm
        pad, feed = self._pass_feed(arr, keep)
        binding = lm.session.io_binding()
        for name, value in feed.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(value))
        for name, past in zip(lm.past_names, self._dev, strict=True):
            binding.bind_ortvalue_input(name, past)
        binding.bind_output(lm.spec.logits_name, logits_device, 0)
        for name in lm.present_names:
            binding.bind_output(name, self._device, 0)
        lm.run_pass(lambda options: lm.session.run_with_iobinding(binding, options), keep is None)
        outs = binding.get_outputs()  # [logits [1, n + pad, vocab], present k0, v0, ... (device)]
        self._dev = list(outs[1:])
        self._pad = pad
        self._length += arr.size
        return outs[0], pad

    def forward(self, ids: Sequence[int]) -> np.ndarray:
        arr = _check_ids(ids, self._lm.spec, self._length)
        if arr.size == 0:
            return np.zeros((0, self._lm.spec.vocab_size), dtype=np.float32)
        logits = self._run(arr, "cpu")[0].numpy()[0, : arr.size]  # [n, width]
        return self._lm.to_vocab(logits)  # [n, vocab]

    def append(self, ids: Sequence[int]) -> None:
        """A prefill: the logits stay on the device and are dropped ([n, vocab] of a long prompt is
        hundreds of MB at a 150k vocabulary), only the KV is kept."""
        arr = _check_ids(ids, self._lm.spec, self._length)
        if arr.size:
            self._run(arr, self._device, keep=1)

    def forward_last(self, ids: Sequence[int]) -> np.ndarray:
        arr = _check_ids(ids, self._lm.spec, self._length)
        if arr.size == 0:
            return np.zeros((self._lm.spec.vocab_size,), dtype=np.float32)
        logits, pad = self._run(arr, "cpu", keep=1)
        row = logits.numpy()[0, -1 - pad]  # [width]
        return self._lm.to_vocab(row[None, :])[0]  # [vocab]

    def forward_greedy(self, ids: Sequence[int]) -> np.ndarray:
        arr = _check_ids(ids, self._lm.spec, self._length)
        if arr.size == 0:
            return np.zeros((0,), dtype=np.int64)
        logits, _ = self._run(arr, self._device)  # [1, n + pad, width] on the device
        idx = self._lm.device_ops(self._device).argmax(logits)[: arr.size]  # [n]
        return self._lm.to_token_ids(idx)


class _DeviceOps:
    """Small ONNX graphs run on a cache's device so nothing big crosses to the host:

    - slice: ``y_i = Slice(x_i, starts=[0], ends=[n], axes=[2])`` for every KV tensor in one run (the
      device-to-device copy of the kept prefix that ``truncate`` needs);
    - argmax: ``ids = ArgMax(logits, axis=-1)`` so greedy steps copy n ids, not [n, vocab] logits;
    - gather / split (batched passes): left-pad B sequences' KV and stack them on the batch axis; slice
      each sequence's positions back out of the batch's presents. One graph per B, built on first use.

    Built in memory with the ``onnx`` package; without it they fall back to a host round trip.
    """

    def __init__(self, lm: OnnxCausalLM, device: str) -> None:
        self._device = device
        self._count = count = 2 * lm.spec.num_layers
        self._kv_dtype = lm.kv_dtype
        self._slice: Any = None
        self._argmax: Any = None
        self._gathers: dict[int, Any] = {}
        self._splits: dict[int, Any] = {}
        self._lock = threading.Lock()
        try:
            from onnx import TensorProto, helper
        except ImportError:
            log.warning("the onnx package is missing: KV truncation/argmax on %s go through the host", device)
            return
        self._elem = elem = TensorProto.FLOAT16 if lm.spec.dtype == "fp16" else TensorProto.FLOAT
        self._kv_shape = (lm.spec.num_kv_heads, lm.spec.head_dim)
        shape: list[str | int | None] = [1, lm.spec.num_kv_heads, "s", lm.spec.head_dim]
        inputs = [helper.make_tensor_value_info(f"x{i}", elem, shape) for i in range(count)]
        inputs.append(helper.make_tensor_value_info("end", TensorProto.INT64, [1]))
        outputs = [helper.make_tensor_value_info(f"y{i}", elem, None) for i in range(count)]
        nodes = [helper.make_node("Slice", [f"x{i}", "zero", "end", "axis"], [f"y{i}"]) for i in range(count)]
        inits = [
            helper.make_tensor("zero", TensorProto.INT64, [1], [0]),
            helper.make_tensor("axis", TensorProto.INT64, [1], [2]),
        ]
        self._slice = self._session(helper.make_graph(nodes, "kv_slice", inputs, outputs, initializer=inits))
        logits_type = next(o.type for o in lm.session.get_outputs() if o.name == lm.spec.logits_name)
        logits_elem = TensorProto.FLOAT16 if logits_type == "tensor(float16)" else TensorProto.FLOAT
        argmax = helper.make_graph(
            [helper.make_node("ArgMax", ["logits"], ["ids"], axis=-1, keepdims=0)],
            "greedy",
            [helper.make_tensor_value_info("logits", logits_elem, [1, "n", lm.logits_width])],
            [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, "n"])],
        )
        self._argmax = self._session(argmax)

    def _session(self, graph: Any) -> Any:
        import onnxruntime as ort
        from onnx import helper

        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.log_severity_level = 3
        providers = ["CUDAExecutionProvider"] if self._device == "cuda" else []
        return ort.InferenceSession(
            model.SerializeToString(), so, providers=[*providers, "CPUExecutionProvider"]
        )

    def slice(self, values: list[Any], n: int) -> list[Any]:
        """values: 2*layers x [1, kv, length, hd] OrtValues -> the same, [1, kv, n, hd]."""
        if self._slice is None:
            import onnxruntime as ort

            return [
                ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(v.numpy()[:, :, :n]), self._device, 0)
                for v in values
            ]
        binding = self._slice.io_binding()
        for i, v in enumerate(values):
            binding.bind_ortvalue_input(f"x{i}", v)
        binding.bind_cpu_input("end", np.array([n], dtype=np.int64))
        for i in range(self._count):
            binding.bind_output(f"y{i}", self._device, 0)
        self._slice.run_with_iobinding(binding)
        return list(binding.get_outputs())

    def _gather_graph(self, b: int) -> Any:
        from onnx import TensorProto, helper

        kv, hd = self._kv_shape
        inputs = [
            helper.make_tensor_value_info(f"x{k}_{i}", self._elem, [1, kv, f"s{i}", hd])
            for k in range(self._count)
            for i in range(b)
        ]
        inputs += [helper.make_tensor_value_info(f"pad{i}", TensorProto.INT64, [8]) for i in range(b)]
        outputs = [
            helper.make_tensor_value_info(f"y{k}", self._elem, [b, kv, "p", hd]) for k in range(self._count)
        ]
        nodes = [
            helper.make_node("Pad", [f"x{k}_{i}", f"pad{i}"], [f"t{k}_{i}"], mode="constant")
            for k in range(self._count)
            for i in range(b)
        ]
        nodes += [
            helper.make_node("Concat", [f"t{k}_{i}" for i in range(b)], [f"y{k}"], axis=0)
            for k in range(self._count)
        ]
        return self._session(helper.make_graph(nodes, f"kv_gather_{b}", inputs, outputs))

    def _split_graph(self, b: int) -> Any:
        from onnx import TensorProto, helper

        kv, hd = self._kv_shape
        inputs = [
            helper.make_tensor_value_info(f"x{k}", self._elem, [b, kv, "p", hd]) for k in range(self._count)
        ]
        for i in range(b):
            inputs += [
                helper.make_tensor_value_info(f"start{i}", TensorProto.INT64, [2]),
                helper.make_tensor_value_info(f"end{i}", TensorProto.INT64, [2]),
            ]
        outputs = [
            helper.make_tensor_value_info(f"y{k}_{i}", self._elem, [1, kv, f"s{i}", hd])
            for k in range(self._count)
            for i in range(b)
        ]
        nodes = [
            helper.make_node("Slice", [f"x{k}", f"start{i}", f"end{i}", "axes"], [f"y{k}_{i}"])
            for k in range(self._count)
            for i in range(b)
        ]
        axes = helper.make_tensor("axes", TensorProto.INT64, [2], [0, 2])
        return self._session(helper.make_graph(nodes, f"kv_split_{b}", inputs, outputs, initializer=[axes]))

    def _graph(self, cache: dict[int, Any], b: int, build: Callable[[int], Any]) -> Any:
        if self._slice is None:
            return None  # no onnx package
        with self._lock:
            if b not in cache:
                cache[b] = build(b)
            return cache[b]

    def gather(self, seqs: list[list[Any]], pads: list[int]) -> list[Any]:
        """seqs: B x (2*layers x [1, kv, len_i, hd]) -> 2*layers x [B, kv, max len, hd], sequence i
        left-padded with ``pads[i]`` zeros on the sequence axis (masked out by the batch's mask)."""
        b = len(seqs)
        graph = self._graph(self._gathers, b, self._gather_graph)
        if graph is None:
            import onnxruntime as ort

            host = [
                np.concatenate(
                    [
                        np.pad(seq[k].numpy(), ((0, 0), (0, 0), (pad, 0), (0, 0)))
                        for seq, pad in zip(seqs, pads, strict=True)
                    ],
                    axis=0,
                )
                for k in range(self._count)
            ]
            return [ort.OrtValue.ortvalue_from_numpy(h, self._device, 0) for h in host]
        binding = graph.io_binding()
        for i, (seq, pad) in enumerate(zip(seqs, pads, strict=True)):
            for k, value in enumerate(seq):
                binding.bind_ortvalue_input(f"x{k}_{i}", value)
            binding.bind_cpu_input(f"pad{i}", np.array([0, 0, pad, 0, 0, 0, 0, 0], dtype=np.int64))
        for k in range(self._count):
            binding.bind_output(f"y{k}", self._device, 0)
        graph.run_with_iobinding(binding)
        return list(binding.get_outputs())

    def split(self, values: list[Any], starts: list[int], ends: list[int]) -> list[list[Any]]:
        """values: 2*layers x [B, kv, L, hd] -> B x (2*layers x [1, kv, ends[i] - starts[i], hd]), the
        range [starts[i], ends[i]) of sequence i on the sequence axis, each a copy of its own."""
        b = len(starts)
        graph = self._graph(self._splits, b, self._split_graph)
        if graph is None:
            import onnxruntime as ort

            return [
                [
                    ort.OrtValue.ortvalue_from_numpy(
                        np.ascontiguousarray(v.numpy()[i : i + 1, :, starts[i] : ends[i]]), self._device, 0
                    )
                    for v in values
                ]
                for i in range(b)
            ]
        binding = graph.io_binding()
        for k, value in enumerate(values):
            binding.bind_ortvalue_input(f"x{k}", value)
        for i in range(b):
            binding.bind_cpu_input(f"start{i}", np.array([i, starts[i]], dtype=np.int64))
            binding.bind_cpu_input(f"end{i}", np.array([i + 1, ends[i]], dtype=np.int64))
        for k in range(self._count):
            for i in range(b):
                binding.bind_output(f"y{k}_{i}", self._device, 0)
        graph.run_with_iobinding(binding)
        outs = binding.get_outputs()  # ordered as the graph's outputs: k-major, then i
        return [[outs[k * b + i] for k in range(self._count)] for i in range(b)]

    def argmax(self, logits: Any) -> np.ndarray:
        """logits: OrtValue [1, n, vocab] on the device -> [n] int64 on the host."""
        if self._argmax is None or logits.data_type() not in ("tensor(float)", "tensor(float16)"):
            return np.argmax(logits.numpy()[0], axis=-1).astype(np.int64)
        binding = self._argmax.io_binding()
        binding.bind_ortvalue_input("logits", logits)
        binding.bind_output("ids", "cpu")
        self._argmax.run_with_iobinding(binding)
        return np.asarray(binding.get_outputs()[0].numpy()[0], dtype=np.int64)  # [n]
