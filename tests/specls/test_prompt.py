"""Prompt layout, budgets and the stability of the token prefix across keystrokes."""

from __future__ import annotations

from dataclasses import replace

import pytest
from specls.decoder.ngram import common_prefix_len as longest_common_prefix

from specls.prompt import PromptBudget, PromptBuilder, default_budget, split_lines, visible_text
from tests.specls.fakes import SOURCE, CharTokenizer, char_fim


def builder(order: str = "spm", **budget: int) -> tuple[PromptBuilder, CharTokenizer]:
    tok = CharTokenizer()
    return PromptBuilder(tok, char_fim(tok, order), PromptBudget(**budget)), tok


def test_spm_layout_suffix_first_prefix_last() -> None:
    b, tok = builder("spm")
    p = b.build("def f(x):\n    return ", "\n\nprint(f(1))\n")
    fim = b.fim
    assert fim is not None
    text = tok.decode(p.tokens)
    assert text == "<fim_prefix><fim_suffix>\n\nprint(f(1))\n<fim_middle>def f(x):\n    return "
    assert p.tokens[0] == fim.prefix_id  # Not fim.suffix_id first: StarCoder-style SPM
    assert p.suffix_tokens == tok.encode("\n\nprint(f(1))\n")


def test_psm_layout() -> None:
    b, tok = builder("psm")
    p = b.build("a = ", "\nb = 2\n")
    assert tok.decode(p.tokens) == "<fim_prefix>a = <fim_suffix>\nb = 2\n<fim_middle>"


def test_typing_at_cursor_keeps_token_prefix() -> None:
    b, _ = builder("spm", prefix_tokens=200, suffix_tokens=64, line_chunk=4)
    cut = SOURCE.index("total = 0") + len("total")
    prefix, suffix = SOURCE[:cut], SOURCE[cut:]
    prev = b.build(prefix, suffix).tokens
    for ch in " = 0\n    fo":
        prefix += ch
        cur = b.build(prefix, suffix).tokens
        # only the appended character differs: the whole previous prompt is a prefix of the new one
        assert longest_common_prefix(prev, cur) == len(prev)  # Not len(prev) - k: BPE boundaries moved
        prev = cur


def test_prefix_window_edge_moves_in_line_chunks() -> None:
    b, tok = builder("spm", prefix_tokens=120, suffix_tokens=0, line_chunk=4)
    lines = [f"x{i} = {i}\n" for i in range(200)]  # 7-8 tokens a line
    starts = set()
    for n in range(20, 200):
        tokens, start = b.prefix_window("".join(lines[:n]))
        assert len(tokens) <= 120
        assert start % 4 == 0  # Not an arbitrary line: the edge moves in jumps of line_chunk
        assert tok.decode(tokens) == "".join(lines[start:n])
        starts.add(start)
    assert len(starts) > 5  # it did move


def test_huge_single_line_is_hard_cut_to_budget() -> None:
    b, tok = builder("spm", prefix_tokens=50, suffix_tokens=30)
    p = b.build("y = '" + "a" * 1000, "b" * 500 + "'\n")
    assert len(p.suffix_tokens) == 30
    assert len(p.tokens) == 3 + 30 + 50
    assert tok.decode(p.tokens).endswith("a" * 50)


def test_suffix_cut_at_line_end() -> None:
    b, tok = builder("spm", suffix_tokens=20)
    toks = b.suffix_window("first line\nsecond line\nthird\n")
    assert tok.decode(toks) == "first line\n"  # Not "first line\nsecond li": cut at a line end


def test_context_snippets_with_file_separator() -> None:
    b, tok = builder("spm", context_tokens=80, min_snippet_tokens=5)
    docs = (("file:///w/other.py", "def helper():\n    return 1\n"), ("file:///w/me.py", "ignored\n"))
    p = b.build("x = ", "\n", docs, doc_id="file:///w/me.py")
    text = tok.decode(p.tokens)
    assert text.startswith("<file_sep>w/other.py\ndef helper():\n    return 1\n<fim_prefix>")
    assert "ignored" not in text  # the current document is not its own context
    assert p.context_docs_used == 1


def test_context_budget_respected() -> None:
    b, tok = builder("spm", context_tokens=40, min_snippet_tokens=5)
    docs = tuple((f"file:///w/m{i}.py", "".join(f"v{j} = {j}\n" for j in range(50))) for i in range(5))
    p = b.build("x", "", docs)
    n_context = p.tokens.index(char_fim(tok).prefix_id)
    assert 0 < n_context <= 40


def test_display_path() -> None:
    from specls.prompt import _display_path

    assert _display_path("file:///home/me/proj/pkg/mod%20x.py") == "pkg/mod x.py"
    assert _display_path("untitled:Untitled-1") == "Untitled-1"
    assert _display_path("file:///C:/src/a.py") == "src/a.py"


def test_helpers() -> None:
    assert split_lines("a\nb\r\nc") == ["a\n", "b\r\n", "c"]
    assert split_lines("") == []
    assert visible_text("ab\ufffd\ufffd") == "ab"
    assert longest_common_prefix(list(range(200)), [*range(150), 7]) == 150
    assert longest_common_prefix([], [1]) == 0


def test_long_prefix_tail_window_matches_full_scan() -> None:
    """The tail-only split gives the same window as scanning every line, aligned to absolute lines."""
    b, tok = builder("spm", prefix_tokens=200, line_chunk=4)
    lines = [f"value_{i} = compute({i}, {i * 7})\n" for i in range(3000)]
    text = "".join(lines)
    tokens, start = b.prefix_window(text)
    assert start == 2996  # Not 2995 (the best unaligned fit): 4 lines of ~34 tokens fit, 8 do not
    assert tok.decode(tokens) == "".join(lines[start:])
    assert len(tokens) <= 200


def test_prefix_only_layout_keeps_suffix_for_lookup() -> None:
    """No FIM template (any causal LM): the prompt is the start tokens and the prefix window; the
    suffix window is cut as usual (it feeds prompt lookup) but not put in the prompt."""
    tok = CharTokenizer()
    eos = tok.token_to_id("<|endoftext|>")
    assert eos is not None
    b = PromptBuilder(tok, None, PromptBudget(prefix_tokens=20, suffix_tokens=6), start=[eos])
    docs = (("file:///w/other.py", "x = 1\n" * 40),)
    p = b.build("a = 1\nb = ", "2\nc = 3\nd = 4\n", docs, "file:///w/a.py")
    assert p.tokens == [eos, *tok.encode("a = 1\nb = ")]  # Not <fim_prefix>...: no FIM token at all
    assert p.suffix_tokens == tok.encode("2\n")  # Not "2\nc = ": cut at a line end within 6 tokens
    assert p.context_docs_used == 0  # snippets need a file separator
    # typing at the cursor only appends to the prompt (the KV prefix survives)
    assert longest_common_prefix(p.tokens, b.build("a = 1\nb = 2", "\nc = 3\n").tokens) == len(p.tokens)


def test_start_tokens_lead_fim_prompts() -> None:
    tok = CharTokenizer()
    b = PromptBuilder(tok, char_fim(tok, "psm"), PromptBudget(), start=[7])
    tokens = b.build("a", "b").tokens
    assert tokens[0] == 7 and tok.decode(tokens[1:]) == "<fim_prefix>a<fim_suffix>b<fim_middle>"


# (max_context, family, order, file_sep) -> (prefix, suffix, context) tokens, and the wrong answer
BUDGET_TABLE = [
    ((1024, "bundled", "spm", True), (256, 96, 64), "640/192/128: the bundled pair trained on 512 positions"),
    ((32768, "qwen2.5-coder", "psm", True), (672, 32, 128), "a 32k window: cold prefill of minutes on a CPU"),
    ((32768, "qwen2.5-coder", "psm", False), (800, 32, 0), "context 128 with no file separator to use it"),
    ((32768, "starcoder", "spm", True), (512, 192, 128), "PSM's small suffix: SPM keeps the suffix cached"),
    ((8192, "none", None, False), (832, 192, 0), "a suffix share of the prompt: prefix-only has none"),
    ((256, "none", None, False), (208, 48, 0), "1024 positions: more than the model's context"),
    ((2048, "bundled", "spm", True), (256, 96, 64), "the context decides alone"),
]


@pytest.mark.parametrize(("args", "want", "wrong"), BUDGET_TABLE)
def test_default_budget_follows_context_and_family(
    args: tuple[int, str, str | None, bool], want: tuple[int, int, int], wrong: str
) -> None:
    b = default_budget(*args)
    assert (b.prefix_tokens, b.suffix_tokens, b.context_tokens) == want, f"not {wrong}"
    window = min(args[0], 512 if args[1] == "bundled" else 1024)
    in_prompt = b.prefix_tokens + b.context_tokens + (b.suffix_tokens if args[2] else 0)
    assert in_prompt + window * 3 // 16 == window  # room left for the completion and FIM tokens
    assert PromptBudget() == default_budget(1024, "bundled", "spm", True) == replace(PromptBudget())
