"""OnnxEngine on fake models (numpy FakeLM + a character tokenizer): speculative == plain greedy,
prefix-KV reuse, completion reuse, the LRU, stops, cancellation, documents, bad input."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import partial

import pytest
from specls.decoder.pass_cost_learner import PassCostLearner

from specls.api import CompletionRequest, EngineError
from specls.engine import EngineSettings, LoadedModels, OnnxEngine
from specls.prompt import PromptBudget
from tests.decoder.fakes import FakeLM
from tests.specls.fakes import SOURCE, fake_models

CONFIGS = {
    "plain": EngineSettings(speculation=False),
    "lookup": EngineSettings(draft_model=False),
    "draft": EngineSettings(lookup=False),
    "hybrid": EngineSettings(),  # both drafters, planned per pass by the drafting policy
    "hybrid-length1": EngineSettings(draft_length=1),  # the same, one drafted token a pass at most
    "none": EngineSettings(draft_model=False, lookup=False),  # only completion reuse could draft
}

# cursor positions in SOURCE: (characters before the cursor)
POINTS = [
    SOURCE.index("total = 0") + len("total"),
    SOURCE.index("    for name") + 4,
    SOURCE.index("print(total)"),
    len(SOURCE),
    0,
]


def request(
    pos: int, max_tokens: int = 40, doc: str = "file:///w/a.py", text: str = SOURCE
) -> CompletionRequest:
    return CompletionRequest(doc_id=doc, prefix=text[:pos], suffix=text[pos:], max_tokens=max_tokens)


def reference(models: LoadedModels, engine: OnnxEngine, max_tokens: int) -> list[int]:
    """Plain greedy decoding of the target on the engine's last prompt, without caches or drafters."""
    target = models.target
    assert isinstance(target, FakeLM)
    return target.greedy(engine.last_prompt, max_tokens, models.eos_ids)


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_speculative_equals_plain_greedy(config: str) -> None:
    models = fake_models()
    engine = OnnxEngine(CONFIGS[config], models)
    engine.update_document("file:///w/a.py", SOURCE)
    engine.update_document("file:///w/b.py", SOURCE.replace("total", "size"))
    for pos in POINTS:
        result = engine.complete(request(pos, doc=f"file:///w/{pos}.py"))
        ref = reference(models, engine, 40)
        assert engine.last_tokens == ref, f"{config} at {pos}"  # Not a drafter's guess
        assert result.text == models.tokenizer.decode(ref)
        assert result.tokens == len(ref)
        assert not result.cache_hit
        if config == "plain":
            assert result.drafted == 0 and result.target_passes == len(ref) + (result.stop_reason == "eos")


def test_hybrid_drafts_and_saves_passes() -> None:
    models = fake_models()
    engine = OnnxEngine(CONFIGS["hybrid"], models)
    engine.update_document("file:///w/a.py", SOURCE)
    total_tokens = total_passes = 0
    for pos in POINTS:
        r = engine.complete(request(pos, max_tokens=64, doc=f"file:///w/{pos}.py"))
        total_tokens += r.tokens
        total_passes += r.target_passes
        assert r.drafted >= r.accepted
    stats = engine.stats()
    assert isinstance(stats["drafted"], int) and stats["drafted"] > 0
    assert total_passes < total_tokens  # Not one pass per token: drafts were accepted


def test_prefix_reuse_same_result_fewer_prefill_tokens() -> None:
    models = fake_models()
    warm = OnnxEngine(EngineSettings(), models)
    pos = POINTS[0]
    first = warm.complete(request(pos))
    assert first.prefix_reused_tokens == 0
    text = SOURCE[:pos] + " =" + SOURCE[pos:]  # the user typed " ="
    second = warm.complete(request(pos + 2, text=text))
    cold = OnnxEngine(EngineSettings(), fake_models())
    fresh = cold.complete(request(pos + 2, text=text))
    assert second.text == fresh.text  # Not a stale cache's answer
    assert second.prefix_reused_tokens > 0
    assert second.prefill_tokens < fresh.prefill_tokens
    assert second.prefill_tokens + second.prefix_reused_tokens == len(cold.last_prompt)


def test_prefix_reuse_after_edit_above_cursor() -> None:
    """An edit far above the cursor changes the prompt's middle: the cache is cut there, output exact."""
    models = fake_models()
    # the whole file fits the window (one character = one token here)
    engine = OnnxEngine(EngineSettings(speculation=False, budget=PromptBudget(prefix_tokens=1000)), models)
    pos = POINTS[2]
    engine.complete(request(pos))
    text = SOURCE.replace("import sys", "import sys as system")
    r = engine.complete(request(pos + len(" as system"), text=text))
    assert engine.last_tokens == reference(models, engine, 40)
    assert 0 < r.prefix_reused_tokens < len(engine.last_prompt) - 10


def test_completion_reuse_typing_through_suggestion() -> None:
    models = fake_models(allow_eos=False)
    engine = OnnxEngine(EngineSettings(), models)
    pos = POINTS[1]
    first = engine.complete(request(pos, max_tokens=48))
    assert len(first.text) > 10
    typed = first.text[:4]
    text = SOURCE[:pos] + typed + SOURCE[pos:]
    second = engine.complete(request(pos + 4, max_tokens=44, text=text))
    cold = OnnxEngine(EngineSettings(completion_reuse=False), fake_models(allow_eos=False))
    fresh = cold.complete(request(pos + 4, max_tokens=44, text=text))
    assert second.completion_reuse
    assert second.text == fresh.text == first.text[4:]  # Not the old suggestion re-shown blindly
    assert second.target_passes <= 2  # Not ~ tokens / (draft_length + 1): the remainder was verified at once
    assert second.per_drafter["reuse"].accepted >= len(second.text) - 2
    assert engine.stats()["completion_reuse_hits"] == 1


def test_completion_reuse_wrong_guess_still_exact() -> None:
    """The user typed something else than the suggestion: no reuse, exact output."""
    models = fake_models()
    engine = OnnxEngine(EngineSettings(), models)
    pos = POINTS[1]
    first = engine.complete(request(pos, max_tokens=30))
    other = "zz" if not first.text.startswith("zz") else "qq"
    text = SOURCE[:pos] + other + SOURCE[pos:]
    second = engine.complete(request(pos + 2, max_tokens=30, text=text))
    assert not second.completion_reuse
    assert engine.last_tokens == reference(models, engine, 30)


def test_lru_hit_makes_no_model_calls() -> None:
    models = fake_models()
    engine = OnnxEngine(EngineSettings(), models)
    target, draft = models.target, models.draft
    assert isinstance(target, FakeLM) and isinstance(draft, FakeLM)
    first = engine.complete(request(POINTS[0]))
    calls = (target.counter.calls, draft.counter.calls)
    again = engine.complete(request(POINTS[0], doc="file:///w/other.py"))
    assert again.cache_hit
    assert (target.counter.calls, draft.counter.calls) == calls  # Not one more pass
    assert again.text == first.text
    # a different max_tokens is a different key
    third = engine.complete(request(POINTS[0], max_tokens=12))
    assert not third.cache_hit and target.counter.calls > calls[0]
    assert engine.stats()["cache_hits"] == 1


def test_lru_replays_stop_of_the_new_request() -> None:
    models = fake_models()
    engine = OnnxEngine(EngineSettings(), models)
    full = engine.complete(request(POINTS[3], max_tokens=40))
    assert len(full.text) > 3
    cut_at = 3

    def stop(text: str) -> int | None:
        return cut_at if len(text) >= cut_at else None

    req = replace(request(POINTS[3], max_tokens=40), stop=stop)
    hit = engine.complete(req)
    assert hit.cache_hit and hit.text == full.text[:cut_at] and hit.stop_reason == "stop"
    # an entry cut by a stop does not answer a request without one
    engine2 = OnnxEngine(EngineSettings(), models)
    engine2.complete(req)
    miss = engine2.complete(request(POINTS[3], max_tokens=40))
    assert not miss.cache_hit and miss.text == full.text


def test_text_stop_cuts_and_stops_early() -> None:
    models = fake_models()
    engine = OnnxEngine(EngineSettings(lru_size=0), models)
    full = engine.complete(request(POINTS[1], max_tokens=40))
    assert len(full.text) >= 6

    def stop(text: str) -> int | None:
        return 5 if len(text) >= 6 else None

    cut = engine.complete(replace(request(POINTS[1], max_tokens=40), stop=stop, doc_id="file:///w/c.py"))
    assert cut.text == full.text[:5]
    assert cut.stop_reason == "stop"
    assert cut.tokens == 6  # Not 40: generation stopped as soon as the stop fired


def test_text_stop_decodes_only_new_tokens() -> None:
    """The loop's stop callback sees the whole text at every token but decodes each token about once."""
    from collections.abc import Sequence

    from tests.specls.fakes import CharTokenizer

    class CountingTokenizer(CharTokenizer):
        decoded = 0

        def decode(self, ids: Sequence[int]) -> str:
            self.decoded += len(ids)
            return super().decode(ids)

    models = replace(fake_models(allow_eos=False), tokenizer=CountingTokenizer())
    engine = OnnxEngine(EngineSettings(lru_size=0, speculation=False), models)
    seen: list[int] = []

    def stop(text: str) -> int | None:
        seen.append(len(text))
        return None

    r = engine.complete(replace(request(POINTS[1], max_tokens=64), stop=stop))
    tok = models.tokenizer
    assert isinstance(tok, CountingTokenizer)
    assert r.tokens == 64 and seen == list(range(1, 65))  # the stop saw every prefix of the text
    assert tok.decoded <= 5 * 64  # Not 64 * 65 / 2 + 64 = 2144: no re-decoding of the whole text


def test_cancel_returns_within_one_pass() -> None:
    models = fake_models()
    engine = OnnxEngine(EngineSettings(speculation=False, lru_size=0), models)
    target = models.target
    assert isinstance(target, FakeLM)
    checks = 0

    def cancelled() -> bool:
        nonlocal checks
        checks += 1
        return checks > 4

    r = engine.complete(request(POINTS[0], max_tokens=40), cancelled)
    assert r.cancelled and r.stop_reason == "cancelled"
    assert r.target_passes <= 4  # Not 40
    assert engine.stats()["cancelled"] == 1
    # the document's cache is still consistent: the next request is exact
    engine.complete(request(POINTS[0], max_tokens=20))
    assert engine.last_tokens == reference(models, engine, 20)


def test_cancelled_before_start_makes_no_calls() -> None:
    models = fake_models()
    engine = OnnxEngine(EngineSettings(), models)
    r = engine.complete(request(POINTS[0]), lambda: True)
    assert r.cancelled and r.text == "" and r.target_passes == 0


def test_close_document_frees_kv() -> None:
    engine = OnnxEngine(EngineSettings(), fake_models())
    engine.update_document("file:///w/a.py", SOURCE)
    engine.complete(request(POINTS[0]))
    assert engine.stats()["documents"] == 1 and int(engine.stats()["kv_tokens"]) > 0  # type: ignore[call-overload]
    assert engine.stats()["indexed_documents"] == 1
    engine.close_document("file:///w/a.py")
    stats = engine.stats()
    assert stats["documents"] == 0 and stats["kv_tokens"] == 0 and stats["indexed_documents"] == 0


def test_kv_documents_bounded() -> None:
    engine = OnnxEngine(EngineSettings(kv_documents=2, speculation=False), fake_models())
    for i in range(4):
        engine.complete(request(POINTS[0], max_tokens=3, doc=f"file:///w/{i}.py"))
    assert engine.stats()["documents"] == 2


def test_speculation_cap_zero_turns_drafting_off() -> None:
    models = fake_models()
    engine = OnnxEngine(EngineSettings(), models)
    r = engine.complete(replace(request(POINTS[1]), speculation_cap=0))
    assert r.drafted == 0
    assert engine.last_tokens == reference(models, engine, 40)


def test_bad_inputs() -> None:
    engine = OnnxEngine(EngineSettings(), fake_models())
    assert engine.complete(request(POINTS[0], max_tokens=0)).text == ""
    assert engine.complete(CompletionRequest(doc_id="x", prefix="", suffix="")).stop_reason in (
        "eos",
        "max_tokens",
    )
    with pytest.raises(EngineError):
        OnnxEngine(EngineSettings()).complete(request(0))  # not loaded


def test_missing_model_dir_is_engine_error(tmp_path: object) -> None:
    engine = OnnxEngine(EngineSettings(model=str(tmp_path) + "/nope", draft_model=False))
    with pytest.raises(EngineError) as info:
        engine.load()
    assert "nope" in str(info.value)
    assert not engine.ready


def test_update_from_another_thread_while_completing() -> None:
    models = fake_models()
    engine = OnnxEngine(EngineSettings(lru_size=0), models)
    stop_flag = threading.Event()

    def typer() -> None:
        i = 0
        while not stop_flag.is_set():
            engine.update_document(f"file:///w/t{i % 3}.py", SOURCE[: 50 + i % 100])
            if i % 7 == 0:
                engine.close_document(f"file:///w/t{i % 3}.py")
            i += 1

    t = threading.Thread(target=typer)
    t.start()
    try:
        for pos in POINTS:
            engine.complete(request(pos, max_tokens=16))
            assert engine.last_tokens == reference(models, engine, 16)
    finally:
        stop_flag.set()
        t.join()


def test_stats_shape() -> None:
    engine = OnnxEngine(EngineSettings(), fake_models())
    engine.complete(request(POINTS[0]))
    engine.complete(request(POINTS[0]))
    s = engine.stats()
    for key in (
        "requests",
        "cancelled",
        "empty",
        "tokens_generated",
        "target_passes",
        "per_drafter",
        "prefix_reuse_hit_rate",
        "completion_reuse_hit_rate",
        "cache_hits",
        "latency_ms_p50",
        "latency_ms_p95",
        "provider",
    ):
        assert key in s
    assert s["requests"] == 2 and s["cache_hits"] == 1


def stop_before(ch: str) -> Callable[[str], int | None]:
    """A text stop like single-line mode's: keep what comes before the first ``ch``."""
    return lambda text: text.index(ch) if ch in text else None


def typed_through(first: str, n: int) -> tuple[str, str]:
    """The document after typing the first ``n`` characters of a suggestion at POINTS[1], and a
    character of it whose first occurrence lies at least 4 characters after them (a stop)."""
    ch = next(c for i, c in enumerate(first) if i >= n + 4 and first.index(c) == i)
    return SOURCE[: POINTS[1]] + first[:n] + SOURCE[POINTS[1] :], ch


def test_type_ahead_shows_the_rest_of_the_suggestion_without_a_model_call() -> None:
    models = fake_models(allow_eos=False)
    engine = OnnxEngine(EngineSettings(), models)
    first = engine.complete(request(POINTS[1], max_tokens=48))
    text, ch = typed_through(first.text, 3)
    target = models.target
    assert isinstance(target, FakeLM)
    calls = target.counter.calls
    req = replace(request(POINTS[1] + 3, max_tokens=48, text=text), stop=stop_before(ch))
    ahead = engine.complete(req)
    assert ahead.type_ahead and ahead.decode is None and not ahead.cache_hit
    assert target.counter.calls == calls  # Not a prefill + verify pass
    assert ahead.text == first.text[3 : first.text.index(ch)]  # the sent prompt's greedy answer, cut
    assert ahead.tokens == len(ahead.text)  # one character per token in the fake tokenizer
    more = replace(req, prefix=req.prefix + ahead.text[:2])  # typing on through it
    assert engine.complete(more).text == ahead.text[2:]
    assert engine.stats()["type_ahead_hits"] == 2 and engine.stats()["requests"] == 3


def broken_stop(text: str) -> int | None:
    raise RuntimeError("a stop rule with a bug")


def late(checks: Iterator[int], k: int) -> bool:
    """A cancel check that says yes from its k-th call on."""
    return next(checks) >= k


def test_type_ahead_only_when_the_rest_is_the_whole_answer() -> None:
    """The model runs (exact for the new prompt) whenever the old suggestion's rest might not be what
    it was shown as: another text typed, no stop cutting a budget-cut completion, a smaller budget,
    type_ahead off, or a completion that was cancelled rather than answered."""
    models = fake_models(allow_eos=False)
    engine = OnnxEngine(EngineSettings(), models)
    first = engine.complete(request(POINTS[1], max_tokens=48))
    text, ch = typed_through(first.text, 3)
    req = replace(request(POINTS[1] + 3, max_tokens=48, text=text), stop=stop_before(ch))
    other = "zz" if not first.text.startswith("zz") else "qq"
    cases = {
        "typed other text": replace(req, prefix=SOURCE[: POINTS[1]] + other, suffix=SOURCE[POINTS[1] :]),
        "budget-cut, no stop": replace(req, stop=None),  # Not the 45 characters left of 48
        "smaller budget": replace(req, max_tokens=2),
        "broken stop": replace(req, stop=broken_stop),  # Not a crash: the decode path ignores it
    }
    for name, case in cases.items():
        e = OnnxEngine(EngineSettings(), models)
        e.complete(request(POINTS[1], max_tokens=48))
        r = e.complete(case)
        assert not r.type_ahead and r.decode is not None, name
        assert e.last_tokens == reference(models, e, case.max_tokens)[: len(e.last_tokens)], name
    off = OnnxEngine(EngineSettings(type_ahead=False), models)
    off.complete(request(POINTS[1], max_tokens=48))
    r = off.complete(req)
    assert not r.type_ahead and r.completion_reuse  # verified instead, in about one pass
    assert r.text == first.text[3 : first.text.index(ch)]
    for k in range(3, 48):  # cancel after k checks, late enough that the stop lies in what it made
        checks = iter(range(1000))
        cut = OnnxEngine(EngineSettings(), models)
        r = cut.complete(request(POINTS[1], max_tokens=48), cancelled=partial(late, checks, k))
        if r.cancelled and ch in r.text[4:]:
            break
    assert r.cancelled and first.text.startswith(r.text)
    assert not cut.complete(req).type_ahead  # the cancelled completion was never shown


def early_case(models: LoadedModels) -> tuple[str, str, CompletionRequest]:
    """The whole answer at POINTS[1], a character of it whose first occurrence is at least 6 in (the
    early stop cuts before it) and the request with that early stop and no stop."""
    whole = OnnxEngine(EngineSettings(), models).complete(request(POINTS[1], max_tokens=48)).text
    ch = next(c for i, c in enumerate(whole) if i >= 6 and whole.index(c) == i)
    return whole, ch, replace(request(POINTS[1], max_tokens=48), early_stop=stop_before(ch))


def test_early_stop_answers_the_beginning_and_a_request_without_it_the_rest_exactly() -> None:
    models = fake_models(allow_eos=False)
    whole, ch, req = early_case(models)
    engine = OnnxEngine(EngineSettings(), models)
    early = engine.complete(req)
    assert early.partial and early.text == whole[: whole.index(ch)] and early.stop_reason == "stop"
    rest = engine.complete(replace(req, early_stop=None))  # the background block, same cursor
    assert not rest.partial and rest.text == whole and rest.completion_reuse  # Not the early cut
    assert engine.last_tokens == reference(models, engine, 48)
    again = engine.complete(req)  # with the early stop again: the whole answer is known now
    assert again.cache_hit and not again.partial and again.text == whole  # Not whole[:whole.index(ch)]
    cut = replace(req, stop=stop_before(ch))  # the stop itself cuts there: a whole answer, not partial
    assert not OnnxEngine(EngineSettings(), models).complete(cut).partial


def test_early_stop_type_ahead_and_replay_without_a_model_call() -> None:
    models = fake_models(allow_eos=False)
    whole, ch, req = early_case(models)
    engine = OnnxEngine(EngineSettings(), models)
    early = engine.complete(req)
    target = models.target
    assert isinstance(target, FakeLM)
    calls = target.counter.calls
    typed = replace(req, prefix=req.prefix + early.text[:2])
    ahead = engine.complete(typed)  # typing into the early answer: its rest, cut by the early stop
    assert ahead.type_ahead and ahead.partial and ahead.text == early.text[2:]
    replay = engine.complete(req)  # the same cursor again: the early answer from the cache
    assert replay.cache_hit and replay.partial and replay.text == early.text
    assert target.counter.calls == calls  # Not a prefill + verify pass
    assert not engine.complete(replace(typed, early_stop=None)).type_ahead  # the rest is not known


def test_a_cancelled_block_keeps_the_shown_early_answer_for_type_ahead() -> None:
    models = fake_models(allow_eos=False)
    whole, ch, req = early_case(models)
    engine = OnnxEngine(EngineSettings(), models)
    early = engine.complete(req)
    for k in range(3, 48):  # preempted by the next keystroke, late enough to have made tokens
        block = engine.complete(replace(req, early_stop=None), cancelled=partial(late, iter(range(1000)), k))
        if block.cancelled and block.tokens > 0:
            break
    assert block.cancelled and block.tokens > 0
    ahead = engine.complete(replace(req, prefix=req.prefix + early.text[:2]))
    assert ahead.type_ahead and ahead.text == early.text[2:]  # Not a decode: the early answer is kept


def test_completion_reuse_then_regular_drafting_is_exact() -> None:
    """The new request wants more than the old suggestion had: reuse first, then lookup/draft."""
    models = fake_models(allow_eos=False)
    engine = OnnxEngine(EngineSettings(), models)
    pos = POINTS[0]
    first = engine.complete(request(pos, max_tokens=12))
    text = SOURCE[:pos] + first.text[:2] + SOURCE[pos:]
    second = engine.complete(request(pos + 2, max_tokens=40, text=text))
    assert second.completion_reuse
    assert engine.last_tokens == reference(models, engine, 40)
    assert second.per_drafter["reuse"].accepted == 10  # the rest of the old suggestion
    assert set(second.per_drafter) - {"reuse"}  # then the regular drafters took over


def test_big_reindex_of_a_buffer_waits() -> None:
    models = fake_models()
    engine = OnnxEngine(EngineSettings(reindex_max_chars=50, reindex_interval_s=3600.0), models)
    doc, other = "file:///w/a.py", "file:///w/b.py"
    engine.update_document(doc, SOURCE)
    engine.complete(request(POINTS[0], max_tokens=2, doc=doc))
    assert engine._docs.buffers is not None
    index = engine._docs.buffers.index
    assert index.tokens(doc) == models.tokenizer.encode(SOURCE)
    edited = "# top\n" + SOURCE  # an edit far from the end: re-indexing would redo the whole buffer
    engine.update_document(doc, edited)
    engine.update_document(other, "x = 1\n")
    engine.complete(request(POINTS[0], max_tokens=2, doc=doc))
    assert index.tokens(doc) == models.tokenizer.encode(SOURCE)  # Not yet: deferred
    assert index.tokens(other) == models.tokenizer.encode("x = 1\n")  # other buffers: at once
    near_end = edited + "y = 2\n"  # measured against the last indexed text: still a big change
    engine.update_document(doc, near_end)
    engine.complete(request(POINTS[0], max_tokens=2, doc=doc))
    assert index.tokens(doc) == models.tokenizer.encode(SOURCE)  # still far from the last indexed text
    engine.flush()
    assert index.tokens(doc) == models.tokenizer.encode(near_end)
    # another client's buffer follows the same rule (a team server sees every client's keystrokes)
    engine.update_document(other, "# header\n" + SOURCE)
    engine.complete(request(POINTS[0], max_tokens=2, doc=doc))
    assert index.tokens(other) == models.tokenizer.encode("x = 1\n")  # small old text: the tail is big
    engine.update_document(other, "x = 1\ny = 2\n")  # a small change against the last indexed text
    engine.complete(request(POINTS[0], max_tokens=2, doc=doc))
    assert index.tokens(other) == models.tokenizer.encode("x = 1\ny = 2\n")  # at once
    engine.close_document(doc)
    engine.flush()
    assert doc not in index


def test_result_carries_its_decode() -> None:
    engine = OnnxEngine(EngineSettings(), fake_models())
    r = engine.complete(request(POINTS[0]))
    assert r.decode is not None and r.decode.tokens == engine.last_tokens  # the loop's own result
    assert (r.target_passes, r.drafted, r.prefill_tokens) == (
        r.decode.target_passes,
        r.decode.drafted,
        r.decode.prefill_tokens,
    )
    hit = engine.complete(request(POINTS[0]))
    assert hit.cache_hit and hit.decode is None and hit.target_passes == 0  # Not the first one's cost
    d = r.to_dict()
    assert d["target_passes"] == r.target_passes and "decode" not in d  # flat, without token ids


def test_the_drafting_policy_is_offered_draft_length_every_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """The policy chooses each pass's length itself, within ``draft_length`` (fewer near the end)."""
    from specls.decoder.planned import PlannedDrafter

    offered: list[tuple[int, int]] = []
    propose = PlannedDrafter.propose

    def spy(self: PlannedDrafter, context: list[int], k: int) -> list[int]:
        offered.append((len(context), k))
        return propose(self, context, k)

    monkeypatch.setattr(PlannedDrafter, "propose", spy)
    models = fake_models()
    engine = OnnxEngine(EngineSettings(draft_length=9), models)
    engine.update_document("file:///w/a.py", SOURCE)
    engine.complete(request(POINTS[0], max_tokens=40))
    assert engine.last_tokens == reference(models, engine, 40)
    start = len(engine.last_prompt)
    assert offered and all(k == min(9, 40 - (n - start) - 1) for n, k in offered)


DRAFT_LENGTHS = {"hybrid": EngineSettings(), "lookup": CONFIGS["lookup"], "draft": CONFIGS["draft"]}


@pytest.mark.parametrize("config", sorted(DRAFT_LENGTHS))
@pytest.mark.parametrize("draft_length", [1, 2, 5, 12])
def test_draft_length_bounds_every_pass_and_never_the_output(config: str, draft_length: int) -> None:
    """``draft_length`` is measurable: no pass verifies more drafted tokens than it says. It moves
    plans (a shorter cap, more passes) but never the output."""
    models = fake_models()
    engine = OnnxEngine(replace(DRAFT_LENGTHS[config], draft_length=draft_length), models)
    uncapped = OnnxEngine(replace(DRAFT_LENGTHS[config], draft_length=64), fake_models())
    passes = uncapped_passes = 0
    for pos in POINTS:
        for e in (engine, uncapped):
            e.update_document("file:///w/a.py", SOURCE)
        r = engine.complete(request(pos, max_tokens=40))
        assert engine.last_tokens == reference(models, engine, 40)
        u = uncapped.complete(request(pos, max_tokens=40))
        assert u.decode is not None and r.decode is not None
        assert r.decode.tokens == u.decode.tokens  # Not another answer: the cap moves plans only
        assert len(r.decode.accept_hist) <= draft_length  # the longest proposal verified
        # [uncached prompt tail...] + last committed + drafted: only the first pass carries a tail
        assert all(fed <= draft_length + 1 for fed, _ in r.decode.pass_ms[1:])
        passes += r.target_passes
        uncapped_passes += u.target_passes
    assert passes >= uncapped_passes
    if draft_length == 1 and config != "draft":  # the fake draft model's plans draft one token anyway
        assert passes > uncapped_passes  # Not the same plans: lookup runs are cut to one token


def test_lookup_alone_is_planned_by_a_policy_state_of_its_own() -> None:
    """Without the draft model the policy plans lookup (lookup or nothing each pass) and learns in
    ``lookup_policy``; an engine of the same load with the draft model learns apart from it."""
    models = fake_models()
    lookup = OnnxEngine(EngineSettings(draft_model=False), models)
    lookup.update_document("file:///w/a.py", SOURCE)
    for pos in POINTS:
        lookup.complete(request(pos, max_tokens=40, doc=f"file:///w/{pos}.py"))
        assert lookup.last_tokens == reference(models, lookup, 40)
    choices = dict(models.lookup_policy.choices)
    assert sum(choices.values()) > 0  # Not {}: every pass is planned
    assert set(choices) <= {"plain", "lookup"}
    assert lookup.stats()["drafting_policy"] == models.lookup_policy.snapshot()
    assert models.policy.choices == {} and not models.policy.lookup.reached  # the pair's policy: untouched
    both = lookup.with_settings(EngineSettings())
    both.update_document("file:///w/b.py", SOURCE)
    both.complete(request(POINTS[0], max_tokens=40, doc="file:///w/b.py"))
    assert sum(models.policy.choices.values()) > 0
    assert both.stats()["drafting_policy"] == models.policy.snapshot()
    assert dict(models.lookup_policy.choices) == choices  # Not more: the pair's requests teach it nothing


def test_the_drafting_policy_plans_both_drafters_and_learns_across_requests() -> None:
    models = fake_models()
    engine = OnnxEngine(EngineSettings(), models)
    engine.update_document("file:///w/a.py", SOURCE)
    for pos in POINTS:
        engine.complete(request(pos, max_tokens=40, doc=f"file:///w/{pos}.py"))
        assert engine.last_tokens == reference(models, engine, 40)
    policy = engine.stats()["drafting_policy"]
    assert isinstance(policy, dict)
    choices = policy["choices"]
    assert sum(choices.values()) > 0  # every pass was planned. Not {}
    assert set(choices) <= {"plain", "lookup", "model", "lookup+model"}
    assert models.policy.lookup.reached or models.policy.model.reached  # acceptance was learned
    assert models.policy.length != 16.0  # and completion lengths, one document per request. Not the prior


def test_the_draft_model_alone_is_planned_by_a_policy_state_of_its_own() -> None:
    """Without lookup the policy plans the draft model (the model or nothing each pass) and learns in
    ``draft_policy``: the pair's policy, which plans both drafters, learns nothing from it."""
    models = fake_models()
    draft = OnnxEngine(EngineSettings(lookup=False), models)
    for pos in POINTS:
        draft.complete(request(pos, max_tokens=40, doc=f"file:///w/{pos}.py"))
        assert draft.last_tokens == reference(models, draft, 40)
    choices = dict(models.draft_policy.choices)
    assert sum(choices.values()) > 0 and set(choices) <= {"plain", "model"}  # Not a lookup plan
    assert draft.stats()["drafting_policy"] == models.draft_policy.snapshot()
    assert models.policy.choices == {} and models.lookup_policy.choices == {}  # untouched


@pytest.mark.parametrize("config", ["hybrid", "draft", "lookup"])
def test_sampling_is_planned_by_the_policy_and_reproducible(config: str) -> None:
    """Sampling (temperature > 0) drafts through the policy too: its proposals carry the draft
    model's distributions, so rejection sampling stays exact; a seed gives the same answers."""
    settings = replace(CONFIGS[config], temperature=0.8, seed=5, lru_size=0, completion_reuse=False)
    answers: list[list[list[int]]] = []
    drafted = 0
    for _ in range(2):  # the same plans need the same learned state: a fresh load each time
        models = fake_models()
        engine = OnnxEngine(settings, models)
        engine.update_document("file:///w/a.py", SOURCE)
        answers.append([])
        for pos in POINTS:
            r = engine.complete(request(pos, max_tokens=30, doc=f"file:///w/{pos}.py"))
            assert r.decode is not None and len(r.decode.accept_hist) <= settings.draft_length
            answers[-1].append(r.decode.tokens)
            drafted += r.drafted
    assert answers[0] == answers[1]
    assert drafted > 0  # Not plain decoding
    policy = engine.stats()["drafting_policy"]
    assert isinstance(policy, dict) and sum(policy["choices"].values()) > 0  # every pass planned


def learning(models: LoadedModels) -> LoadedModels:
    """``models`` with a pass-cost learner on each policy, as ``OnnxEngine.load`` gives them."""
    for policy in (models.policy, models.lookup_policy, models.draft_policy):
        policy.learner = PassCostLearner(policy.costs, models.target.pass_granularity)
    return models


@pytest.mark.parametrize("learn_costs", [True, False])
def test_the_policy_learns_pass_costs_from_its_requests_passes(learn_costs: bool) -> None:
    models = learning(fake_models())
    engine = OnnxEngine(EngineSettings(learn_costs=learn_costs), models)
    engine.update_document("file:///w/a.py", SOURCE)
    passes = 0
    for pos in POINTS:
        result = engine.complete(request(pos, max_tokens=40, doc=f"file:///w/{pos}.py"))
        assert engine.last_tokens == reference(models, engine, 40)
        passes += result.target_passes
    learner = models.policy.learner
    assert learner is not None
    policy = engine.stats()["drafting_policy"]
    assert isinstance(policy, dict)
    if learn_costs:
        assert learner.passes == passes > 0  # every target pass of every request
        assert models.policy.costs != learner.prior  # Not the calibration: the passes moved it
        assert policy["costs_learned_from_passes"] == passes
        assert policy["verify_cost_calibrated"] == [round(x, 3) for x in learner.prior.verify]
    else:
        assert learner.passes == 0 and models.policy.costs == learner.prior
    assert models.lookup_policy.learner is not None and models.lookup_policy.learner.passes == 0  # apart


@pytest.mark.parametrize("rows_ms", [1.0, 1e4])  # every extra row free / every extra row ruinous
def test_learned_costs_move_plans_never_the_output(rows_ms: float) -> None:
    models = learning(fake_models())
    learner = models.policy.learner
    assert learner is not None
    for n in range(1, 13):  # a host whose passes cost what no calibration said
        for _ in range(50):
            learner.observe_target(n, 10.0 + rows_ms * (n - 1))
    models.policy.costs = learner.costs()
    engine = OnnxEngine(EngineSettings(learn_costs=False), models)  # those prices stay (no wall clock)
    engine.update_document("file:///w/a.py", SOURCE)
    for pos in POINTS:
        engine.complete(request(pos, max_tokens=40, doc=f"file:///w/{pos}.py"))
        assert engine.last_tokens == reference(models, engine, 40)  # Not a drafter's guess
    choices = models.policy.choices
    if rows_ms > 1e3:  # nothing pays at those prices: every pass plain
        assert set(choices) == {"plain"}
    else:
        assert choices["plain"] < sum(choices.values())


def test_a_decode_ended_before_its_first_pass_teaches_the_costs_nothing() -> None:
    models = learning(fake_models())
    engine = OnnxEngine(EngineSettings(), models)
    engine.update_document("file:///w/a.py", SOURCE)
    engine.complete(request(POINTS[0], max_tokens=40))
    learner = models.policy.learner
    assert learner is not None
    drafter = engine._docs.get("file:///w/a.py").planned_drafter
    assert drafter is not None and drafter.model is not None
    drafter.model.feed_ms = [(1, 1e6)]  # on record from before: a feed that must not be learned again
    passes, costs = learner.passes, models.policy.costs
    answers = iter([False])  # the engine's own check passes; the decode is cancelled before any pass
    result = engine.complete(request(POINTS[1], max_tokens=40), lambda: next(answers, True))
    assert result.cancelled and result.target_passes == 0
    assert (learner.passes, models.policy.costs) == (passes, costs)  # Not a draft step of 1e6 ms
