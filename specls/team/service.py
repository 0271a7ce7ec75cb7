"""Glue for ``specls serve --tcp``: one ``TeamService`` per server process holds the token store, the
fair scheduler over the shared engine, the metrics registry (+ optional HTTP endpoint) and the
structured request log. The LSP layer calls ``authenticate`` on ``initialize`` and gives each
connection ``open_session(client)`` as its engine, closing it on disconnect."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from specls.api import CompletionResult, Engine
from specls.team.auth import AuthError, TokenStore, require_auth_for_bind, token_from_init_options
from specls.team.logs import RequestLog, RequestLogSettings
from specls.team.metrics import Metrics, MetricsServer, MetricsSettings
from specls.team.scheduler import ClientSession, FairScheduler, RequestEvent, SchedulerSettings

log = logging.getLogger(__name__)

LOCAL_CLIENT = "local"


@dataclass(frozen=True)
class ConnectionSettings:
    # An editor sends initialize as its first message, within milliseconds of connecting; 10 s covers a
    # slow editor start over a slow link and bounds how long a scanner or a tokenless client holds a slot.
    auth_timeout_s: float = 10.0
    # Editors are silent while their user is away, and Neovim's client does not reconnect by itself
    # (VS Code's restarts), so this is long: a workday. It reclaims an editor left open overnight;
    # peers that vanished without a FIN are found sooner by TCP keepalive (on for every connection).
    # A connection waiting for one of its requests is never idle. 0 = never close.
    idle_timeout_s: float = 8 * 3600.0
    # An idle connection costs little server memory (docs/team.md, "What a connection costs"), and
    # this is more editors than one engine serves at interactive latency.
    max_connections: int = 256
    # One developer runs a few editors; a team behind NAT shares an address. Behind a proxy on the same
    # host every client comes from 127.0.0.1: raise it to max_connections there.
    max_per_address: int = 32
    # Far more than an initialize with full client capabilities; before a token is checked a client gets
    # no more than this (a maximum-size "message" from a stranger would be framed and parsed for nothing).
    max_unauthenticated_bytes: int = 1 << 20


@dataclass(frozen=True)
class TeamSettings:
    host: str = "127.0.0.1"
    token_file: str | None = None
    require_token: bool = False  # force token auth even on loopback (tests, proxies on the same host)
    metrics_port: int | None = None  # None = no HTTP endpoint
    metrics_host: str = "127.0.0.1"
    scheduler: SchedulerSettings = field(default_factory=SchedulerSettings)
    request_log: RequestLogSettings = field(default_factory=RequestLogSettings)
    connections: ConnectionSettings = field(default_factory=ConnectionSettings)


class TeamMetricsObserver:
    """Turns scheduler events into Prometheus metrics and JSON request-log lines."""

    def __init__(self, metrics: Metrics, request_log: RequestLog | None) -> None:
        self.m = metrics
        self.request_log = request_log
        self._lock = threading.Lock()
        self._served = 0
        self._prefix_hits = 0
        self._completion_reuse = 0
        self._cache_hits = 0
        self._drafted: dict[str, int] = {}
        self._accepted: dict[str, int] = {}
        m = metrics
        m.counter("requests", "Completion requests by client and outcome")
        m.counter("cancellations", "Requests that ended without a result, by reason")
        m.histogram("request_latency_seconds", "Submit-to-result latency of served requests")
        m.histogram("queue_wait_seconds", "Time requests spent queued before a target pass")
        m.counter("tokens", "Completion tokens generated")
        m.counter("target_passes", "Target model forward passes")
        m.counter("drafted_tokens", "Drafted tokens verified, by drafter")
        m.counter("accepted_tokens", "Drafted tokens accepted, by drafter")
        m.gauge("drafter_acceptance", "Accepted / drafted tokens, by drafter", callback=self._acceptance)
        m.counter("prefix_reuse_hits", "Served requests that reused a cached KV prefix")
        m.counter("prefix_reused_tokens", "Prompt tokens whose KV was reused")
        m.counter("completion_reuse_hits", "Served requests that used the previous completion as draft")
        m.counter("completion_cache_hits", "Served requests answered from the finished-completion cache")
        m.gauge("reuse_hit_rate", "Hit rate among served requests, by kind", callback=self._rates)
        m.counter("speculation_decisions", "Load-aware speculation decisions at dispatch, by reason")
        m.counter("engine_errors", "Requests that failed in the engine")
        m.counter("auth_failures", "Connections refused for a missing or wrong token")
        m.counter("sessions", "Client sessions opened")
        m.counter("next_edits", "Next-edit requests by outcome (also counted in requests)")
        m.histogram("next_edit_latency_seconds", "Submit-to-result latency of served next edits")

    def _acceptance(self) -> Iterable[tuple[Mapping[str, str], float]]:
        with self._lock:
            return [
                ({"drafter": d}, self._accepted.get(d, 0) / n) for d, n in sorted(self._drafted.items()) if n
            ]

    def _rates(self) -> Iterable[tuple[Mapping[str, str], float]]:
        with self._lock:
            n = self._served
            if not n:
                return []
            return [
                ({"kind": "prefix"}, self._prefix_hits / n),
                ({"kind": "completion_reuse"}, self._completion_reuse / n),
                ({"kind": "completion_cache"}, self._cache_hits / n),
            ]

    def on_request(self, event: RequestEvent) -> None:
        m = self.m
        m.inc("requests", labels={"client": event.client, "outcome": event.outcome})
        if event.outcome in ("cancelled", "superseded", "preempted", "dropped"):
            m.inc("cancellations", labels={"reason": event.outcome})
        if event.outcome == "error":
            m.inc("engine_errors")
        if event.speculation_reason is not None:
            m.inc("speculation_decisions", labels={"reason": event.speculation_reason})
        r = event.result
        if event.kind == "next_edit":
            m.inc("next_edits", labels={"outcome": event.outcome})
            if event.outcome == "served":
                m.observe("next_edit_latency_seconds", event.latency_s)
        if r is not None:
            m.inc("tokens", r.tokens)
            m.inc("target_passes", r.target_passes)
            for name, s in r.per_drafter.items():
                m.inc("drafted_tokens", s.drafted, labels={"drafter": name})
                m.inc("accepted_tokens", s.accepted, labels={"drafter": name})
            with self._lock:
                for name, s in r.per_drafter.items():
                    self._drafted[name] = self._drafted.get(name, 0) + s.drafted
                    self._accepted[name] = self._accepted.get(name, 0) + s.accepted
        if event.outcome == "served" and r is not None and event.kind == "completion":
            # completions only: a next edit's latency is another scale (next_edit_latency_seconds)
            self._served_completion(event, r)
        if self.request_log is not None and r is not None:
            self.request_log.record(
                client=event.client,
                doc_id=event.doc_id,
                result=r,
                latency_ms=event.latency_s * 1000,
                queued_ms=event.queued_s * 1000,
                gamma_cap=event.speculation_cap,
                outcome=event.outcome,
            )

    def _served_completion(self, event: RequestEvent, r: CompletionResult) -> None:
        m = self.m
        m.observe("request_latency_seconds", event.latency_s)
        m.observe("queue_wait_seconds", event.queued_s)
        with self._lock:
            self._served += 1
            self._prefix_hits += r.prefix_reused_tokens > 0
            self._completion_reuse += r.completion_reuse
            self._cache_hits += r.cache_hit
        if r.prefix_reused_tokens > 0:
            m.inc("prefix_reuse_hits")
            m.inc("prefix_reused_tokens", r.prefix_reused_tokens)
        if r.completion_reuse:
            m.inc("completion_reuse_hits")
        if r.cache_hit:
            m.inc("completion_cache_hits")


def declare_scheduler_gauges(metrics: Metrics, scheduler: FairScheduler) -> None:
    """Gauges read from the scheduler at scrape time."""

    def depth() -> Iterable[tuple[Mapping[str, str], float]]:
        return [({}, float(scheduler.queue_depth()))]

    def active() -> Iterable[tuple[Mapping[str, str], float]]:
        return [({}, float(scheduler.active_clients))]

    def ready() -> Iterable[tuple[Mapping[str, str], float]]:
        return [({}, 1.0 if scheduler.ready else 0.0)]

    def cap() -> Iterable[tuple[Mapping[str, str], float]]:
        spec = scheduler.scheduler_stats()["speculation"]
        value = spec.get("current_cap") if isinstance(spec, dict) else None
        return [({}, -1.0 if value is None else float(value))]

    def running() -> Iterable[tuple[Mapping[str, str], float]]:
        value = scheduler.scheduler_stats().get("running", 0)
        return [({}, float(value) if isinstance(value, int) else 0.0)]

    def batching() -> Iterable[tuple[Mapping[str, str], float]]:
        try:
            stats = scheduler.engine.stats().get("batching")
        except Exception:  # an engine without stats (or not loaded): no samples
            return []
        if not isinstance(stats, dict) or not stats.get("enabled"):
            return []
        return [
            ({"kind": k}, float(stats[k]))
            for k in ("passes", "batched_passes", "mean_batch", "solo_prefills", "fallbacks")
            if isinstance(stats.get(k), int | float)
        ]

    metrics.gauge("queue_depth", "Requests waiting for the engine", callback=depth)
    metrics.gauge("running_requests", "Requests the engine is decoding now", callback=running)
    metrics.gauge(
        "batching",
        "Batched target passes (--batch): passes, batched_passes (>= 2 sequences), mean_batch, "
        "solo_prefills, fallbacks",
        callback=batching,
    )
    metrics.gauge("active_clients", "Connected client sessions", callback=active)
    metrics.gauge("engine_ready", "1 when the model is loaded", callback=ready)
    metrics.gauge("speculation_cap", "Speculation cap of the last dispatch (-1 = engine's own)", callback=cap)


class TeamService:
    """Everything a multi-client server shares. Raises AuthError at construction when the bind
    address needs a token file and none was given."""

    def __init__(self, settings: TeamSettings, engine: Engine) -> None:
        self.settings = settings
        store = require_auth_for_bind(settings.host, settings.token_file)
        if store is None and settings.require_token:
            raise AuthError("token auth was required but no --token-file was given")
        self.tokens: TokenStore | None = store
        self.metrics = Metrics()
        self.request_log = RequestLog(settings.request_log)
        self.observer = TeamMetricsObserver(self.metrics, self.request_log)
        self.scheduler = FairScheduler(engine, settings.scheduler, observers=(self.observer,))
        declare_scheduler_gauges(self.metrics, self.scheduler)
        self._server: MetricsServer | None = None
        self._load_message = ""  # the engine's latest load progress ("waiting for back end ...")
        self._load_error: str | None = None

    def load_progress(self, message: str, fraction: float) -> None:
        """A load progress listener (``EngineHost.start_load``): /healthz and stats show the message."""
        self._load_message = message

    def load_failed(self, error: str) -> None:
        """The engine cannot load: /healthz answers 503 "failed: ..." (the server then exits)."""
        self._load_error = error or "unknown error"

    def _loading_state(self) -> str:
        """ "preparing" while a model given by name is downloaded or converted, else "loading"."""
        from specls.models.progress import preparing_stage

        return "preparing" if preparing_stage(self._load_message) else "loading"

    def load_status(self) -> dict[str, object]:
        state = (
            "failed"
            if self._load_error is not None
            else "ready"
            if self.scheduler.ready
            else self._loading_state()
        )
        out: dict[str, object] = {"state": state, "message": self._load_message}
        if self._load_error is not None:
            out["error"] = self._load_error
        return out

    @property
    def auth_required(self) -> bool:
        return self.tokens is not None

    def authenticate(self, initialization_options: object) -> str:
        """The client name for an ``initialize`` request; raises AuthError (message safe to send to
        the client, never containing a token)."""
        if self.tokens is None:
            return LOCAL_CLIENT
        token = token_from_init_options(initialization_options)
        if token is None:
            self.metrics.inc("auth_failures")
            log.warning("refused a client without a token")
            raise AuthError(
                'this specls server requires a token: set initializationOptions {"token": "..."} '
                '(or {"specls": {"token": "..."}}) in your editor'
            )
        name = self.tokens.authenticate(token)
        if name is None:
            self.metrics.inc("auth_failures")
            log.warning("refused a client with an unknown token")
            raise AuthError("invalid specls token")
        return name

    def open_session(self, client: str) -> ClientSession:
        self.metrics.inc("sessions")
        session = self.scheduler.session(client)
        log.info("client %s connected (session %d)", client, session.id)
        return session

    def health(self) -> tuple[bool, str]:
        if self._load_error is not None:
            return False, f"failed: {self._load_error}"
        if not self.scheduler.ready:
            state = self._loading_state()  # "preparing: downloading 43%", "loading: loading target model"
            return False, f"{state}: {self._load_message}" if self._load_message else state
        return True, f"ok clients={self.scheduler.active_clients} queue={self.scheduler.queue_depth()}"

    def start_metrics(self) -> MetricsServer | None:
        if self.settings.metrics_port is None:
            return None
        self._server = MetricsServer(
            MetricsSettings(self.settings.metrics_host, self.settings.metrics_port), self.metrics, self.health
        ).start()
        return self._server

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        self.scheduler.close()
