"""``python -m bench.lab.quant`` (from the repository root): which quantization to ship, measured in one run against the fp32 export.

Given an fp32 model dir (``specls export --quantize none``), every variant of a grid -- block size
x ``accuracy_level`` of int4 ``MatMulNBits``, the embedding table kept vs quantized at one point of
the grid, and int8 (``MatMulInteger``, ``--quantize int8``) -- is quantized with ``models.quantize.quantize_graph`` into a scratch dir (graph, the fp32
dir's tokenizer and ``specls.json``, as ``specls export`` assembles a quantized dir) and measured
next to the fp32 reference with the same thread count:

- size of the dir on disk; quantize wall time and the quantizer's peak RSS (it runs in a child
  process so that each figure is its own: the child's ``VmHWM``);
- load time (``OnnxCausalLM``: session creation, which prepacks the int4 blocks);
- prefill tokens/s of a ``--prompt-tokens`` (256) prompt into an empty cache (a cold request);
- prefill tokens/s of ``--keystroke-tokens`` (16) tokens appended to that cached prompt (what a
  keystroke costs once the prefix is cached; median of 3);
- plain greedy decode tokens/s over ``--decode-tokens`` (32) tokens after that prompt, and how many
  of them equal the fp32 graph's greedy tokens (the common prefix);
- top-1 agreement and mean KL against the fp32 graph (``models.agreement``) over ``--positions``
  held-out positions (the fp32 logits are computed once and reused for every variant).

``accuracy_level`` is an attribute of the ``MatMulNBits`` nodes only (the packed blocks do not depend
on it), so each block size is quantized once and its other levels are the same graph with the
attribute rewritten (``set_accuracy_level``; a test checks that this equals quantizing at that level).
Each variant's dir is deleted once measured: the 1.5B's variants are 1.2-1.4 GB each.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from specls.bench import int_list
from specls.memory import release_freed_memory

logger = logging.getLogger(__name__)

BLOCKS = (32, 64, 128)
LEVELS = (0, 4)


@dataclass(frozen=True)
class Variant:
    """One graph of the sweep: ``block_size`` None is the fp32 reference."""

    block_size: int | None = None
    accuracy_level: int = 0
    embedding: bool = True  # the embedding table as GatherBlockQuantized (int4) or kept fp32
    kernel: str = "nbits"  # "integer": --quantize int8 (block_size and accuracy_level unused)

    @property
    def name(self) -> str:
        keep = "" if self.embedding else "-keep-emb"
        if self.kernel == "integer":
            return "int8" + keep
        if self.block_size is None:
            return "fp32"
        return f"b{self.block_size}-l{self.accuracy_level}" + keep

    @property
    def weights_key(self) -> tuple[int | None, bool, str]:
        """Variants with the same key hold the same quantized blocks (they differ in accuracy_level)."""
        return (self.block_size, self.embedding, self.kernel)


def variant_grid(
    blocks: Sequence[int],
    levels: Sequence[int],
    embedding: bool,
    embedding_at: tuple[int, int] | None,
    int8: bool = False,
) -> list[Variant]:
    """The fp32 reference, then blocks x levels with the default ``embedding``, then (if
    ``embedding_at`` = (block, level) is given) the other embedding choice at that point, then int8
    if asked. Ordered so that the variants sharing quantized weights are neighbours.

    Example: blocks (32, 64), levels (4, 0), embedding True, embedding_at (32, 4), int8 ->
    fp32, b32-l4, b32-l0, b64-l4, b64-l0, b32-l4-keep-emb, int8.
    """
    grid = [Variant()]
    grid += [Variant(b, lv, embedding) for b in blocks for lv in levels]
    if embedding_at is not None:
        grid.append(Variant(embedding_at[0], embedding_at[1], not embedding))
    if int8:
        grid.append(Variant(kernel="integer", embedding=embedding))
    return list(dict.fromkeys(grid))  # a repeated block or level once


@dataclass(frozen=True)
class QuantBenchOptions:
    fp32: Path
    blocks: tuple[int, ...] = BLOCKS
    levels: tuple[int, ...] = LEVELS
    embedding_at: tuple[int, int] | None = None  # None = the QuantizeOptions default block/level
    no_embedding_variant: bool = False
    int8: bool = True  # also measure --quantize int8
    threads: int = 2
    extra_decode_threads: int | None = None  # also decode with this many threads (a second session)
    prompt_tokens: int = 256
    keystroke_tokens: int = 16
    decode_tokens: int = 32
    positions: int = 2048  # agreement positions (the export's check uses 2,048)
    window: int = 256
    scratch: Path | None = None  # where variant dirs are written (None: a temp dir)
    json_out: Path | None = None
    seed: int = 0


@dataclass
class Row:
    variant: str
    size_bytes: int = 0
    quantize_s: float | None = None
    quantize_peak_rss: int | None = None  # bytes
    shared_with: str | None = None  # the variant whose quantized blocks this one reuses
    load_s: float = 0.0
    prefill_tok_s: float = 0.0
    keystroke_ms: float = 0.0
    keystroke_tok_s: float = 0.0
    decode_tok_s: float = 0.0
    extra_decode_tok_s: float | None = None
    greedy_same: int = 0  # leading decode tokens equal to fp32's
    top1: float | None = None
    fim_top1: float | None = None
    mean_kl: float | None = None
    agreement_positions: int = 0
    decoded: list[int] = field(default_factory=list)


def build_parser() -> argparse.ArgumentParser:
    """The command's options (``python -m bench.lab.quant``); ``func`` is ``run``."""
    p = argparse.ArgumentParser(
        prog="python -m bench.lab.quant",
        description="int4 settings sweep (block size x accuracy_level, embedding) against an fp32 export: "
        "quantize it into each variant and print size, load time, prefill, keystroke prefill, decode "
        "speed and agreement with fp32, side by side.",
    )
    p.add_argument("--fp32", required=True, type=Path, help="fp32 model dir (specls export --quantize none)")
    p.add_argument("--blocks", default=",".join(map(str, BLOCKS)), help="block sizes (comma-separated)")
    p.add_argument("--levels", default=",".join(map(str, LEVELS)), help="accuracy levels (comma-separated)")
    p.add_argument(
        "--embedding-at",
        default=None,
        help="BLOCK/LEVEL where the other embedding choice is measured (default: the shipped defaults)",
    )
    p.add_argument("--no-embedding-variant", action="store_true", help="skip the embedding variant")
    p.add_argument("--no-int8", action="store_true", help="skip the int8 (MatMulInteger) variant")
    p.add_argument(
        "--threads", type=int, default=QuantBenchOptions.threads, help="ORT threads, every variant"
    )
    p.add_argument(
        "--extra-decode-threads",
        type=int,
        default=None,
        help="also measure decode with this many threads (a second session per variant)",
    )
    p.add_argument("--prompt-tokens", type=int, default=QuantBenchOptions.prompt_tokens)
    p.add_argument("--keystroke-tokens", type=int, default=QuantBenchOptions.keystroke_tokens)
    p.add_argument("--decode-tokens", type=int, default=QuantBenchOptions.decode_tokens)
    p.add_argument(
        "--positions",
        type=int,
        default=QuantBenchOptions.positions,
        help="held-out positions for agreement (half in FIM prompts when the model has a template)",
    )
    p.add_argument("--scratch", type=Path, default=None, help="where variant dirs are written and deleted")
    p.add_argument("--json", dest="json_out", type=Path, default=None, help="save every number as JSON")
    p.set_defaults(func=run)
    return p


def options_from_args(args: argparse.Namespace) -> QuantBenchOptions:
    at = None
    if args.embedding_at:
        block, _, level = str(args.embedding_at).partition("/")
        at = (int(block), int(level or 0))
    return QuantBenchOptions(
        fp32=args.fp32,
        blocks=int_list(args.blocks),
        levels=int_list(args.levels),
        embedding_at=at,
        no_embedding_variant=args.no_embedding_variant,
        int8=not args.no_int8,
        threads=max(1, args.threads),
        extra_decode_threads=args.extra_decode_threads,
        prompt_tokens=args.prompt_tokens,
        keystroke_tokens=args.keystroke_tokens,
        decode_tokens=args.decode_tokens,
        positions=args.positions,
        scratch=args.scratch,
        json_out=args.json_out,
    )


def run(args: argparse.Namespace) -> int:
    from specls.models.quantize import QuantizeError
    from specls.models.spec import ModelLoadError

    opt = options_from_args(args)
    try:
        rows = run_bench(opt, progress=lambda m: print(m, file=sys.stderr, flush=True))
    except (QuantizeError, ModelLoadError, ValueError) as exc:
        print(f"bench.lab.quant: {exc}", file=sys.stderr)
        return 1
    print(format_table(rows, opt))
    return 0


# -- graphs ------------------------------------------------------------------------------------------

_CHILD = """
import json, sys
from dataclasses import asdict
from pathlib import Path
from specls.models.quantize import QuantizeOptions, quantize_graph
a = json.loads(sys.argv[1])
r = quantize_graph(Path(a["src"]), Path(a["dst"]), QuantizeOptions(**a["options"]), a["logits"])
hwm = [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")]
print(json.dumps({"report": asdict(r), "hwm_kib": hwm[0] if hwm else 0}))
"""


def quantize_in_child(
    src: Path, dst: Path, options: Any, logits_name: str
) -> tuple[dict[str, Any], float, int]:
    """``quantize_graph(src, dst, options)`` in a child interpreter: (its report, wall s, the child's
    peak RSS in bytes). A child so that the peak is the quantizer's alone, not this process'. The peak
    is the child's ``VmHWM`` (its own address space after exec), not ``wait4``'s ``ru_maxrss``:
    Linux carries the parent's RSS at fork into the child's ``ru_maxrss`` across exec (the sweep read
    12.8 GiB for every variant that way)."""
    arg = json.dumps({"src": str(src), "dst": str(dst), "options": asdict(options), "logits": logits_name})
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, arg], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        from specls.models.quantize import QuantizeError

        tail = err.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise QuantizeError(f"{src}: quantization failed in the child process: {tail[0]}")
    result = json.loads(out.decode().strip().splitlines()[-1])
    return result["report"], wall, int(result["hwm_kib"]) * 1024


def set_accuracy_level(graph: Path, level: int) -> int:
    """Rewrite ``accuracy_level`` of every ``MatMulNBits`` node of ``graph`` in place (the packed
    weights do not depend on it). Returns the number of nodes changed. The graph must be a single
    file (a quantized graph under protobuf's 2 GB limit, which is what ``quantize_graph`` writes)."""
    import onnx
    from onnx import helper

    if graph.with_name(f"{graph.name}.data").exists():
        raise ValueError(f"{graph}: has external data; set_accuracy_level needs a single-file graph")
    model = onnx.load(str(graph))
    changed = 0
    for node in model.graph.node:
        if node.op_type != "MatMulNBits":
            continue
        kept = [a for a in node.attribute if a.name != "accuracy_level"]
        del node.attribute[:]
        node.attribute.extend(kept)
        if level:
            node.attribute.append(helper.make_attribute("accuracy_level", level))
        changed += 1
    onnx.save_model(model, str(graph))
    return changed


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


# -- measurement -------------------------------------------------------------------------------------


def prompt_ids(
    tokenize: Callable[[str], list[int]], n: int, seed: int, root: Path | None = None
) -> list[int]:
    """``n`` token ids of held-out code (stdlib test files, seeded order, joined): the speed prompt."""
    from specls.models import data as D

    split = D.split_corpus(root)
    files = list(split.heldout)
    random.Random(seed + 7).shuffle(files)
    ids: list[int] = []
    for _, text in D.iter_documents(files, split.root):
        ids += tokenize(text)
        if len(ids) >= n:
            return ids[:n]
    raise ValueError(f"held-out code has fewer than {n} tokens")


def _decode(cache: Any, first: int, n: int) -> tuple[list[int], float]:
    """Plain greedy decode of ``n`` tokens after feeding ``first``: (tokens, tokens/s)."""
    out: list[int] = []
    tok = first
    t0 = time.perf_counter()
    for _ in range(n):
        tok = int(np.argmax(cache.forward_last([tok])))
        out.append(tok)
    return out, n / max(1e-9, time.perf_counter() - t0)


def measure_speed(model_dir: Path, opt: QuantBenchOptions, row: Row, ids: list[int]) -> Any:
    """Fill ``row``'s load/prefill/keystroke/decode figures; returns the loaded model (for agreement)."""
    from specls.models.runtime import OnnxCausalLM, RuntimeSettings

    p, k = opt.prompt_tokens, opt.keystroke_tokens
    t0 = time.perf_counter()
    lm = OnnxCausalLM(model_dir, RuntimeSettings(threads=opt.threads, provider="cpu"))
    row.load_s = time.perf_counter() - t0
    lm.warmup()
    cache = lm.new_cache()
    t0 = time.perf_counter()
    cache.append(ids[:p])
    row.prefill_tok_s = p / max(1e-9, time.perf_counter() - t0)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        cache.append(ids[p : p + k])
        times.append(time.perf_counter() - t0)
        cache.truncate(p)
    row.keystroke_ms = 1000 * statistics.median(times)
    row.keystroke_tok_s = k / max(1e-9, statistics.median(times))
    row.decoded, row.decode_tok_s = _decode(cache, ids[p], opt.decode_tokens)
    del cache
    if opt.extra_decode_threads:
        other = OnnxCausalLM(model_dir, RuntimeSettings(threads=opt.extra_decode_threads, provider="cpu"))
        c = other.new_cache()
        c.append(ids[:p])
        _, row.extra_decode_tok_s = _decode(c, ids[p], opt.decode_tokens)
        del c, other
        release_freed_memory(collect=True)
    return lm


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _fp32_reference(
    opt: QuantBenchOptions,
    row: Row,
    ids: list[int],
    agree: Any,
    ref_logits: dict[tuple[int, ...], np.ndarray],
) -> tuple[Callable[[str], list[int]], Any]:
    """Measure the fp32 dir into ``row`` and fill ``ref_logits`` with its logits of every scored
    window. Returns (tokenize, FIM template) for the variants' agreement."""
    from specls.models.agreement import measure_agreement, sequence_logits

    ref_lm = measure_speed(opt.fp32, opt, row, ids)
    logits = sequence_logits(ref_lm)

    def ref_fn(x: Sequence[int]) -> np.ndarray:
        key = tuple(x)
        if key not in ref_logits:
            ref_logits[key] = logits(x)
        return ref_logits[key]

    res = measure_agreement(ref_fn, ref_fn, ref_lm.tokenizer.encode, agree, fim=ref_lm.spec.fim)
    row.agreement_positions = res.positions
    return ref_lm.tokenizer.encode, ref_lm.spec.fim  # the session is freed with this frame


def run_bench(opt: QuantBenchOptions, progress: Callable[[str], None] = lambda m: None) -> list[Row]:
    from specls.models.agreement import AgreementOptions, measure_agreement, sequence_logits
    from specls.models.export import TOKENIZER_FILE
    from specls.models.quantize import QuantizeOptions, options_for
    from specls.models.spec import load_spec
    from specls.models.tokenizer import Tokenizer

    spec = load_spec(opt.fp32)
    src = opt.fp32 / spec.onnx_file
    base = options_for("int4")
    assert base is not None
    at = opt.embedding_at or (QuantizeOptions.block_size, QuantizeOptions.accuracy_level)
    grid = variant_grid(
        opt.blocks, opt.levels, base.embedding, None if opt.no_embedding_variant else at, opt.int8
    )
    int8 = options_for("int8")
    assert int8 is not None
    agree = AgreementOptions(positions=opt.positions, window=opt.window, seed=opt.seed, threads=opt.threads)

    # the fp32 logits of every scored window, computed once (positions x vocab float32: 2,048 x 152k
    # = 1.2 GB for Qwen; keyed by the window's ids)
    ref_logits: dict[tuple[int, ...], np.ndarray] = {}
    rows: list[Row] = []
    scratch = Path(tempfile.mkdtemp(prefix="specls-quant-", dir=opt.scratch))
    try:
        fp32 = Row("fp32", size_bytes=dir_bytes(opt.fp32))
        progress(f"fp32: loading {opt.fp32}")
        tokenizer = Tokenizer.from_file(opt.fp32 / spec.tokenizer_file)
        ids = prompt_ids(tokenizer.encode, opt.prompt_tokens + opt.keystroke_tokens + 1, opt.seed)
        progress("fp32: measuring speed, then the reference logits")
        tokenize, fim = _fp32_reference(opt, fp32, ids, agree, ref_logits)
        release_freed_memory(collect=True)
        rows.append(fp32)
        progress(format_row(fp32, opt.extra_decode_threads is not None))

        def ref_cached(x: Sequence[int]) -> np.ndarray:
            return ref_logits[tuple(x)]

        built: dict[tuple[int | None, bool, str], tuple[Path, str]] = {}
        for v in grid[1:]:
            row = Row(v.name)
            if v.kernel == "integer":
                options = replace(int8, embedding=v.embedding)
            else:
                options = replace(
                    base,
                    block_size=v.block_size or 32,
                    accuracy_level=v.accuracy_level,
                    embedding=v.embedding,
                )
            vdir = scratch / f"{v.kernel}-b{v.block_size}-emb{int(v.embedding)}"
            if v.weights_key in built:
                vdir, row.shared_with = built[v.weights_key]
                progress(f"{v.name}: accuracy_level {v.accuracy_level} on {row.shared_with}'s graph")
                set_accuracy_level(vdir / spec.onnx_file, v.accuracy_level)
            else:
                for old, _ in built.values():  # only one variant's files on disk at a time
                    shutil.rmtree(old, ignore_errors=True)
                built.clear()
                progress(f"{v.name}: quantizing")
                vdir.mkdir(parents=True)
                _, row.quantize_s, row.quantize_peak_rss = quantize_in_child(
                    src, vdir / spec.onnx_file, options, spec.logits_name
                )
                shutil.copyfile(opt.fp32 / spec.tokenizer_file, vdir / TOKENIZER_FILE)
                spec.write(vdir)
                built[v.weights_key] = (vdir, v.name)
            row.size_bytes = dir_bytes(vdir)
            progress(f"{v.name}: measuring speed")
            lm = measure_speed(vdir, opt, row, ids)
            row.greedy_same = common_prefix(row.decoded, fp32.decoded)

            cand = sequence_logits(lm)
            progress(f"{v.name}: {row.decode_tok_s:.2f} tok/s decode; agreement")
            res = measure_agreement(ref_cached, cand, tokenize, agree, fim=fim)
            row.top1, row.fim_top1, row.mean_kl = res.top1, res.fim_top1, res.mean_kl
            row.agreement_positions = res.positions
            del lm, cand
            release_freed_memory(collect=True)
            rows.append(row)
            progress(format_row(row, opt.extra_decode_threads is not None))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if opt.json_out is not None:
        opt.json_out.write_text(
            json.dumps({"options": _jsonable(opt), "rows": [asdict(r) for r in rows]}, indent=1)
        )
    return rows


def _jsonable(opt: QuantBenchOptions) -> dict[str, Any]:
    return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(opt).items()}


def _gib(n: int | None) -> str:
    return "" if n is None else f"{n / 2**30:.1f} GiB"


COLUMNS = (
    "variant",
    "size",
    "quantize (peak RSS)",
    "load",
    "prefill {p}",
    "+{k} on cached {p}",
    "decode {d}",
    "= fp32 greedy",
    "top-1 (FIM)",
    "mean KL",
)


def format_row(r: Row, extra: bool) -> str:
    """One table row. Example: a b32-l4 row -> ``| b32-l4 | 1.24 GB | 181 s (2.3 GiB) | 8.2 s |
    16.1 tok/s | 310 ms (52 tok/s) | 2.63 tok/s | 32/32 | 91.5% (90.4%) | 0.0500 |``."""
    if r.shared_with is not None:
        quant = f"= {r.shared_with}'s"
    elif r.quantize_s is None:
        quant = ""
    else:
        quant = f"{r.quantize_s:.0f} s ({_gib(r.quantize_peak_rss)})"
    decode = f"{r.decode_tok_s:.2f} tok/s"
    if extra and r.extra_decode_tok_s is not None:
        decode += f" ({r.extra_decode_tok_s:.2f})"
    top1 = "" if r.top1 is None else f"{100 * r.top1:.1f}%"
    if r.fim_top1 is not None:
        top1 += f" ({100 * r.fim_top1:.1f}%)"
    cells = [
        r.variant,
        f"{r.size_bytes / 1e9:.2f} GB",
        quant,
        f"{r.load_s:.1f} s",
        f"{r.prefill_tok_s:.1f} tok/s",
        f"{r.keystroke_ms:.0f} ms ({r.keystroke_tok_s:.0f} tok/s)",
        decode,
        "" if r.variant == "fp32" else f"{r.greedy_same}/{len(r.decoded)}",
        top1,
        "" if r.mean_kl is None else f"{r.mean_kl:.4f}",
    ]
    return "| " + " | ".join(cells) + " |"


def format_table(rows: Sequence[Row], o: QuantBenchOptions) -> str:
    """A markdown table, one row per variant, fp32 first, with a header naming the settings."""
    threads, extra_threads = o.threads, o.extra_decode_threads
    head = [c.format(p=o.prompt_tokens, k=o.keystroke_tokens, d=o.decode_tokens) for c in COLUMNS]
    if extra_threads:
        head[6] += f" ({extra_threads} thr)"
    positions = next((r.agreement_positions for r in rows if r.variant != "fp32"), 0)
    lines = [
        f"{threads} threads; agreement over {positions} held-out positions; "
        "= fp32 greedy: leading decode tokens equal to fp32's",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    lines += [format_row(r, extra_threads is not None) for r in rows]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
    )
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
