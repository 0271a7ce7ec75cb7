"""`specls bench lsp` on the bundled model: a real `specls serve` subprocess typed into; the report's
counts must add up (timing-dependent numbers are not asserted)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from specls.bench.lsp import LspBenchSettings, pick_regions, run_bench


def test_report_adds_up() -> None:
    s = LspBenchSettings(files=1, chars=60, min_key_ms=5.0, max_key_ms=30.0, line_pause_ms=100.0)
    report = asyncio.run(run_bench(s))
    assert report["error_count"] == 0, report["errors"]
    assert 0 < report["requests"] <= report["keystrokes"]  # a keystroke inside the debounce asks nothing
    assert report["answered"] + report["cancelled"] == report["requests"]  # each request came back once
    through = report["through_keystroke_to_result_ms"]["n"]
    other = report["other_keystroke_to_result_ms"]["n"]
    assert through + other == report["answered"] == report["keystroke_to_result_ms"]["n"]
    assert report["server"]["engine_calls"] >= report["answered"] - 1
    assert 0.0 <= report["server"]["type_ahead_rate"] <= 1.0


def test_waiting_at_line_ends_answers_every_line_end() -> None:
    # keys 1-5 ms apart and no pause: without the wait, no Enter outlives the 30 ms debounce
    fast = LspBenchSettings(files=1, chars=60, min_key_ms=1.0, max_key_ms=5.0, line_pause_ms=0.0)
    s = replace(fast, wait_at_line_end=True)
    line_ends = sum(region.count("\n") for _, _, region in pick_regions(s))
    report = asyncio.run(run_bench(s))
    assert report["error_count"] == 0, report["errors"]
    # each Enter's request was waited for, so none of them was cancelled by the next keystroke
    assert report["answered"] >= line_ends > 0
    assert asyncio.run(run_bench(fast))["answered"] < line_ends  # Not every line end: nothing waited


def test_reading_after_a_line_end_lets_the_block_follow_the_first_line() -> None:
    # 3 files of 160 characters: at least one line end where the bundled model's block has more lines
    fast = LspBenchSettings(
        files=3, chars=160, min_key_ms=1.0, max_key_ms=5.0, line_pause_ms=0.0, wait_at_line_end=True
    )
    server = asyncio.run(run_bench(replace(fast, read_ms=1000.0)))["server"]
    assert server["continuations"] >= 1 and server["continued"] >= 1  # the pause outlived the 0.3 s
    # Not a background block without the pause: the next key always came within 5 ms of the answer
    assert asyncio.run(run_bench(fast))["server"]["continuations"] == 0
