"""`specls bench lsp --next-edit` on the bundled model: next edits asked for at the pauses of the typing
replay; the report's counts add up, no edit names a version other than its request's, and the same
replay without next edits is there for the completions' latency (timings are not asserted)."""

from __future__ import annotations

import asyncio

import pytest

from specls.bench.lsp import LspBenchSettings, _print, pick_regions, run_next_edit_bench


def test_next_edit_replay_adds_up(capsys: pytest.CaptureFixture[str]) -> None:
    s = LspBenchSettings(
        files=1,
        chars=60,
        min_key_ms=1.0,
        max_key_ms=5.0,
        line_pause_ms=0.0,
        wait_at_line_end=True,
        next_edit=True,
    )
    line_ends = sum(region.count("\n") for _, _, region in pick_regions(s))
    report = asyncio.run(run_next_edit_bench(s))
    assert report["error_count"] == 0, report["errors"]
    n = report["next_edit"]
    assert n["error_count"] == 0, n["errors"]
    # every line end was waited for: its next edit was asked and answered (keys 1-5 ms apart ask nothing)
    assert n["answered"] >= line_ends > 0
    assert n["answered"] + n["cancelled"] == n["requests"]
    assert n["stale"] == 0
    assert n["request_to_result_ms"]["n"] == n["answered"]
    server = n["server"]
    assert server["requests"] == n["requests"] and server["errors"] == 0
    assert server["answered"] == n["edits"]
    without = report["without_next_edits"]
    assert without["keystroke_to_result_ms"]["n"] > 0 and report["keystroke_to_result_ms"]["n"] > 0
    # each engine request's prompt, what its KV reused and what it prefilled
    recent = report["engine"]["next_edit"]["recent_requests"]
    assert recent and all(r["prompt_tokens"] > 0 and r["reused_tokens"] < r["prompt_tokens"] for r in recent)
    _print(report)
    printed = capsys.readouterr().out
    assert "stale 0 (must be 0)" in printed and "without p50" in printed
    assert "next edit prefill per request" in printed
