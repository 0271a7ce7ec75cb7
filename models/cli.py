"""``specls export``: Hugging Face checkpoint -> verified ONNX model dir. Also hosts ``specls train``
(when ``specls.models.train`` exists)."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="export a Hugging Face causal LM or a GGUF file to an ONNX model dir for specls",
        description="Export a hub id, a local checkpoint dir (config + safetensors + tokenizer.json) or a "
        "GGUF file (dequantized; config and tokenizer from its metadata) to DIR/model.onnx + "
        "tokenizer.json + specls.json, then verify ONNX Runtime against torch.",
    )
    _add_source_args(p)
    _add_output_args(p)
    p.set_defaults(func=_export_cmd)

    try:
        train = importlib.import_module("specls.models.train")
    except ModuleNotFoundError as exc:
        if exc.name != "specls.models.train":
            raise
        return
    train.register(sub)


def _add_source_args(p: argparse.ArgumentParser) -> None:
    """What to export and how to trace and check it."""
    p.add_argument(
        "model", help="Hugging Face hub id, local checkpoint directory, FILE.gguf, or a directory holding one"
    )
    p.add_argument("--out", required=True, type=Path, help="output directory")
    p.add_argument("--dtype", choices=("fp32", "fp16"), default="fp32")
    p.add_argument("--opset", type=int, default=18)
    p.add_argument("--trust-remote-code", action="store_true", help="allow the checkpoint's own model code")
    p.add_argument("--no-verify", action="store_true", help="skip the ONNX Runtime vs torch check")
    p.add_argument("--tolerance", type=float, default=None, help="max abs logit diff allowed by verify")
    p.add_argument(
        "--ort-fusions",
        choices=("auto", "cpu", "cuda", "none"),
        default="auto",
        help="fuse into ONNX Runtime ops for a provider (auto: cpu for fp32, cuda for fp16; none: plain graph)",
    )
    p.add_argument(
        "--fim-family",
        default=None,
        help="FIM template preset (qwen2.5-coder, starcoder, deepseek-coder, codellama, bundled), or none "
        "for prefix-only prompts (default: detect from the vocab; a model without FIM tokens gets "
        "prefix-only prompts)",
    )


def _add_output_args(p: argparse.ArgumentParser) -> None:
    """What the model directory holds: shared weights, a batch graph, quantization, the draft head."""
    p.add_argument(
        "--share-weights",
        action="store_true",
        help="one copy of the weights: copy the checkpoint's model.safetensors (+ config) into DIR and "
        "make the graph(s) read their initializers from it",
    )
    p.add_argument(
        "--batch-graph",
        action="store_true",
        help="fused exports: also write model.batch.onnx (plain graph, dynamic batch) for batched passes",
    )
    p.add_argument(
        "--quantize",
        choices=("auto", "int4", "int8", "none"),
        default="auto",
        help="quantization of every MatMul with a constant weight (LM head included): int8 = per-channel "
        "int8 weights x per-row int8 activations (MatMulIntegerToFloat; fp32 graphs), int4 = ONNX Runtime's "
        "MatMulNBits (auto: int8 for --dtype fp32, the CPU graph, for models of 50M+ weights; none for fp16, "
        "the CUDA graph). A quantized graph "
        "must agree with the unquantized one on held-out code or the export fails",
    )
    p.add_argument(
        "--draft-head",
        choices=("full", "ascii"),  # models.head.DRAFT_HEADS (not imported: this parser loads no numpy)
        default="full",
        help="ascii: the LM head scores only ASCII and added tokens (a draft model's option: cheaper "
        "steps, and the target still checks every token); never for a target",
    )
    p.add_argument(
        "--keep-embedding",
        action="store_true",
        help="keep the embedding table in the graph's dtype instead of GatherBlockQuantized (4 bits)",
    )
    p.add_argument(
        "--agreement-floor",
        type=float,
        default=None,
        help="lowest top-1 agreement (0..1) of a quantized graph with the unquantized one "
        f"(default: {_default_floor():.2f})",
    )
    p.add_argument(
        "--log",
        type=Path,
        default=None,
        help="where the export's warnings and details go (default: DIR.export.log beside DIR)",
    )


def _default_floor() -> float:
    from specls.models.agreement import AgreementOptions

    return AgreementOptions().min_top1


class _Bar:
    """A one-line progress bar on ``stream`` (stderr by default)."""

    def __init__(self, width: int = 30, stream: TextIO | None = None) -> None:
        self.width = width
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()

    def __call__(self, message: str, fraction: float) -> None:
        filled = int(round(self.width * max(0.0, min(1.0, fraction))))
        line = f"[{'#' * filled}{'-' * (self.width - filled)}] {100 * fraction:3.0f}% {message}"
        if self.tty:
            self.stream.write(f"\r\033[K{line}")
            if fraction >= 1.0:
                self.stream.write("\n")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


@contextlib.contextmanager
def _quiet_into(log_path: Path) -> Iterator[TextIO]:
    """Send everything the export prints (torch.export's warnings, onnxscript's progress, ORT's
    quantizer logs, Python warnings and our own log records) into ``log_path``; yields a stream on
    the original stderr for the progress bar. The file descriptors themselves are redirected, so
    output of C++ code and of print() goes there too."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    try:  # the real stderr: the bar writes to a copy of its descriptor, which stays the terminal
        bar_stream: TextIO = os.fdopen(os.dup(sys.stderr.fileno()), "w", buffering=1)
        own_bar = True
    except (AttributeError, OSError, ValueError):  # a replaced sys.stderr (tests): write to it
        bar_stream, own_bar = sys.stderr, False
    saved = os.dup(1), os.dup(2)
    root = logging.getLogger()
    old_level, old_handlers = root.level, list(root.handlers)
    with log_path.open("w", buffering=1) as log_file:
        handler = logging.StreamHandler(log_file)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        for h in old_handlers:
            root.removeHandler(h)
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        logging.captureWarnings(True)
        os.dup2(log_file.fileno(), 1)
        os.dup2(log_file.fileno(), 2)
        try:
            yield bar_stream
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            logging.captureWarnings(False)
            for h in list(root.handlers):
                root.removeHandler(h)
            for h in old_handlers:
                root.addHandler(h)
            root.setLevel(old_level)
            if own_bar:
                bar_stream.close()


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


def _dir_bytes(d: Path) -> int:
    return sum(f.stat().st_size for f in d.iterdir() if f.is_file())


def _export_cmd(args: argparse.Namespace) -> int:
    import resource
    from dataclasses import replace

    from specls.models.agreement import AgreementOptions
    from specls.models.export import ExportOptions, export_model, read_report

    from specls.api import EngineError

    options = ExportOptions(
        dtype=args.dtype,
        opset=args.opset,
        verify=not args.no_verify,
        trust_remote_code=args.trust_remote_code,
        fim_family=args.fim_family,
        ort_fusions=args.ort_fusions,
        share_weights=args.share_weights,
        batch_graph=args.batch_graph,
        quantize=args.quantize,
        quantize_embedding=not args.keep_embedding,
        draft_head=args.draft_head,
    )
    if args.tolerance is not None:
        field = "fp16_tolerance" if args.dtype == "fp16" else "tolerance"
        options = replace(options, **{field: args.tolerance})
    if args.agreement_floor is not None:
        options = replace(options, agreement=AgreementOptions(min_top1=args.agreement_floor))
    out = Path(args.out)
    log_path = args.log or out.with_name(f"{out.name}.export.log")
    try:
        with _quiet_into(log_path) as bar_stream:
            export_model(args.model, out, options, progress=_Bar(stream=bar_stream))
    except EngineError as exc:
        print(f"\nspecls export: {exc}\n(details: {log_path})", file=sys.stderr)
        return 1
    report = read_report(out)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    parts = [report.get("quantize", "none"), args.dtype, f"fusions {report.get('ort_fusions', 'none')}"]
    parts += [
        f"{_dir_bytes(out) / 1e9:.2f} GB on disk",
        f"{report.get('export_s', '?')} s",
        f"peak RSS {_gb(peak)}",
    ]
    verify = report.get("verify")
    if isinstance(verify, dict):
        diffs = verify.get("max_abs_diff", {})
        each = ", ".join(f"{k} {v:.2g}" for k, v in diffs.items())
        parts.append(f"vs torch max |Δlogit| {max(diffs.values(), default=float('nan')):.2g} ({each})")
    agree = report.get("agreement")
    if isinstance(agree, dict):
        parts.append(
            f"vs unquantized: top-1 {100 * agree['top1']:.1f}%, KL {agree['mean_kl']:.4f}, "
            f"|Δlogit| {agree['mean_abs_dlogit']:.3f} over {agree['positions']} positions"
        )
    print(f"exported {args.model} -> {out} ({'; '.join(parts)}); log: {log_path}")
    return 0
