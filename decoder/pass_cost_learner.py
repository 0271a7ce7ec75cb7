"""Pass costs learned from the decode's own passes, starting from the load-time calibration.

``calibrate`` (``decoder/planned.py``) times a pair once, for about a second, after a 32-token
context. A CPU host does not keep one speed: what a bigger pass costs next to a one-token pass drifts
for seconds at a time, so calibrations of one pair on one host disagree, and the plans that follow
are only as good as the sample. ``PassCostLearner`` keeps what
the decode loop measured (every target pass: tokens fed and milliseconds; every draft-model feed
likewise) as decayed sums per pass size, and prices a pass of g drafted tokens at

    verify[g] = (sum of ms of r-row passes / base + w * prior.verify[g]) / (weight of r-row passes + w)

with r the rows a pass over g+1 tokens computes (``pass_granularity``), ``base`` the mean ms of a
one-token pass (the same average over the passes of the smallest size) and ``w`` the calibration's
weight in passes. A size not seen lately keeps its calibrated ratio; one seen often follows the host.
Older passes fade by ``decay`` per observed pass, so a host that changes speed is followed within
tens of passes. Where the estimates price more rows below fewer, they are pooled (``monotone``).
The draft model's step (a one-token feed) and catch-up (per token of a longer feed)
are learned the same way, both relative to ``base``. Costs move plans only, never an output.

Worked example (granularity 1, prior verify (1.0, 1.2), weight 1, no decay): one-token passes of
10 ms and two-token passes of 15 ms, three each: base 10, verify[1] = (4.5 + 1.2) / 4 = 1.425.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from specls.decoder.policy import PassCosts


def pass_rows(tokens: int, granularity: int) -> int:
    """The rows a pass over ``tokens`` computes on a model of pass granularity ``granularity``.

    >>> pass_rows(3, 2), pass_rows(4, 2), pass_rows(3, 1)   # Not 3: an odd pass is padded to even
    (4, 4, 3)
    """
    k = max(1, granularity)
    return -(-max(1, tokens) // k) * k


@dataclass
class _Mean:
    """A decayed mean: ``total`` of the values, ``weight`` of them (each value weighs 1 when seen)."""

    total: float = 0.0
    weight: float = 0.0

    def add(self, value: float) -> None:
        self.total += value
        self.weight += 1.0

    def fade(self, decay: float) -> None:
        self.total *= decay
        self.weight *= decay


@dataclass
class PassCostLearner:
    """Learns a pair's ``PassCosts`` online (module docstring). Not thread-safe: its owner locks."""

    prior: PassCosts
    granularity: int = 1
    # the calibration counts as this many passes of each size: a few passes' worth, so that one slow
    # pass (a page fault, a neighbour's burst) moves a price little and a minute of passes decides
    prior_weight: float = 8.0
    # per observed target pass; 0.99 keeps about 100 passes' memory: seconds of decoding, about as long
    # as a host keeps one speed
    decay: float = 0.99
    _target: dict[int, _Mean] = field(default_factory=dict)  # rows computed -> ms of such passes
    _step: _Mean = field(default_factory=_Mean)  # ms of a one-token draft feed
    _catchup: _Mean = field(default_factory=_Mean)  # ms per token of a longer draft feed
    passes: int = 0  # target passes observed (for stats)

    def observe_target(self, tokens: int, ms: float) -> None:
        """A target pass over ``tokens`` tokens took ``ms``."""
        if tokens <= 0 or not ms > 0.0:
            return
        for mean in (*self._target.values(), self._step, self._catchup):
            mean.fade(self.decay)
        self._target.setdefault(pass_rows(tokens, self.granularity), _Mean()).add(ms)
        self.passes += 1

    def observe_draft(self, tokens: int, ms: float) -> None:
        """A draft-model feed of ``tokens`` tokens took ``ms`` (one token: a step; more: catch-up)."""
        if tokens <= 0 or not ms > 0.0:
            return
        if tokens == 1:
            self._step.add(ms)
        else:
            self._catchup.add(ms / tokens)

    def observe(self, target: Iterable[tuple[int, float]], draft: Iterable[tuple[int, float]] = ()) -> None:
        """A request's passes: ``(tokens, ms)`` of each target pass, then of each draft-model feed."""
        for tokens, ms in target:
            self.observe_target(tokens, ms)
        for tokens, ms in draft:
            self.observe_draft(tokens, ms)

    def base_ms(self) -> float | None:
        """The mean ms of a one-token target pass lately, None before one was seen."""
        one = self._target.get(pass_rows(1, self.granularity))
        if one is None or one.weight <= 1e-6:
            return None
        return one.total / one.weight

    def costs(self) -> PassCosts:
        """The prices to plan with: the calibration's, moved by what the passes measured."""
        base = self.base_ms()
        if base is None:  # nothing to relate the other sizes to
            return self.prior
        w = self.prior_weight

        def blend(mean: _Mean | None, prior: float) -> tuple[float, float]:
            """(estimate, its weight in passes)"""
            if mean is None:
                return prior, w
            return (mean.total / base + w * prior) / (mean.weight + w), mean.weight + w

        rows = [pass_rows(g + 1, self.granularity) for g in range(1, len(self.prior.verify))]
        sizes = [blend(self._target.get(r), v) for r, v in zip(rows, self.prior.verify[1:], strict=True)]
        verify = monotone([v for v, _ in sizes], [n for _, n in sizes])  # more rows never cost less
        return PassCosts(
            verify=(1.0, *(max(1.0, v) for v in verify)),  # a one-token pass is the unit
            step=blend(self._step, self.prior.step)[0],
            catchup=blend(self._catchup, self.prior.catchup)[0],
        )


def monotone(values: Sequence[float], weights: Sequence[float]) -> list[float]:
    """The non-decreasing sequence closest to ``values`` in weighted least squares (pool adjacent
    violators): where the estimates price more rows below fewer, the better-measured one moves least.

    >>> monotone([1.2, 1.1, 1.5], [1.0, 3.0, 1.0])   # Not [1.2, 1.2, 1.5]: 1.1 was seen 3 times
    [1.125, 1.125, 1.5]
    """
    blocks: list[tuple[float, float, int]] = []  # (mean, weight, values pooled)
    for v, n in zip(values, weights, strict=True):
        blocks.append((v, n, 1))
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (v2, n2, c2), (v1, n1, c1) = blocks.pop(), blocks.pop()
            blocks.append(((v1 * n1 + v2 * n2) / (n1 + n2), n1 + n2, c1 + c2))
    return [mean for mean, _, count in blocks for _ in range(count)]
