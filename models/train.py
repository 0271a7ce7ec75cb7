"""Train the bundled code-model pair (target + draft, same tokenizer, same batches) on the stdlib.

``python -m specls.models.train --out runs/pair`` or ``specls train --out runs/pair``; ``--resume``
continues from ``OUT/state.pt``. When done (or with ``--finalize-only``) the weights are rounded to
fp16-representable values, saved as Hugging Face checkpoints into ``models/bundled/{target,draft}`` and
exported to ONNX in the same directories, the graphs reading their weights from the checkpoint's
``model.safetensors`` (one copy of the weights; the target also gets a dynamic-batch ``model.batch.onnx``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from specls.models import data as D

if TYPE_CHECKING:
    import torch
    from tokenizers import Tokenizer
    from transformers import LlamaForCausalLM

log = logging.getLogger(__name__)

MODELS_DIR = Path(__file__).resolve().parent
DEFAULT_BUNDLED = MODELS_DIR / "bundled"


@dataclass(frozen=True)
class ModelShape:
    """A LlamaForCausalLM's size."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    max_positions: int = 1024


TARGET_SHAPE = ModelShape(hidden=320, layers=8, heads=8, kv_heads=4, intermediate=864)
DRAFT_SHAPE = ModelShape(hidden=128, layers=2, heads=4, kv_heads=2, intermediate=320)


@dataclass(frozen=True)
class TrainOptions:
    """One training run. ``max_tokens`` is the token budget (steps = max_tokens // (batch * seq_len))."""

    out_dir: Path
    corpus_root: Path | None = None  # None = the running interpreter's stdlib
    max_files: int | None = None  # use only the first N training files (tests)
    vocab_size: int = 8192
    seq_len: int = 512
    batch_size: int = 4
    max_tokens: int = 1_200_000
    lr: float = 2e-3  # target
    draft_lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 30
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 1234
    save_every: int = 100
    threads: int = 2
    resume: bool = False
    stop_after: int | None = None  # stop (after checkpointing) at this step, as if interrupted
    # Wall-clock budget: the cosine follows max(step fraction, time fraction) and training stops when
    # either reaches 1 (not bit-for-bit reproducible; None = the token budget alone decides).
    time_budget_s: float | None = None
    # Long-context phase: once the cosine is past ``1 - long_frac``, batches are rows of
    # ``seq_len * long_factor`` tokens (consecutive packed rows joined; ``batch_size // long_factor``
    # of them, same tokens per step) so positions up to the model's context are trained too.
    long_factor: int = 2
    long_frac: float = 0.25
    target: ModelShape = TARGET_SHAPE
    draft: ModelShape = DRAFT_SHAPE
    data: D.DataOptions = field(default_factory=D.DataOptions)
    progress: bool = True

    @property
    def steps(self) -> int:
        return max(1, self.max_tokens // (self.batch_size * self.seq_len))


@dataclass(frozen=True)
class TrainReport:
    steps: int
    tokens_seen: int
    wall_s: float
    tokens_per_s: float
    target_params: int
    draft_params: int
    target_loss: float  # mean loss over the last ``min(20, steps)`` steps
    draft_loss: float
    first_target_loss: float
    first_draft_loss: float
    corpus_tokens: int
    long_steps: int = 0  # steps run on long-context rows

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------------------------
# Tokenizer and data
# ---------------------------------------------------------------------------------------------


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """Byte-level BPE with the bundled special tokens (ids 0..5 in ``data.SPECIAL_TOKENS`` order), no BOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(D.SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def prepare_data(options: TrainOptions) -> tuple[Tokenizer, np.ndarray]:
    """The tokenizer and packed rows int32 [n_rows, seq_len], cached in ``out_dir``."""
    from tokenizers import Tokenizer

    out = options.out_dir
    out.mkdir(parents=True, exist_ok=True)
    tok_path, rows_path = out / "tokenizer.json", out / "rows.npy"
    if tok_path.exists() and rows_path.exists():
        return Tokenizer.from_file(str(tok_path)), np.load(rows_path)
    split = D.split_corpus(options.corpus_root)
    files = split.train[: options.max_files] if options.max_files else split.train
    docs = list(D.iter_documents(files, split.root))
    if not docs:
        raise ValueError(f"no training documents under {split.root}")
    t0 = time.perf_counter()
    tok = train_tokenizer((text for _, text in docs), options.vocab_size)
    log.info("tokenizer trained in %.1fs (%d tokens)", time.perf_counter() - t0, tok.get_vocab_size())
    samples = list(D.make_samples(iter(docs), options.data))
    encoded = tok.encode_batch(samples, add_special_tokens=False)
    rows = D.pack([e.ids for e in encoded], options.seq_len)
    if len(rows) == 0:
        raise ValueError("corpus too small for one sequence")
    tok.save(str(tok_path))
    np.save(rows_path, rows)
    log.info("%d samples -> %d rows of %d tokens", len(samples), len(rows), options.seq_len)
    return tok, rows


def batch_indices(step: int, batch_size: int, n_rows: int, seed: int) -> np.ndarray:
    """Row indices of batch ``step``: a fresh seeded permutation of all rows every epoch."""
    start = step * batch_size
    out = np.empty(batch_size, dtype=np.int64)
    for i in range(batch_size):
        epoch, pos = divmod(start + i, n_rows)
        perm = np.random.default_rng([seed, epoch]).permutation(n_rows)
        out[i] = perm[pos]
    return out


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------


def llama_config(shape: ModelShape, vocab_size: int) -> Any:
    from transformers import LlamaConfig

    eot, pad = D.SPECIAL_TOKENS.index(D.EOT), D.SPECIAL_TOKENS.index(D.PAD)
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=shape.max_positions,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eot,
        pad_token_id=pad,
        attention_dropout=0.0,
    )


def count_params(model: torch.nn.Module) -> int:
    """Unique parameters (tied embeddings counted once)."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def params_from_config(cfg: dict[str, Any]) -> int:
    """Parameter count of a Llama config dict (config.json), without building the model."""
    h, inter, n_layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or h // heads
    attn = h * heads * head_dim * 2 + h * kv * head_dim * 2
    layer = attn + 3 * h * inter + 2 * h
    emb = cfg["vocab_size"] * h
    lm_head = 0 if cfg.get("tie_word_embeddings", False) else emb
    return emb + lm_head + n_layers * layer + h


def lr_at(step: int, decay_frac: float, peak: float, warmup: int, min_ratio: float) -> float:
    """Linear warmup over ``warmup`` steps, then cosine decay to ``peak * min_ratio`` as ``decay_frac``
    goes from 0 to 1."""
    if step < warmup:
        return peak * (step + 1) / warmup
    t = min(1.0, max(0.0, decay_frac))
    return peak * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def decay_fraction(step: int, total: int, warmup: int, wall_s: float, time_budget_s: float | None) -> float:
    """How far the cosine has gone: by steps, or by wall time when a time budget is set (whichever is
    further), so a run on a contended machine still ends at a low learning rate."""
    frac = (step - warmup) / max(1, total - warmup)
    if time_budget_s is not None and time_budget_s > 0:
        frac = max(frac, wall_s / time_budget_s)
    return frac


def _optimizer(model: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    import torch

    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for p in model.parameters():
        (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8)


# ---------------------------------------------------------------------------------------------
# Training loop
# ---------------------------------------------------------------------------------------------


class _Progress:
    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled = total, enabled

    def update(self, step: int, text: str) -> None:
        if not self.enabled:
            return
        width = 30
        done = int(width * step / self.total)
        bar = "#" * done + "-" * (width - done)
        sys.stderr.write(f"\r[{bar}] {step}/{self.total} {text}")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _save_state(path: Path, state: dict[str, Any]) -> None:
    import torch

    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


@dataclass
class _Pair:
    """Target and draft with their optimizers, and the run so far (what ``state.pt`` holds)."""

    target: Any  # LlamaForCausalLM
    draft: Any
    opt_target: Any  # torch.optim.Optimizer
    opt_draft: Any
    start_step: int = 0
    prior_wall: float = 0.0  # seconds trained before this process (a resumed run)
    history: list[tuple[float, float]] = field(default_factory=list)  # (target, draft) loss per step


def _new_pair(options: TrainOptions) -> _Pair:
    """Fresh target and draft, or with ``resume`` the ones saved in ``out_dir/state.pt``."""
    import torch
    from transformers import LlamaForCausalLM

    vocab = options.vocab_size
    target = LlamaForCausalLM(llama_config(options.target, vocab))
    draft = LlamaForCausalLM(llama_config(options.draft, vocab))
    pair = _Pair(
        target,
        draft,
        _optimizer(target, options.lr, options.weight_decay),
        _optimizer(draft, options.draft_lr, options.weight_decay),
    )
    state_path = options.out_dir / "state.pt"
    if options.resume and state_path.exists():
        state = torch.load(state_path, weights_only=False)
        target.load_state_dict(state["target"])
        draft.load_state_dict(state["draft"])
        pair.opt_target.load_state_dict(state["opt_target"])
        pair.opt_draft.load_state_dict(state["opt_draft"])
        pair.start_step, pair.prior_wall = int(state["step"]), float(state["wall_s"])
        pair.history = [tuple(h) for h in state["history"]]  # type: ignore[misc]
        log.info("resumed at step %d", pair.start_step)
    return pair


class _Batches:
    """Each step's batch: rows of ``seq_len``, or in the last ``long_frac`` of the decay rows
    ``long_factor`` times longer (fewer of them: the same tokens per step)."""

    def __init__(self, rows: np.ndarray, options: TrainOptions) -> None:
        import torch

        self.options = options
        self.rows = torch.from_numpy(rows.astype(np.int64))  # [n_rows, seq_len]
        self.factor = max(1, options.long_factor)
        self.n_long = len(rows) // self.factor
        self.long_rows = self.rows[: self.n_long * self.factor].reshape(
            self.n_long, options.seq_len * self.factor
        )
        self.long_batch = max(1, options.batch_size // self.factor)
        self.use_long = options.long_frac > 0 and self.factor > 1 and self.n_long >= 1
        self.long_steps = 0

    def at(self, step: int, frac: float) -> torch.Tensor:
        import torch

        o = self.options
        if self.use_long and frac >= 1.0 - o.long_frac:
            idx = torch.from_numpy(batch_indices(step, self.long_batch, self.n_long, o.seed))
            self.long_steps += 1
            return self.long_rows[idx]  # [batch / factor, seq_len * factor]
        idx = torch.from_numpy(batch_indices(step, o.batch_size, len(self.rows), o.seed))
        return self.rows[idx]  # [batch, seq_len]


def _step(
    pair: _Pair, batch: torch.Tensor, step: int, frac: float, options: TrainOptions
) -> tuple[float, float]:
    """One optimizer step of each model on ``batch``; returns (target loss, draft loss)."""
    import torch

    losses = []
    for model, opt, peak in (
        (pair.target, pair.opt_target, options.lr),
        (pair.draft, pair.opt_draft, options.draft_lr),
    ):
        lr = lr_at(step, frac, peak, options.warmup_steps, options.min_lr_ratio)
        for g in opt.param_groups:
            g["lr"] = lr
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), options.grad_clip)
        opt.step()
        losses.append(float(loss.detach()))
    return losses[0], losses[1]


def _checkpoint(pair: _Pair, step: int, wall_s: float, options: TrainOptions) -> None:
    _save_state(
        options.out_dir / "state.pt",
        {
            "step": step,
            "wall_s": wall_s,
            "target": pair.target.state_dict(),
            "draft": pair.draft.state_dict(),
            "opt_target": pair.opt_target.state_dict(),
            "opt_draft": pair.opt_draft.state_dict(),
            "history": pair.history,
            "target_shape": dataclasses.asdict(options.target),
            "draft_shape": dataclasses.asdict(options.draft),
            "vocab_size": options.vocab_size,
            "options": repr(options),
        },
    )


def train(options: TrainOptions) -> TrainReport:
    """Train target and draft on the same batches; checkpoints to ``out_dir/state.pt``."""
    import torch

    torch.set_num_threads(options.threads)
    torch.manual_seed(options.seed)
    _tok, rows = prepare_data(options)
    pair = _new_pair(options)
    pair.target.train()
    pair.draft.train()
    total = options.steps
    tokens_per_step = options.batch_size * options.seq_len
    progress = _Progress(total, options.progress)
    t0 = time.perf_counter()
    batches = _Batches(rows, options)
    end = total if options.stop_after is None else min(total, options.stop_after)
    for step in range(pair.start_step, end):
        frac = decay_fraction(
            step,
            total,
            options.warmup_steps,
            pair.prior_wall + time.perf_counter() - t0,
            options.time_budget_s,
        )
        batch = batches.at(step, frac)
        losses = _step(pair, batch, step, frac, options)
        pair.history.append(losses)
        elapsed = time.perf_counter() - t0
        tps = (step + 1 - pair.start_step) * tokens_per_step / max(elapsed, 1e-9)
        progress.update(
            step + 1,
            f"loss T {losses[0]:.3f} D {losses[1]:.3f} {tps:,.0f} tok/s len {batch.shape[1]} lr-frac {frac:.2f}",
        )
        out_of_time = options.time_budget_s is not None and pair.prior_wall + elapsed >= options.time_budget_s
        if (step + 1) % options.save_every == 0 or step + 1 == end or out_of_time:
            _checkpoint(pair, step + 1, pair.prior_wall + elapsed, options)
        if out_of_time:
            log.info("time budget reached after step %d", step + 1)
            end = step + 1
            break
    progress.close()
    wall = pair.prior_wall + (time.perf_counter() - t0)
    report = _report(pair, end, tokens_per_step, wall, rows, batches.long_steps)
    (options.out_dir / "report.json").write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    return report


def _report(
    pair: _Pair, end: int, tokens_per_step: int, wall: float, rows: np.ndarray, long_steps: int
) -> TrainReport:
    history = pair.history
    tail = history[-min(20, len(history)) :] if history else [(float("nan"), float("nan"))]
    return TrainReport(
        steps=end,
        tokens_seen=end * tokens_per_step,
        wall_s=wall,
        tokens_per_s=end * tokens_per_step / max(wall, 1e-9),
        target_params=count_params(pair.target),
        draft_params=count_params(pair.draft),
        target_loss=float(np.mean([h[0] for h in tail])),
        draft_loss=float(np.mean([h[1] for h in tail])),
        first_target_loss=history[0][0] if history else float("nan"),
        first_draft_loss=history[0][1] if history else float("nan"),
        corpus_tokens=int(rows.size),
        long_steps=long_steps,
    )


def load_trained(out_dir: Path) -> tuple[LlamaForCausalLM, LlamaForCausalLM, dict[str, Any]]:
    """Target and draft from ``out_dir/state.pt`` (shapes and vocab as saved in the state)."""
    import torch
    from transformers import LlamaForCausalLM

    state = torch.load(out_dir / "state.pt", weights_only=False)
    models = []
    for key in ("target", "draft"):
        model = LlamaForCausalLM(llama_config(ModelShape(**state[f"{key}_shape"]), state["vocab_size"]))
        model.load_state_dict(state[key])
        models.append(model)
    return models[0], models[1], state


# ---------------------------------------------------------------------------------------------
# fp16 rounding, HF checkpoints, ONNX export
# ---------------------------------------------------------------------------------------------


def round_to_fp16(model: torch.nn.Module) -> None:
    """Round every weight to the nearest fp16-representable value (stays fp32)."""
    import torch

    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.float16).to(torch.float32))


def save_checkpoint(model: LlamaForCausalLM, tokenizer_file: Path, out_dir: Path) -> Path:
    """HF checkpoint: fp16 safetensors (exact after :func:`round_to_fp16`), config with dtype float32,
    tokenizer files, generation config."""
    import copy

    from transformers import GenerationConfig, PreTrainedTokenizerFast

    out_dir.mkdir(parents=True, exist_ok=True)
    half = copy.deepcopy(model)
    half.half()
    half.generation_config = GenerationConfig(
        eos_token_id=model.config.eos_token_id, pad_token_id=model.config.pad_token_id
    )
    half.save_pretrained(out_dir, safe_serialization=True)
    cfg_path = out_dir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["dtype"] = "float32"
    cfg["torch_dtype"] = "float32"
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    tok = PreTrainedTokenizerFast(
        tokenizer_file=str(tokenizer_file),
        eos_token=D.EOT,
        pad_token=D.PAD,
        additional_special_tokens=[D.FIM_PREFIX, D.FIM_MIDDLE, D.FIM_SUFFIX, D.FILE_SEP],
    )
    tok.model_max_length = model.config.max_position_embeddings
    tok.save_pretrained(out_dir)
    return out_dir


def export_pair(bundled: Path) -> list[Path]:
    """Export the HF checkpoints in ``bundled/{target,draft}`` in place (fp32 ONNX, verified), the graphs
    reading their weights from the checkpoint's model.safetensors; the target also gets the
    dynamic-batch model.batch.onnx. Same as ``specls export DIR --out DIR --share-weights
    [--batch-graph] --fim-family bundled``."""
    from specls.models.export import ExportOptions, export_model

    outs = []
    for name in ("target", "draft"):
        options = ExportOptions(fim_family="bundled", share_weights=True, batch_graph=name == "target")
        outs.append(export_model(_source_name(bundled / name), bundled / name, options))
    return outs


def _source_name(path: Path) -> str:
    """``path`` relative to the working directory when it is under it (what export.json records)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def finalize(out_dir: Path, bundled: Path, export: bool = True) -> None:
    """fp16-round the trained pair from ``out_dir``, save HF checkpoints to ``bundled/{target,draft}``,
    export them to ONNX there (unless ``export`` is False)."""
    target, draft, _state = load_trained(out_dir)
    for name, model in (("target", target), ("draft", draft)):
        round_to_fp16(model)
        save_checkpoint(model, out_dir / "tokenizer.json", bundled / name)
        log.info("saved %s checkpoint to %s", name, bundled / name)
    if export:
        try:
            paths = export_pair(bundled)
        except ImportError as exc:
            log.warning("export unavailable (%s); ONNX pair not written", exc)
        else:
            log.info("exported %s", ", ".join(str(p) for p in paths))


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------


def _add_train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, required=True, help="run directory (state.pt, tokenizer, data cache)")
    p.add_argument("--max-tokens", type=int, default=TrainOptions.max_tokens)
    p.add_argument("--batch-size", type=int, default=TrainOptions.batch_size)
    p.add_argument("--seq-len", type=int, default=TrainOptions.seq_len)
    p.add_argument("--save-every", type=int, default=TrainOptions.save_every)
    p.add_argument("--warmup-steps", type=int, default=TrainOptions.warmup_steps)
    p.add_argument("--lr", type=float, default=TrainOptions.lr, help="target peak learning rate")
    p.add_argument("--draft-lr", type=float, default=TrainOptions.draft_lr, help="draft peak learning rate")
    p.add_argument("--time-budget", type=float, default=None, help="wall-clock seconds (see TrainOptions)")
    p.add_argument("--threads", type=int, default=TrainOptions.threads)
    p.add_argument("--seed", type=int, default=TrainOptions.seed)
    p.add_argument("--max-files", type=int, default=None)
    p.add_argument("--resume", action="store_true")
    p.add_argument(
        "--bundled",
        type=Path,
        default=DEFAULT_BUNDLED,
        help="HF checkpoints + ONNX graphs go to DIR/{target,draft}",
    )
    p.add_argument("--no-export", action="store_true", help="save HF checkpoints only")
    p.add_argument("--finalize-only", action="store_true", help="skip training; finalize OUT/state.pt")


def _run_train(args: argparse.Namespace) -> int:
    options = TrainOptions(
        out_dir=args.out,
        max_tokens=args.max_tokens,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        save_every=args.save_every,
        warmup_steps=args.warmup_steps,
        lr=args.lr,
        draft_lr=args.draft_lr,
        time_budget_s=args.time_budget,
        threads=args.threads,
        seed=args.seed,
        max_files=args.max_files,
        resume=args.resume,
    )
    if not args.finalize_only:
        report = train(options)
        print(json.dumps(report.to_dict(), indent=2))
    finalize(args.out, args.bundled, export=not args.no_export)
    return 0


def _run_eval(args: argparse.Namespace) -> int:
    from specls.models.evaluate import EvalOptions, evaluate

    result = evaluate(
        EvalOptions(
            target=args.target,
            draft=args.draft,
            tokens=args.tokens,
            seed=args.seed,
            window=args.window,
            backend=args.backend,
            threads=args.threads,
        )
    )
    print(json.dumps(result.to_dict(), indent=2))
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("train", help="train the bundled target/draft pair on the stdlib")
    _add_train_args(p)
    p.set_defaults(func=_run_train)
    e = sub.add_parser("eval", help="held-out next-token accuracy of the bundled pair")
    e.add_argument("--target", type=Path, default=DEFAULT_BUNDLED / "target")
    e.add_argument("--draft", type=Path, default=DEFAULT_BUNDLED / "draft")
    e.add_argument("--tokens", type=int, default=100_000, help="scored positions")
    e.add_argument("--window", type=int, default=512)
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--backend", choices=("onnx", "torch"), default="onnx")
    e.add_argument("--threads", type=int, default=2)
    e.set_defaults(func=_run_eval)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specls.models.train", description=__doc__)
    _add_train_args(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return _run_train(args)


if __name__ == "__main__":
    sys.exit(main())
