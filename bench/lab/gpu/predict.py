"""The standard cost model of speculative decoding: tokens per pass, cost per pass, predicted speedups,
and acceptance rates read from JSON (inverting the model from counts)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from bench.lab.gpu.shapes import METHODS, BenchError


def expected_tokens(alpha: float, gamma: int) -> float:
    """Expected tokens committed per verify pass with ``gamma`` drafts each accepted with probability
    ``alpha`` (independently): (1 - a^(g+1)) / (1 - a)."""
    if gamma <= 0:
        return 1.0
    if alpha >= 1.0:
        return float(gamma + 1)
    alpha = max(alpha, 0.0)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def interp_cost(curve: Mapping[int, float], n: int) -> float:
    """T(n) from the measured points: linear between them, the end segments extended beyond."""
    xs = sorted(curve)
    if not xs:
        raise ValueError("empty cost curve")
    if n in curve:
        return curve[n]
    if len(xs) == 1:
        return curve[xs[0]] * n / xs[0]
    if n < xs[0]:
        lo, hi = xs[0], xs[1]
    elif n > xs[-1]:
        lo, hi = xs[-2], xs[-1]
    else:
        hi = next(x for x in xs if x > n)
        lo = max(x for x in xs if x < n)
    slope = (curve[hi] - curve[lo]) / (hi - lo)
    return max(curve[lo] + slope * (n - lo), 1e-9)


def predicted_speedup(curve: Mapping[int, float], c: float, alpha: float, gamma: int, method: str) -> float:
    """Speedup over plain greedy: tokens/pass * T(1) / (T(g+1) + g*c*T(1) [draft model only])."""
    t1 = curve[1]
    cost = interp_cost(curve, gamma + 1)
    if method == "draft":
        cost += gamma * c * t1
    return expected_tokens(alpha, gamma) * t1 / cost


def predicted_speedup_with_overhead(
    curve: Mapping[int, float],
    c: float,
    alpha: float,
    gamma: int,
    method: str,
    overhead_ms: float,
    truncate_ms: float = 0.0,
) -> float:
    """The same with a fixed per-pass cost ``overhead_ms`` (the loop's own work: argmax, bookkeeping,
    host<->device copies) added to plain and speculative passes, and the cache rollback after a
    rejection (``truncate_ms``) to speculative ones."""
    t1 = curve[1]
    cost = interp_cost(curve, gamma + 1) + (gamma * c * t1 if method == "draft" else 0.0)
    return expected_tokens(alpha, gamma) * (t1 + overhead_ms) / (cost + overhead_ms + truncate_ms)


def best_gamma(
    curve: Mapping[int, float], c: float, alpha: float, method: str, gamma_max: int
) -> tuple[int, float]:
    """The gamma in 1..gamma_max with the highest predicted speedup, and that speedup."""
    best = (1, predicted_speedup(curve, c, alpha, 1, method))
    for g in range(2, max(1, gamma_max) + 1):
        s = predicted_speedup(curve, c, alpha, g, method)
        if s > best[1] + 1e-12:
            best = (g, s)
    return best


def alpha_from_counts(drafted: float, accepted: float, proposals: float) -> float | None:
    """The per-token acceptance rate a whose standard model gives ``accepted/proposals`` accepted tokens
    per proposal of ``drafted/proposals`` tokens: sum_{i=1..g} a^i (solved by bisection)."""
    if proposals <= 0 or drafted <= 0:
        return None
    g = drafted / proposals
    target = accepted / proposals
    if target <= 0:
        return 0.0
    if target >= g:
        return 0.99

    def mean_accepted(a: float) -> float:
        # sum_{i=1..g} a^i for a real-valued g
        return a * (1.0 - a**g) / (1.0 - a)

    lo, hi = 0.0, 0.999999
    for _ in range(60):
        mid = (lo + hi) / 2
        if mean_accepted(mid) < target:
            lo = mid
        else:
            hi = mid
    return round((lo + hi) / 2, 4)


def _method_of(key: str) -> str | None:
    k = key.lower()
    if "lookup" in k or k in ("pld", "ngram"):
        return "lookup"
    if "draft" in k:
        return "draft"
    return None


def _is_rate(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and 0.0 <= float(v) <= 1.0


def _alphas_from_decode_bench(data: object) -> dict[str, tuple[float, ...]]:
    """`specls bench decode --json`: ``methods.<lookup|draft>`` with ``tokens``, ``target_passes`` and
    ``acceptance`` (accepted/drafted). Each pass commits its accepted drafts plus one token, so
    accepted = tokens - passes and drafted = accepted / acceptance; a is the standard model inverted."""
    methods = data.get("methods") if isinstance(data, dict) else None
    if not isinstance(methods, dict):
        return {}
    out: dict[str, tuple[float, ...]] = {}
    for m in METHODS:
        row = methods.get(m)
        if not isinstance(row, dict):
            continue
        tokens, passes, ratio = row.get("tokens"), row.get("target_passes"), row.get("acceptance")
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (tokens, passes, ratio)):
            continue
        accepted = max(0.0, float(tokens) - float(passes))  # type: ignore[arg-type]
        if float(ratio) <= 0.0 or accepted <= 0.0:  # type: ignore[arg-type]
            out[m] = (0.0,)
            continue
        a = alpha_from_counts(accepted / float(ratio), accepted, float(passes))  # type: ignore[arg-type]
        if a is not None:
            out[m] = (a,)
    return out


def _rates(value: object) -> list[float] | None:
    """One rate or a non-empty list of rates as floats; None for anything else."""
    if _is_rate(value):
        return [float(value)]  # type: ignore[arg-type]
    if isinstance(value, list) and value and all(_is_rate(v) for v in value):
        return [float(v) for v in value]
    return None


def _walk_rates(obj: object, method: str | None, found: dict[str, list[float]]) -> None:
    """Collect the rates (or drafted/accepted/proposals counts) under `obj` into `found` per method."""
    if isinstance(obj, list):
        for item in obj:
            _walk_rates(item, method, found)
        return
    if not isinstance(obj, dict):
        return
    counts = [obj.get(k) for k in ("drafted", "accepted", "proposals")]
    if method and all(isinstance(v, int | float) and not isinstance(v, bool) for v in counts):
        a = alpha_from_counts(*(float(v) for v in counts))  # type: ignore[arg-type]
        if a is not None:
            found[method].append(a)
        return
    for key, value in obj.items():
        sub = _method_of(str(key)) or method
        vals = _rates(value)
        if vals is not None and str(key) in METHODS:
            found[str(key)] += vals
        elif vals is not None and key in ("alpha", "acceptance", "alphas") and method:
            found[method] += vals
        elif isinstance(value, dict | list):
            _walk_rates(value, sub, found)


def load_acceptance(path: Path) -> dict[str, tuple[float, ...]]:
    """Acceptance rates per method from a JSON file.

    Accepted forms: `specls bench decode --json` output (``methods.lookup`` / ``methods.draft``);
    ``{"lookup": 0.6, "draft": [0.7, 0.8]}`` (optionally under ``"alpha"``); or objects holding
    ``drafted``/``accepted``/``proposals`` counts (e.g. ``per_drafter`` stats) under keys naming the
    method ("lookup", "draft"...), each giving one a (the standard model inverted). Raises BenchError
    when the file holds no usable rate.
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BenchError(f"{path}: unreadable acceptance JSON ({exc})") from None
    from_decode = _alphas_from_decode_bench(data)
    if from_decode:
        return from_decode
    found: dict[str, list[float]] = {m: [] for m in METHODS}
    _walk_rates(data, None, found)
    out = {m: tuple(sorted(set(round(v, 4) for v in vs))) for m, vs in found.items() if vs}
    if not out:
        raise BenchError(f"{path}: no acceptance rates found (want e.g. {{'lookup': 0.6, 'draft': 0.75}})")
    return out
