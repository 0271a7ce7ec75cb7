"""Prometheus text rendering/parsing, the HTTP endpoint, and the service's metrics + request log."""

from __future__ import annotations

import json
import logging
import math
import urllib.error
import urllib.request

import pytest

from specls.api import CompletionRequest
from specls.team.fake import FakeEngine, FakeEngineSettings
from specls.team.logs import REQUEST_LOGGER, JsonLineFormatter
from specls.team.metrics import (
    Metrics,
    MetricsServer,
    MetricsSettings,
    PrometheusParseError,
    parse_prometheus_text,
)
from specls.team.service import TeamService, TeamSettings


def test_render_and_parse_roundtrip() -> None:
    m = Metrics()
    m.counter("requests", "Requests")
    m.gauge("queue_depth", "Depth")
    m.histogram("latency_seconds", "Latency", buckets=(0.1, 1.0))
    m.inc("requests", labels={"client": 'a"b\\c\nd'})
    m.inc("requests", 2, labels={"client": "x"})
    m.set("queue_depth", 3)
    for v in (0.05, 0.5, 5.0):
        m.observe("latency_seconds", v)
    fams = parse_prometheus_text(m.render())
    req = fams["specls_requests_total"]
    assert req.kind == "counter"
    assert {s.labels["client"]: s.value for s in req.samples} == {'a"b\\c\nd': 1.0, "x": 2.0}
    assert fams["specls_queue_depth"].samples[0].value == 3.0
    hist = fams["specls_latency_seconds"]
    assert hist.kind == "histogram"
    buckets = {s.labels["le"]: s.value for s in hist.samples if s.name.endswith("_bucket")}
    assert buckets == {"0.1": 1.0, "1": 2.0, "+Inf": 3.0}
    total = [s.value for s in hist.samples if s.name.endswith("_sum")][0]
    assert math.isclose(total, 5.55)


@pytest.mark.parametrize(
    "text",
    [
        "metric_without_value\n",
        'm{a="1"} 1',  # no trailing newline
        'm{a="1" 1\n',
        "m 1x\n",
        '# TYPE h histogram\nh_bucket{le="1"} 2\nh_bucket{le="+Inf"} 1\nh_count 1\n',  # not cumulative
        '# TYPE h histogram\nh_bucket{le="1"} 1\nh_count 1\n',  # no +Inf
        "# TYPE c counter\nc -1\n",
        "# TYPE c wibble\n",
    ],
)
def test_parser_rejects_malformed(text: str) -> None:
    with pytest.raises(PrometheusParseError):
        parse_prometheus_text(text)


def test_counters_only_go_up_and_must_be_declared() -> None:
    m = Metrics()
    m.counter("c", "c")
    with pytest.raises(ValueError):
        m.inc("c", -1)
    with pytest.raises(KeyError):
        m.inc("undeclared")


def test_service_metrics_endpoint_and_request_log(caplog: pytest.LogCaptureFixture) -> None:
    engine = FakeEngine(FakeEngineSettings(pass_s=0.0))
    engine.load()
    svc = TeamService(TeamSettings(metrics_port=0), engine)
    server = svc.start_metrics()
    assert server is not None
    caplog.set_level(logging.INFO, logger=REQUEST_LOGGER)
    try:
        s = svc.open_session("alice")
        secret = "SECRET_DOCUMENT_TEXT = 42\n"
        s.update_document("file:///home/alice/secret.py", secret)
        r = s.complete(CompletionRequest("file:///home/alice/secret.py", secret, "", max_tokens=6))
        assert r.text
        host, port = server.address
        assert host == "127.0.0.1"
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            fams = parse_prometheus_text(resp.read().decode())

        def value(name: str, **labels: str) -> float:
            samples = [x for f in fams.values() for x in f.samples if x.name == name]
            assert samples, name
            return sum(x.value for x in samples if all(x.labels.get(k) == v for k, v in labels.items()))

        assert value("specls_requests_total", client="alice", outcome="served") == 1
        assert value("specls_tokens_total") == 6
        assert value("specls_target_passes_total") == r.target_passes > 0
        assert value("specls_drafted_tokens_total", drafter="fake") == r.drafted
        assert value("specls_drafter_acceptance", drafter="fake") == pytest.approx(r.accepted / r.drafted)
        assert value("specls_active_clients") == 1
        assert value("specls_queue_depth") == 0
        assert value("specls_request_latency_seconds_count") == 1
        assert value("specls_reuse_hit_rate", kind="prefix") == 0
        assert value("specls_speculation_decisions_total", reason="idle") == 1
        for name in (
            "specls_cancellations_total",
            "specls_completion_cache_hits_total",
            "specls_engine_ready",
        ):
            assert name in fams
        with urllib.request.urlopen(f"http://{host}:{port}/healthz", timeout=5) as resp:
            assert resp.status == 200 and resp.read().startswith(b"ok")
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(f"http://{host}:{port}/nope", timeout=5)
        assert info.value.code == 404
        # one JSON line per request, no document text or path
        recs = [r for r in caplog.records if r.name == REQUEST_LOGGER]
        assert len(recs) == 1
        line = JsonLineFormatter().format(recs[0])
        obj = json.loads(line)
        assert obj["client"] == "alice" and obj["tokens"] == 6 and obj["outcome"] == "served"
        assert len(obj["doc"]) == 12
        assert "SECRET" not in line and "secret.py" not in line and "alice/" not in line
        assert obj["acceptance"] == pytest.approx(r.accepted / r.drafted, abs=1e-3)
        s.close()
        fams = parse_prometheus_text(server_text(host, port))
        assert [x.value for x in fams["specls_active_clients"].samples] == [0]
    finally:
        svc.close()


def server_text(host: str, port: int) -> str:
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as resp:
        return resp.read().decode()


def test_healthz_reports_loading() -> None:
    engine = FakeEngine()
    svc = TeamService(TeamSettings(), engine)
    server = MetricsServer(MetricsSettings(port=0), svc.metrics, svc.health).start()
    try:
        host, port = server.address
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(f"http://{host}:{port}/healthz", timeout=5)
        assert info.value.code == 503
    finally:
        server.close()
        svc.close()


def test_metrics_report_batching_of_concurrent_clients() -> None:
    """Four clients at once on a batching engine: /metrics shows joined passes and no running request
    once they are all served."""
    import dataclasses
    import threading

    from specls.decoder.batching import BatchSettings

    from specls.engine import EngineSettings, OnnxEngine
    from specls.team.scheduler import SchedulerSettings
    from tests.decoder.fakes import FakeLM
    from tests.specls.fakes import SOURCE, BatchableFakeLM, fake_models

    models = fake_models(allow_eos=False)
    assert isinstance(models.target, FakeLM)
    # 20 ms a pass: each request stays active for its ~25 passes, so the four overlap even when the
    # machine is busy (as fast as numpy, one could finish before the next got a thread: no batch)
    models = dataclasses.replace(models, target=BatchableFakeLM(models.target, pass_delay_s=0.02))
    batching = BatchSettings(max_batch=4, max_wait_ms=200.0)
    engine = OnnxEngine(EngineSettings(threads=1, lru_size=0, batching=batching), models)
    svc = TeamService(TeamSettings(metrics_port=0, scheduler=SchedulerSettings(workers=4)), engine)
    server = svc.start_metrics()
    assert server is not None
    try:
        sessions = [svc.open_session(f"c{i}") for i in range(4)]
        barrier = threading.Barrier(4)
        texts: list[str] = []

        def one(i: int) -> None:
            cut = SOURCE.index("total = 0") + 3 * i
            barrier.wait()
            r = sessions[i].complete(
                CompletionRequest("file:///w/a.py", SOURCE[:cut], SOURCE[cut:], max_tokens=24)
            )
            texts.append(r.text)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(texts) == 4 and all(texts)
        fams = parse_prometheus_text(server_text(*server.address))
        passes = {x.labels["kind"]: x.value for x in fams["specls_batching"].samples}
        assert passes["batched_passes"] >= 1 and passes["mean_batch"] > 1.0
        assert [x.value for x in fams["specls_running_requests"].samples] == [0]
    finally:
        svc.close()
