"""Issue 13 item 9: a per-message warning cannot flood the log (a buggy client produced 1.17 million
lines in 4 minutes). ``RateLimitFilter`` with a fake clock; ``TeamService.health`` states."""

from __future__ import annotations

import io
import logging

from specls.team.fake import FakeEngine, FakeEngineSettings
from specls.team.logs import RateLimitFilter
from specls.team.service import TeamService, TeamSettings


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def logger_with_filter(name: str, burst: int, period: float) -> tuple[logging.Logger, io.StringIO, FakeClock]:
    clock = FakeClock()
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    handler.addFilter(RateLimitFilter(burst, period, clock))
    log = logging.getLogger(name)
    log.handlers = [handler]
    log.propagate = False
    log.setLevel(logging.DEBUG)
    return log, out, clock


def test_a_repeated_warning_is_rate_limited_and_the_suppressed_count_reported() -> None:
    log, out, clock = logger_with_filter("specls.test.ratelimit.a", burst=2, period=60.0)
    for t in (0.0, 1.0, 2.0, 3.0):
        clock.now = t
        log.warning("cancel for unknown id %s", t)
    clock.now = 61.0
    log.warning("cancel for unknown id %s", 61)
    lines = out.getvalue().splitlines()
    # wrong without the filter: 5 lines (one per message)
    assert lines == [
        "WARNING cancel for unknown id 0.0",
        "WARNING cancel for unknown id 1.0",
        "WARNING cancel for unknown id 61 (2 similar messages suppressed)",
    ]


def test_a_flood_is_bounded_per_call_site_and_others_pass() -> None:
    log, out, clock = logger_with_filter("specls.test.ratelimit.b", burst=10, period=60.0)
    for i in range(100_000):  # one minute of a buggy client
        clock.now = i * 0.0005
        log.warning("bad message %d", i)
    log.error("a different problem")  # its own call site: not suppressed by the flood
    log.info("info %d", 1)  # below WARNING: never limited
    log.info("info %d", 2)
    lines = out.getvalue().splitlines()
    assert len([x for x in lines if "bad message" in x]) == 10
    assert lines[-3:] == ["ERROR a different problem", "INFO info 1", "INFO info 2"]


def test_sites_remembered_are_bounded() -> None:
    f = RateLimitFilter(1, 60.0, FakeClock())
    for i in range(5000):  # a message template per record (formatted before logging): still bounded
        f.filter(logging.LogRecord("x", logging.WARNING, "p", 1, f"m{i}", None, None))
    assert len(f._sites) == f.max_sites


def test_health_says_loading_waiting_failed_and_ok() -> None:
    engine = FakeEngine(FakeEngineSettings(pass_s=0.0))
    service = TeamService(TeamSettings(host="127.0.0.1"), engine)
    try:
        assert service.health() == (False, "loading")
        service.load_progress("waiting for back end at http://127.0.0.1:1 (HTTP 503: Loading model)", 0.0)
        assert service.health() == (
            False,
            "loading: waiting for back end at http://127.0.0.1:1 (HTTP 503: Loading model)",
        )
        assert service.load_status()["state"] == "loading"
        engine.load()
        assert service.health()[0] and service.health()[1].startswith("ok")
        service.load_failed("model directory /nope not found")
        # wrong before the fix: (False, "loading") forever, so a supervisor never restarted the server
        assert service.health() == (False, "failed: model directory /nope not found")
        assert service.load_status() == {
            "state": "failed",
            "message": "waiting for back end at http://127.0.0.1:1 (HTTP 503: Loading model)",
            "error": "model directory /nope not found",
        }
    finally:
        service.close()
