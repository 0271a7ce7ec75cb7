"""A model given by name is prepared (downloaded, converted) before it loads: the load's one progress
callback says so in the words editors show ("downloading 43%", "converting: quantizing"), within the
first part of the load's progress and never going back; the team service's /healthz says "preparing"."""

from __future__ import annotations

from specls.models.progress import preparing_stage

from specls.loading import PREPARE_SHARE, _preparing
from specls.team.fake import FakeEngine, FakeEngineSettings
from specls.team.service import TeamService, TeamSettings


def test_preparing_reports_what_editors_show_within_its_share() -> None:
    said: list[tuple[str, float]] = []
    report = _preparing(lambda message, fraction: said.append((message, fraction)), 0.0, PREPARE_SHARE)
    report("resolving", 0.0, "org/tiny")
    for f in (0.0, 0.43, 1.0):
        report("downloading", f, "model.safetensors")
    report("converting", 0.0, "org/tiny")
    report("converting", 0.65, "quantizing model.onnx to 8 bits")
    report("ready", 1.0, "org--tiny--abc")
    messages = [m for m, _ in said]
    assert messages[:5] == [
        "resolving org/tiny",
        "downloading 0%",
        "downloading 43%",
        "downloading 100%",
        "converting: org/tiny",
    ]
    assert messages[5] == "converting: quantizing model.onnx to 8 bits"
    fractions = [f for _, f in said]
    assert fractions == sorted(fractions) and fractions[-1] == PREPARE_SHARE
    assert [preparing_stage(m) for m in messages[:-1]] == ["resolving"] + ["downloading"] * 3 + [
        "converting"
    ] * 2
    assert preparing_stage(messages[-1]) is None  # ready: in the cache; loading follows


def test_healthz_says_preparing_while_a_model_is_prepared() -> None:
    engine = FakeEngine(FakeEngineSettings(pass_s=0.0))
    service = TeamService(TeamSettings(host="127.0.0.1"), engine)
    try:
        service.load_progress("downloading 43%", 0.17)
        assert service.health() == (False, "preparing: downloading 43%")
        assert service.load_status() == {"state": "preparing", "message": "downloading 43%"}
        service.load_progress("converting: quantizing model.onnx to 8 bits", 0.4)
        assert service.health() == (False, "preparing: converting: quantizing model.onnx to 8 bits")
        service.load_progress("loading target model", 0.55)
        assert service.health() == (False, "loading: loading target model")
        assert service.load_status()["state"] == "loading"
    finally:
        service.close()
