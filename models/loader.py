"""Where models live: the bundled target/draft pair shipped as package data, or a directory given by the
user; loading, and the check that a target/draft pair shares a tokenizer."""

from __future__ import annotations

import logging
from pathlib import Path

from specls.models.runtime import OnnxCausalLM, RuntimeSettings
from specls.models.spec import SPEC_FILE, ModelLoadError

log = logging.getLogger(__name__)

ROLES = ("target", "draft")


def bundled_dir(role: str) -> Path:
    """``specls/models/bundled/<role>/`` (repo: ``models/bundled/<role>/``)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, not {role!r}")
    return Path(__file__).resolve().parent / "bundled" / role


def resolve_model_dir(arg: str | None, role: str) -> Path:
    """The model dir for ``role``: ``arg`` when given, else the bundled one. Raises ModelLoadError
    when it is not a directory with a specls.json (the full validation happens in ``load_model``)."""
    if arg is None or not str(arg).strip():
        d = bundled_dir(role)
        if not (d / SPEC_FILE).is_file():
            raise ModelLoadError(
                f"{d / SPEC_FILE}: the bundled {role} model is missing (train/export it, or pass a model "
                f"directory made by `specls export`)"
            )
        return d
    d = Path(arg).expanduser()
    if not d.is_dir():
        raise ModelLoadError(f"{d}: {role} model directory does not exist")
    return d


def load_model(path: str | Path, settings: RuntimeSettings | None = None) -> OnnxCausalLM:
    return OnnxCausalLM(Path(path), settings or RuntimeSettings())


def check_pair(target: OnnxCausalLM, draft: OnnxCausalLM) -> None:
    """A draft must share the target's tokenizer (same token -> id map); its logits may be narrower or
    wider than the target's (padded vocabularies), which the decoder aligns."""
    tv, dv = target.tokenizer.get_vocab(), draft.tokenizer.get_vocab()
    if tv != dv:
        only_t = len(tv.keys() - dv.keys())
        only_d = len(dv.keys() - tv.keys())
        moved = sum(1 for k in tv.keys() & dv.keys() if tv[k] != dv[k])
        raise ModelLoadError(
            f"{draft.model_dir / draft.spec.tokenizer_file}: the draft's tokenizer differs from the target's "
            f"({target.model_dir / target.spec.tokenizer_file}): {only_t} tokens only in the target, "
            f"{only_d} only in the draft, {moved} with different ids; a draft model must use the same tokenizer"
        )
    if target.vocab_size != draft.vocab_size:
        log.info("target logits width %d, draft %d (same tokenizer)", target.vocab_size, draft.vocab_size)
    if target.head_ids is not None:
        log.warning(
            "%s: the target has a reduced LM head (%d of %d tokens; `--draft-head` is a draft model's "
            "option): completions can only use those tokens; re-export the target without it",
            target.model_dir,
            target.logits_width,
            target.vocab_size,
        )


def load_pair(
    target_arg: str | None, draft_arg: str | None, settings: RuntimeSettings | None = None
) -> tuple[OnnxCausalLM, OnnxCausalLM]:
    """Resolve, load and check a target/draft pair (None = bundled)."""
    target = load_model(resolve_model_dir(target_arg, "target"), settings)
    draft = load_model(resolve_model_dir(draft_arg, "draft"), settings)
    check_pair(target, draft)
    return target, draft
