"""A fake target that rewrites a region as scripted: after a scripted prompt its greedy output is the
script's tokens, then an end-of-text id; anywhere else it is a ``FakeLM`` (random, exact)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specls.api import NextEditRequest
from specls.engine import LoadedModels
from specls.next_edit.layouts import EditLayout
from specls.next_edit.request_prompt import build_job
from specls.next_edit.settings import NextEditSettings
from tests.decoder.fakes import FakeLM, FakeLMConfig
from tests.specls.fakes import CharTokenizer, char_fim


class ScriptLM(FakeLM):
    def __init__(self, vocab: int, eos: int) -> None:
        super().__init__(FakeLMConfig(vocab=vocab, window=2, seed=3, scale=1.0))
        self.eos = eos
        self.scripts: list[tuple[list[int], list[int]]] = []

    def script(self, prompt: Sequence[int], output: Sequence[int]) -> None:
        self.scripts.append(([int(t) for t in prompt], [int(t) for t in output]))

    def logits_at(self, tokens: Sequence[int], pos: int) -> np.ndarray:
        row = super().logits_at(tokens, pos)
        for prompt, out in self.scripts:
            n = len(prompt)
            i = pos + 1 - n
            if 0 <= i <= len(out) and list(tokens[:n]) == prompt and list(tokens[n : pos + 1]) == out[:i]:
                row[out[i] if i < len(out) else self.eos] += 100.0
                break
        return row


def script_models() -> tuple[LoadedModels, ScriptLM]:
    tok = CharTokenizer()
    fim = char_fim(tok)
    (eos,) = fim.eos_ids
    lm = ScriptLM(tok.vocab_size, eos)
    return LoadedModels(target=lm, tokenizer=tok, fim=fim, eos_ids=frozenset({eos}), max_positions=8192), lm


def script_rewrite(
    models: LoadedModels,
    lm: ScriptLM,
    request: NextEditRequest,
    layout: EditLayout,
    settings: NextEditSettings,
    rewrite: str,
) -> list[int]:
    """Script ``lm`` to answer the request's prompt with ``rewrite`` of its region (the layout's
    output); returns the prompt."""
    job = build_job(request, layout, models.tokenizer, settings, models.max_positions)
    assert job is not None
    lm.script(job.prompt, models.tokenizer.encode(layout.output_of(rewrite)))
    return job.prompt
