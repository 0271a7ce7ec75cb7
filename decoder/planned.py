"""A drafter that plans every pass with the drafting policy (``specls.decoder.policy``).

``PlannedDrafter`` holds prompt lookup and the draft model and, before each pass, asks ``plan_pass``
for lookup tokens (free to propose) and draft-model tokens (each a draft pass) so that the estimated
speedup over plain decoding is the best available, and never below 1: lookup alone, the model alone,
lookup extended by the model, or nothing. The draft model is touched only when the plan uses it, so a
request whose plan never wants it pays no catch-up (lazy start); its KV keeps its prefix across
requests (``DraftModelDrafter`` syncs by common prefix).

``PolicyState`` is what the policy learns for one model pair, across requests: the pair's pass costs
(``calibrate``), acceptance by position for each drafter, the usual completion length, and counts of
the choices made (for ``--stats``).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from specls.decoder.api import CausalLM, DecodeSettings, Drafter, KVCache
from specls.decoder.drafters import DraftModelDrafter, PromptLookupDrafter, point_masses_then
from specls.decoder.head_drafter import HeadDrafter
from specls.decoder.ngram import LookupMatch
from specls.decoder.pass_cost_learner import PassCostLearner, pass_rows
from specls.decoder.policy import (
    AcceptanceByPosition,
    PassCosts,
    Plan,
    best_gamma,
    expected_tokens,
    plan_pass,
)
from specls.decoder.region_drafter import RegionDrafter

log = logging.getLogger(__name__)


@dataclass
class PolicyState:
    """What the policy knows about one model pair; shared by that pair's requests (thread-safe)."""

    costs: PassCosts = field(default_factory=PassCosts)
    # Priors: lookup matches that long are usually right at first and fade; a same-family draft model
    # agrees with its target on about 6 tokens in 10. Four requests' worth of passes outweigh them.
    lookup: AcceptanceByPosition = field(default_factory=lambda: AcceptanceByPosition(prior=(0.7, 0.6, 0.5)))
    # Lookup right after a lookup proposal of the same request was accepted whole: the completion is
    # copying text that the buffers hold, so the next match is far more often right than a first one
    # (one table for both under-proposed while copying and over-proposed on chance matches).
    lookup_hot: AcceptanceByPosition = field(
        default_factory=lambda: AcceptanceByPosition(prior=(0.9, 0.85, 0.8))
    )
    # Lookup on a match of the context's last token alone (``DrafterSettings.lookup_min_n`` 1), after
    # a hit too: a guess, right far less often than a longer match, kept apart so that it neither
    # shortens the longer matches' proposals nor is trusted like them. It pays where a CPU verifies
    # a few extra rows at about no cost. Prior 0.3.
    lookup_guess: AcceptanceByPosition = field(
        default_factory=lambda: AcceptanceByPosition(prior=(0.3, 0.5, 0.5))
    )
    model: AcceptanceByPosition = field(default_factory=lambda: AcceptanceByPosition(prior=(0.6,)))
    # The region's continuation in a next edit (``RegionDrafter``): free to propose like lookup, and
    # the output copies the region but for the edit, so long proposals are mostly right. Prior 0.9.
    region: AcceptanceByPosition = field(
        default_factory=lambda: AcceptanceByPosition(prior=(0.9,), pooled=True)
    )
    # The region right after a region proposal of the same request was accepted whole: the output is
    # copying the region, which it goes on doing to the region's end but for the edit, so far more
    # often right than the first proposal (at the start or after a realignment, which may be wrong).
    # Apart, so that long runs are drafted long and first proposals are not: such a run is drafted
    # whole (``PlannedDrafter.propose``), this table only counts how often it holds. Prior 0.98.
    region_hot: AcceptanceByPosition = field(
        default_factory=lambda: AcceptanceByPosition(prior=(0.98,), pooled=True)
    )
    # A feature head's guesses (``HeadDrafter``): each later head is right less often. Priors: about
    # half at first, fading.
    head: AcceptanceByPosition = field(default_factory=lambda: AcceptanceByPosition(prior=(0.5, 0.45, 0.4)))
    length: float = 16.0  # moving average of tokens per completion: what "remaining" is guessed from
    # The same for requests that end at a text stop (the end of the line, a line-first answer), kept
    # apart: in one figure, long completions made short ones start the draft model, whose catch-up
    # they never repay. Prior 8: a line is a few tokens.
    stop_length: float = 8.0
    # The share of a request's tokens that lookup did not copy (accepted lookup tokens are the rest):
    # the tokens a draft model that must first catch up can speed up at all. Without
    # it, every request that starts without a match paid a whole view's catch-up, and most then copied
    # on lookup, slower than lookup alone. Prior 0.5; per class as above.
    unmatched: float = 0.5
    stop_unmatched: float = 0.5
    choices: Counter[str] = field(default_factory=Counter)  # passes by plan: plain/lookup/model/lookup+model
    # learns ``costs`` from the requests' own passes (``learn``); None keeps them as calibrated
    learner: PassCostLearner | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def learn(self, target: Sequence[tuple[int, float]], draft: Sequence[tuple[int, float]] = ()) -> None:
        """A request's passes, ``(tokens, ms)`` each (target passes, draft-model feeds): the costs the
        next requests plan with follow them (``PassCostLearner``); nothing without a learner."""
        with self.lock:
            if self.learner is not None:
                self.learner.observe(target, draft)
                self.costs = self.learner.costs()

    def finish(self, generated: int, stopped: bool = False, unmatched: int | None = None) -> None:
        """A request of ``generated`` tokens is over (``stopped``: one that ends at a text stop), of
        which ``unmatched`` were not accepted lookup tokens (None: not known)."""
        with self.lock:
            share = None if unmatched is None or generated <= 0 else min(1.0, unmatched / generated)
            if stopped:
                self.stop_length = 0.8 * self.stop_length + 0.2 * float(generated)
                if share is not None:
                    self.stop_unmatched = 0.8 * self.stop_unmatched + 0.2 * share
            else:
                self.length = 0.8 * self.length + 0.2 * float(generated)
                if share is not None:
                    self.unmatched = 0.8 * self.unmatched + 0.2 * share

    def usual_length(self, stopped: bool) -> float:
        return self.stop_length if stopped else self.length

    def usual_unmatched(self, stopped: bool) -> float:
        return self.stop_unmatched if stopped else self.unmatched

    def snapshot(self) -> dict[str, object]:
        with self.lock:
            calibrated = self.costs if self.learner is None else self.learner.prior
            return {
                "choices": dict(self.choices),
                "lookup_accept": [round(x, 3) for x in self.lookup.rates(4)],
                "lookup_accept_after_hit": [round(x, 3) for x in self.lookup_hot.rates(4)],
                "lookup_accept_one_token_match": [round(x, 3) for x in self.lookup_guess.rates(4)],
                "model_accept": [round(x, 3) for x in self.model.rates(4)],
                "region_accept": [round(x, 3) for x in self.region.rates(4)],
                "region_accept_after_hit": [round(x, 3) for x in self.region_hot.rates(4)],
                "head_accept": [round(x, 3) for x in self.head.rates(4)],
                "mean_length": round(self.length, 1),
                "mean_length_to_stop": round(self.stop_length, 1),
                "unmatched_share": round(self.unmatched, 3),
                "unmatched_share_to_stop": round(self.stop_unmatched, 3),
                "verify_cost": [round(x, 3) for x in self.costs.verify],
                "draft_step_cost": round(self.costs.step, 3),
                "draft_catchup_cost": round(self.costs.catchup, 4),
                "costs_learned_from_passes": 0 if self.learner is None else self.learner.passes,
                "verify_cost_calibrated": [round(x, 3) for x in calibrated.verify],
                "draft_step_cost_calibrated": round(calibrated.step, 3),
            }


def _plan_name(plan: Plan, head: str = "lookup") -> str:
    """The plan's name in the choices (``head``: the source of its point-mass tokens)."""
    parts = [name for name, n in ((head, plan.lookup), ("model", plan.model)) if n > 0]
    return "+".join(parts) or "plain"


class PlannedDrafter(Drafter):
    """Lookup and/or draft model, chosen per pass by ``plan_pass``. ``k`` from the loop is the cap.

    ``region`` (a next edit): the region's continuation is offered before the lookup match, as free
    point-mass tokens priced by its own acceptance (``PolicyState.region``); where it has none (the
    output left the region and has not realigned) the lookup match is offered.

    ``feature_head`` (a head on the target's hidden state): its guesses instead of the lookup match
    where the policy expects more of them (no match, or a match it trusts less), priced by
    ``PolicyState.head``; the head runs only then."""

    name = "policy"

    def __init__(
        self,
        lookup: PromptLookupDrafter | None,
        model: DraftModelDrafter | None,
        state: PolicyState,
        region: RegionDrafter | None = None,
        feature_head: HeadDrafter | None = None,
    ) -> None:
        self.lookup = lookup
        self.model = model
        self.state = state
        self.region = region
        self.feature_head = feature_head
        self._head = PromptLookupDrafter.name  # the source of the last proposal's point-mass tokens
        self._max_new = DecodeSettings().max_new_tokens
        self._start: int | None = None  # context length at the first proposal: the prompt
        self._generated = 0
        self._copied = 0  # this request's tokens that were accepted lookup tokens
        self._sources: list[str] = []
        self._q: np.ndarray | None = None
        self._hot = False  # this request's last lookup proposal was accepted whole
        self._region_hot = False  # this request's last region proposal was accepted whole
        self._table: AcceptanceByPosition | None = None  # what the last proposal's lookup tokens teach
        # Set by the caller before a request: it ends at a text stop (PolicyState.stop_length)
        self.stopped = False

    def begin(self, settings: DecodeSettings) -> None:
        self.end()  # the previous request of this drafter, if it was not ended
        self._max_new = settings.max_new_tokens
        self._start = None
        self._generated = 0
        self._copied = 0
        self._hot = False
        self._region_hot = False
        if self.model is not None:  # lookup keeps no per-request state
            self.model.begin(settings)
        if self.region is not None:
            self.region.begin(settings)

    def end(self) -> None:
        """The request is over: its length teaches the policy what "remaining" usually is."""
        if self._start is not None:
            self.state.finish(self._generated, self.stopped, max(0, self._generated - self._copied))
            self._start = None

    def _remaining(self, context: Sequence[int]) -> int:
        """Tokens this request is still expected to produce: a completion that ran g tokens is guessed to
        run at least as long again (its length is open-ended), and at least the usual length."""
        if self._start is None:
            self._start = len(context)
        self._generated = len(context) - self._start
        expected = max(self.state.usual_length(self.stopped), 2.0 * self._generated)
        if self.region is not None:  # a rewrite is about as long as the region it rewrites
            expected = max(expected, float(len(self.region.region)))
        return max(1, min(self._max_new - self._generated, round(expected) - self._generated))

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        self._sources, self._q = [], None
        if k <= 0 or not context:
            return []
        remaining = self._remaining(context)
        free, table = self._free_tokens(context, k)
        with self.state.lock:
            self._table = table
            if table is self.state.region_hot:
                # a copy of the region in progress breaks at most once, at the edit, anywhere in it:
                # a pass's expected tokens then grow with its length as its cost does (Not the decay
                # the policy prices other drafts with), and each pass spared spares its fixed cost
                g = len(free)
                plan = Plan(g, 0, expected_tokens(table.rates(g), g) / self.state.costs.verify_cost(g))
            else:
                plan = plan_pass(
                    len(free),
                    table.rates(k),
                    self.state.model.rates(k) if self.model is not None else None,
                    self.state.costs,
                    g_max=k,
                    remaining=remaining + 1,  # plan_pass keeps one token for the target's own
                    model_behind=self.model.behind(context) if self.model is not None else 0,
                    model_share=self.state.usual_unmatched(self.stopped),
                )
            self.state.choices[_plan_name(plan, self._head)] += 1
        tokens = free[: plan.lookup]
        model_q: np.ndarray | None = None
        if plan.model > 0 and self.model is not None:
            tokens += self.model.propose([*context, *tokens], plan.model)
            model_q = self.model.proposal_probs()
        n_lookup = plan.lookup
        self._sources = [self._head] * n_lookup + [DraftModelDrafter.name] * (len(tokens) - n_lookup)
        self._q = point_masses_then(tokens, n_lookup, model_q)
        return tokens

    def observe(self, n_accepted: int, n_verified: int) -> None:
        # the pass's tokens count now (the last pass of a request has no next proposal to count them)
        self._generated = min(self._max_new, self._generated + n_accepted + 1)
        verified = self._sources[:n_verified]  # the tokens past a stop were not verified: no evidence
        n_lookup = verified.count(self._head)
        n_model = len(verified) - n_lookup
        with self.state.lock:
            if n_lookup and self._table is not None:
                self._table.observe(n_lookup, min(n_accepted, n_lookup))
            if n_model and n_accepted >= n_lookup:  # the model's tokens were reached
                self.state.model.observe(n_model, n_accepted - n_lookup)
        if n_lookup and self._head == PromptLookupDrafter.name:
            self._hot = n_accepted >= n_lookup
        if n_lookup and self._head == RegionDrafter.name:
            self._region_hot = n_accepted >= n_lookup
        if n_lookup:
            self._copied += min(n_accepted, n_lookup)
        if self.model is not None and n_model:
            self.model.observe(max(0, n_accepted - n_lookup), n_model)

    def _free_tokens(self, context: Sequence[int], k: int) -> tuple[list[int], AcceptanceByPosition]:
        """The point-mass tokens on offer this pass (the region's, else the lookup match's) and the
        table that prices them; their source in ``_head``."""
        if self.region is not None:
            tokens = self.region.propose(context, k)
            if tokens:
                self._head = RegionDrafter.name
                hot = self._region_hot and self.region.continued  # Not after a realignment
                return tokens[:k], self.state.region_hot if hot else self.state.region
        match = self.lookup.match(context, k) if self.lookup is not None else None
        self._head = PromptLookupDrafter.name
        tokens, table = (list(match.tokens[:k]) if match is not None else []), self._lookup_table(match)
        if self.feature_head is not None and self._head_beats(tokens, table, k):
            guess = self.feature_head.propose(context, k)
            if guess:
                self._head = HeadDrafter.name
                return guess, self.state.head
        return tokens, table

    def _head_beats(self, tokens: list[int], table: AcceptanceByPosition, k: int) -> bool:
        """Whether the head's guesses promise a better pass than the lookup tokens (by the tables), its
        guess's cost included (a head that is seldom right costs more than it saves)."""
        head = self.feature_head
        assert head is not None
        costs, n = self.state.costs, min(k, head.heads)
        _, s_head = best_gamma(self.state.head.rates(n), costs, 0.0, n, fixed=head.cost)
        _, s_lookup = best_gamma(table.rates(k), costs, 0.0, len(tokens))
        return s_head > s_lookup

    def _lookup_table(self, match: LookupMatch | None) -> AcceptanceByPosition:
        """The acceptance that prices this match: a one-token match's own, else after a hit or not."""
        if match is not None and match.guess:
            return self.state.lookup_guess
        return self.state.lookup_hot if self._hot else self.state.lookup

    def proposal_probs(self) -> np.ndarray | None:
        return self._q

    def proposal_sources(self) -> Sequence[str]:
        return list(self._sources)


Clock = Callable[[], float]


def calibrate(
    target: CausalLM,
    draft: CausalLM | None,
    clock: Clock,
    prefix: int = 32,
    points: Sequence[int] = (1, 3, 8),  # the verify curve is close to linear between them
    catchup_tokens: int = 16,
    rounds: int = 3,  # a few: the fastest of them counts, and each costs every shape once
) -> PassCosts:
    """Measure a pair's pass costs: a target pass over g+1 tokens for g in ``points`` (interpolated
    between them) and a one-token draft pass, both relative to a one-token target pass after a
    ``prefix``-token context, and the draft's catch-up cost per token (a ``catchup_tokens`` feed).
    The target is measured by the rows its passes compute (``CausalLM.pass_granularity``): on a
    target that pads odd passes g = 1 costs what a one-token pass costs and g = 2 what g = 3 costs.

    Interleaved rounds on one cache per model (fed its prefix once, truncated back after each pass):
    a warm-up round that is thrown away (a shape's first pass also pays ORT's allocations for it), then
    ``rounds`` rounds that each time every shape once; each shape's fastest round counts. A busy host
    only ever adds time to a pass, so the fastest is the least disturbed, and since the rounds
    interleave the shapes, a host whose speed changes between minutes (a shared CPU) gives every
    shape the same fast minutes instead of some shapes a slow one.

    Costs two 32-token prefills and 4 rounds of 4 target and 2 draft passes at load: seconds for a
    1.5B pair on a CPU, milliseconds for the bundled pair."""
    vocab = target.vocab_size
    k = max(1, target.pass_granularity)
    rows = sorted({pass_rows(g + 1, k) for g in (0, *points)})  # [one-token pass, ...]
    ids = [(7 * i + 3) % vocab for i in range(prefix + max(rows[-1], catchup_tokens))]

    def primed(model: CausalLM) -> KVCache:
        cache = model.new_cache()
        cache.forward(ids[:prefix])
        return cache

    def timed(cache: KVCache, n: int) -> float:
        t0 = clock()
        cache.forward(ids[prefix : prefix + n])
        elapsed = clock() - t0
        cache.truncate(prefix)
        return elapsed

    on_target = primed(target)
    shapes = [(on_target, r) for r in rows]  # then the draft's step and catch-up feed
    if draft is not None:
        on_draft = primed(draft)
        shapes += [(on_draft, 1), (on_draft, catchup_tokens)]
    for cache, n in shapes:  # warm-up
        timed(cache, n)
    times = np.array([[timed(c, n) for c, n in shapes] for _ in range(max(1, rounds))])  # [rounds, shapes]
    fastest = times.min(axis=0)
    one = max(float(fastest[0]), 1e-9)  # a one-token target pass
    cost = [float(t) / one for t in fastest]
    verify = tuple(
        float(np.interp(pass_rows(g + 1, k), rows, cost[: len(rows)])) for g in range(max(points) + 1)
    )
    if draft is None:
        return PassCosts(verify=verify, step=0.0, catchup=0.0)
    step, feed = cost[len(rows) :]
    costs = PassCosts(verify=verify, step=step, catchup=feed / catchup_tokens)
    log.info(
        "drafting policy costs: verify %s, draft step %.3f, catch-up %.4f per token",
        verify,
        step,
        costs.catchup,
    )
    return costs
