"""OnnxEngine on the bundled ONNX pair at real completion points cut from held-out code."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from specls.decoder.api import CausalLM, DecodeSettings, KVCache
from specls.decoder.margin import describe_margin, first_difference, plain_greedy_margin
from specls.decoder.planned import PolicyState
from specls.decoder.policy import PassCosts
from specls.models import runtime
from specls.models.loader import bundled_dir

from specls.api import CompletionRequest
from specls.bench.decode import Point, make_points, source_files
from specls.engine import EngineSettings, LoadedModels, OnnxEngine

pytestmark = pytest.mark.slow

if not (bundled_dir("target") / "specls.json").is_file():  # pragma: no cover
    pytest.fail("the bundled target model is missing", pytrace=False)

MAX = 24


class CountingCache(KVCache):
    def __init__(self, inner: KVCache, counter: list[int]) -> None:
        self._inner = inner
        self._counter = counter

    @property
    def length(self) -> int:
        return self._inner.length

    def forward(self, ids: Sequence[int]) -> np.ndarray:
        self._counter[0] += 1
        return self._inner.forward(ids)

    def truncate(self, n: int) -> None:
        self._inner.truncate(n)


class CountingLM(CausalLM):
    """Counts forward calls of every cache it opens."""

    def __init__(self, inner: CausalLM) -> None:
        self._inner = inner
        self.calls = [0]

    @property
    def vocab_size(self) -> int:
        return self._inner.vocab_size

    @property
    def pass_granularity(self) -> int:
        return self._inner.pass_granularity

    def new_cache(self) -> KVCache:
        return CountingCache(self._inner.new_cache(), self.calls)


@pytest.fixture(scope="module")
def engine() -> OnnxEngine:
    e = OnnxEngine(EngineSettings(threads=1))
    e.load()
    return e


@pytest.fixture(scope="module")
def points() -> list[Point]:
    return make_points(source_files(None), 4, seed=7)


def margin(models: LoadedModels, prompt: list[int], ref: list[int], got: list[int]) -> str:
    j = first_difference(ref, got)
    return f"diverged at token {j}: {describe_margin(plain_greedy_margin(models.target, prompt, ref, j))}"


def req(p: Point, doc: str, max_tokens: int = MAX) -> CompletionRequest:
    return CompletionRequest(doc_id=doc, prefix=p.prefix, suffix=p.suffix, max_tokens=max_tokens)


@pytest.mark.parametrize(
    "config",
    [
        EngineSettings(draft_model=False),
        EngineSettings(lookup=False),
        EngineSettings(),
        EngineSettings(draft_model=False, lookup=False),
    ],
    ids=["lookup", "draft", "hybrid", "none"],
)
def test_speculative_equals_plain_on_bundled(
    engine: OnnxEngine, points: list[Point], config: EngineSettings
) -> None:
    plain = engine.with_settings(EngineSettings(speculation=False, lru_size=0))
    # Fixed pass costs at which the draft model pays: whether it runs must not hang on how fast this
    # host timed it at load (the equality below must cover the draft model's path)
    costs = PassCosts(verify=(1.0, 1.02, 1.04, 1.06, 1.08), step=0.1, catchup=0.001)
    models = replace(engine.models, policy=PolicyState(costs=costs), draft_policy=PolicyState(costs=costs))
    spec = OnnxEngine(replace(config, lru_size=0, learn_costs=False), models)
    drafted = 0
    for i, p in enumerate(points):
        doc = f"file:///bench/{i}.py"
        for e in (plain, spec):
            e.update_document(doc, p.prefix + p.suffix)
        plain.complete(req(p, doc))
        r = spec.complete(req(p, doc))
        assert spec.last_prompt == plain.last_prompt
        assert spec.last_tokens == plain.last_tokens, margin(
            engine.models, plain.last_prompt, plain.last_tokens, spec.last_tokens
        )
        drafted += r.drafted
    if config.draft_model:
        assert drafted > 0


def test_prefix_reuse_matches_cold_engine(engine: OnnxEngine, points: list[Point]) -> None:
    p = points[1]
    warm = engine.with_settings(EngineSettings(lru_size=0))
    first = warm.complete(req(p, "file:///w/a.py", 8))
    assert first.prefix_reused_tokens == 0
    typed = Point(p.path, p.kind, p.prefix + "x", p.suffix, "")
    second = warm.complete(req(typed, "file:///w/a.py", 8))
    cold = engine.with_settings(EngineSettings(lru_size=0))
    fresh = cold.complete(req(typed, "file:///w/a.py", 8))
    assert second.text == fresh.text
    assert warm.last_tokens == cold.last_tokens
    assert second.prefix_reused_tokens > len(cold.last_prompt) // 2
    assert second.prefill_tokens < fresh.prefill_tokens // 4


def test_completion_reuse_on_bundled(engine: OnnxEngine, points: list[Point]) -> None:
    consistent = 0
    for i, p in enumerate(points):
        e = engine.with_settings(EngineSettings(lru_size=0))
        doc = f"file:///w/r{i}.py"
        first = e.complete(req(p, doc, 32))
        toks = e.last_tokens
        if len(toks) < 8:
            continue
        typed = engine.models.tokenizer.decode(toks[:2])
        nxt = Point(p.path, p.kind, p.prefix + typed, p.suffix, "")
        second = e.complete(req(nxt, doc, 30))
        cold = engine.with_settings(EngineSettings(lru_size=0, completion_reuse=False))
        fresh = cold.complete(req(nxt, doc, 30))
        assert second.text == fresh.text  # exact, whatever the reuse drafter proposed
        assert second.completion_reuse
        if fresh.text == first.text[len(typed) :]:
            consistent += 1
            assert second.target_passes <= 2, second  # Not ~ tokens / (draft_length + 1)
    assert consistent >= 1


def test_lru_hit_makes_zero_model_calls(engine: OnnxEngine, points: list[Point]) -> None:
    m = engine.models
    target, draft = CountingLM(m.target), CountingLM(m.draft) if m.draft is not None else None
    counted = replace(m, target=target, draft=draft)
    e = OnnxEngine(EngineSettings(), counted)
    first = e.complete(req(points[0], "file:///w/l.py", 8))
    before = (target.calls[0], draft.calls[0] if draft else 0)
    again = e.complete(req(points[0], "file:///w/l.py", 8))
    assert again.cache_hit and again.text == first.text
    assert (target.calls[0], draft.calls[0] if draft else 0) == before  # Not one more forward


def test_cancel_mid_generation_returns_within_one_pass(engine: OnnxEngine, points: list[Point]) -> None:
    m = engine.models
    target = CountingLM(m.target)
    settings = EngineSettings(speculation=False, lru_size=0)
    probe = OnnxEngine(settings, m)
    probe.complete(req(points[2], "file:///w/c.py", 1))
    chunk = DecodeSettings().prefill_chunk
    runs = -(-(len(probe.last_prompt) - 1) // chunk)  # the prefill's runs of prefill_chunk tokens
    e = OnnxEngine(settings, replace(m, target=target))

    def cancelled() -> bool:
        return target.calls[0] >= runs + 2  # fires once the prefill and 2 passes ran

    r = e.complete(req(points[2], "file:///w/c.py", 40), cancelled)
    assert r.cancelled and r.stop_reason == "cancelled"
    assert r.target_passes == 2  # Not 3+: the loop noticed before the next pass
    assert r.tokens == 2
    assert target.calls[0] == runs + 2  # prefill + 2 passes, Not 40


def test_typing_session_stays_exact_and_cheap(engine: OnnxEngine, points: list[Point]) -> None:
    """Type the first characters of each suggestion one by one: every answer equals a cold engine's,
    and the prompt's KV is reused at every keystroke."""
    p = points[3]
    e = engine.with_settings(EngineSettings())
    prefix = p.prefix
    prefill = 0
    for _ in range(5):
        r = e.complete(CompletionRequest("file:///w/t.py", prefix, p.suffix, 12))
        cold = engine.with_settings(EngineSettings(lru_size=0))
        fresh = cold.complete(CompletionRequest("file:///w/t.py", prefix, p.suffix, 12))
        assert r.text == fresh.text
        if r.cache_hit:
            break
        prefill += r.prefill_tokens
        if not r.text:
            break
        prefix += r.text[0]  # the user types the suggestion's first character
    s = e.stats()
    assert s["prefix_reuse_hit_rate"] == pytest.approx((int(s["requests"]) - 1) / int(s["requests"]))  # type: ignore[call-overload]


class BoundOnCpu(CausalLM):
    """The bundled target handing out device-style caches (IOBinding, KV as OrtValues) on the CPU:
    the CUDA code path, batching included, without a GPU."""

    def __init__(self, lm: Any) -> None:
        self._lm = lm

    @property
    def vocab_size(self) -> int:
        return int(self._lm.vocab_size)

    @property
    def pass_granularity(self) -> int:
        return int(self._lm.pass_granularity)

    def new_cache(self) -> KVCache:
        from specls.models.runtime import BoundKVCache

        return BoundKVCache(self._lm, "cpu")

    def enable_batching(self) -> bool:
        return bool(self._lm.enable_batching())

    def forward_batch(self, caches: Sequence[KVCache], ids: Sequence[Sequence[int]]) -> list[np.ndarray]:
        return list(self._lm.forward_batch(caches, ids))


@pytest.mark.parametrize("caches", ["host", "device-path"])
def test_concurrent_batched_completions_equal_one_at_a_time(
    engine: OnnxEngine, points: list[Point], caches: str
) -> None:
    """Four documents completed at once with batching on: the bundled target's batch graph joins
    their passes, and every completion equals the one-at-a-time (fused batch-1 graph) completion."""
    import threading

    from specls.decoder.batching import BatchSettings

    models = engine.models
    if caches == "device-path":
        models = replace(models, target=BoundOnCpu(models.target))
    one = OnnxEngine(EngineSettings(threads=1, lru_size=0), models)
    batching = BatchSettings(max_batch=4, max_wait_ms=50.0)
    many = OnnxEngine(EngineSettings(threads=1, lru_size=0, batching=batching), models)
    requests = [req(p, f"file:///batch/{i}.py") for i, p in enumerate(points)]
    want, prompts, tokens = [], [], []
    for r in requests:
        want.append(one.complete(r).text)
        prompts.append(list(one.last_prompt))
        tokens.append(list(one.last_tokens))
    got: list[str] = [""] * len(requests)
    barrier = threading.Barrier(len(requests))

    def run(i: int) -> None:
        barrier.wait()
        got[i] = many.complete(requests[i]).text

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    stats = many.stats()["batching"]
    assert isinstance(stats, dict) and stats["enabled"] and stats["batched_passes"] > 0
    for i in range(len(requests)):
        assert got[i] == want[i], margin(
            engine.models, prompts[i], tokens[i], models.tokenizer.encode(got[i])
        )


def test_a_custom_target_without_a_draft_dir_loads_no_draft() -> None:
    # the bundled draft shares only the bundled target's tokenizer: not a default for other targets
    custom = OnnxEngine(EngineSettings(model=str(bundled_dir("target"))))
    custom.load()
    assert custom.models.draft is None  # Not the bundled draft (a tokenizer mismatch for real models)
    paired = OnnxEngine(EngineSettings(model=str(bundled_dir("target")), draft=str(bundled_dir("draft"))))
    paired.load()
    assert paired.models.draft is not None
    assert paired.models.policy.costs.step > 0.0  # pass costs measured at load for the pair


@pytest.mark.parametrize(("threads", "want"), [(0, 3), (2, 2)])
def test_threads_zero_means_auto_threads(monkeypatch: pytest.MonkeyPatch, threads: int, want: int) -> None:
    """``threads`` 0 (every entry point's default) loads both sessions with ``auto_threads()``; any other
    value is taken as it is."""
    monkeypatch.setattr(runtime, "auto_threads", lambda cpus=None: 3)
    e = OnnxEngine(EngineSettings(threads=threads, lru_size=0))
    e.load()
    assert e.models.draft is not None
    for lm in (e.models.target, e.models.draft):
        assert lm.session.get_session_options().intra_op_num_threads == want  # type: ignore[attr-defined]


@pytest.mark.parametrize("costs_cache", [True, False])
def test_pass_costs_measured_once_per_machine(monkeypatch: pytest.MonkeyPatch, costs_cache: bool) -> None:
    """With ``costs_cache`` (the default) a second load of the same pair and settings reads the first
    load's pass costs instead of timing the passes again; off, every load times them. A load with
    other threads is another key."""
    import specls.loading as loading_module

    calls: list[int] = []
    real = loading_module.calibrate

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(loading_module, "calibrate", counting)
    base = EngineSettings(lru_size=0, threads=1, costs_cache=costs_cache)
    first = OnnxEngine(base)
    first.load()
    second = OnnxEngine(base)
    second.load()
    assert second.models.policy.costs == first.models.policy.costs or not costs_cache
    assert second.models.lookup_policy.costs == second.models.policy.costs
    assert second.models.draft_policy.costs == second.models.policy.costs  # one calibration for all three
    assert len(calls) == (1 if costs_cache else 2)  # Not 2 with the cache: the second load reads it
    OnnxEngine(replace(base, threads=2)).load()
    assert len(calls) == (2 if costs_cache else 3)


def test_an_interrupt_stops_a_cancelled_pass_and_a_stray_one_changes_nothing(
    engine: OnnxEngine, points: list[Point]
) -> None:
    m = engine.models
    settings = EngineSettings(lru_size=0, speculation=False)  # a pass a token: the same passes each run
    ref = OnnxEngine(settings, m)
    calls = [0]

    def counted() -> bool:
        calls[0] += 1
        return False

    want = ref.complete(req(points[1], "file:///w/ref.py", 40), counted)  # a check before every pass
    # a stray interrupt (meant for work that had ended) lands on this request's first pass: it runs
    # the pass again, the completion is the same
    e = OnnxEngine(settings, m)
    e.interrupt()
    got = e.complete(req(points[1], "file:///w/stray.py", 40))
    assert got.text == want.text and e.last_tokens == ref.last_tokens
    # the request is cancelled just as its pass starts, and the pass is interrupted: it ends there
    e2 = OnnxEngine(settings, m)
    asked = [0]

    def cancelled() -> bool:
        asked[0] += 1
        if asked[0] == calls[0] - 1:  # before the last decode pass: it starts, then both land
            e2.interrupt()
            return False
        return asked[0] > calls[0] - 1

    r = e2.complete(req(points[1], "file:///w/cancelled.py", 40), cancelled)
    assert r.cancelled and r.stop_reason == "cancelled"
    assert 0 < r.tokens < len(ref.last_tokens)  # Not all of it: the interrupted pass was the last
    assert e2.last_tokens == ref.last_tokens[: r.tokens]
