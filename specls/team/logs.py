"""Structured request logs: one JSON line per completion on the ``specls.team.requests`` logger.

Documents appear as a short salted hash of their id (never the path or the text); the salt is per
process so hashes correlate within one server's log but not across restarts. With
``include_text=True`` (an operator's explicit choice) the completion text is logged too."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from specls.api import CompletionResult

REQUEST_LOGGER = "specls.team.requests"
_SALT = os.urandom(8)


def doc_hash(doc_id: str) -> str:
    return hashlib.sha256(_SALT + doc_id.encode("utf-8", "surrogatepass")).hexdigest()[:12]


@dataclass(frozen=True)
class RequestLogSettings:
    include_text: bool = False


class JsonLineFormatter(logging.Formatter):
    """Formats records whose ``msg`` is a dict as one JSON object per line (others as plain JSON
    messages), for shipping to a log collector."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, object]
        if isinstance(record.msg, dict):
            payload = dict(record.msg)
        else:
            payload = {"msg": record.getMessage()}
        payload.setdefault("ts", round(record.created, 3))
        payload.setdefault("level", record.levelname.lower())
        payload.setdefault("logger", record.name)
        return json.dumps(payload, separators=(",", ":"), sort_keys=True, default=str)


class RequestLog:
    def __init__(self, settings: RequestLogSettings = RequestLogSettings()) -> None:
        self._settings = settings
        self._log = logging.getLogger(REQUEST_LOGGER)

    def record(
        self,
        client: str,
        doc_id: str,
        result: CompletionResult,
        latency_ms: float,
        queued_ms: float,
        gamma_cap: int | None,
        outcome: str = "served",
    ) -> dict[str, object]:
        """Build and emit one request record; returns it (tests inspect it)."""
        per = {name: {"drafted": s.drafted, "accepted": s.accepted} for name, s in result.per_drafter.items()}
        rec: dict[str, object] = {
            "event": "completion",
            "outcome": outcome,
            "client": client,
            "doc": doc_hash(doc_id),
            "latency_ms": round(latency_ms, 1),
            "queued_ms": round(queued_ms, 1),
            "tokens": result.tokens,
            "chars": len(result.text),
            "stop": result.stop_reason,
            "cancelled": result.cancelled,
            "target_passes": result.target_passes,
            "drafted": result.drafted,
            "accepted": result.accepted,
            "acceptance": round(result.accepted / result.drafted, 3) if result.drafted else None,
            "per_drafter": per,
            "prefix_reused_tokens": result.prefix_reused_tokens,
            "completion_reuse": result.completion_reuse,
            "cache_hit": result.cache_hit,
            "type_ahead": result.type_ahead,
            "gamma_cap": gamma_cap,
        }
        if self._settings.include_text:
            rec["text"] = result.text
        self._log.info(rec)
        return rec


def install_json_handler(stream: object | None = None) -> logging.Handler:
    """Send request records to ``stream`` (stderr by default) as JSON lines; returns the handler."""
    import sys

    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)  # type: ignore[arg-type]
    handler.setFormatter(JsonLineFormatter())
    logger = logging.getLogger(REQUEST_LOGGER)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return handler


class RateLimitFilter(logging.Filter):
    """At most ``burst`` records per ``period_s`` for each call site (logger, level, message template)
    at WARNING or above; the rest are dropped and counted, and the next record let through says how
    many were suppressed. A client that repeats one bad message cannot fill the disk with one warning
    per message (a buggy client once sent the same bad message without pause). DEBUG/INFO pass
    (they are off by default). ``clock`` is for tests.

    Example (burst 2, period 60): warnings at t=0, 1, 2, 3 -> the first two pass, two are suppressed;
    the same warning at t=61 passes as "... (2 similar messages suppressed)"."""

    def __init__(
        self, burst: int = 10, period_s: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.burst = burst
        self.period_s = period_s
        self.clock = clock
        self._lock = threading.Lock()
        # call site -> (window start, records let through in it, suppressed since the last one let through)
        self._sites: OrderedDict[tuple[str, int, str], list[float]] = OrderedDict()
        self.max_sites = 1024  # distinct call sites remembered (bounded memory)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        key = (record.name, record.levelno, str(record.msg))
        now = self.clock()
        with self._lock:
            site = self._sites.get(key)
            if site is None or now - site[0] >= self.period_s:
                suppressed = int(site[2]) if site is not None else 0
                self._sites[key] = [now, 1.0, 0.0]
                self._sites.move_to_end(key)
                while len(self._sites) > self.max_sites:
                    self._sites.popitem(last=False)
            elif site[1] < self.burst:
                site[1] += 1
                suppressed = int(site[2])
                site[2] = 0
            else:
                site[2] += 1
                return False
        if suppressed:
            record.msg = f"{record.msg} ({suppressed} similar messages suppressed)"
        return True


def install_rate_limit(handler: logging.Handler, burst: int = 10, period_s: float = 60.0) -> RateLimitFilter:
    """Rate-limit ``handler``'s warnings per call site (``specls`` CLIs do it for stderr)."""
    f = RateLimitFilter(burst, period_s)
    handler.addFilter(f)
    return f
