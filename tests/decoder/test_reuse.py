"""Completion reuse as a drafter: when the new cursor continues the previous completion, and what the
reuse drafter then proposes (the old tokens from the current text position)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from specls.decoder.api import Drafter
from specls.decoder.reuse import REUSE, CompletionReuseDrafter, PreviousCompletion, ReuseFirstDrafter

from tests.decoder.fakes import ScriptedDrafter


class Chars:
    """One token per character (ord), so text positions and token positions coincide."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(chr(i) for i in ids)


class Pairs(Chars):
    """Two characters per token: 1000 + index into a fixed pair table (tests a cut inside a token)."""

    PAIRS = ("re", "tu", "rn", " x")

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.PAIRS[i - 1000] if i >= 1000 else chr(i) for i in ids)


def previous(text: str = "return x", tokenizer: Chars | None = None) -> PreviousCompletion:
    tok = tokenizer or Chars()
    tokens = [1000, 1001, 1002, 1003] if isinstance(tok, Pairs) else tok.encode(text)
    return PreviousCompletion("def f(x):\n    ", "\n", text, tokens, tok)


@pytest.mark.parametrize(
    ("prefix", "suffix", "want"),
    [
        ("def f(x):\n    ", "\n", 0),  # the same cursor: nothing typed yet
        ("def f(x):\n    ret", "\n", 3),  # typed into it
        ("def f(x):\n    rex", "\n", None),  # typed something else. Not 2
        ("def f(x):\n    ret", "\n\n", None),  # the suffix changed. Not 3
        ("def g(x):\n    ret", "\n", None),  # an edit before the old cursor. Not 3
        ("def f(x):\n    return x", "\n", None),  # all of it typed: nothing left to propose. Not 8
    ],
)
def test_typed(prefix: str, suffix: str, want: int | None) -> None:
    assert previous().typed(prefix, suffix) == want


def test_reuse_proposes_the_rest_and_stops_on_a_wrong_guess() -> None:
    prompt = [1, 2, 3]
    d = CompletionReuseDrafter(len(prompt), previous(), 3, max_draft=64)
    assert d.propose(prompt, 10) == Chars().encode("urn x")
    assert d.propose([*prompt, ord("u")], 2) == Chars().encode("rn")  # Not from the start again
    assert d.propose([*prompt, ord("u"), ord("X")], 4) == []  # the model left the old text
    assert d.propose([*prompt, *Chars().encode("urn")], 4) == []  # Not revived: a wrong guess ends them


def test_reuse_inside_an_old_token_tokenises_the_head_afresh() -> None:
    tok = Pairs()
    d = CompletionReuseDrafter(1, previous(tokenizer=tok), 1, max_draft=64)  # typed "r"
    assert d.propose([7], 10) == [ord("e"), 1001, 1002, 1003]  # Not [1000, ...]: "r" is typed


def test_reuse_first_then_the_inner_drafter() -> None:
    prompt = [1, 2, 3]
    full = Chars().encode("urn x!!!!")
    inner = ScriptedDrafter(prompt, full, 200, "right")
    d: Drafter = ReuseFirstDrafter(CompletionReuseDrafter(3, previous(), 3, 64), inner, 2)
    assert d.name == f"{REUSE}+{inner.name}"
    assert d.propose(prompt, 12) == Chars().encode("urn x")
    assert list(d.proposal_sources()) == [REUSE] * 5
    d.observe(5, 5)
    ctx = [*prompt, *Chars().encode("urn x")]
    assert d.propose(ctx, 12) == Chars().encode("!!")  # the inner drafter at its draft_length. Not 12
    assert list(d.proposal_sources()) == [inner.name] * 2
    d.observe(2, 2)
    assert d.propose(ctx, 12) == Chars().encode("!!")  # one cap, not grown by an accepted proposal
    assert d.propose(ctx, 1) == Chars().encode("!")  # a smaller offer from the loop still caps it
