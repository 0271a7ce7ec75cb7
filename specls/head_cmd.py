"""``specls head``: give an exported target a feature draft head (``specls.models.feature_head``), or
show the one it has.

    specls head train --model DIR [--from stdlib] [--from ~/my-repo] [--tokens 160000]   # then serve DIR
    specls head show --model DIR

``train`` adds the hidden-state output to the target's graph (in place: logits and KV are
unchanged), runs the target over each code corpus to collect its hidden states and argmaxes (up to
``--tokens`` positions from each), trains the heads (torch: the ``export`` extra) and writes
``DIR/feature_head/``. Serving then drafts with it unless ``--no-feature-head``. The head is short of
data, not of capacity, and code like the code it drafts for teaches it most: give it your
repository beside the standard library. Train it on code the evaluation does not use.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specls.models.feature_head_train import FeatureSet

log = logging.getLogger(__name__)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "head",
        help="train a feature draft head for an exported target, or show its head",
        description="A feature head guesses the target's next tokens from its own hidden state, at a few "
        "percent of a target pass: drafts for code with nothing to copy. Kept in the model's directory.",
    )
    hsub = p.add_subparsers(dest="head_command", metavar="ACTION")
    train = hsub.add_parser("train", help="collect the target's hidden states on a corpus and train")
    train.add_argument("--model", required=True, metavar="DIR", help="the exported target's directory")
    train.add_argument(
        "--from",
        dest="corpus",
        action="append",
        default=None,
        metavar="CORPUS",
        help="stdlib, site-packages or a folder; again for more (default: stdlib)",
    )
    train.add_argument(
        "--tokens", type=int, default=160_000, help="positions of hidden states to collect from each corpus"
    )
    train.add_argument("--heads", type=int, default=4, help="tokens guessed per pass")
    train.add_argument("--vocab", type=int, default=8192, help="the heads' reduced vocabulary")
    train.add_argument("--epochs", type=int, default=3)
    train.add_argument("--threads", type=int, default=0, help="onnxruntime/torch threads (0: auto)")
    train.add_argument(
        "--features",
        default=None,
        metavar="FILE",
        help="keep the collected features here (reused if it exists)",
    )
    show = hsub.add_parser("show", help="the head a target has")
    show.add_argument("--model", required=True, metavar="DIR")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from specls.models.spec import ModelLoadError

    try:
        if args.head_command == "train":
            return _train(args)
        if args.head_command == "show":
            return _show(Path(args.model))
    except ModelLoadError as exc:
        sys.stderr.write(f"specls head: {exc}\n")
        return 2
    sys.stderr.write("specls head: train or show\n")
    return 2


def _show(model_dir: Path) -> int:
    from specls.models.feature_head import HEAD_INFO, has_feature_head, head_dir

    if not has_feature_head(model_dir):
        sys.stdout.write(f"{model_dir}: no feature head (specls head train --model {model_dir})\n")
        return 1
    sys.stdout.write((head_dir(model_dir) / HEAD_INFO).read_text(encoding="utf-8"))
    return 0


def _train(args: argparse.Namespace) -> int:
    try:
        import torch
    except ImportError:
        sys.stderr.write("specls head train needs torch: pip install 'specls[export]'\n")
        return 2
    from specls.model_options import resolve_threads
    from specls.models.feature_head import HeadInfo, head_dir, write_head_graph
    from specls.models.feature_head_train import HeadTraining, projection_rows, train_heads
    from specls.models.hidden_output import add_hidden_output
    from specls.models.spec import load_spec

    say = sys.stderr.write
    model_dir = Path(args.model)
    threads = resolve_threads(args.threads)
    torch.set_num_threads(threads)
    add_hidden_output(model_dir)
    corpora: list[str] = args.corpus or ["stdlib"]
    t0 = time.perf_counter()
    f = _features(args, corpora, model_dir, threads)
    if f is None:
        return 2
    extract_s = time.perf_counter() - t0
    cfg = replace(HeadTraining(), heads=args.heads, vocab=args.vocab, epochs=args.epochs)
    say(f"head: training {cfg.heads} heads on {f.tokens.size} positions\n")

    def trained_one(k: int, accuracy: float) -> None:
        say(f"head: head {k} of {cfg.heads} trained, held-out top-1 {accuracy:.3f}\n")

    trained = train_heads(f, lambda ids: projection_rows(model_dir, ids), cfg, report=trained_one)
    info = HeadInfo(
        heads=cfg.heads,
        vocab=int(trained.ids.size),
        hidden_size=int(f.hidden.shape[1]),
        corpus=",".join(corpora),
        positions=int(f.tokens.size),
        accuracy=tuple(round(a, 4) for a in trained.accuracy),
        train_s=round(extract_s + trained.train_s, 1),
    )
    vocab_size = load_spec(model_dir).vocab_size
    write_head_graph(head_dir(model_dir), trained.blocks, trained.rows, trained.ids, info, vocab_size)
    report = {
        "positions": int(f.tokens.size),
        "extract_s": round(extract_s, 1),
        "train_s": round(trained.train_s, 1),
        "samples": trained.samples,
        "accuracy": [round(a, 4) for a in trained.accuracy],
        "untrained_accuracy": [round(a, 4) for a in trained.base_accuracy],
        "vocab_coverage": round(trained.coverage, 4),
    }
    sys.stdout.write(json.dumps(report) + "\n")
    return 0


def _features(
    args: argparse.Namespace, corpora: list[str], model_dir: Path, threads: int
) -> FeatureSet | None:
    """The FeatureSet to train on: ``--features``'s file when it exists, else collected from each
    corpus (and kept there); None, said on stderr, for an unknown corpus or one without code files."""
    from specls.datastore_cache import corpus_files
    from specls.models.feature_head_train import FeatureSet, extract_features
    from specls.models.runtime import OnnxCausalLM, RuntimeSettings

    say = sys.stderr.write
    features = Path(args.features) if args.features else None
    if features is not None and features.is_file():
        return FeatureSet.load(features)
    try:  # every corpus checked before the first one's minutes of collecting
        files = {corpus: corpus_files(corpus) for corpus in corpora}
    except ValueError as exc:
        say(f"specls head train: {exc}\n")
        return None
    empty = [corpus for corpus, found in files.items() if not found]
    if empty:
        say(f"specls head train: no code files in {', '.join(empty)}\n")
        return None
    lm = OnnxCausalLM(model_dir, RuntimeSettings(threads=threads))
    parts = []
    for corpus in corpora:
        texts = [p.read_text(encoding="utf-8", errors="replace") for p in files[corpus]]
        say(f"head: hidden states from {corpus} ({len(texts)} files), up to {args.tokens} positions\n")

        def collected(n: int, rate: float) -> None:
            left = max(0, args.tokens - n) / max(rate, 1e-9)
            say(f"head: {n} positions ({rate:.0f} a second, at most {left / 60:.0f} min left)\n")

        parts.append(extract_features(lm, texts, lm.tokenizer.encode, args.tokens, report=collected))
    f = parts[0] if len(parts) == 1 else FeatureSet.concat(parts)
    if features is not None:
        f.save(features)
    return f
