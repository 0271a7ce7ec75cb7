"""Model facts resolved at load: FIM tokens of a template (typed), and the bundled target's facts."""

from __future__ import annotations

import pytest
from specls.models.facts import DEFAULT_MAX_POSITIONS, model_facts
from specls.models.fim import BUNDLED, QWEN25_CODER
from specls.models.loader import bundled_dir, load_model

from specls.prompt import FimTokens, fim_tokens_from_template


class Vocab:
    def __init__(self, tokens: list[str]) -> None:
        self._ids = {t: i for i, t in enumerate(tokens)}

    def encode(self, text: str) -> list[int]:
        return []

    def decode(self, ids: object) -> str:
        return ""

    def token_to_id(self, token: str) -> int | None:
        return self._ids.get(token)


QWEN_VOCAB = Vocab(
    ["a", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|endoftext|>", "<|file_sep|>"]
)


def test_fim_tokens_of_a_template() -> None:
    fim = fim_tokens_from_template(QWEN25_CODER, QWEN_VOCAB)
    assert fim == FimTokens("psm", 1, 2, 3, 5, frozenset({4}))
    no_sep = fim_tokens_from_template(
        QWEN25_CODER, Vocab(["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"])
    )
    assert no_sep.file_sep_id is None and no_sep.eos_ids == frozenset()  # optional ones left out
    bundled = fim_tokens_from_template(BUNDLED, Vocab(["<fim_prefix>", "<fim_suffix>", "<fim_middle>"]))
    assert bundled.order == "spm"


def test_a_missing_fim_token_is_named() -> None:
    with pytest.raises(ValueError, match="fim_middle.*middle"):
        fim_tokens_from_template(QWEN25_CODER, Vocab(["<|fim_prefix|>", "<|fim_suffix|>"]))


@pytest.mark.slow
def test_bundled_target_facts() -> None:
    target = load_model(bundled_dir("target"))
    facts = model_facts(target)
    tok = target.tokenizer
    fim = facts.prompt.fim
    assert fim is not None and fim.order == "spm" and fim.middle_id == tok.token_to_id("<fim_middle>")
    assert set(target.spec.eos_token_ids) <= facts.prompt.eos_ids and fim.prefix_id in facts.prompt.eos_ids
    assert facts.max_positions == (target.spec.max_context or DEFAULT_MAX_POSITIONS)
    assert facts.provider == "cpu"
