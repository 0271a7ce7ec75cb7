"""Prompt building for the in-process engine: FIM layout at the token level, with a token prefix that
stays stable across keystrokes so the engine can reuse the KV cache of the previous request.

Layout (token level; ``S`` = a special token; ``start`` = what the model's tokenizer puts before a
text, e.g. BOS, usually nothing):

- ``start``, then context snippets (other open buffers), each ``S<file_sep> path\\n text`` when the
  template has a file separator (skipped otherwise),
- SPM: ``S<fim_prefix> S<fim_suffix> suffix S<fim_middle> prefix`` (StarCoder-style: the middle continues
  the prefix), PSM: ``S<fim_prefix> prefix S<fim_suffix> suffix S<fim_middle>``,
- no FIM template (any causal LM): ``start prefix`` alone. The suffix window is still cut and returned
  (``Prompt.suffix_tokens``) for prompt-lookup drafting; the text-level stop rules see the suffix too.

Stability: with SPM only the end of the prompt changes while the user types at the cursor. The prefix
window's left edge is cut at absolute line numbers that are multiples of ``line_chunk``, so it moves in
large jumps instead of on every keystroke. Each segment is tokenised on its own, starting at a line
start, so appending characters at the cursor changes only the last few tokens (byte-level BPE merges never
cross the pre-tokeniser's word boundaries); the engine re-checks the longest common token prefix anyway.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from specls.decoder.text import visible_text as visible_text  # re-exported (tests, callers)

if TYPE_CHECKING:  # specls.models.fim builds on this module
    from specls.models.fim import FimTemplate

logger = logging.getLogger(__name__)

_LINE_RE = re.compile(r"[^\n]*\n|[^\n]+")


class TextTokenizer(Protocol):
    """What the engine needs from a tokenizer (``specls.models.tokenizer`` provides it)."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def token_to_id(self, token: str) -> int | None: ...


@dataclass(frozen=True)
class PromptBudget:
    """Token budgets of the prompt's parts. ``EngineSettings.budget`` None = ``default_budget`` of the
    loaded model; these field defaults are the bundled pair's (``default_budget(1024, "bundled", ...)``)."""

    # Defaults keep prompt + 64 new tokens within 512 positions (the bundled pair's main training
    # length) and the cold prefill a small part of a cold completion.
    prefix_tokens: int = 256
    suffix_tokens: int = 96
    context_tokens: int = 64
    line_chunk: int = 8  # the prefix window's left edge moves in jumps of this many lines
    min_snippet_tokens: int = 24  # a context snippet smaller than this is not worth its separator


# The positions a prompt plus its completion may fill: the model's context length, capped by these.
# 1024 on any model: a cold prompt is prefilled whole before the first token (slow for a 1.5B model on
# a CPU), while a warm keystroke prefills only the changed tail; 1024 gives a real model a few dozen
# lines of prefix and keeps the cold start within seconds at int4. An explicit EngineSettings.budget overrides it.
PROMPT_WINDOW = 1024
# Families trained on shorter FIM examples than their context: the bundled pair saw 512 positions.
FAMILY_WINDOWS: dict[str, int] = {"bundled": 512}


def default_budget(max_context: int, family: str, order: str | None, file_sep: bool) -> PromptBudget:
    """The prompt budgets for a model: ``order`` "psm"/"spm" (None = no FIM: prefix-only prompt),
    ``file_sep`` whether the template has a file separator (context snippets need one).

    Window ``W = min(max_context, FAMILY_WINDOWS.get(family), PROMPT_WINDOW)``; of it 3W/16 stays free
    for the completion and the FIM tokens, W/8 goes to context snippets (with a file separator), the
    suffix gets 3W/16 in SPM but W/32 in PSM, and the prefix the rest. PSM puts the suffix after the
    cursor's tokens, so every keystroke prefills it again: a shorter PSM suffix window re-prefills
    less per keystroke but matches fewer lines exactly, and SPM order matches far fewer on a model not
    trained on it (``python -m bench.lab.fim``), so PSM keeps its order with the middle window. Prefix-only
    prompts still cut a 3W/16 suffix window for lookup drafting (it costs no prefill).

    >>> def parts(b: PromptBudget) -> tuple[int, int, int]:
    ...     return b.prefix_tokens, b.suffix_tokens, b.context_tokens
    >>> parts(default_budget(1024, "bundled", "spm", True))  # W = 512: the bundled pair's defaults
    (256, 96, 64)
    >>> parts(default_budget(32768, "qwen2.5-coder", "psm", True))  # W = 1024
    (672, 32, 128)
    >>> parts(default_budget(8192, "none", None, False))  # SmolLM2: W = 1024, suffix for lookup only
    (832, 192, 0)
    """
    window = min(max(1, max_context), FAMILY_WINDOWS.get(family, PROMPT_WINDOW), PROMPT_WINDOW)
    reserve = window * 3 // 16
    context = window // 8 if order is not None and file_sep else 0
    in_prompt = {"spm": window * 3 // 16, "psm": window // 32}.get(order or "", 0)
    prefix = max(1, window - reserve - context - in_prompt)
    suffix = in_prompt if order is not None else window * 3 // 16
    return PromptBudget(prefix_tokens=prefix, suffix_tokens=suffix, context_tokens=context)


@dataclass(frozen=True)
class FimTokens:
    """The FIM template resolved to token ids of one tokenizer."""

    order: str  # "psm" | "spm"
    prefix_id: int
    suffix_id: int
    middle_id: int
    file_sep_id: int | None = None
    eos_ids: frozenset[int] = frozenset()


@dataclass
class Prompt:
    """One request's prompt tokens and where its parts lie."""

    tokens: list[int]
    suffix_tokens: list[int] = field(default_factory=list)  # the suffix window (for suffix lookup)
    prefix_start_line: int = 0  # first line of the document inside the prefix window
    context_docs_used: int = 0


def fim_tokens_from_template(template: FimTemplate, tokenizer: TextTokenizer) -> FimTokens:
    """Resolve a FIM template against a tokenizer's vocabulary: the prefix/suffix/middle tokens must
    exist (ValueError naming the missing one); a missing file separator or EOS string is left out."""

    def required(text: str, field: str) -> int:
        tid = tokenizer.token_to_id(text)
        if tid is None:
            raise ValueError(f"FIM token {text!r} ({field}) is not in the tokenizer's vocabulary")
        return tid

    if template.order not in ("psm", "spm"):
        raise ValueError(f"unknown FIM order {template.order!r}")
    file_sep_id = tokenizer.token_to_id(template.file_sep) if template.file_sep else None
    eos = {tid for tid in (tokenizer.token_to_id(s) for s in template.eos) if tid is not None}
    return FimTokens(
        template.order,
        required(template.prefix, "prefix"),
        required(template.suffix, "suffix"),
        required(template.middle, "middle"),
        file_sep_id,
        frozenset(eos),
    )


def split_lines(text: str) -> list[str]:
    """Lines with their '\\n' kept (only '\\n' splits: the tokenizer sees '\\r' as text)."""
    return _LINE_RE.findall(text)


class PromptBuilder:
    """Builds prompt token lists; keeps a cache of per-line token counts (for the budgets).

    ``fim`` None: prefix-only prompts (``start + prefix``); ``start``: token ids every prompt begins
    with (BOS where the model's tokenizer adds one)."""

    def __init__(
        self,
        tokenizer: TextTokenizer,
        fim: FimTokens | None,
        budget: PromptBudget,
        start: Sequence[int] = (),
    ) -> None:
        self._tok = tokenizer
        self.fim = fim
        self.budget = budget
        self.start = tuple(start)
        self._counts: dict[str, int] = {}

    # -- token counting -------------------------------------------------------------------------

    def _count(self, line: str) -> int:
        n = self._counts.get(line)
        if n is None:
            if len(self._counts) > 200_000:
                self._counts.clear()
            n = len(self._tok.encode(line)) if line else 0
            self._counts[line] = n
        return n

    # -- windows ----------------------------------------------------------------------------------

    def prefix_window(self, prefix: str) -> tuple[list[int], int]:
        """Tokens of the tail of ``prefix`` within the budget, starting at a line that is a multiple
        of ``line_chunk`` when possible. Returns (tokens, first line index)."""
        budget = self.budget.prefix_tokens
        if budget <= 0 or not prefix:
            return [], 0
        # Only the tail can fit (a token is rarely longer than 16 characters): split just that, and
        # keep absolute line numbers for the chunk alignment.
        base = 0
        limit = budget * 16
        if len(prefix) > limit:
            cut = prefix.find("\n", len(prefix) - limit)
            if cut >= 0:
                base = prefix.count("\n", 0, cut + 1)
                prefix = prefix[cut + 1 :]
        lines = split_lines(prefix)
        counts = [self._count(line) for line in lines]
        # suffix sums: tail[i] = tokens of lines[i:]
        tail = [0] * (len(lines) + 1)
        for i in range(len(lines) - 1, -1, -1):
            tail[i] = tail[i + 1] + counts[i]
        chunk = max(1, self.budget.line_chunk)
        start = (-base) % chunk  # the first line whose absolute number is a multiple of chunk
        while start < len(lines) and tail[start] > budget:
            start += chunk
        if start >= len(lines):  # the last chunk alone is too big: fall back to single lines
            start = max(0, len(lines) - 1 - (len(lines) - 1 + base) % chunk)
            while start < len(lines) - 1 and tail[start] > budget:
                start += 1
        tokens = self._tok.encode("".join(lines[start:]))
        if len(tokens) > budget:  # per-line counts are an estimate; a very long line needs a hard cut
            tokens = tokens[len(tokens) - budget :]
        return tokens, base + start

    def suffix_window(self, suffix: str) -> list[int]:
        """Tokens of the head of ``suffix`` within the budget, cut at a line end when possible."""
        budget = self.budget.suffix_tokens
        if budget <= 0 or not suffix:
            return []
        return self._head(suffix, budget)

    def _head(self, text: str, budget: int) -> list[int]:
        lines = split_lines(text[: budget * 16])  # more cannot fit
        used = 0
        end = 0
        for line in lines:
            n = self._count(line)
            if used + n > budget:
                break
            used += n
            end += 1
        if end == 0:  # first line alone is over budget: hard cut
            return self._tok.encode(lines[0])[:budget] if lines else []
        tokens = self._tok.encode("".join(lines[:end]))
        return tokens[:budget]

    def context_snippets(
        self, context_docs: Sequence[tuple[str, str]], exclude: str, budget: int
    ) -> tuple[list[int], int]:
        """``S<file_sep> path\\n head-of-text`` for each other buffer while the budget lasts."""
        if self.fim is None or self.fim.file_sep_id is None or budget <= 0:
            return [], 0
        sep = self.fim.file_sep_id
        out: list[int] = []
        used = 0
        for uri, text in context_docs:
            if uri == exclude or not text.strip():
                continue
            header = self._tok.encode(f"{_display_path(uri)}\n")
            room = budget - used - 1 - len(header)
            if room < self.budget.min_snippet_tokens:
                continue
            body = self._head(text, room)
            if len(body) < self.budget.min_snippet_tokens and len(body) < self._count(text):
                continue
            out += [sep, *header, *body]
            used = len(out)
        docs = out.count(sep)
        return out, docs

    # -- the prompt -------------------------------------------------------------------------------

    def build(
        self,
        prefix: str,
        suffix: str,
        context_docs: Sequence[tuple[str, str]] = (),
        doc_id: str = "",
    ) -> Prompt:
        fim = self.fim
        suffix_tokens = self.suffix_window(suffix)
        prefix_tokens, start_line = self.prefix_window(prefix)
        context, n_docs = self.context_snippets(context_docs, doc_id, self.budget.context_tokens)
        start = self.start
        if fim is None:
            # [start] prefix -> continuation (the suffix only feeds lookup drafting)
            tokens = [*start, *prefix_tokens]
        elif fim.order == "spm":
            # [start] [context] <fim_prefix><fim_suffix> suffix <fim_middle> prefix -> middle
            tokens = [*start, *context, fim.prefix_id, fim.suffix_id, *suffix_tokens, fim.middle_id]
            tokens += prefix_tokens
        else:
            # [start] [context] <fim_prefix> prefix <fim_suffix> suffix <fim_middle> -> middle
            tokens = [*start, *context, fim.prefix_id, *prefix_tokens, fim.suffix_id, *suffix_tokens]
            tokens.append(fim.middle_id)
        return Prompt(tokens, suffix_tokens, start_line, n_docs)


def _display_path(uri: str) -> str:
    """A short relative-looking path for a buffer (training data used paths like ``email/utils.py``)."""
    from urllib.parse import unquote, urlsplit

    path = unquote(urlsplit(uri).path) if "://" in uri else uri.split(":", 1)[-1]
    parts = [p for p in path.replace("\\", "/").split("/") if p]
    return "/".join(parts[-2:]) if parts else uri


# Line starts where a byte-level BPE pre-tokeniser (GPT-2 regex) always has a word boundary: before the
# last whitespace character of a run that contains a newline and is followed by a non-space.
_CHUNK_BOUNDARY = re.compile(r"\s*\n\s*(?=\S)")


class DocumentEncoder:
    """Tokenises whole documents in line-sized chunks cut at pre-tokeniser boundaries, caching each
    chunk's tokens: re-tokenising a large buffer after an edit costs about the edited lines (the
    result equals tokenising the whole text for GPT-2-style byte-level BPE)."""

    def __init__(self, tokenizer: TextTokenizer, max_entries: int = 200_000) -> None:
        self._tok = tokenizer
        self._cache: dict[str, list[int]] = {}
        self._max = max_entries

    @staticmethod
    def chunks(text: str) -> list[str]:
        out: list[str] = []
        start = 0
        for m in _CHUNK_BOUNDARY.finditer(text):
            cut = m.end() - 1
            if cut > start:
                out.append(text[start:cut])
                start = cut
        if start < len(text):
            out.append(text[start:])
        return out

    def encode(self, text: str) -> list[int]:
        if len(self._cache) > self._max:
            self._cache.clear()
        ids: list[int] = []
        for chunk in self.chunks(text):
            toks = self._cache.get(chunk)
            if toks is None:
                toks = self._tok.encode(chunk)
                self._cache[chunk] = toks
            ids += toks
        return ids
