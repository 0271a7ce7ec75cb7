"""The decode loop: speculative == plain greedy, cache invariants, prefix reuse, stops, stats, sampling."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from specls.decoder.acceptance import process_logits
from specls.decoder.api import DecodeSettings, Drafter, KVCache, PassInterrupted, StopWhen
from specls.decoder.drafters import DrafterSettings, DraftModelDrafter, PromptLookupDrafter
from specls.decoder.loop import generate
from specls.decoder.ngram import NgramIndex
from specls.decoder.planned import PlannedDrafter, PolicyState
from specls.decoder.policy import PassCosts

from tests.decoder.fakes import FakeCache, FakeLM, FakeLMConfig, ScriptedDrafter

PROMPT = [5, 9, 17, 2, 40, 33, 8]
N = 48
TARGET = FakeLM(FakeLMConfig(vocab=64, window=3, seed=0))
REF = TARGET.greedy(PROMPT, N)
FULL = PROMPT + REF
K = 4  # draft length of the scripted-drafter cases (a scripted drafter drafts all it is offered)


class CheckedCache(KVCache):
    """Wraps a FakeCache and checks the loop's cache invariant on every call: before each forward the
    cache plus the first fed token is a prefix of the true sequence (cache == committed - last), and
    after each truncate the cache holds only committed tokens (no rejected draft survives)."""

    def __init__(self, inner: FakeCache, full: Sequence[int]) -> None:
        self.inner = inner
        self.full = list(full)
        self.forwards = 0
        self.truncates = 0
        self.fed_end = 0  # the furthest position any pass fed (exclusive)

    @property
    def length(self) -> int:
        return self.inner.length

    def forward(self, ids: Sequence[int]) -> np.ndarray:
        n = self.inner.length
        assert self.inner.tokens + [int(ids[0])] == self.full[: n + 1]
        self.forwards += 1
        self.fed_end = max(self.fed_end, n + len(ids))
        return self.inner.forward(ids)

    def truncate(self, n: int) -> None:
        self.inner.truncate(n)
        assert self.inner.tokens == self.full[:n]
        self.truncates += 1


def _index_with_reference() -> NgramIndex:
    index = NgramIndex()
    index.update("other.py", [1, 2, 3] + REF[5:25] + [60, 61] + REF[30:44])
    return index


def _drafters() -> list[tuple[str, Drafter]]:
    out: list[tuple[str, Drafter]] = [
        ("right", ScriptedDrafter(PROMPT, REF, 64, "right")),
        ("wrong", ScriptedDrafter(PROMPT, REF, 64, "wrong")),
    ]
    out += [(f"wrong_at_{j}", ScriptedDrafter(PROMPT, REF, 64, "wrong_at", j)) for j in range(K + 1)]
    near = FakeLM.perturbed(TARGET, 0.4, seed=11)
    out += [
        ("lookup", PromptLookupDrafter(_index_with_reference())),
        ("draft_other_seed", DraftModelDrafter(FakeLM(FakeLMConfig(vocab=64, window=3, seed=7)))),
        ("draft_near", DraftModelDrafter(near)),
        ("policy", _planned(PromptLookupDrafter(_index_with_reference()), DraftModelDrafter(near))),
        ("policy_lookup", _planned(PromptLookupDrafter(_index_with_reference()), None)),
        ("policy_draft", _planned(None, DraftModelDrafter(near))),
    ]
    return out


def _planned(lookup: PromptLookupDrafter | None, model: DraftModelDrafter | None) -> PlannedDrafter:
    """The drafting policy over these drafters, with a draft model cheap enough that it gets used."""
    return PlannedDrafter(lookup, model, PolicyState(costs=PassCosts(step=0.05, catchup=0.001)))


LENGTHS = {
    "length1": DecodeSettings(max_new_tokens=N, draft_length=1),
    "lengthK": DecodeSettings(max_new_tokens=N, draft_length=K),
    "default": DecodeSettings(max_new_tokens=N),
    # the prompt prefilled by a run of its own instead of riding with the first pass
    "own_prefill": DecodeSettings(max_new_tokens=N, draft_length=8, fold_prefill=0),
}


def prefill_runs(prompt: Sequence[int], settings: DecodeSettings, cached: int = 0) -> int:
    """Forwards before the first pass: none when the uncached prompt[:-1] rides with it."""
    return 0 if len(prompt) - 1 - cached <= settings.fold_prefill else 1


@pytest.mark.parametrize("length", list(LENGTHS))
@pytest.mark.parametrize("which", [name for name, _ in _drafters()])
def test_speculative_equals_plain_greedy(which: str, length: str) -> None:
    drafter = dict(_drafters())[which]
    cache = CheckedCache(TARGET.new_cache(), FULL)
    result = generate(cache, PROMPT, drafter, LENGTHS[length], frozenset())
    assert result.tokens == REF
    assert result.stop_reason == "max_tokens"
    assert cache.inner.tokens == FULL[: cache.length]  # on return: a prefix of prompt + tokens
    assert cache.length >= len(FULL) - 1
    # one forward per pass, after the prefill's (Not the same count when the prompt rode along)
    assert result.target_passes == cache.forwards - prefill_runs(PROMPT, LENGTHS[length])
    assert sum(s.drafted for s in result.per_drafter.values()) == result.drafted
    assert sum(s.accepted for s in result.per_drafter.values()) == result.accepted
    assert result.accepted + result.target_passes == len(REF)  # each pass: accepted + one token


def test_always_right_drafter_takes_few_passes_and_wrong_one_takes_n() -> None:
    fixed = LENGTHS["lengthK"]
    right = generate(
        TARGET.new_cache(), PROMPT, ScriptedDrafter(PROMPT, REF, 64, "right"), fixed, frozenset()
    )
    assert right.target_passes == -(-N // (K + 1))  # ceil(N / (K+1)): K accepted + bonus. Not N
    assert right.accepted == N - right.target_passes
    full, rest = divmod(N, K + 1)  # full passes, then one pass drafting rest - 1 (max_new_tokens clip)
    assert right.accept_hist == [full + (i < rest - 1) for i in range(K)]
    wrong = generate(
        TARGET.new_cache(), PROMPT, ScriptedDrafter(PROMPT, REF, 64, "wrong"), fixed, frozenset()
    )
    assert wrong.target_passes == N
    assert wrong.accepted == 0 and wrong.drafted > 0
    assert wrong.accept_hist == [0] * len(wrong.accept_hist)


@pytest.mark.parametrize("j", range(K))
def test_accept_hist_for_wrong_at_j(j: int) -> None:
    fixed = LENGTHS["lengthK"]
    result = generate(
        TARGET.new_cache(), PROMPT, ScriptedDrafter(PROMPT, REF, 64, "wrong_at", j), fixed, frozenset()
    )
    proposals = result.per_drafter["scripted-wrong_at"].proposals
    # positions before j are accepted in every full-length pass, from j on never. Not all zero
    assert all(result.accept_hist[i] >= proposals - 2 for i in range(j))
    assert all(result.accept_hist[i] == 0 for i in range(j, len(result.accept_hist)))


@pytest.mark.parametrize("cached", [0, 1, 4, len(PROMPT) - 1, len(PROMPT)])
def test_prefix_reuse_equals_fresh(cached: int) -> None:
    cache = TARGET.new_cache()
    if cached:
        cache.forward(PROMPT[:cached])
    drafter = _planned(PromptLookupDrafter(NgramIndex()), DraftModelDrafter(FakeLM.perturbed(TARGET, 0.4, 3)))
    result = generate(cache, PROMPT, drafter, LENGTHS["default"], frozenset())
    assert result.tokens == REF
    # tokens computed: the uncached ones, or the last one re-fed when all were cached. Not 0
    assert result.prefill_tokens == max(len(PROMPT) - cached, 1)


def test_cache_after_generate_serves_the_next_request() -> None:
    cache = TARGET.new_cache()
    first = generate(cache, PROMPT, None, DecodeSettings(max_new_tokens=20), frozenset())
    held = (PROMPT + first.tokens)[: cache.length]
    assert cache.tokens == held
    prompt2 = held[:-3] + [11, 12]  # the user edited near the end
    cache.truncate(len(held) - 3)  # the caller keeps the common prefix
    second = generate(
        cache, prompt2, ScriptedDrafter(prompt2, [], 64), DecodeSettings(max_new_tokens=20), frozenset()
    )
    assert second.tokens == TARGET.greedy(prompt2, 20)
    assert second.prefill_tokens == 2


def test_eos_stops_and_is_not_included() -> None:
    eos = REF[12]
    expected = TARGET.greedy(PROMPT, N, frozenset({eos}))
    assert len(expected) < N  # the eos really occurs
    for drafter in (None, ScriptedDrafter(PROMPT, REF, 64, "right")):
        cache = CheckedCache(TARGET.new_cache(), FULL)
        result = generate(cache, PROMPT, drafter, LENGTHS["lengthK"], frozenset({eos}))
        assert result.tokens == expected  # Not expected + [eos]
        assert result.stop_reason == "eos"
        assert cache.inner.tokens == (PROMPT + expected)[: cache.length]


@pytest.mark.parametrize("max_new", [1, 2, 3, 5, 7, 11])
def test_max_new_tokens_never_exceeded(max_new: int) -> None:
    settings = DecodeSettings(max_new_tokens=max_new, draft_length=8)
    cache = CheckedCache(TARGET.new_cache(), FULL)
    result = generate(cache, PROMPT, ScriptedDrafter(PROMPT, REF, 64, "right"), settings, frozenset())
    assert result.tokens == REF[:max_new]  # Not REF[:max_new + bonus]
    assert result.stop_reason == "max_tokens"


def test_stop_callback_cuts_inside_an_accepted_draft() -> None:
    target_token = REF[6]
    first = REF.index(target_token)
    cache = CheckedCache(TARGET.new_cache(), FULL)
    result = generate(
        cache,
        PROMPT,
        ScriptedDrafter(PROMPT, REF, 64, "right"),
        LENGTHS["lengthK"],
        frozenset(),
        stop=StopWhen(lambda toks: toks[-1] == target_token),
    )
    assert result.tokens == REF[: first + 1]  # the stop token is kept; nothing after it
    assert result.stop_reason == "stop"
    assert cache.inner.tokens == FULL[: cache.length]


@pytest.mark.parametrize("ends", ["stop", "eos"])
def test_no_draft_token_past_a_stop_or_an_eos_is_verified(ends: str) -> None:
    """The right drafter proposes K tokens a pass (K + 1 committed); the one ending the decode sits
    inside a proposal, so the rows after it would be verified for nothing."""
    first = next(i for i in range(6, N) if REF.index(REF[i]) == i and i % (K + 1) not in (K - 1, K))
    token = REF[first]
    drafter = ScriptedDrafter(PROMPT, REF, 64, "right")
    cache = CheckedCache(TARGET.new_cache(), FULL)
    if ends == "stop":
        result = generate(
            cache, PROMPT, drafter, LENGTHS["lengthK"], frozenset(), stop=StopWhen(lambda t: t[-1] == token)
        )
        assert result.tokens == REF[: first + 1] and result.stop_reason == "stop"
    else:
        result = generate(cache, PROMPT, drafter, LENGTHS["lengthK"], frozenset({token}))
        assert result.tokens == REF[:first] and result.stop_reason == "eos"
    uncut = len(PROMPT) + (first // (K + 1)) * (K + 1) + K  # where the last proposal's rows would end
    assert cache.fed_end == len(PROMPT) + first + 1 < uncut  # Not uncut: no row past the last token
    assert drafter.observed[-1] == drafter.verified[-1] == first % (K + 1) + 1  # verified: the cut draft


def test_horizon_of_a_stop() -> None:
    stop = StopWhen(lambda toks: toks[-1] == 0)
    assert stop([3, 0]) and not stop([0, 3])
    assert stop.horizon([3], [4, 0, 5, 0]) == 2  # Not 4: the 5 and the last 0 are never committed
    assert stop.horizon([0], [4, 5]) == 2  # an earlier stop token is not the draft's
    assert stop.horizon([], [0]) == 1


@pytest.mark.parametrize("length", ["lengthK", "own_prefill"])
@pytest.mark.parametrize("m", [0, 1, 3])
def test_cancel_returns_after_exactly_that_pass(m: int, length: str) -> None:
    cache = TARGET.new_cache()
    runs = prefill_runs(PROMPT, LENGTHS[length])  # decode passes = forwards - the prefill's
    result = generate(
        cache,
        PROMPT,
        ScriptedDrafter(PROMPT, REF, 64, "wrong_at", 2),
        LENGTHS[length],
        frozenset(),
        cancelled=lambda: cache.counter.calls - runs >= m,
    )
    assert result.stop_reason == "cancelled"
    assert result.target_passes == m  # Not m + 1
    assert cache.counter.calls == m + runs
    assert result.tokens == REF[: len(result.tokens)]
    assert len(result.tokens) >= m


def test_cancelled_before_start_runs_nothing() -> None:
    cache = TARGET.new_cache()
    result = generate(cache, PROMPT, None, LENGTHS["length1"], frozenset(), cancelled=lambda: True)
    assert result.stop_reason == "cancelled" and result.tokens == []
    assert cache.counter.calls == 0


def test_deadline_with_injected_clock() -> None:
    cache = TARGET.new_cache()
    # time = number of forward calls so far: each decode pass takes "1 second"
    result = generate(
        cache,
        PROMPT,
        ScriptedDrafter(PROMPT, REF, 64, "wrong"),
        DecodeSettings(max_new_tokens=N, deadline_s=3.5),
        frozenset(),
        clock=lambda: float(cache.counter.calls),
    )
    assert result.stop_reason == "deadline"
    assert result.target_passes == 4  # the first pass whose end is past 3.5 s. Not 3
    assert result.tokens == REF[:4]


@pytest.mark.parametrize(
    ("prompt", "cached"),
    [([], 0), ([1, 2], 3)],
)
def test_bad_input_is_a_clear_error(prompt: list[int], cached: int) -> None:
    cache = TARGET.new_cache()
    if cached:
        cache.forward([1] * cached)
    with pytest.raises(ValueError):
        generate(cache, prompt, None, DecodeSettings(), frozenset())


def test_zero_max_new_tokens_is_an_empty_result() -> None:
    cache = TARGET.new_cache()
    result = generate(cache, PROMPT, None, DecodeSettings(max_new_tokens=0), frozenset())
    assert result.tokens == [] and cache.counter.calls == 0


def test_the_policy_reports_sub_drafter_stats() -> None:
    result = generate(
        TARGET.new_cache(),
        PROMPT,
        _planned(
            PromptLookupDrafter(_index_with_reference()), DraftModelDrafter(FakeLM.perturbed(TARGET, 0.4, 3))
        ),
        LENGTHS["default"],
        frozenset(),
    )
    assert set(result.per_drafter) == {"lookup", "draft"}  # Not {"policy"}
    assert result.per_drafter["lookup"].accepted > 0
    assert result.per_drafter["draft"].accepted > 0


# -- sampling mode -----------------------------------------------------------------------------


def test_sampling_is_reproducible_with_a_seed() -> None:
    settings = DecodeSettings(max_new_tokens=20, temperature=0.8, seed=42)
    draft = FakeLM.perturbed(TARGET, 0.4, 3)
    a = generate(TARGET.new_cache(), PROMPT, DraftModelDrafter(draft), settings, frozenset())
    b = generate(TARGET.new_cache(), PROMPT, DraftModelDrafter(draft), settings, frozenset())
    c = generate(
        TARGET.new_cache(),
        PROMPT,
        DraftModelDrafter(draft),
        DecodeSettings(max_new_tokens=20, temperature=0.8, seed=43),
        frozenset(),
    )
    assert a.tokens == b.tokens
    assert a.tokens != c.tokens


@pytest.mark.parametrize("which", ["draft", "policy", "policy_draft", "none"])
def test_sampling_loop_matches_target_distribution(which: str) -> None:
    """Joint distribution of the first two tokens through the whole loop (draft length 2) ==
    p(t1) p(t2|t1). The policy plans sampling too: its proposals carry q (point masses for lookup
    tokens, the draft model's distributions after them)."""
    vocab = 6
    target = FakeLM(FakeLMConfig(vocab=vocab, window=1, seed=1, scale=1.0))
    draft_lm = FakeLM.perturbed(target, 0.8, seed=2)
    prompt = [0, 1, 2, 3, 1]
    temperature = 0.9
    p1 = process_logits(target.logits_at(prompt, len(prompt) - 1), temperature)
    p2 = np.stack([process_logits(target.logits_at([t], 0), temperature) for t in range(vocab)])
    exact = p1[:, None] * p2  # [vocab, vocab]
    index = NgramIndex(min_n=1, max_n=2)
    index.update("doc", [1, 4, 2, 1, 5, 5, 1, 3])
    draws = 5000
    counts = np.zeros((vocab, vocab))
    drafted = 0
    sources: set[str] = set()
    ds = DrafterSettings(lookup_min_n=1, lookup_max_n=2)
    for seed in range(draws):
        drafter: Drafter | None = None
        if which == "draft":
            drafter = DraftModelDrafter(draft_lm)
        elif which == "policy":
            drafter = _planned(PromptLookupDrafter(index, ds), DraftModelDrafter(draft_lm, ds))
        elif which == "policy_draft":
            drafter = _planned(None, DraftModelDrafter(draft_lm, ds))
        settings = DecodeSettings(max_new_tokens=3, draft_length=2, temperature=temperature, seed=seed)
        result = generate(target.new_cache(), prompt, drafter, settings, frozenset())
        counts[result.tokens[0], result.tokens[1]] += 1
        drafted += result.drafted
        sources |= {name for name, s in result.per_drafter.items() if s.drafted}
    tv = 0.5 * np.abs(counts / draws - exact).sum()
    assert tv < 0.05
    if which != "none":
        assert drafted >= draws  # the drafter really drafted
    if which == "policy":
        assert sources == {"lookup", "draft"}  # both kinds of proposal rows were verified


class _FailingDrafter(ScriptedDrafter):
    """Right for a few proposals, then raises (or returns garbage)."""

    def __init__(self, fail_after: int, how: str) -> None:
        super().__init__(PROMPT, REF, 64, "right")
        self.calls = 0
        self.fail_after = fail_after
        self.how = how

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        self.calls += 1
        if self.calls > self.fail_after:
            if self.how == "raise":
                raise RuntimeError("draft model crashed")
            return [-3] * k
        return super().propose(context, k)


@pytest.mark.parametrize("how", ["raise", "negative"])
def test_a_failing_drafter_degrades_to_plain_decoding(how: str) -> None:
    drafter = _FailingDrafter(2, how)
    cache = CheckedCache(TARGET.new_cache(), FULL)
    result = generate(cache, PROMPT, drafter, LENGTHS["lengthK"], frozenset())
    assert result.tokens == REF  # Not an exception
    assert drafter.calls == 3  # never asked again after it failed
    assert result.accepted == 2 * K


class AppendingCache(FakeCache):
    """A cache with ``append`` (a forward whose logits nobody reads), recording how it was fed."""

    def __init__(self, model: FakeLM) -> None:
        super().__init__(model)
        self.appended: list[int] = []  # sizes of append calls
        self.forwarded: list[int] = []  # sizes of forward calls

    def forward(self, ids: Sequence[int]) -> np.ndarray:
        self.forwarded.append(len(ids))
        return super().forward(ids)

    def append(self, ids: Sequence[int]) -> None:
        self.appended.append(len(ids))
        FakeCache.forward(self, ids)


def test_prefill_goes_through_append_when_the_cache_has_it() -> None:
    cache = AppendingCache(TARGET)
    out = generate(cache, PROMPT, None, DecodeSettings(max_new_tokens=8, fold_prefill=0), frozenset())
    assert out.tokens == REF[:8]
    assert cache.appended == [len(PROMPT) - 1]  # the prompt but its last token, logits never read
    assert cache.forwarded == [1] * 8  # Not [len(PROMPT) - 1, 1, ...]: decode passes only


@pytest.mark.parametrize("cached", [0, 3, len(PROMPT) - 1])
def test_a_short_prompt_tail_rides_with_the_first_pass(cached: int) -> None:
    cache = AppendingCache(TARGET)
    if cached:
        FakeCache.forward(cache, PROMPT[:cached])
    drafter = ScriptedDrafter(PROMPT, REF, 64, "wrong_at", 2)
    settings = DecodeSettings(max_new_tokens=12, draft_length=4)
    out = generate(cache, PROMPT, drafter, settings, frozenset())
    assert out.tokens == REF[:12]
    assert cache.appended == []  # Not a prefill run of its own
    assert cache.forwarded[0] == len(PROMPT) - cached + 4  # tail + last prompt token + 4 drafted
    assert out.prefill_tokens == len(PROMPT) - cached
    # 2 accepted + the target's token a pass: 4 passes, 4 forwards (Not 5: no prefill forward)
    assert out.target_passes == len(cache.forwarded) == 4 and out.accepted == 8
    assert out.first_pass_tokens == 3  # its 2 accepted drafts + the target's token. Not 1


def test_the_first_pass_is_timed_apart() -> None:
    cache = TARGET.new_cache()
    # time = number of forward calls so far: each pass takes "1 second"
    clock = lambda: float(cache.counter.calls)  # noqa: E731
    out = generate(cache, PROMPT, None, DecodeSettings(max_new_tokens=5), frozenset(), clock=clock)
    assert out.tokens == REF[:5] and out.target_passes == 5
    assert (out.first_pass_ms, out.first_pass_tokens) == (1000.0, 1)
    assert out.decode_ms == 5000.0  # the first pass included: decode_ms - first_pass_ms is the rest


class GreedyIdsCache(FakeCache):
    """A cache whose greedy verify passes are counted (``forward_greedy``) apart from other forwards."""

    def __init__(self, model: FakeLM) -> None:
        super().__init__(model)
        self.greedy: list[int] = []
        self.forwards = 0

    def forward(self, ids: Sequence[int]) -> np.ndarray:
        self.forwards += 1
        return super().forward(ids)

    def forward_greedy(self, ids: Sequence[int]) -> np.ndarray:
        self.greedy.append(len(ids))
        return np.argmax(super().forward(ids), axis=-1).astype(np.int64)


def test_greedy_verify_passes_ask_for_ids_only() -> None:
    cache = GreedyIdsCache(TARGET)
    out = generate(cache, PROMPT, ScriptedDrafter(PROMPT, REF, 64, "right"), LENGTHS["lengthK"], frozenset())
    assert out.tokens == REF
    assert len(cache.greedy) == out.target_passes  # verify passes, the first with the prompt riding
    assert cache.greedy[0] == len(PROMPT) + K and max(cache.greedy[1:]) == K + 1
    assert cache.forwards == 0  # Not one logits pass per step (the prompt rode with the first pass)


LONG = PROMPT * 5  # 35 tokens: 34 to prefill


@pytest.mark.parametrize(("chunk", "runs"), [(0, [34]), (128, [34]), (8, [8, 8, 8, 8, 2]), (34, [34])])
def test_prefill_runs_of_prefill_chunk_tokens(chunk: int, runs: list[int]) -> None:
    cache = AppendingCache(TARGET)
    settings = DecodeSettings(max_new_tokens=6, prefill_chunk=chunk, fold_prefill=0)
    out = generate(cache, LONG, None, settings, frozenset())
    assert out.tokens == TARGET.greedy(LONG, 6)
    assert cache.appended == runs  # Not [34] for chunk 8: a cancel could not land inside it
    assert out.prefill_tokens == len(LONG)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_cancel_between_prefill_runs_keeps_the_runs_done(k: int) -> None:
    cache = AppendingCache(TARGET)
    settings = DecodeSettings(max_new_tokens=6, prefill_chunk=8, fold_prefill=0)
    # cancelled() is asked once at the start and then before every run after the first
    out = generate(cache, LONG, None, settings, frozenset(), cancelled=lambda: len(cache.appended) >= k)
    assert out.stop_reason == "cancelled" and out.tokens == [] and out.target_passes == 0
    assert cache.appended == [8] * k  # Not a whole prefill: it stopped at the next run boundary
    assert out.prefill_tokens == 8 * k and cache.tokens == LONG[: 8 * k]
    again = generate(cache, LONG, None, settings, frozenset())  # the next request goes on from there
    assert again.tokens == TARGET.greedy(LONG, 6)
    assert again.prefill_tokens == len(LONG) - 8 * k


def test_every_decode_pass_is_timed_with_the_tokens_it_fed() -> None:
    cache = TARGET.new_cache()
    cache.append(PROMPT[:3])  # a short uncached tail rides with the first pass: it is timed with it
    clock = lambda: float(cache.counter.tokens)  # noqa: E731  # "1 second" per token fed
    drafter = ScriptedDrafter(PROMPT, REF, TARGET.vocab_size, mode="wrong_at", j=2)
    out = generate(
        cache, PROMPT, drafter, DecodeSettings(max_new_tokens=20, draft_length=4), frozenset(), clock=clock
    )
    assert out.tokens == REF[:20]
    assert len(out.pass_ms) == out.target_passes
    assert [ms for _, ms in out.pass_ms] == [1e3 * n for n, _ in out.pass_ms]  # each pass's own time
    assert out.pass_ms[0][0] == len(PROMPT) - 3 + 4  # Not 5: the 4-token tail fed with 4 drafts
    # every token fed after the 3 cached ones (rejected drafts included) is in exactly one timed pass
    assert sum(n for n, _ in out.pass_ms) == cache.counter.tokens - 3


class InterruptedCache(FakeCache):
    """A cache whose passes numbered in ``at`` (0-based, prefill runs and decode passes alike) stop
    midway: ``PassInterrupted``, nothing of the pass kept (as ``OnnxCausalLM.interrupt`` does)."""

    def __init__(self, model: FakeLM, at: set[int]) -> None:
        super().__init__(model)
        self.at = at
        self.passes = 0
        self.interrupted = 0

    def forward(self, ids: Sequence[int]) -> np.ndarray:
        n = self.passes
        self.passes += 1
        if n in self.at:
            self.interrupted += 1
            raise PassInterrupted("terminate flag")
        return super().forward(ids)


@pytest.mark.parametrize("at", [{0}, {1}, {2, 3}, {5}])
def test_an_interrupted_pass_of_a_request_not_cancelled_runs_again(at: set[int]) -> None:
    # an interrupt meant for work that had just ended lands on this request's pass: it runs again
    cache = InterruptedCache(TARGET, at)
    drafter = ScriptedDrafter(PROMPT, REF, TARGET.vocab_size, mode="wrong_at", j=2)
    settings = DecodeSettings(max_new_tokens=20, draft_length=4, prefill_chunk=4, fold_prefill=0)
    out = generate(cache, PROMPT, drafter, settings, frozenset())
    assert out.tokens == REF[:20] and out.stop_reason == "max_tokens"  # Not cut short, Not changed
    assert cache.interrupted == len(at)
    assert out.target_passes == cache.passes - len(at) - 2  # the 2 prefill runs; no stopped pass counted


@pytest.mark.parametrize("at", [0, 1, 2, 4])
def test_an_interrupted_pass_of_a_cancelled_request_ends_it_with_its_cache_intact(at: int) -> None:
    cache = InterruptedCache(TARGET, {at})
    drafter = ScriptedDrafter(PROMPT, REF, TARGET.vocab_size, mode="right")
    settings = DecodeSettings(max_new_tokens=20, draft_length=4, prefill_chunk=4, fold_prefill=0)
    out = generate(cache, PROMPT, drafter, settings, frozenset(), cancelled=lambda: cache.interrupted > 0)
    assert out.stop_reason == "cancelled"
    assert cache.passes == at + 1  # Not one more: it stopped at the interrupted pass
    assert out.tokens == REF[: len(out.tokens)]
    assert cache.tokens == (PROMPT + out.tokens)[: cache.length]  # what it holds is right
    done = len(out.tokens)  # the next request goes on from there, on the same cache
    again = generate(cache, PROMPT + out.tokens, None, DecodeSettings(max_new_tokens=20 - done), frozenset())
    assert again.tokens == REF[done:20]
