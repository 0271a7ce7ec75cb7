"""Fill-in-the-middle prompt templates: which special tokens a model family uses, how to find the
family from a vocabulary, how to lay out a prompt from the text before/after the cursor (plus other
files as context), and the prompt facts of a loaded model (``prompt_facts``). A model without FIM
tokens gets prefix-only prompts."""

from __future__ import annotations

from collections.abc import Container, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from specls.models.tokenizer import Tokenizer

from specls.prompt import FimTokens, PromptBudget, default_budget, fim_tokens_from_template

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

# ``--fim-family none`` (ExportOptions.fim_family): no FIM template even when the vocab holds one;
# specls.json then says ``"fim": null`` and the engine builds prefix-only prompts.
NO_FIM = "none"


def fit_template(t: FimTemplate, vocab: Container[str]) -> FimTemplate:
    """``t`` with what ``vocab`` lacks of its optional parts dropped: the file separator and repo name
    (None when absent) and the EOS alternatives (only the present ones, unless none is)."""
    eos = tuple(e for e in t.eos if e in vocab) or t.eos
    return replace(
        t,
        eos=eos,
        file_sep=t.file_sep if t.file_sep and t.file_sep in vocab else None,
        repo_name=t.repo_name if t.repo_name and t.repo_name in vocab else None,
    )


def _has_triple(t: FimTemplate, vocab: Container[str]) -> bool:
    return all(tok in vocab for tok in (t.prefix, t.suffix, t.middle))


def detect_template(vocab: Container[str]) -> FimTemplate | None:
    """The preset whose three FIM tokens (prefix, suffix, middle) ``vocab`` (token strings, e.g.
    ``tokenizer.get_vocab()``) holds, fitted to it (``fit_template``: file separator, repo name and
    EOS alternatives are optional), or None: the model gets prefix-only prompts.

    StarCoder and "bundled" share token strings: a vocab with StarCoder's extra specials
    (``<fim_pad>``, ``<repo_name>``, ``<filename>``) is StarCoder; one with the bundled tokenizer's
    file separator and EOS (and none of those) is bundled; any other is StarCoder.

    Example: ``{"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|endoftext|>"}`` (a Qwen2
    checkpoint without ``<|file_sep|>``) -> qwen2.5-coder with ``file_sep=None``; SmolLM2's vocab
    (``<file_sep>``, ``<repo_name>`` but no ``<fim_prefix>``) -> None.
    """
    for t in (QWEN25_CODER, DEEPSEEK_CODER, CODELLAMA):
        if _has_triple(t, vocab):
            return fit_template(t, vocab)
    if _has_triple(STARCODER, vocab):
        if any(m in vocab for m in _STARCODER_MARKERS):
            return fit_template(STARCODER, vocab)
        if all(tok in vocab for tok in BUNDLED.special_tokens):
            return BUNDLED
        return fit_template(STARCODER, vocab)
    return None


@dataclass(frozen=True)
class PromptFacts:
    """What the engine's prompts need to know about one model, resolved when it loads."""

    family: str  # the FIM family, or NO_FIM: prefix-only prompts
    fim: FimTokens | None  # None: prefix-only
    eos_ids: frozenset[int]
    budget: PromptBudget
    # tokens the model's own tokenizer puts before a text (BOS for Llama-2-style sentencepiece
    # vocabularies; nothing for byte-level BPE ones such as Qwen, SmolLM2 or the bundled pair)
    start_ids: tuple[int, ...] = ()


def prompt_facts(
    template: FimTemplate | None,
    eos_token_ids: Sequence[int],
    max_context: int,
    tokenizer: Tokenizer,
) -> PromptFacts:
    """The prompt layout of a model from its ``specls.json`` facts (``fim``, ``eos_token_ids``,
    ``max_context``) and its tokenizer.

    ``template`` None means prefix-only (the export found no FIM tokens, or ``--fim-family none``);
    the vocab is not searched again. Stops: the model's EOS ids, the template's EOS strings and FIM
    tokens (one in the middle means the model thinks the middle is over), and every special token of
    the tokenizer (never text to insert: it would reach the editor as ``<|im_start|>``). Budgets:
    ``specls.prompt.default_budget`` for the context length and family. Raises ValueError naming a
    FIM token the tokenizer lacks.
    """
    fim = fim_tokens_from_template(template, tokenizer) if template is not None else None
    eos = set(eos_token_ids) | set(tokenizer.special_ids)
    if fim is not None:
        eos |= set(fim.eos_ids) | {fim.prefix_id, fim.suffix_id, fim.middle_id}
        if fim.file_sep_id is not None:
            eos.add(fim.file_sep_id)
    family = template.family if template is not None else NO_FIM
    budget = default_budget(
        max_context,
        family=family,
        order=fim.order if fim is not None else None,
        file_sep=fim is not None and fim.file_sep_id is not None,
    )
    start = tuple(tokenizer.encode("", add_special_tokens=True))
    return PromptFacts(family, fim, frozenset(eos), budget, start)


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
