"""``specls export``: Hugging Face checkpoint -> verified ONNX model dir. Also hosts ``specls train``
(when ``specls.models.train`` exists)."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="export a Hugging Face causal LM or a GGUF file to an ONNX model dir for specls",
        description="Export a hub id, a local checkpoint dir (config + safetensors + tokenizer.json) or a "
        "GGUF file (dequantized; config and tokenizer from its metadata) to DIR/model.onnx + "
        "tokenizer.json + specls.json, then verify ONNX Runtime against torch.",
    )
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
    p.set_defaults(func=_export_cmd)

    try:
        train = importlib.import_module("specls.models.train")
    except ModuleNotFoundError as exc:
        if exc.name != "specls.models.train":
            raise
        return
    train.register(sub)


class _Bar:
    """A one-line progress bar on stderr."""

    def __init__(self, width: int = 30) -> None:
        self.width = width
        self.tty = sys.stderr.isatty()

    def __call__(self, message: str, fraction: float) -> None:
        filled = int(round(self.width * max(0.0, min(1.0, fraction))))
        line = f"[{'#' * filled}{'-' * (self.width - filled)}] {100 * fraction:3.0f}% {message}"
        if self.tty:
            sys.stderr.write(f"\r\033[K{line}")
            if fraction >= 1.0:
                sys.stderr.write("\n")
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


def _export_cmd(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from specls.decoder.api import EngineError
    from specls.models.export import ExportOptions, export_model, read_report

    options = ExportOptions(
        dtype=args.dtype,
        opset=args.opset,
        verify=not args.no_verify,
        trust_remote_code=args.trust_remote_code,
        fim_family=args.fim_family,
        ort_fusions=args.ort_fusions,
        share_weights=args.share_weights,
        batch_graph=args.batch_graph,
    )
    if args.tolerance is not None:
        field = "fp16_tolerance" if args.dtype == "fp16" else "tolerance"
        options = replace(options, **{field: args.tolerance})
    try:
        out = export_model(args.model, args.out, options, progress=_Bar())
    except EngineError as exc:
        print(f"\nspecls export: {exc}", file=sys.stderr)
        return 1
    report = read_report(out)
    verify = report.get("verify")
    if isinstance(verify, dict):
        diffs = verify.get("max_abs_diff", {})
        agree = verify.get("argmax_agree", {})
        print(f"verify (ONNX Runtime vs torch, max abs logit diff, tolerance {verify.get('tolerance')}):")
        for key, value in diffs.items():
            print(f"  {key:10s} {value:.3g}  argmax agree {agree.get(key, float('nan')):.2f}")
    print(
        f"exported {args.model} -> {out} ({args.dtype}, ort fusions: {report.get('ort_fusions', 'none')}, "
        f"{report.get('export_s', '?')} s)"
    )
    return 0
