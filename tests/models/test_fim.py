"""FIM family detection from a vocabulary (three FIM tokens decide; file separator and repo name are
optional), the prompt facts of a loaded model, and prefix-only completion for a model without FIM."""

from __future__ import annotations

from dataclasses import replace

import pytest
from specls.models.fim import (
    BUNDLED,
    CODELLAMA,
    DEEPSEEK_CODER,
    NO_FIM,
    QWEN25_CODER,
    STARCODER,
    detect_template,
    prompt_facts,
)
from specls.models.tokenizer import Tokenizer

from specls.api import CompletionRequest
from specls.engine import EngineSettings, OnnxEngine
from specls.prompt import PromptBudget
from tests.specls.fakes import SOURCE, fake_models

QWEN_TRIPLE = {"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"}
STAR_TRIPLE = {"<fim_prefix>", "<fim_suffix>", "<fim_middle>"}
# SmolLM2-135M's vocabulary carries StarCoder's repo/file specials but no FIM tokens
SMOLLM2 = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<file_sep>", "<filename>"}

# (vocabulary, family or None, file_sep, the wrong answer this row guards against)
DETECT_TABLE = [
    (QWEN_TRIPLE | {"<|endoftext|>", "<|file_sep|>", "<|repo_name|>"}, "qwen2.5-coder", "<|file_sep|>", ""),
    # the local Qwen2 checkpoint of issue 11: refused before (no <|file_sep|>)
    (QWEN_TRIPLE | {"<|endoftext|>"}, "qwen2.5-coder", None, "None (file separator required)"),
    (QWEN_TRIPLE, "qwen2.5-coder", None, "None (EOS string required)"),
    ({"<|fim_prefix|>", "<|fim_suffix|>", "<|endoftext|>", "<|file_sep|>"}, None, None, "qwen2.5-coder"),
    (SMOLLM2, None, None, "starcoder (it has <file_sep> and <repo_name>)"),
    (
        STAR_TRIPLE | {"<|endoftext|>", "<file_sep>", "<repo_name>", "<fim_pad>"},
        "starcoder",
        "<file_sep>",
        "",
    ),
    (STAR_TRIPLE | {"<|endoftext|>", "<fim_pad>"}, "starcoder", None, "None (file separator required)"),
    (STAR_TRIPLE | {"<|endoftext|>", "<file_sep>"}, "bundled", "<file_sep>", "starcoder"),
    (STAR_TRIPLE | {"<|endoftext|>"}, "starcoder", None, "bundled (it has no <file_sep>)"),
    ({"<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>", "<|EOT|>"}, "deepseek-coder", None, "None"),
    ({"<PRE>", "<SUF>", "<MID>", "</s>"}, "codellama", None, "None (<EOT> missing)"),
    ({"<PRE>", "<SUF>", "</s>"}, None, None, "codellama (no <MID>)"),
    (set(), None, None, "a preset"),
]


@pytest.mark.parametrize(("vocab", "family", "file_sep", "wrong"), DETECT_TABLE)
def test_detect_family_from_three_fim_tokens(
    vocab: set[str], family: str | None, file_sep: str | None, wrong: str
) -> None:
    t = detect_template(vocab | {"a", "def", "Ġreturn"})
    got = t.family if t is not None else None
    assert got == family, f"not {wrong}"
    if t is not None:
        assert t.file_sep == file_sep
        # every token the fitted template names is in the vocab (except EOS when none of them is)
        assert all(tok in vocab for tok in t.special_tokens if tok not in t.eos)
        assert t.repo_name is None or t.repo_name in vocab


def test_detect_keeps_presets_on_full_vocabularies() -> None:
    for t in (QWEN25_CODER, DEEPSEEK_CODER, CODELLAMA, BUNDLED):
        assert detect_template(set(t.special_tokens)) == t
    # only the EOS alternatives the vocab holds (a base DeepSeek model lacks <|EOT|>)
    base = detect_template({"<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>", "<｜end▁of▁sentence｜>"})
    assert base is not None and base.eos == ("<｜end▁of▁sentence｜>",)
    assert detect_template(set(STARCODER.special_tokens) | {"<fim_pad>"}) == STARCODER


def _tokenizer(specials: list[str]) -> Tokenizer:
    from tokenizers import Tokenizer as HF
    from tokenizers import models, pre_tokenizers

    hf = HF(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    hf.add_special_tokens(specials)
    return Tokenizer(hf)


def test_prompt_facts_prefix_only_and_fim() -> None:
    tok = _tokenizer(["<|endoftext|>", "<|im_end|>", *sorted(QWEN_TRIPLE)])
    ids = tok.special_tokens
    none = prompt_facts(None, [ids["<|im_end|>"]], 8192, tok)
    assert none.family == NO_FIM and none.fim is None
    # every special token stops a prefix-only completion, not only the config's EOS (<|im_end|>)
    assert none.eos_ids == frozenset(ids.values())
    assert (none.budget.prefix_tokens, none.budget.suffix_tokens, none.budget.context_tokens) == (832, 192, 0)
    fitted = detect_template(tok.get_vocab())
    assert fitted is not None
    qwen = prompt_facts(fitted, [], 32768, tok)
    assert qwen.family == "qwen2.5-coder" and qwen.fim is not None and qwen.fim.file_sep_id is None
    # PSM without a file separator: no context snippets, their share goes to the prefix
    assert (qwen.budget.prefix_tokens, qwen.budget.suffix_tokens, qwen.budget.context_tokens) == (800, 32, 0)
    with pytest.raises(ValueError, match="<fim_prefix>"):
        prompt_facts(BUNDLED, [], 1024, tok)  # a template whose tokens this tokenizer lacks


def test_prefix_only_model_completes_and_suffix_feeds_lookup() -> None:
    """A model without FIM tokens: the prompt is the prefix alone, the output equals plain greedy, and
    the suffix window still reaches prompt lookup (a suffix holding the continuation is drafted from)."""
    base = fake_models(with_draft=False, allow_eos=False)
    models = replace(base, fim=None, eos_ids=frozenset())
    budget = PromptBudget(prefix_tokens=300, suffix_tokens=200)
    pos = SOURCE.index("    total = 0")
    prefix = SOURCE[:pos]

    def run(settings: EngineSettings, suffix: str) -> tuple[OnnxEngine, str, int]:
        e = OnnxEngine(replace(settings, budget=budget, lru_size=0, completion_reuse=False), models)
        r = e.complete(
            CompletionRequest(doc_id="file:///w/a.py", prefix=prefix, suffix=suffix, max_tokens=40)
        )
        lookup = r.per_drafter.get("lookup")
        return e, r.text, lookup.accepted if lookup is not None else 0

    plain, text, _ = run(EngineSettings(speculation=False), "")
    assert len(text) >= 20
    assert plain.last_prompt == models.tokenizer.encode(prefix)  # Not a FIM layout: no special token
    with_suffix, text_s, accepted_s = run(EngineSettings(draft_model=False), text + "\n")
    without, text_n, accepted_n = run(EngineSettings(draft_model=False), "")
    assert text_s == text_n == text  # speculative == plain greedy
    assert with_suffix.last_prompt == plain.last_prompt  # the suffix is not in the prompt ...
    assert accepted_s > accepted_n  # ... but lookup drafted from it
