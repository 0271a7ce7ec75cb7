"""The real-loop check: the decode loop with a drafter forced to a given acceptance rate (optionally paying
for the draft model's steps), timed against plain greedy and compared with the prediction."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from specls.decoder.api import CausalLM, DecodeSettings, Drafter, KVCache

from bench.lab.gpu.predict import (
    alpha_from_counts,
    best_gamma,
    predicted_speedup,
    predicted_speedup_with_overhead,
)
from bench.lab.gpu.report import GpuBenchReport, LoopMeasurement
from bench.lab.gpu.shapes import METHODS, GpuBenchSettings


def greedy_reference(lm: CausalLM, prompt: Sequence[int], n: int) -> list[int]:
    """Plain greedy decoding with one token per pass (no eos): the reference continuation."""
    cache = lm.new_cache()
    logits = cache.forward(list(prompt))  # logits: [len(prompt), vocab]
    out = [int(np.argmax(logits[-1]))]
    while len(out) < n:
        logits = cache.forward([out[-1]])  # logits: [1, vocab]
        out.append(int(np.argmax(logits[-1])))
    return out


class ForcedDrafter(Drafter):
    """Proposes the target's own greedy continuation ``reference`` of ``prompt``, each drafted token right
    with probability ``alpha`` (seeded) and otherwise a wrong id, always ``k`` tokens so every verify
    pass has N = k + 1. With ``draft_lm`` it also runs the draft model for those k steps (its output
    discarded), so the measured time pays the draft model's real cost."""

    def __init__(
        self,
        prompt: Sequence[int],
        reference: Sequence[int],
        alpha: float,
        vocab: int,
        seed: int,
        draft_lm: CausalLM | None = None,
    ) -> None:
        self.name = "draft" if draft_lm is not None else "lookup"
        self._full = [int(t) for t in prompt] + [int(t) for t in reference]
        self._alpha = alpha
        self._vocab = vocab
        self._rng = np.random.default_rng(seed)
        self._cache: KVCache | None = draft_lm.new_cache() if draft_lm is not None else None
        self._fed: list[int] = []  # the tokens the draft cache holds
        self.proposed = 0

    def prime(self, prompt: Sequence[int]) -> None:
        """Prefill the draft model with the prompt (outside the timed decode phase)."""
        if self._cache is not None and len(prompt) > 1:
            self._cache.forward(list(prompt[:-1]))
            self._fed = list(prompt[:-1])

    def _draft_steps(self, context: Sequence[int], proposal: Sequence[int]) -> None:
        cache = self._cache
        assert cache is not None
        common = 0
        for a, b in zip(self._fed, context, strict=False):
            if a != b:
                break
            common += 1
        cache.truncate(common)
        self._fed = self._fed[:common]
        # one catch-up pass (newly committed tokens) yields the first draft, then one step per draft
        feed = [list(context[common:]), *[[t] for t in proposal[:-1]]]
        for ids in feed:
            if ids:
                cache.forward(ids)  # logits: [len(ids), vocab], discarded
                self._fed += ids

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        n = len(context)
        if k <= 0 or list(context) != self._full[:n]:
            return []
        right = self._full[n : n + k]
        out = [t if self._rng.random() < self._alpha else (t + 1) % self._vocab for t in right]
        if self._cache is not None and out:
            self._draft_steps(context, out)
        self.proposed += len(out)
        return out

    def observe(self, n_accepted: int, n_verified: int) -> None:
        pass

    def proposal_probs(self) -> np.ndarray | None:
        return None


def run_loop(
    settings: GpuBenchSettings,
    report: GpuBenchReport,
    target: CausalLM,
    draft: CausalLM,
    say: Callable[[str], None],
) -> None:
    from specls.decoder.loop import generate

    prompt_len = settings.prompt_tokens or min(settings.past_lengths)
    rng = np.random.default_rng(settings.seed + 7)
    prompt = rng.integers(0, target.vocab_size, size=prompt_len).tolist()
    n = settings.gen_tokens
    reference = greedy_reference(target, prompt, n)
    # the prediction at the loop's mean past length (prompt + half the new tokens), from the curve at
    # the nearest measured L
    L = min(settings.past_lengths, key=lambda x: abs(x - (prompt_len + n // 2)))
    curve, c = report.target_ms[L], report.c[L]

    def run(drafter: ForcedDrafter | None, gamma: int) -> tuple[list[int], float, Any]:
        decode = DecodeSettings(max_new_tokens=n, draft_length=gamma)
        cache = target.new_cache()
        if drafter is not None:
            drafter.prime(prompt)
        res = generate(cache, prompt, drafter, decode, frozenset())
        return list(res.tokens), float(res.decode_ms), res

    greedy_times: list[float] = []
    for i in range(settings.loop_repeats + 1):  # the first run warms up
        toks, ms, _ = run(None, 0)
        if toks != reference:
            report.greedy_matches = False
        if i > 0:
            greedy_times.append(ms)
    greedy_ms = statistics.median(greedy_times)
    overhead = max(0.0, greedy_ms / n - curve[1])
    report.loop_overhead_ms = overhead
    say(f"loop: plain greedy {n} tokens after a {prompt_len}-token prompt: {greedy_ms:.1f} ms")
    for method in METHODS:
        for a in settings.loop_alphas:
            gamma, _ = best_gamma(curve, c, a, method, max(report.ns) - 1)
            times: list[float] = []
            matches = True
            res: Any = None
            counts = np.zeros(3)  # drafted, accepted, proposals over every run (warm-up included)
            for i in range(settings.loop_repeats + 1):
                drafter = ForcedDrafter(
                    prompt,
                    reference,
                    a,
                    target.vocab_size,
                    settings.seed + 100 + i,
                    draft if method == "draft" else None,
                )
                toks, ms, res = run(drafter, gamma)
                matches = matches and toks == reference
                st = res.per_drafter.get(drafter.name)
                if st is not None:
                    counts += (st.drafted, st.accepted, st.proposals)
                if i > 0:
                    times.append(ms)
            spec_ms = statistics.median(times)
            realized = alpha_from_counts(*(float(x) for x in counts))
            m = LoopMeasurement(
                method=method,
                alpha=a,
                gamma=gamma,
                prompt_tokens=prompt_len,
                new_tokens=n,
                greedy_ms=greedy_ms,
                spec_ms=spec_ms,
                measured_speedup=greedy_ms / spec_ms if spec_ms > 0 else 0.0,
                predicted_speedup=predicted_speedup(curve, c, a, gamma, method),
                target_passes=int(res.target_passes),
                drafted=int(res.drafted),
                accepted=int(res.accepted),
                realized_alpha=realized,
                predicted_at_realized=(
                    predicted_speedup(curve, c, realized, gamma, method) if realized is not None else None
                ),
                predicted_with_overhead=(
                    predicted_speedup_with_overhead(
                        curve, c, realized, gamma, method, overhead, report.truncate_ms.get(L, 0.0)
                    )
                    if realized is not None
                    else None
                ),
                matches_greedy=matches,
            )
            report.loop.append(m)
            say(
                f"loop: {method} a={a} g={gamma}: {spec_ms:.1f} ms, measured {m.measured_speedup:.2f}x, "
                f"predicted {m.predicted_speedup:.2f}x, == greedy: {matches}"
            )
