"""Prompt layouts for next edits: how a model is shown the file, the region and the recent edits, and
how its output is read back into the rewritten region.

A layout is named (``specls.json`` picks one; ``get_layout``), renders an ``EditPrompt`` into a prompt
string, says which text ends its output (``end_markers``; ``eos_ends`` when the model's end-of-text
token ends it too), gives the output that leaves the region unchanged (``output_of``: what the region
drafter drafts, tokenized with special tokens) and parses an output back (``parse``: None when it is
malformed, i.e. cut off before its end).

- ``sweep`` / ``sweep-file``: Sweep's open next-edit models (sweepai/sweep-next-edit-1.5B and -0.5B,
  Qwen2.5-Coder fine-tunes). Sources, read for this (not guessed):
  * github.com/sweepai/vscode-nes, src/local/completions.ts (``buildLocalPrompt``, Sweep's own VS Code
    extension running the model locally): ``<|file_sep|>original/{path}``, the region before the
    recent edits, ``<|file_sep|>current/{path}``, the region now, ``<|file_sep|>updated/{path}``, each
    followed by a newline; the model writes the updated region.
  * github.com/sweepai/cursortab.nvim, server/provider/sweep/sweep.go (``buildPrompt``,
    ``buildDiffSection``, ``parseCompletion``): recent edits before those blocks, each as
    ``<|file_sep|>{file}.diff`` then ``original:``/``updated:`` blocks; stop at ``<|file_sep|>`` or
    ``</s>``; an output equal to the region is no edit.
  * github.com/ioma8/sweep-next-edit-vscode, src/core/prompt.ts: other files first, each as
    ``<|file_sep|>{path}`` and its text (Qwen2.5-Coder's repo-level pretraining format).
  * blog.sweep.dev/posts/oss-next-edit: original/updated blocks beat unified diffs for these models;
    fixed windows of about 21 lines around the cursor.
  * huggingface.co/sweepai/sweep-next-edit-v2-7B (the later 7B's card): the current file's text comes
    first as ``<|file_sep|>{path}``; ``sweep-file`` adds that block, ``sweep`` is the 1.5B clients'
    layout without it (which one suits the 1.5B is for measurement).
- ``chat-rewrite``: zero-shot, for instruct models: Qwen2.5's chat template (``<|im_start|>``
  roles), the recent edits as unified diffs, the file with the region marked and the cursor in it,
  and the assistant's reply started with a code fence so the output is the region itself.
- ``fim-rewrite``: zero-shot, for code models: the current file and the recent edits as
  ``<|file_sep|>`` files, then the file again as Qwen2.5-Coder FIM (``<|fim_prefix|>`` text before the
  region ``<|fim_suffix|>`` text after it ``<|fim_middle|>``): the middle ends where the suffix starts,
  which raw original/current/updated blocks did not tell a model that was not trained on them.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from specls.next_edit.edit_diff import EditDiff

log = logging.getLogger(__name__)

FILE_SEP = "<|file_sep|>"
CURSOR = "<|cursor|>"


@dataclass(frozen=True)
class EditPrompt:
    """What a layout shows the model.

    ``prefix`` + ``region`` + ``suffix``: the document (or a window of it), split at whole lines;
    ``cursor``: code point offset of the cursor in ``region``; ``history``: recent edits, oldest
    first; ``region_before``: the region's text before those edits (Sweep's ``original/`` block; None
    = the region as it is); ``context_files``: other files as (path, text).
    """

    path: str
    prefix: str
    region: str
    suffix: str
    cursor: int = 0
    history: Sequence[EditDiff] = ()
    region_before: str | None = None
    context_files: Sequence[tuple[str, str]] = ()
    # the file's 0-based line number where ``prefix`` starts (the layouts name lines as the file does)
    first_line: int = 0
    # the file as the prompt shows it: a window of it as it was a few requests ago (kept while the
    # cursor stays in it, so successive prompts share it and its KV: ``request_prompt.FileView``),
    # from 0-based line ``view_line``; None: ``prefix + region + suffix`` now
    view: str | None = None
    view_line: int = 0

    @property
    def region_line(self) -> int:
        """The region's first line in the file (0-based)."""
        return self.first_line + self.prefix.count("\n")

    def file_view(self) -> tuple[str, int]:
        """(the file's text the prompt shows, its first line, 0-based)."""
        if self.view is None:
            return self.prefix + self.region + self.suffix, self.first_line
        return self.view, self.view_line


def _chomp(text: str) -> str:
    """``text`` without one final newline (blocks are joined with newlines)."""
    if text.endswith("\r\n"):
        return text[:-2]
    return text[:-1] if text.endswith(("\n", "\r")) else text


def _run_on(output: str, after: str) -> int | None:
    """Where ``output`` goes on into ``after`` at a line's start (past a first line), else None."""
    if not after:
        return None
    i = output.find("\n" + after)
    return None if i < 0 else i + 1


# characters of text that mark where a region ends (the file's text after it, or its own last
# lines): shorter lines (a closing bracket, ``pass``) recur all over code
TELLING = 16


def run_on_text(region: str, suffix: str, lines: int = 2, telling: int = TELLING) -> str:
    """The text after the region that marks a run on: ``suffix`` through its first non-blank line
    when that is ``telling`` characters long (a model that copied the region often writes the file's
    next line and then makes up its own), else through its first ``lines`` non-blank lines; ""
    (no run-on end) when that text is short or the region holds it already (a rewrite may repeat
    it), or at the end of the file.

    >>> run_on_text("x = 1\\n", "\\ndef g():\\n    pass\\nmore\\n")
    '\\ndef g():\\n    pass\\n'
    >>> run_on_text("x = 1\\n", "    total += size(path)\\n    return total\\n")
    '    total += size(path)\\n'
    >>> run_on_text("x = 1\\n", ")\\n\\n")   # too short to be telling
    ''
    """
    out, seen = [], 0
    for line in suffix.splitlines(keepends=True):
        out.append(line)
        seen += int(bool(line.strip()))
        if seen >= lines or (seen and len("".join(out).strip()) >= telling):
            break
    text = "".join(out)
    if not seen or len(text.strip()) < 12 or text in region:
        return ""
    return text


class EditLayout(ABC):
    """A prompt layout: ``render`` a prompt, ``output_of`` an unchanged region, ``parse`` an output."""

    name: str = ""
    end_markers: tuple[str, ...] = ()
    eos_ends: bool = True  # the model's end-of-text token ends the output as an end marker does

    @abstractmethod
    def render(self, p: EditPrompt) -> str:
        """The prompt string (special tokens as text: tokenize it with them on)."""

    @abstractmethod
    def output_of(self, region: str) -> str:
        """The output that rewrites the region to ``region``, its end marker included."""

    def _body_end(self, output: str) -> int | None:
        """Where the region's text ends in ``output`` (the first end marker), None without one."""
        found = [i for i in (output.find(m) for m in self.end_markers) if i >= 0]
        return min(found) if found else None

    def _unwrap(self, body: str) -> str:
        """The rewritten region from the output's text before its end."""
        return body

    def body_end(self, output: str, after: str = "") -> int | None:
        """Where the rewritten region ends in ``output`` (at its end marker); None before one came
        (the decode's text stop: the output is over once this is not None). ``after``: the file's
        text right after the region (``run_on_text``): an output that goes on into it, at a line's
        start, has rewritten the region and is copying the file on, so the region ends there.

        >>> CHAT.body_end("x = 1\\n```"), CHAT.body_end("s = '```'\\n")   # the second: a fence inside a line is code
        (6, None)
        >>> CHAT.body_end("x = 2\\ndef g():\\n    pass\\n", after="def g():\\n    pass\\n")
        6
        """
        found = [i for i in (self._body_end(output), _run_on(output, after)) if i is not None]
        return min(found) if found else None

    def parse(self, output: str, eos: bool = False, after: str = "") -> str | None:
        """The rewritten region from the model's ``output`` (decoded with special tokens), or None
        when it is malformed: no end marker (nor a run on into ``after``, as ``body_end``), and not
        ended by the model's end-of-text token (``eos``: the decode stopped on it) where that ends
        the layout's output. The region's final newline is the caller's to keep as the region's
        (``specls.next_edit.edits.normalize_rewrite``)."""
        end = self.body_end(output, after)
        if end is None:
            if not (eos and self.eos_ends):
                log.debug("%s: no end marker in %d chars of output", self.name, len(output))
                return None
            end = len(output)
        return self._unwrap(output[:end])


class SweepLayout(EditLayout):
    """Sweep's next-edit models (module docstring: the sources). ``file_context``: the current file's
    text as the first block (the v2 7B's card) or not (the 1.5B clients).

    >>> p = EditPrompt("a.py", "", "x = 1\\n", "", history=[EditDiff("a.py", "y = 0\\n", "y = 1\\n")])
    >>> print(SWEEP.render(p), end="")
    <|file_sep|>a.py.diff
    original:
    y = 0
    updated:
    y = 1
    <|file_sep|>original/a.py
    x = 1
    <|file_sep|>current/a.py
    x = 1
    <|file_sep|>updated/a.py
    >>> SWEEP.parse("x = 2\\n<|file_sep|>"), SWEEP.parse("x = 2\\n"), SWEEP.parse("x = 2\\n", eos=True)
    ('x = 2\\n', None, 'x = 2\\n')
    """

    end_markers = (FILE_SEP, "</s>")
    eos_ends = True

    def __init__(self, file_context: bool = False) -> None:
        self.file_context = file_context
        self.name = "sweep-file" if file_context else "sweep"

    def render(self, p: EditPrompt) -> str:
        parts: list[str] = []
        for path, text in p.context_files:
            parts += [f"{FILE_SEP}{path}", _chomp(text)]
        if self.file_context:
            parts += [f"{FILE_SEP}{p.path}", _chomp(p.file_view()[0])]
        for d in p.history:
            if d.old != d.new:
                parts += [f"{FILE_SEP}{d.path}.diff", "original:", _chomp(d.old), "updated:", _chomp(d.new)]
        before = p.region if p.region_before is None else p.region_before
        parts += [f"{FILE_SEP}original/{p.path}", _chomp(before)]
        parts += [f"{FILE_SEP}current/{p.path}", _chomp(p.region)]
        parts += [f"{FILE_SEP}updated/{p.path}", ""]
        return "\n".join(parts)

    def output_of(self, region: str) -> str:
        return f"{_chomp(region)}\n{FILE_SEP}"

    # No trimming of trailing whitespace (cursortab.nvim trims it from both sides before comparing):
    # the output is the region and a newline, so a trimmed region with blank last lines would read
    # as their deletion.


CHAT_SYSTEM = "You predict a programmer's next edit from their recent edits. You reply with code only."
CHAT_INSTRUCTIONS = (
    "Rewrite the code between <region> and </region> the way the programmer will edit it next, "
    f"following their recent edits; {CURSOR} marks their cursor. If it needs no edit, repeat it "
    "unchanged. Reply with the rewritten region only, in one code block, without the markers."
)
SNIPPET_INSTRUCTIONS = (
    "Apply to the code block above the next edit that the recent edits imply (the same change at "
    "the next place it fits). If they imply none there, return the block unchanged. Reply with the "
    "whole block only, in one code block."
)
# the snippet layouts' instruction in the system prompt, the prompt's stable start (its KV is kept),
# and a short reminder of it after the block: a request re-prefills the reminder only
SNIPPET_SYSTEM = (
    f"{CHAT_SYSTEM} You are shown a file, the programmer's recent edits and a code block of the file. "
    f"{SNIPPET_INSTRUCTIONS}"
)
SNIPPET_REMINDER = "Reply with the whole block, the next edit applied."
FENCE = "```"


def _chat(user: str, examples: str = "", system: str = CHAT_SYSTEM) -> str:
    """Qwen2.5's chat template with the reply started by a code fence: its output is code.
    ``examples``: earlier turns (worked examples) between the system prompt and the request."""
    return (
        f"<|im_start|>system\n{system}<|im_end|>\n{examples}<|im_start|>user\n{user}<|im_end|>\n"
        f"<|im_start|>assistant\n{FENCE}\n"
    )


def _diffs(history: Sequence[EditDiff]) -> str:
    """The edits as one unified diff: a file's ``---``/``+++`` header once for its successive hunks
    (fewer tokens, and the newest hunk, which changes as the user types, starts at its ``@@``).

    Hunk headers leave out the new side's count (``EditDiff.unified``): the hunk being typed grows
    a line at a time, and its lines so far then stay the same tokens from one request to the next.

    >>> print(_diffs([EditDiff("a.py", "x\\n", "y\\n", 0), EditDiff("a.py", "", "z\\nw\\n", 5)]), end="")
    --- a/a.py
    +++ b/a.py
    @@ -1 +1 @@
    -x
    +y
    @@ -5,0 +6 @@
    +z
    +w
    """
    parts, last = [], None
    for d in history:
        diff = d.unified(new_count=False)
        if diff and d.path == last:
            diff = diff.split("\n", 2)[2]
        if diff:
            parts.append(diff)
            last = d.path
    return "".join(parts)


def _edits_block(p: EditPrompt) -> str:
    diffs = _diffs(p.history)
    return (
        f"Recent edits, oldest first:\n{FENCE}diff\n{diffs}{FENCE}\n\n" if diffs else "No recent edits.\n\n"
    )


def _edit_blocks(p: EditPrompt) -> str:
    """The recent edits as before/after code blocks (what Sweep found its models read better than
    unified diffs), each named by its file and first line."""
    parts = [
        f"{d.path}, line {d.start_line + 1}, before:\n{FENCE}\n{_line(d.old)}{FENCE}\nafter:\n{FENCE}\n"
        f"{_line(d.new)}{FENCE}\n"
        for d in p.history
        if d.old != d.new
    ]
    return f"Recent edits, oldest first:\n{''.join(parts)}\n" if parts else "No recent edits.\n\n"


def _line(text: str) -> str:
    return text if not text or text.endswith("\n") else text + "\n"


class ChatRewriteLayout(EditLayout):
    """Zero-shot for instruct models in Qwen2.5's chat template (``<|im_start|>``/``<|im_end|>``):
    the recent edits as unified diffs, the file with the region marked and the cursor in it; the
    reply is started with a code fence, so the output is the region and a closing fence.

    >>> CHAT.parse("x = 2\\n```\\n"), CHAT.parse("x = 2\\n"), CHAT.parse("x = 2\\n", eos=True)
    ('x = 2\\n', None, 'x = 2\\n')
    """

    name = "chat-rewrite"
    end_markers = (FENCE,)
    # an instruct model often ends its turn right after the code, without the closing fence: the
    # turn's end ends the code too (a budget cut still has neither and is dropped)
    eos_ends = True

    def render(self, p: EditPrompt) -> str:
        cursor = min(max(p.cursor, 0), len(p.region))
        marked = _line(p.region[:cursor] + CURSOR + p.region[cursor:])
        user = (
            f"{_edits_block(p)}File {p.path}:\n{FENCE}\n{p.prefix}<region>\n{marked}</region>\n"
            f"{_line(p.suffix)}{FENCE}\n\n{CHAT_INSTRUCTIONS}"
        )
        return _chat(user)

    def output_of(self, region: str) -> str:
        return f"{_line(region)}{FENCE}"

    def _body_end(self, output: str) -> int | None:
        # the closing fence opens a line: a ``` inside a line of code is code
        at = 0
        while (i := output.find(FENCE, at)) >= 0:
            if i == 0 or output[i - 1] == "\n":
                return i
            at = i + 1
        return None

    def _unwrap(self, body: str) -> str:
        return body.replace(CURSOR, "")  # a model that copies the cursor marker meant no edit there


class ChatSnippetLayout(ChatRewriteLayout):
    """Zero-shot for instruct models, the region as a code block of its own. The prompt's stable part
    comes first: the file (``EditPrompt.file_view``: a window kept across requests); then what
    changes as the user types: the recent edits, the cursor's line, the block to edit (the region
    now) and the instruction to return it with the next edit applied. Successive requests of a
    document so share the prompt up to the edits, and re-prefill only them and what follows
    (docs/next-edit.md, "The prompt's KV"). The block comes last, right before the reply: the reply
    copies a block the model has just read, start to end, so it starts on the region's first token
    (the region drafter aligned from the first pass) and it knows where the block ends (the closing
    fence, or the end of its turn).

    >>> text = SNIPPET.render(EditPrompt("a.py", "a\\n", "b\\n", "c\\n", cursor=1))
    >>> "lines 1-3:\\n```\\na\\nb\\nc\\n```" in text, "(lines 2-2 as it is now):\\n```\\nb\\n```" in text
    (True, True)
    >>> text.endswith("the next edit applied.<|im_end|>\\n<|im_start|>assistant\\n```\\n")
    True
    """

    name = "chat-snippet"

    def render(self, p: EditPrompt) -> str:
        return _chat(self.user_turn(p), self.examples(), SNIPPET_SYSTEM)

    def examples(self) -> str:
        """Worked examples as earlier chat turns before the request ("": zero-shot)."""
        return ""

    def edits_block(self, p: EditPrompt) -> str:
        """The recent edits: unified diffs."""
        return _edits_block(p)

    def user_turn(self, p: EditPrompt) -> str:
        view, view_line = p.file_view()
        last_view = view_line + max(1, len(view.splitlines()))
        first = p.region_line + 1
        last = first + max(1, len(p.region.splitlines())) - 1
        cursor = min(max(p.cursor, 0), len(p.region))
        return (
            f"File {p.path}, lines {view_line + 1}-{last_view}:\n{FENCE}\n{_line(view)}{FENCE}\n\n"
            f"{self.edits_block(p)}The cursor is on line {first + p.region[:cursor].count(chr(10))}. "
            f"The code block to edit (lines {first}-{last} as it is now):\n{FENCE}\n"
            f"{_line(p.region)}{FENCE}\n\n{SNIPPET_REMINDER}"
        )


EXAMPLE_BEFORE = (
    "class Settings:\n"
    '    host: str = "localhost"\n'
    "    port: int = 8080\n"
    "    retries: int = 3\n"
    "    timeout: float = 2.5\n"
)
EXAMPLE = EditPrompt(
    "settings.py",
    "class Settings:\n",
    '    host: Optional[str] = "localhost"\n    port: int = 8080\n    retries: int = 3\n',
    "    timeout: float = 2.5\n",
    cursor=len("    host: Optional[str]"),
    history=[
        EditDiff("settings.py", '    host: str = "localhost"\n', '    host: Optional[str] = "localhost"\n', 1)
    ],
    first_line=0,
    view=EXAMPLE_BEFORE,
)
# the same change at the next place only: the line after the edited one
EXAMPLE_REPLY = (
    '    host: Optional[str] = "localhost"\n    port: Optional[int] = 8080\n    retries: int = 3\n'
)


class ChatFewShotLayout(ChatSnippetLayout):
    """``chat-snippet`` with one worked example before the request (a user turn in the same layout
    and its answer): one field's type made ``Optional``, the same change on the next field only. The
    example is part of the prompt's stable start, so its KV is kept as the rest of it is.

    >>> text = FEW_SHOT.render(EditPrompt("a.py", "", "b\\n", ""))
    >>> text.count("<|im_start|>user"), "port: Optional[int] = 8080\\n    retries: int = 3" in text
    (2, True)
    """

    name = "chat-fewshot"

    def examples(self) -> str:
        reply = f"{FENCE}\n{EXAMPLE_REPLY}{FENCE}"
        return f"<|im_start|>user\n{self.user_turn(EXAMPLE)}<|im_end|>\n<|im_start|>assistant\n{reply}<|im_end|>\n"


class ChatBlocksLayout(ChatFewShotLayout):
    """``chat-fewshot`` with the recent edits as before/after code blocks instead of unified diffs.

    >>> text = BLOCKS.render(EditPrompt("a.py", "", "b\\n", "", history=[EditDiff("a.py", "x\\n", "y\\n", 2)]))
    >>> "a.py, line 3, before:\\n```\\nx\\n```\\nafter:\\n```\\ny\\n```" in text, "@@" in text
    (True, False)
    """

    name = "chat-blocks"

    def edits_block(self, p: EditPrompt) -> str:
        return _edit_blocks(p)


class FimRewriteLayout(EditLayout):
    """Zero-shot for code models with Qwen2.5-Coder's FIM and file-separator tokens: other files, the
    current file, the recent edits as a ``.diff`` file, then the file as FIM around the region (the
    middle is the rewritten region; it ends at the model's end-of-text).

    >>> print(FIM.render(EditPrompt("a.py", "a\\n", "b\\n", "c\\n")), end="")
    <|file_sep|>a.py
    a
    b
    c
    <|file_sep|>a.py
    <|fim_prefix|>a
    <|fim_suffix|>c
    <|fim_middle|>
    >>> FIM.parse("b2\\n<|endoftext|>"), FIM.parse("b2\\n"), FIM.parse("b2\\n", eos=True)
    ('b2\\n', None, 'b2\\n')
    """

    name = "fim-rewrite"
    end_markers = ("<|endoftext|>", FILE_SEP, "<|fim_pad|>")
    eos_ends = True

    def render(self, p: EditPrompt) -> str:
        parts = [f"{FILE_SEP}{path}\n{_chomp(text)}\n" for path, text in p.context_files]
        parts.append(f"{FILE_SEP}{p.path}\n{_chomp(p.file_view()[0])}\n")
        diffs = "".join(d.unified() for d in p.history)
        if diffs:
            parts.append(f"{FILE_SEP}{p.path}.diff\n{diffs}")
        parts.append(f"{FILE_SEP}{p.path}\n<|fim_prefix|>{p.prefix}<|fim_suffix|>{p.suffix}<|fim_middle|>")
        return "".join(parts)

    def output_of(self, region: str) -> str:
        return f"{region}<|endoftext|>"


SWEEP = SweepLayout()
SWEEP_FILE = SweepLayout(file_context=True)
CHAT = ChatRewriteLayout()
SNIPPET = ChatSnippetLayout()
FEW_SHOT = ChatFewShotLayout()
BLOCKS = ChatBlocksLayout()
FIM = FimRewriteLayout()
LAYOUTS: dict[str, EditLayout] = {
    layout.name: layout for layout in (SWEEP, SWEEP_FILE, CHAT, SNIPPET, FEW_SHOT, BLOCKS, FIM)
}
# for models not trained on a next-edit layout
ZERO_SHOT = ("chat-rewrite", "chat-snippet", "chat-fewshot", "chat-blocks", "fim-rewrite")


def get_layout(name: str) -> EditLayout:
    """The layout called ``name`` (as ``specls.json`` spells it).

    >>> get_layout("sweep").name
    'sweep'
    """
    try:
        return LAYOUTS[name]
    except KeyError:
        raise ValueError(f"unknown next-edit layout {name!r}; known: {', '.join(sorted(LAYOUTS))}") from None


def layout_for_model(model_id: str) -> str:
    """The layout an export writes into ``specls.json`` when none is given: Sweep's for its next-edit
    models, ``chat-snippet`` for instruct models (measured against ``chat-rewrite``: it ends where
    the region ends and suggests no edit where none is due; bench/README.md, "Next edits"), the FIM
    one for other code models.

    >>> [layout_for_model(m) for m in ("sweepai/sweep-next-edit-1.5B", "Qwen/Qwen2.5-Coder-1.5B-Instruct",
    ...                                 "Qwen/Qwen2.5-Coder-1.5B")]
    ['sweep', 'chat-snippet', 'fim-rewrite']
    """
    lowered = model_id.lower()
    if "sweep-next-edit" in lowered:
        return SWEEP.name
    return SNIPPET.name if "instruct" in lowered or "chat" in lowered else FIM.name
