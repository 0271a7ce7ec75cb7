"""The drafting policy: which drafter to use, and how many tokens to draft, so speculation never loses.

Speculative decoding pays when the tokens a pass commits outweigh what the pass costs. With ``a[i]`` the
probability that drafted position ``i`` is accepted given that every earlier one was (acceptance by
position), a pass drafting ``g`` tokens commits on average

    E(g) = 1 + a[0] + a[0]*a[1] + ... + a[0]*...*a[g-1]        (the 1 is the target's own token)

and costs, in units of one plain (one-token) target pass,

    C(g) = verify[g] + g * step

where ``verify[g]`` is a target pass over g+1 tokens relative to a one-token pass (> 1 on a CPU, ~1 on
a GPU) and ``step`` is one draft-model step relative to a one-token target pass (0 for prompt lookup,
about 1/3 for a 0.5B draft of a 1.5B target on a CPU). ``E(g) / C(g)`` is the speedup over plain
decoding; ``g = 0`` is plain decoding, speedup exactly 1. The policy picks the ``g`` with the best ratio,
so it only drafts when the estimate beats plain decoding.

A draft model that is behind the context (a new prompt: its KV holds a different prefix) must first
catch up over ``behind`` tokens; that is worth it only when the time the model saves over the tokens
still to come exceeds the catch-up: ``remaining * (1 - 1/speedup) > behind * catchup`` (both in target
passes). Short completions (stop at end of line) seldom clear that bar; long ones do.

Costs come from a calibration of the pair at load (``PassCosts``); acceptance by position is learned
online across requests (``AcceptanceByPosition``), so the first requests of a pair start from priors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class PassCosts:
    """What passes cost, relative to one plain (one-token) target pass. Measured once per pair."""

    # verify[g]: a target pass over g+1 tokens (the last committed token + g drafted ones); verify[0] = 1.
    # Beyond the table the last step's slope is extrapolated.
    verify: tuple[float, ...] = (1.0, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3, 1.35, 1.4)
    step: float = 0.3  # one draft-model step (a 0.5B draft of a 1.5B target on a CPU: ~1/3)
    catchup: float = 0.01  # one prompt token of draft-model catch-up (a batched prefill)

    def verify_cost(self, g: int) -> float:
        v = self.verify
        if g < len(v):
            return v[g]
        slope = v[-1] - v[-2] if len(v) > 1 else 0.0
        return v[-1] + slope * (g - len(v) + 1)


def expected_tokens(accept: Sequence[float], g: int) -> float:
    """Mean tokens committed by a pass that drafts ``g`` tokens with acceptance by position ``accept``.

    >>> expected_tokens([0.5, 0.5], 2)   # 1 + 0.5 + 0.25
    1.75
    """
    total, p = 1.0, 1.0
    for i in range(g):
        p *= _at(accept, i)
        total += p
    return total


def _at(accept: Sequence[float], i: int) -> float:
    """accept[i], the last rate beyond the end (a short history), 0 for none."""
    return accept[min(i, len(accept) - 1)] if accept else 0.0


def best_gamma(
    accept: Sequence[float], verify: PassCosts, step: float, g_max: int, fixed: float = 0.0
) -> tuple[int, float]:
    """The draft length in [0, g_max] with the best speedup E(g) / (verify(g) + g*step + fixed), and
    that speedup; ``fixed``: what a pass that drafts at all pays once (a feature head's guess).

    Plain decoding (g = 0) has speedup 1 and wins ties, so a drafter that does not pay is not used.

    >>> costs = PassCosts(verify=(1.0, 1.1, 1.2, 1.3))
    >>> best_gamma([0.9, 0.9, 0.9], costs, step=0.0, g_max=3)  # lookup: free to propose
    (3, 2.6...)
    >>> best_gamma([0.2, 0.2, 0.2], costs, step=0.3, g_max=3)  # a weak draft model: plain wins
    (0, 1.0)
    """
    best, best_s = 0, 1.0
    for g in range(1, max(0, g_max) + 1):
        s = expected_tokens(accept, g) / (verify.verify_cost(g) + g * step + fixed)
        if s > best_s + 1e-9:
            best, best_s = g, s
    return best, best_s


def catchup_pays(speedup: float, remaining: int, behind: int, catchup: float) -> bool:
    """Whether a draft model ``behind`` tokens behind the context earns its catch-up within ``remaining``
    tokens at ``speedup`` (plain passes saved: remaining * (1 - 1/speedup); cost: behind * catchup).

    >>> catchup_pays(2.0, remaining=64, behind=300, catchup=0.01)   # saves 32 passes, costs 3
    True
    >>> catchup_pays(2.0, remaining=4, behind=300, catchup=0.01)    # saves 2 passes, costs 3
    False
    """
    if speedup <= 1.0 or remaining <= 0:
        return False
    return remaining * (1.0 - 1.0 / speedup) > behind * catchup


@dataclass
class AcceptanceByPosition:
    """Learned acceptance by position for one drafter: ``rate(i)`` = accepted at i / reached position i,
    with a prior worth ``prior_weight`` observations so that a new pair starts from ``prior``.

    ``pooled``: shrink each position toward the drafter's rate over all positions instead (itself
    shrunk toward the prior), for a drafter whose acceptance hardly depends on the position: a copy
    breaks where the text differs, anywhere. Positions no pass reached are then priced by what the
    reached ones measured, not by the prior, so long drafts get tried where copies run long.

    >>> a = AcceptanceByPosition(prior=(0.9,), pooled=True)
    >>> for _ in range(40): a.observe(8, 8)
    >>> round(a.rate(100), 3)   # Not 0.9: 320 tokens accepted of 320 reached
    0.999
    """

    prior: tuple[float, ...]
    prior_weight: float = 4.0
    reached: list[float] = field(default_factory=list)
    accepted: list[float] = field(default_factory=list)
    pooled: bool = False

    def observe(self, drafted: int, n_accepted: int) -> None:
        """One verify pass: positions 0..drafted-1 were proposed, the first ``n_accepted`` accepted."""
        while len(self.reached) < drafted:
            self.reached.append(0.0)
            self.accepted.append(0.0)
        for i in range(min(drafted, n_accepted + 1)):  # positions after the first rejection were not reached
            self.reached[i] += 1.0
            self.accepted[i] += float(i < n_accepted)

    def rate(self, i: int) -> float:
        return self._rate(i, self._pooled())

    def rates(self, n: int) -> list[float]:
        pooled = self._pooled()
        return [self._rate(i, pooled) for i in range(n)]

    def _pooled(self) -> float | None:
        if not self.pooled:
            return None
        prior = self.prior[0] if self.prior else 0.5
        return (sum(self.accepted) + prior * self.prior_weight) / (sum(self.reached) + self.prior_weight)

    def _rate(self, i: int, pooled: float | None) -> float:
        if pooled is not None:
            prior = pooled
        else:
            prior = self.prior[min(i, len(self.prior) - 1)] if self.prior else 0.5
        seen = self.reached[i] if i < len(self.reached) else 0.0
        hit = self.accepted[i] if i < len(self.accepted) else 0.0
        return (hit + prior * self.prior_weight) / (seen + self.prior_weight)


@dataclass(frozen=True)
class Plan:
    """One pass's drafting: ``lookup`` tokens of the lookup match, then ``model`` draft-model tokens."""

    lookup: int
    model: int
    speedup: float  # the estimate behind the choice (1.0 = plain)


def plan_pass(
    lookup_match: int,
    lookup_accept: Sequence[float],
    model_accept: Sequence[float] | None,
    costs: PassCosts,
    g_max: int,
    remaining: int,
    model_behind: int = 0,
    model_share: float = 1.0,
) -> Plan:
    """Choose this pass's drafting. ``lookup_match``: tokens the lookup index offers now (free to
    propose); ``model_accept``: the draft model's acceptance by position (None = no draft model);
    ``model_behind``: context tokens the draft model would have to catch up on first; ``model_share``:
    the share of the remaining tokens its catch-up can pay off on (those lookup would not produce).

    Lookup first (it costs nothing to propose): its best length within the match. The draft model
    instead of it when it beats lookup (and its catch-up pays), or after it when extending the lookup
    tokens with model tokens raises the ratio (model acceptance starts at the first drafted position
    after the lookup ones, conditional on all of them having been accepted).

    >>> c = PassCosts(verify=(1.0, 1.1, 1.2, 1.3, 1.4), step=0.3, catchup=0.01)
    >>> plan_pass(0, [0.9], [0.8] * 4, c, g_max=4, remaining=64, model_behind=0)
    Plan(lookup=0, model=2, speedup=1.35...)
    >>> plan_pass(0, [0.9], [0.8] * 4, c, g_max=4, remaining=3, model_behind=500)  # catch-up: plain
    Plan(lookup=0, model=0, speedup=1.0)
    """
    g_max = max(0, min(g_max, remaining - 1))
    # the tokens a caught-up model would speed up (a model one token behind is a usual step)
    payoff = remaining if model_behind <= 1 else max(0, round(remaining * model_share))
    n_l, s_l = best_gamma(lookup_accept, costs, 0.0, min(lookup_match, g_max))
    best = Plan(n_l, 0, s_l)
    if model_accept is None or g_max <= 0:
        return best
    n_m, s_m = best_gamma(model_accept, costs, costs.step, g_max)
    if n_m > 0 and s_m > best.speedup and catchup_pays(s_m, payoff, model_behind, costs.catchup):
        best = Plan(0, n_m, s_m)
    if n_l > 0 and n_l < g_max:  # extend the lookup tokens with the model
        head = [_at(lookup_accept, i) for i in range(n_l)]
        for j in range(1, g_max - n_l + 1):
            accept = head + list(model_accept[:j])
            s = expected_tokens(accept, n_l + j) / (costs.verify_cost(n_l + j) + j * costs.step)
            if s > best.speedup + 1e-9 and catchup_pays(s, payoff, model_behind, costs.catchup):
                best = Plan(n_l, j, s)
    return best
