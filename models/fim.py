"""Fill-in-the-middle prompt templates: which special tokens a model family uses, and how to lay out a
prompt from the text before/after the cursor (plus other files as context)."""

from __future__ import annotations

from collections.abc import Container, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

FimOrder = Literal["psm", "spm"]


@dataclass(frozen=True)
class FimTemplate:
    """The FIM layout of one model family.

    ``order``: "psm" = ``{prefix_tok}{prefix}{suffix_tok}{suffix}{middle_tok}``;
    "spm" = the StarCoder-style variant ``{prefix_tok}{suffix_tok}{suffix}{middle_tok}{prefix}`` (the middle
    continues the prefix, so the prompt's token prefix survives typing at the cursor).
    """

    family: str
    prefix: str
    suffix: str
    middle: str
    eos: tuple[str, ...]
    file_sep: str | None = None
    repo_name: str | None = None
    order: FimOrder = "psm"

    @property
    def special_tokens(self) -> tuple[str, ...]:
        """Every special token string the template uses (the ones a vocab must hold)."""
        toks = [self.prefix, self.suffix, self.middle, *self.eos]
        if self.file_sep:
            toks.append(self.file_sep)
        if self.repo_name:
            toks.append(self.repo_name)
        return tuple(toks)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["eos"] = list(self.eos)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FimTemplate:
        """Build from ``to_dict`` output; raises ValueError naming the bad field."""
        if not isinstance(d, dict):
            raise ValueError("fim must be an object")
        for key in ("family", "prefix", "suffix", "middle"):
            if not isinstance(d.get(key), str) or not d[key]:
                raise ValueError(f"fim.{key} must be a non-empty string")
        eos = d.get("eos")
        if not isinstance(eos, list) or not eos or not all(isinstance(e, str) and e for e in eos):
            raise ValueError("fim.eos must be a non-empty list of strings")
        for key in ("file_sep", "repo_name"):
            if d.get(key) is not None and not isinstance(d[key], str):
                raise ValueError(f"fim.{key} must be a string or null")
        order = d.get("order", "psm")
        if order not in ("psm", "spm"):
            raise ValueError(f"fim.order must be 'psm' or 'spm', not {order!r}")
        return cls(
            family=d["family"],
            prefix=d["prefix"],
            suffix=d["suffix"],
            middle=d["middle"],
            eos=tuple(eos),
            file_sep=d.get("file_sep") or None,
            repo_name=d.get("repo_name") or None,
            order=order,
        )


STARCODER = FimTemplate(
    family="starcoder",
    prefix="<fim_prefix>",
    suffix="<fim_suffix>",
    middle="<fim_middle>",
    eos=("<|endoftext|>",),
    file_sep="<file_sep>",
    repo_name="<repo_name>",
)
QWEN25_CODER = FimTemplate(
    family="qwen2.5-coder",
    prefix="<|fim_prefix|>",
    suffix="<|fim_suffix|>",
    middle="<|fim_middle|>",
    eos=("<|endoftext|>",),
    file_sep="<|file_sep|>",
    repo_name="<|repo_name|>",
)
DEEPSEEK_CODER = FimTemplate(
    family="deepseek-coder",
    prefix="<｜fim▁begin｜>",
    suffix="<｜fim▁hole｜>",
    middle="<｜fim▁end｜>",
    eos=("<｜end▁of▁sentence｜>", "<|EOT|>"),
)
CODELLAMA = FimTemplate(
    family="codellama",
    prefix="<PRE>",
    suffix="<SUF>",
    middle="<MID>",
    eos=("<EOT>", "</s>"),
)
BUNDLED = FimTemplate(
    family="bundled",
    prefix="<fim_prefix>",
    suffix="<fim_suffix>",
    middle="<fim_middle>",
    eos=("<|endoftext|>",),
    file_sep="<file_sep>",
    order="spm",
)

PRESETS: dict[str, FimTemplate] = {
    t.family: t for t in (QWEN25_CODER, DEEPSEEK_CODER, CODELLAMA, STARCODER, BUNDLED)
}

# StarCoder and the bundled tokenizer share the FIM token strings; StarCoder vocabs also hold these.
_STARCODER_MARKERS = ("<fim_pad>", "<repo_name>", "<filename>")


def _required(t: FimTemplate) -> tuple[str, ...]:
    # EOS alternatives: the first one must exist (DeepSeek's <|EOT|> only exists in instruct models).
    toks = [t.prefix, t.suffix, t.middle, t.eos[0]]
    if t.file_sep:
        toks.append(t.file_sep)
    return tuple(toks)


def detect_template(vocab: Container[str]) -> FimTemplate | None:
    """The preset whose FIM tokens ``vocab`` (token strings, e.g. ``tokenizer.get_vocab()``) holds, or
    None. StarCoder and "bundled" share token strings; a vocab with StarCoder's extra specials
    (``<fim_pad>``, ``<repo_name>``, ``<filename>``) is StarCoder, otherwise bundled."""
    for t in (QWEN25_CODER, DEEPSEEK_CODER, CODELLAMA):
        if all(tok in vocab for tok in _required(t)):
            return t
    if all(tok in vocab for tok in (STARCODER.prefix, STARCODER.suffix, STARCODER.middle)):
        if any(m in vocab for m in _STARCODER_MARKERS):
            return STARCODER
        if all(tok in vocab for tok in _required(BUNDLED)):
            return BUNDLED
        return STARCODER
    return None


def fim_prompt_text(
    template: FimTemplate,
    prefix: str,
    suffix: str,
    context_files: Sequence[tuple[str, str]] = (),
) -> str:
    """The FIM prompt for a cursor between ``prefix`` and ``suffix``.

    ``context_files``: (path, text) pairs of other files, placed before the FIM part as
    ``{file_sep}{path}\\n{text}\\n`` each; dropped for families without a file separator.
    Layout follows ``template.order`` (see ``FimTemplate``).
    """
    parts: list[str] = []
    if template.file_sep:
        for path, text in context_files:
            parts.append(f"{template.file_sep}{path}\n{text}")
            if not text.endswith("\n"):
                parts.append("\n")
    if template.order == "spm":
        parts += [template.prefix, template.suffix, suffix, template.middle, prefix]
    else:
        parts += [template.prefix, prefix, template.suffix, suffix, template.middle]
    return "".join(parts)
