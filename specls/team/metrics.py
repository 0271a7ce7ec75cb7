"""Prometheus text exposition (format 0.0.4) without a dependency, and the ``/metrics`` + ``/healthz``
HTTP endpoint (stdlib ``http.server`` in a daemon thread, loopback by default).

``Metrics`` is a small thread-safe registry of counters, gauges and histograms with labels.
``parse_prometheus_text`` reads the format back (tests and ``specls bench team`` use it)."""

from __future__ import annotations

import logging
import math
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

LabelKey = tuple[tuple[str, str], ...]


def _label_key(labels: Mapping[str, str] | None) -> LabelKey:
    if not labels:
        return ()
    for k in labels:
        if not _LABEL_RE.match(k) or k.startswith("__"):
            raise ValueError(f"bad label name {k!r}")
    return tuple(sorted((k, str(v)) for k, v in labels.items()))


def _escape_label(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _fmt_labels(key: LabelKey) -> str:
    if not key:
        return ""
    return "{" + ",".join(f'{k}="{_escape_label(v)}"' for k, v in key) + "}"


def _fmt_value(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if float(v).is_integer() and abs(v) < 1e15:
        return str(int(v))
    return repr(float(v))


@dataclass
class _Histogram:
    buckets: tuple[float, ...]
    counts: list[int]
    total: float = 0.0
    n: int = 0


@dataclass
class _Family:
    name: str
    kind: str  # counter | gauge | histogram
    help: str
    buckets: tuple[float, ...] = ()
    values: dict[LabelKey, float] = field(default_factory=dict)
    hists: dict[LabelKey, _Histogram] = field(default_factory=dict)
    # A gauge may be computed at scrape time instead of set.
    callback: Callable[[], Iterable[tuple[Mapping[str, str], float]]] | None = None


class Metrics:
    """Thread-safe registry. Declare families once (``counter``/``gauge``/``histogram``), then update
    them by name with labels."""

    def __init__(self, namespace: str = "specls") -> None:
        self._ns = namespace
        self._lock = threading.Lock()
        self._families: dict[str, _Family] = {}

    def _full(self, name: str) -> str:
        full = f"{self._ns}_{name}" if self._ns else name
        if not _NAME_RE.match(full):
            raise ValueError(f"bad metric name {full!r}")
        return full

    def _declare(self, fam: _Family) -> None:
        with self._lock:
            old = self._families.get(fam.name)
            if old is not None and old.kind != fam.kind:
                raise ValueError(f"metric {fam.name} already declared as {old.kind}")
            if old is None:
                self._families[fam.name] = fam

    def counter(self, name: str, help: str) -> None:
        full = self._full(name if name.endswith("_total") else name + "_total")
        self._declare(_Family(full, "counter", help))

    def gauge(
        self,
        name: str,
        help: str,
        callback: Callable[[], Iterable[tuple[Mapping[str, str], float]]] | None = None,
    ) -> None:
        self._declare(_Family(self._full(name), "gauge", help, callback=callback))

    def histogram(self, name: str, help: str, buckets: tuple[float, ...] = LATENCY_BUCKETS_S) -> None:
        bs = tuple(sorted(set(buckets)))
        if not bs:
            raise ValueError("a histogram needs buckets")
        self._declare(_Family(self._full(name), "histogram", help, buckets=bs))

    def _get(self, name: str, kind: str) -> _Family:
        full = self._full(name + "_total" if kind == "counter" and not name.endswith("_total") else name)
        fam = self._families.get(full)
        if fam is None or fam.kind != kind:
            raise KeyError(f"{kind} {full} is not declared")
        return fam

    def inc(self, name: str, amount: float = 1.0, labels: Mapping[str, str] | None = None) -> None:
        if amount < 0:
            raise ValueError("counters only go up")
        key = _label_key(labels)
        with self._lock:
            fam = self._get(name, "counter")
            fam.values[key] = fam.values.get(key, 0.0) + amount

    def set(self, name: str, value: float, labels: Mapping[str, str] | None = None) -> None:
        key = _label_key(labels)
        with self._lock:
            self._get(name, "gauge").values[key] = float(value)

    def observe(self, name: str, value: float, labels: Mapping[str, str] | None = None) -> None:
        key = _label_key(labels)
        with self._lock:
            fam = self._get(name, "histogram")
            h = fam.hists.get(key)
            if h is None:
                h = fam.hists[key] = _Histogram(fam.buckets, [0] * len(fam.buckets))
            for i, b in enumerate(h.buckets):
                if value <= b:
                    h.counts[i] += 1
            h.total += value
            h.n += 1

    def value(self, name: str, labels: Mapping[str, str] | None = None) -> float:
        """Current value of a counter or gauge sample (0 when never touched)."""
        key = _label_key(labels)
        with self._lock:
            for full in (self._full(name), self._full(name + "_total")):
                fam = self._families.get(full)
                if fam is not None and fam.kind in ("counter", "gauge"):
                    return fam.values.get(key, 0.0)
        raise KeyError(name)

    def render(self) -> str:
        """The whole registry in Prometheus text format."""
        with self._lock:
            fams = list(self._families.values())
            snap: list[tuple[_Family, dict[LabelKey, float], dict[LabelKey, _Histogram]]] = [
                (
                    f,
                    dict(f.values),
                    {k: _Histogram(h.buckets, list(h.counts), h.total, h.n) for k, h in f.hists.items()},
                )
                for f in fams
            ]
        lines: list[str] = []
        for fam, values, hists in snap:
            if fam.callback is not None:
                try:
                    for labels, v in fam.callback():
                        values[_label_key(labels)] = float(v)
                except Exception:  # a broken callback must not break the scrape
                    log.exception("metrics callback for %s failed", fam.name)
            lines.append(f"# HELP {fam.name} {fam.help.replace(chr(92), chr(92) * 2).replace(chr(10), ' ')}")
            lines.append(f"# TYPE {fam.name} {fam.kind}")
            if fam.kind == "histogram":
                for key, h in sorted(hists.items()):
                    for b, c in zip(h.buckets, h.counts, strict=True):
                        bkey = tuple(sorted((*key, ("le", _fmt_value(b)))))
                        lines.append(f"{fam.name}_bucket{_fmt_labels(bkey)} {c}")
                    inf_key = tuple(sorted((*key, ("le", "+Inf"))))
                    lines.append(f"{fam.name}_bucket{_fmt_labels(inf_key)} {h.n}")
                    lines.append(f"{fam.name}_sum{_fmt_labels(key)} {_fmt_value(h.total)}")
                    lines.append(f"{fam.name}_count{_fmt_labels(key)} {h.n}")
            else:
                if not values and fam.kind == "counter":
                    values[()] = 0.0
                for key, v in sorted(values.items()):
                    lines.append(f"{fam.name}{_fmt_labels(key)} {_fmt_value(v)}")
        return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Parsing (for tests and the bench): strict enough to catch malformed output.
# ---------------------------------------------------------------------------------------------


class PrometheusParseError(ValueError):
    pass


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


@dataclass
class ParsedFamily:
    name: str
    kind: str = "untyped"
    help: str = ""
    samples: list[Sample] = field(default_factory=list)


_SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+(-?\d+))?$")
_LABEL_PAIR_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')
_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}


def _parse_value(s: str, lineno: int) -> float:
    if s in ("+Inf", "Inf"):
        return math.inf
    if s == "-Inf":
        return -math.inf
    if s == "NaN":
        return math.nan
    try:
        return float(s)
    except ValueError:
        raise PrometheusParseError(f"line {lineno}: bad value {s!r}") from None


def _parse_labels(body: str, lineno: int) -> dict[str, str]:
    inner = body[1:-1]
    labels: dict[str, str] = {}
    pos = 0
    while pos < len(inner):
        m = _LABEL_PAIR_RE.match(inner, pos)
        if m is None or m.end() == pos:
            raise PrometheusParseError(f"line {lineno}: bad labels {body!r}")
        raw = m.group(2)
        val = re.sub(r"\\(.)", lambda mm: "\n" if mm.group(1) == "n" else mm.group(1), raw)
        if m.group(1) in labels:
            raise PrometheusParseError(f"line {lineno}: duplicate label {m.group(1)}")
        labels[m.group(1)] = val
        pos = m.end()
    return labels


def parse_prometheus_text(text: str) -> dict[str, ParsedFamily]:
    """Parse Prometheus text format; raises PrometheusParseError on anything malformed, including
    samples of an undeclared family, non-cumulative histogram buckets, or a missing +Inf bucket."""
    fams: dict[str, ParsedFamily] = {}
    if text and not text.endswith("\n"):
        raise PrometheusParseError("exposition must end with a newline")
    for lineno, line in enumerate(text.split("\n")[:-1], start=1):
        if not line.strip():
            continue
        if line.startswith("#"):
            _parse_comment(fams, line, lineno)
        else:
            _parse_sample(fams, line, lineno)
    for fam in fams.values():
        if fam.kind == "counter":
            _check_counter(fam)
        if fam.kind == "histogram":
            _check_histogram(fam)
    return fams


def _family_of(fams: dict[str, ParsedFamily], sample_name: str) -> ParsedFamily:
    """The family a sample belongs to (``x_bucket`` to histogram ``x``), made if undeclared."""
    if sample_name in fams and fams[sample_name].kind not in _SUFFIXES:
        return fams[sample_name]
    for base, fam in fams.items():
        for suf in _SUFFIXES.get(fam.kind, ()):
            if sample_name == base + suf:
                return fam
    return fams.setdefault(sample_name, ParsedFamily(sample_name))


def _parse_comment(fams: dict[str, ParsedFamily], line: str, lineno: int) -> None:
    """A ``# HELP`` or ``# TYPE`` line; any other comment is ignored."""
    parts = line.split(None, 3)
    if len(parts) < 3 or parts[1] not in ("HELP", "TYPE"):
        return
    name = parts[2]
    if not _NAME_RE.match(name):
        raise PrometheusParseError(f"line {lineno}: bad metric name {name!r}")
    fam = fams.setdefault(name, ParsedFamily(name))
    if parts[1] == "TYPE":
        kind = parts[3].strip() if len(parts) > 3 else ""
        if kind not in ("counter", "gauge", "histogram", "summary", "untyped"):
            raise PrometheusParseError(f"line {lineno}: bad type {kind!r}")
        if fam.samples:
            raise PrometheusParseError(f"line {lineno}: TYPE after samples of {name}")
        fam.kind = kind
    else:
        fam.help = parts[3] if len(parts) > 3 else ""


def _parse_sample(fams: dict[str, ParsedFamily], line: str, lineno: int) -> None:
    m = _SAMPLE_RE.match(line)
    if m is None:
        raise PrometheusParseError(f"line {lineno}: cannot parse {line!r}")
    labels = _parse_labels(m.group(2), lineno) if m.group(2) else {}
    fam = _family_of(fams, m.group(1))
    fam.samples.append(Sample(m.group(1), labels, _parse_value(m.group(3), lineno)))


def _check_counter(fam: ParsedFamily) -> None:
    for s in fam.samples:
        if s.value < 0:
            raise PrometheusParseError(f"counter {s.name} is negative")


def _check_histogram(fam: ParsedFamily) -> None:
    """Each label set's buckets are cumulative, end at +Inf, and +Inf equals ``_count``."""
    series: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = {}
    counts: dict[tuple[tuple[str, str], ...], float] = {}
    for s in fam.samples:
        rest = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
        if s.name.endswith("_bucket"):
            if "le" not in s.labels:
                raise PrometheusParseError(f"{s.name} bucket without le")
            series.setdefault(rest, []).append((_parse_value(s.labels["le"], 0), s.value))
        elif s.name.endswith("_count"):
            counts[rest] = s.value
    for rest, buckets in series.items():
        buckets.sort()
        if not buckets or not math.isinf(buckets[-1][0]):
            raise PrometheusParseError(f"{fam.name}: no +Inf bucket")
        for (_, a), (_, b) in zip(buckets, buckets[1:], strict=False):
            if b < a:
                raise PrometheusParseError(f"{fam.name}: buckets not cumulative")
        if rest in counts and counts[rest] != buckets[-1][1]:
            raise PrometheusParseError(f"{fam.name}: _count != +Inf bucket")


# ---------------------------------------------------------------------------------------------
# HTTP endpoint
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MetricsSettings:
    host: str = "127.0.0.1"
    port: int = 0  # 0 = pick a free port


class MetricsServer:
    """``/metrics`` and ``/healthz`` on a daemon thread. ``health()`` returns (ok, detail)."""

    def __init__(
        self,
        settings: MetricsSettings,
        metrics: Metrics,
        health: Callable[[], tuple[bool, str]] | None = None,
    ) -> None:
        self._metrics = metrics
        self._health = health or (lambda: (True, "ok"))
        registry, health_fn = metrics, self._health

        class Handler(BaseHTTPRequestHandler):
            server_version = "specls-metrics"

            def do_GET(self) -> None:  # noqa: N802 (http.server naming)
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    body, status, ctype = registry.render().encode(), 200, CONTENT_TYPE
                elif path == "/healthz":
                    try:
                        ok, detail = health_fn()
                    except Exception as exc:  # health must answer, not crash
                        ok, detail = False, f"health check failed: {type(exc).__name__}"
                    body, status = (detail + "\n").encode(), 200 if ok else 503
                    ctype = "text/plain; charset=utf-8"
                else:
                    body, status, ctype = b"not found\n", 404, "text/plain; charset=utf-8"
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                log.debug("metrics http: " + format, *args)

        self._httpd = ThreadingHTTPServer((settings.host, settings.port), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="specls-metrics", daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._httpd.server_address[:2]
        return str(host), int(port)

    def start(self) -> MetricsServer:
        self._thread.start()
        log.info("metrics on http://%s:%d/metrics", *self.address)
        return self

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
