"""Per-request speculation length (gamma) and the "does speculation pay" check.

Adaptive gamma (``adapt_gamma``): grow by one after a pass that accepted its full gamma-long proposal,
shrink by one after an early rejection (fewer than half accepted); clamped to [gamma_min, gamma_max].

Pays check: with tau = tokens committed per speculative pass (accepted + 1) and kappa = cost of a
speculative pass relative to a plain one (1 + drafting cost), the estimated speedup is tau / kappa.
Drafting cost per pass is ``c * drafted`` when the caller gives c (``DecodeSettings.draft_cost_ratio``),
else measured: (drafting time + verify pass time) / plain pass time - 1, where the plain pass time is a
moving average over the plain passes seen so far (the verify pass itself when there were none, which
ignores the extra cost of verifying more positions). All are exponential moving averages. After a
few warm-up passes, if the estimate falls below ``min_speedup`` drafting is turned off (gamma 0 ->
plain steps) for ``backoff`` passes, then probed again; the backoff doubles while it keeps not paying.
"""

from __future__ import annotations

from dataclasses import dataclass

from specls.decoder.api import DecodeSettings


def adapt_gamma(gamma: int, drafted: int, accepted: int, lo: int, hi: int) -> int:
    """The next speculation length after a pass that drafted ``drafted`` tokens (asked for ``gamma``)
    and had ``accepted`` of them accepted: one more after a full acceptance of a full-length proposal,
    one less when fewer than half were accepted, else the same; clamped to [lo, hi].

    Worked example, gamma 4 in [1, 8]: drafted 4, accepted 4 -> 5; drafted 2, accepted 2 -> 4 (a short
    proposal, e.g. a lookup match near its end, says nothing about a longer one); drafted 4, accepted 1
    -> 3; drafted 4, accepted 2 -> 4 (half is not "fewer than half"); drafted 0 -> 4 (nothing learned).
    """
    if drafted <= 0:
        return gamma
    if accepted >= drafted and drafted >= gamma:
        return min(gamma + 1, hi)
    if 2 * accepted < drafted:
        return max(gamma - 1, lo)
    return gamma


@dataclass(frozen=True)
class GammaPolicy:
    """Knobs of the controller that are not per request."""

    ema: float = 0.7  # weight of the history in the moving averages
    warmup_passes: int = 3  # speculative passes observed before the pays check may switch drafting off
    backoff_min: int = 4  # plain passes before probing again
    backoff_max: int = 64


class GammaController:
    """State for one generation. ``gamma(remaining)`` -> how many tokens to draft now (0 = plain step);
    ``observe(...)`` after each speculative pass."""

    def __init__(self, settings: DecodeSettings, policy: GammaPolicy = GammaPolicy()) -> None:
        self._settings = settings
        self._policy = policy
        self._lo = max(1, settings.gamma_min)
        self._hi = max(self._lo, settings.gamma_max)
        self._gamma = min(max(settings.gamma, self._lo), self._hi)
        self._tau: float | None = None  # EMA tokens per speculative pass
        self._cost: float | None = None  # EMA drafting cost per pass, relative to a target pass
        self._plain_s: float | None = None  # EMA time of a plain (one-token) target pass
        self._observed = 0
        self._off_for = 0  # plain passes left before probing again
        self._backoff = policy.backoff_min
        self.disabled_passes = 0  # plain passes forced by the pays check (for stats/tests)

    @property
    def current(self) -> int:
        return self._gamma

    def speedup(self) -> float | None:
        """Estimated speedup of speculation over plain decoding (None until something was observed)."""
        if self._tau is None or self._cost is None:
            return None
        return self._tau / (1.0 + self._cost)

    def gamma(self, remaining: int) -> int:
        """Tokens to draft for the next pass, given ``remaining`` tokens allowed (accepted + bonus must
        fit: at most remaining - 1)."""
        if self._settings.gamma <= 0:
            return 0
        if self._off_for > 0:
            self._off_for -= 1
            self.disabled_passes += 1
            return 0
        return max(0, min(self._gamma, remaining - 1))

    def observe_plain(self, target_s: float) -> None:
        """A plain pass (nothing drafted) took ``target_s``: the baseline of the measured cost."""
        e = self._policy.ema
        self._plain_s = target_s if self._plain_s is None else e * self._plain_s + (1 - e) * target_s

    def observe(self, drafted: int, accepted: int, draft_s: float, target_s: float | None) -> None:
        """One speculative pass: ``drafted`` proposed, ``accepted`` of them accepted; ``draft_s`` time
        spent drafting, ``target_s`` time of the target pass (for the measured cost ratio; None: the
        pass did other work too, a prompt tail, so its time says nothing about drafting's cost)."""
        if drafted <= 0:
            return
        s, p = self._settings, self._policy
        if s.adaptive_gamma:
            self._gamma = adapt_gamma(self._gamma, drafted, accepted, self._lo, self._hi)
        if target_s is None:
            return
        if s.draft_cost_ratio is not None:
            cost = s.draft_cost_ratio * drafted
        else:
            plain = self._plain_s if self._plain_s is not None else target_s
            cost = max(0.0, (draft_s + target_s) / plain - 1.0) if plain > 0.0 else 0.0
        tau = float(accepted + 1)
        self._tau = tau if self._tau is None else p.ema * self._tau + (1 - p.ema) * tau
        self._cost = cost if self._cost is None else p.ema * self._cost + (1 - p.ema) * cost
        self._observed += 1
        speedup = self.speedup()
        if s.min_speedup <= 0.0 or self._observed < p.warmup_passes or speedup is None:
            return
        if speedup < s.min_speedup:
            self._off_for = self._backoff
            self._backoff = min(self._backoff * 2, p.backoff_max)
            self._observed = max(0, p.warmup_passes - 1)  # one probing pass decides again
        else:
            self._backoff = p.backoff_min
