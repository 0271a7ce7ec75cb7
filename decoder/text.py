"""Token ids to text while they are generated: the visible text of a growing token list, decoding only
the new tokens, and the decode loop's stop callback built from a text-level stop.

"Visible" text drops a trailing incomplete UTF-8 character: byte-level BPE splits characters across
tokens and decodes the unfinished part as U+FFFD; it shows once the token completing it arrives.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from specls.decoder.api import Stop

log = logging.getLogger(__name__)

REPLACEMENT = "\ufffd"  # what a decoder renders an incomplete UTF-8 sequence as


class Detokenizer(Protocol):
    """The one tokenizer method text decoding needs."""

    def decode(self, ids: Sequence[int]) -> str: ...


def visible_text(text: str) -> str:
    """Drop a trailing incomplete UTF-8 character (byte-level BPE decodes it to U+FFFD)."""
    return text.rstrip(REPLACEMENT)


class IncrementalText:
    """The visible text of a token list that only grows, decoding only its new tokens.

    ``update(tokens)`` returns ``visible_text(decode(tokens))``, the same string a full decode gives,
    while each call decodes only the tokens since the last committed position plus one committed chunk
    of left context (as vLLM's incremental detokenizer: decoders with position-dependent rules, such as
    SentencePiece dropping a first token's leading space, render the new tokens as in the whole list).
    Tokens whose text ends in an incomplete character stay uncommitted until the character completes.

    Example, byte tokens ("é" is the two bytes C3 A9)::

        t = IncrementalText(lambda ids: bytes(ids).decode("utf-8", "replace"))
        t.update([0x61])              # "a"   decodes [61]
        t.update([0x61, 0xC3])        # "a"   decodes [61, C3] and [61]; C3 is pending
        t.update([0x61, 0xC3, 0xA9])  # "aé"  decodes [61, C3, A9]; committed up to here
        t.update([0x61, 0xC3, 0xA9, 0x62])  # "aéb"  decodes [C3, A9, 62] and [C3, A9], not from 61

    A list that does not extend the previous one (shorter) starts over. ``decoded_tokens`` counts the
    token ids passed to ``decode`` (linear in the length, where a full decode per call is quadratic).
    """

    def __init__(self, tokenizer: Detokenizer) -> None:
        self._tok = tokenizer
        self.decoded_tokens = 0
        self._reset()

    def _reset(self) -> None:
        self._tokens: list[int] = []
        self._start = 0  # the left-context window starts here (the previous commit point)
        self._read = 0  # tokens[:read] are committed: their text is self._done
        self._head = ""  # decode(tokens[start:read]) on its own: the window's known part
        self._done = ""
        self.text = ""

    def fork(self) -> IncrementalText:
        """A copy to update with tokens this one may never see (a draft), leaving this one as it is."""
        other = copy.copy(self)
        other._tokens = list(self._tokens)
        return other

    def _decode(self, ids: Sequence[int]) -> str:
        self.decoded_tokens += len(ids)
        return self._tok.decode(ids) if ids else ""

    def update(self, tokens: Sequence[int]) -> str:
        """The visible text of ``tokens`` (which extend the list of the previous call)."""
        if len(tokens) < len(self._tokens):
            self._reset()
        if len(tokens) == len(self._tokens):
            return self.text
        self._tokens.extend(int(t) for t in tokens[len(self._tokens) :])
        window = self._decode(self._tokens[self._start :])
        if window.startswith(self._head):
            new = window[len(self._head) :]
        else:  # a decoder whose rules changed the known part: keep what still agrees
            n = 0
            for a, b in zip(self._head, window, strict=False):
                if a != b:
                    break
                n += 1
            new = window[n:]
        if new.endswith(REPLACEMENT):  # an incomplete character at the end: not committed yet
            self.text = self._done + visible_text(new)
            return self.text
        self._done += new
        self.text = self._done
        self._start, self._read = self._read, len(self._tokens)
        self._head = self._decode(self._tokens[self._start : self._read])
        return self.text


class TextStop(Stop):
    """The decode loop's token-level stop built from a request's text-level one
    (``stop(text) -> length to keep | None``, a pure function): decodes the generated tokens
    incrementally (a character split across tokens is held back until complete), asks ``stop`` about
    the visible text and records where it cut (``cut``) and the text it saw (``text``). ``horizon``
    asks it about the texts a draft would make, on a fork of the decoded text; ``on_text`` is told
    only the committed text. ``stop`` None: no text stop, only ``on_text`` (a stream without one)."""

    def __init__(
        self,
        tokenizer: Detokenizer,
        stop: Callable[[str], int | None] | None,
        on_text: Callable[[str], None] | None = None,
    ) -> None:
        self._text = IncrementalText(tokenizer)
        self._stop = stop
        self._on_text = on_text  # told the committed text (streaming); not asked about drafts
        self.cut: int | None = None

    @property
    def text(self) -> str:
        return self._text.text

    @property
    def decoded_tokens(self) -> int:
        return self._text.decoded_tokens

    def __call__(self, tokens: Sequence[int]) -> bool:
        text = self._text.update(tokens)
        if self._on_text is not None:
            try:
                self._on_text(text)
            except Exception:  # a broken listener must not kill the completion
                log.exception("on_text callback failed; ignoring it")
        if self._stop is None:
            return False
        try:
            cut = self._stop(text)
        except Exception:  # a broken stop function must not kill the completion
            log.exception("stop function failed; ignoring it")
            return False
        if cut is None:
            return False
        self.cut = max(0, min(int(cut), len(text)))
        return True

    def horizon(self, tokens: Sequence[int], draft: Sequence[int]) -> int:
        if self._stop is None:
            return len(draft)  # nothing to ask: no draft token is decoded
        stop = self._stop
        probe = self._text.fork()
        grown = [int(t) for t in tokens]
        for i, t in enumerate(draft):
            grown.append(int(t))
            try:
                cut = stop(probe.update(grown))
            except Exception:  # __call__ logs it when the decode gets there
                return len(draft)
            if cut is not None:
                return i + 1
        return len(draft)


class EarlyStop:
    """One text stop made of a request's ``stop`` and its ``early_stop``: the earlier cut of the two
    (pure, as ``TextStop.horizon`` needs); ``partial(text)``: whether the early one cuts ``text``
    where ``stop`` would go on (or cut later).

    >>> s = EarlyStop(lambda t: None, lambda t: t.find("\\n") if "\\n" in t else None)
    >>> s("a\\nb"), s.partial("a\\nb"), s.partial("ab")
    (1, True, False)
    """

    def __init__(self, stop: Callable[[str], int | None] | None, early: Callable[[str], int | None]) -> None:
        self._stop = stop
        self._early = early

    def _cuts(self, text: str) -> tuple[int | None, int | None]:
        return (self._stop(text) if self._stop is not None else None), self._early(text)

    def partial(self, text: str) -> bool:
        full, early = self._cuts(text)
        return early is not None and (full is None or early < full)

    def __call__(self, text: str) -> int | None:
        full, early = self._cuts(text)
        return early if early is not None and (full is None or early < full) else full


def visible_offsets(tokenizer: Detokenizer, tokens: Sequence[int], text: str) -> list[int]:
    """offsets[i] = characters of visible text made by tokens[:i] (a character split across tokens
    counts once complete), clamped to ``text`` (the visible text of all of them); offsets[-1] ==
    len(text). Example, byte tokens of "aé" ([61, C3, A9]): [0, 1, 1, 2]."""
    inc = IncrementalText(tokenizer)
    grown: list[int] = []
    offs = [0]
    for t in tokens:
        grown.append(int(t))
        offs.append(len(inc.update(grown)))
    offs[-1] = len(text)
    return [min(o, len(text)) for o in offs]
