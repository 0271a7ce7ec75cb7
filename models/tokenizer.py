"""A thin wrapper over ``tokenizers.Tokenizer`` (tokenizer.json): no BOS/EOS unless asked, special-token
ids, and incremental decoding that copes with byte-level BPE tokens splitting a UTF-8 character."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

# decode() renders an incomplete UTF-8 sequence as U+FFFD; held back until the rest arrives.
_REPLACEMENT = "\ufffd"
# Tokens of left context decoded with a suffix (enough for any split char plus decoder spacing rules).
_CONTEXT_TOKENS = 8


class Tokenizer:
    def __init__(self, tok: HFTokenizer) -> None:
        self._tok = tok
        self._vocab: dict[str, int] = tok.get_vocab(with_added_tokens=True)
        self._special: dict[str, int] = {
            t.content: i for i, t in tok.get_added_tokens_decoder().items() if t.special
        }

    @classmethod
    def from_file(cls, path: str | Path) -> Tokenizer:
        """Load tokenizer.json. Raises whatever ``tokenizers`` raises on a bad file (callers wrap it)."""
        return cls(HFTokenizer.from_file(str(path)))

    @property
    def hf(self) -> HFTokenizer:
        return self._tok

    @property
    def vocab_size(self) -> int:
        """Tokens the tokenizer knows, added tokens included (the model's logits may be wider)."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict[str, int]:
        return dict(self._vocab)

    @property
    def special_tokens(self) -> dict[str, int]:
        """Special added tokens: content -> id."""
        return dict(self._special)

    @property
    def special_ids(self) -> frozenset[int]:
        return frozenset(self._special.values())

    def token_to_id(self, token: str) -> int | None:
        return self._vocab.get(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``; special-token strings inside it become their ids."""
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def decode_suffix(self, ids: Sequence[int], start: int, skip_special_tokens: bool = False) -> str:
        """The text ``ids[start:]`` adds after ``ids[:start]``, decoded with left context.

        A character split across tokens is emitted once complete: text pieces obtained for growing
        ``start`` positions (``decode_suffix(ids, a)`` for ids[:b], then from b, ...) concatenate to
        the decode of the whole list, except a trailing incomplete character is held back.
        """
        start = max(0, min(start, len(ids)))
        ctx = max(0, start - _CONTEXT_TOKENS)
        window = list(ids[ctx:])
        before = self._stable(
            self._tok.decode(window[: start - ctx], skip_special_tokens=skip_special_tokens)
        )
        full = self._stable(self._tok.decode(window, skip_special_tokens=skip_special_tokens))
        if not full.startswith(before):
            # decoders with position-dependent rules: fall back to the common prefix
            n = 0
            for a, b in zip(before, full, strict=False):
                if a != b:
                    break
                n += 1
            return full[n:]
        return full[len(before) :]

    @staticmethod
    def _stable(text: str) -> str:
        # Drop a trailing run of replacement chars (an incomplete UTF-8 sequence at the end).
        return text.rstrip(_REPLACEMENT)


class IncrementalDecoder:
    """Streams text for a growing token list: ``push(ids) -> new text``. A character split across
    tokens comes out with the token that completes it (``decode_suffix`` holds partial ones back)."""

    def __init__(
        self, tokenizer: Tokenizer, context: Sequence[int] = (), skip_special_tokens: bool = False
    ) -> None:
        self._tok = tokenizer
        self._ids: list[int] = list(context)
        self._skip = skip_special_tokens

    def push(self, ids: Sequence[int]) -> str:
        start = len(self._ids)
        self._ids.extend(ids)
        return self._tok.decode_suffix(self._ids, start, self._skip)
