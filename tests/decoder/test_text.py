"""Incremental detokenization: the visible text of a growing token list, each token decoded about once."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import pytest
from specls.decoder.text import EarlyStop, IncrementalText, TextStop, visible_offsets, visible_text


class Bytes:
    """Byte-level: token = one UTF-8 byte (characters split across tokens), decode with U+FFFD."""

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


class Pieces:
    """SentencePiece-like: a token is a word piece, "_" marks a leading space, and a decoded list drops
    the space of its first piece (the position-dependent rule that needs left context)."""

    VOCAB = ("_def", "_f", "(", "x", "):", "_return", "_x", "+", "1", "\n", "_", "é")

    def decode(self, ids: Sequence[int]) -> str:
        text = "".join(self.VOCAB[i] for i in ids).replace("_", " ")
        return text[1:] if text.startswith(" ") else text


class Counting(Bytes):
    def __init__(self) -> None:
        self.decoded = 0

    def decode(self, ids: Sequence[int]) -> str:
        self.decoded += len(ids)
        return super().decode(ids)


def _byte_tokens(seed: int) -> list[int]:
    rng = random.Random(seed)
    text = "".join(rng.choice(["a", " ", "\n", "é", "€", "𝄞", "x=1"]) for _ in range(60))
    return list(text.encode())


@pytest.mark.parametrize(
    ("tokenizer", "tokens"),
    [
        (Bytes(), _byte_tokens(0)),
        (Bytes(), _byte_tokens(1)),
        (Bytes(), [0x61, 0xC3, 0x41, 0xE2, 0x82, 0xAC, 0xA9, 0x62]),  # invalid bytes in the middle
        (Pieces(), [0, 1, 2, 3, 4, 9, 5, 6, 7, 8, 9, 10, 11]),
    ],
)
def test_incremental_text_equals_full_decode_of_every_prefix(
    tokenizer: Bytes | Pieces, tokens: list[int]
) -> None:
    inc = IncrementalText(tokenizer)
    for i in range(len(tokens) + 1):
        assert inc.update(tokens[:i]) == visible_text(tokenizer.decode(tokens[:i])), i  # Not a stale tail


def test_incremental_text_decodes_each_token_about_once() -> None:
    tok = Counting()
    tokens = _byte_tokens(2)
    stop = TextStop(tok, lambda text: None)
    for i in range(1, len(tokens) + 1):
        assert not stop(tokens[:i])
    assert stop.text == visible_text(Bytes().decode(tokens))
    n = len(tokens)  # 125 bytes; a 4-byte character keeps 3 tokens pending, each re-decoded with it
    assert tok.decoded == stop.decoded_tokens <= 6 * n  # Not n * (n + 1) / 2: no full re-decode per token


def test_incremental_text_starts_over_on_a_shorter_list() -> None:
    inc = IncrementalText(Bytes())
    assert inc.update(list(b"abc")) == "abc"
    assert inc.update(list(b"x")) == "x"  # Not "abc": a new list
    assert inc.update(list(b"xy")) == "xy"


def test_text_stop_holds_back_split_utf8() -> None:
    seen: list[str] = []

    def stop(text: str) -> int | None:
        seen.append(text)
        return None

    s = TextStop(Bytes(), stop)
    ids = list("aé€".encode())
    for i in range(1, len(ids) + 1):
        s(ids[:i])
    assert seen == ["a", "a", "aé", "aé", "aé", "aé€"]  # Not "a\ufffd": partial chars held back


def test_text_stop_records_the_cut_and_survives_a_broken_stop() -> None:
    s = TextStop(Bytes(), lambda text: 2 if len(text) >= 3 else None)
    assert not s(list(b"ab"))
    assert s(list(b"abc")) and s.cut == 2 and s.text == "abc"
    clamp = TextStop(Bytes(), lambda text: 99)
    assert clamp(list(b"ab")) and clamp.cut == 2  # Not 99: clamped to the text

    def broken(text: str) -> int | None:
        raise RuntimeError("bad stop")

    assert not TextStop(Bytes(), broken)(list(b"ab"))  # Not an exception: ignored


def _at_newline(text: str) -> int | None:
    return text.index("\n") if "\n" in text else None


@pytest.mark.parametrize(
    "done, draft, horizon",
    [
        (b"ab", b"c\nde", 2),  # through the newline. Not 4
        (b"ab", b"cde", 3),  # no stop in the draft: all of it
        (b"", b"\nx", 1),
        (b"a", "\u00e9\n!".encode(), 3),  # the two bytes of e-acute, then the newline. Not 2: held back
        (b"a\nb", b"cd", 1),  # a stop already in the committed text fires at the first token
    ],
)
def test_text_stop_horizon(done: bytes, draft: bytes, horizon: int) -> None:
    s = TextStop(Bytes(), _at_newline)
    for i in range(1, len(done) + 1):
        s(list(done[:i]))
    assert s.horizon(list(done), list(draft)) == horizon


def test_text_stop_horizon_leaves_the_stop_as_it_was() -> None:
    seen: list[str] = []

    def stop(text: str) -> int | None:
        seen.append(text)
        return _at_newline(text)

    s = TextStop(Bytes(), stop)
    assert not s(list(b"ab"))
    assert s.horizon(list(b"ab"), list(b"xyz\n")) == 4
    seen.clear()
    assert not s(list(b"abc")) and s.text == "abc" and seen == ["abc"]  # Not "abxyz...": the fork's
    assert s.cut is None
    assert s(list(b"abc\n")) and s.cut == 3


def test_on_text_is_told_the_committed_text_only() -> None:
    told: list[str] = []
    s = TextStop(Bytes(), _at_newline, told.append)
    s(list(b"a"))
    assert s.horizon(list(b"a"), list(b"bc\nd")) == 3
    s(list(b"ab"))
    assert told == ["a", "ab"]  # Not "abc\n...": a draft's text is never reported

    def broken(text: str) -> None:
        raise RuntimeError("bad listener")

    assert TextStop(Bytes(), _at_newline, broken)(list(b"a\n"))  # Not an exception: the stop still works


def test_a_text_stop_without_a_stop_only_streams() -> None:
    class Counting(Bytes):
        calls = 0

        def decode(self, ids: Sequence[int]) -> str:
            Counting.calls += 1
            return super().decode(ids)

    told: list[str] = []
    s = TextStop(Counting(), None, told.append)
    assert not s(list(b"a\n")) and s.cut is None  # Not a stop at the newline: there is no stop
    before = Counting.calls
    assert s.horizon(list(b"a\n"), list(b"b\nc")) == 3
    assert Counting.calls == before  # no draft text decoded for a stop that is not there
    assert told == ["a\n"]


def test_text_stop_horizon_with_a_broken_stop_is_the_whole_draft() -> None:
    def broken(text: str) -> int | None:
        raise RuntimeError("bad stop")

    assert TextStop(Bytes(), broken).horizon(list(b"a"), list(b"b\nc")) == 3


def test_visible_offsets() -> None:
    tokens = list("aé".encode())  # [61, C3, A9]
    assert visible_offsets(Bytes(), tokens, "aé") == [
        0,
        1,
        1,
        2,
    ]  # Not [0, 1, 2, 2]: "é" counts once complete


def _at(ch: str) -> Callable[[str], int | None]:
    return lambda text: text.index(ch) if ch in text else None


@pytest.mark.parametrize(
    ("stop", "early", "text", "cut", "partial"),
    [
        (None, _at("\n"), "ab", None, False),  # neither has cut yet
        (None, _at("\n"), "a\nb", 1, True),  # only the early one: a partial answer
        (_at("\n"), _at("\n"), "a\nb", 1, False),  # both at the same point: the whole answer
        (_at("("), _at("\n"), "a(\nb", 1, False),  # the stop first: whole, not partial
        (_at("\n"), _at("("), "a\nb(", 1, False),  # Not 3: the stop cuts earlier than the early one
        (_at("b"), _at("\n"), "a\nb", 1, True),  # the stop cuts later (2): the early cut is partial
    ],
)
def test_early_stop_takes_the_earlier_cut(stop, early, text, cut, partial):
    s = EarlyStop(stop, early)
    assert s(text) == cut and s.partial(text) is partial
