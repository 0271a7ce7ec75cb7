"""`specls bench real`: the llama-server client and process handling against stub servers written
here (no llama.cpp in CI), and the table / ratio code on fake results."""

from __future__ import annotations

import json
import stat
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from specls.bench import real
from specls.bench.real import (
    Cell,
    LlamaClient,
    LlamaConfig,
    LlamaError,
    LlamaServer,
    Run,
    against_llama,
    cut_at_newline,
    end_of_line,
    find_llama_server,
    llama_configs,
    parse_completion,
    ratios,
    record,
    render_against_llama,
    render_table,
    summarize,
)

# -- a stub llama-server in this process -----------------------------------------------------------


class _Stub:
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.status = 200
        self.reply: bytes | None = None  # None = a well-formed answer built from the request


def _answer(body: dict[str, Any]) -> dict[str, Any]:
    """What the stub (and the stub binary below) answer: the prompt's last n_predict ids, reversed,
    as if 2 drafts of 3 were accepted."""
    toks = list(reversed(body["prompt"]))[: body["n_predict"]]
    return {
        "content": "x",
        "tokens": toks,
        "timings": {
            "prompt_n": len(body["prompt"]),
            "prompt_ms": 12.5,
            "predicted_n": len(toks),
            "predicted_ms": 40.0,
            "draft_n": 3,
            "draft_n_accepted": 2,
        },
    }


@pytest.fixture
def stub() -> Iterator[tuple[_Stub, str]]:
    state = _Stub()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
            self.wfile.write(b'{"status":"ok"}')

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state.bodies.append(body)
            data = state.reply if state.reply is not None else json.dumps(_answer(body)).encode()
            self.send_response(state.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_client_sends_token_ids_greedy_uncached_and_reads_timings(stub: tuple[_Stub, str]) -> None:
    state, url = stub
    client = LlamaClient(url, timeout_s=30)
    assert client.healthy()
    r = client.complete([10, 11, 12, 13], 3, stop=("\n",))
    body = state.bodies[-1]
    # the same prompt *token ids* specls built (a string would be re-tokenized by llama.cpp)
    assert body["prompt"] == [10, 11, 12, 13]
    assert body["n_predict"] == 3
    assert body["cache_prompt"] is False  # a cached prompt would make prefill_ms ~0
    assert body["temperature"] == 0.0 and body["top_k"] == 1  # greedy
    assert body["return_tokens"] is True and body["stream"] is False
    assert body["stop"] == ["\n"]
    assert r.tokens == [13, 12, 11]
    assert r.prefill_ms == 12.5 and r.decode_ms == 40.0
    assert (r.drafted, r.accepted) == (3, 2)
    assert r.passes == 1  # 3 tokens, 2 of them accepted drafts: one pass (not 3, not 0)
    assert r.e2e_ms > 0


def test_client_http_error_and_garbage_are_clear_errors(stub: tuple[_Stub, str]) -> None:
    state, url = stub
    client = LlamaClient(url, timeout_s=30)
    state.status, state.reply = 400, b'{"error":"prompt too long"}'
    with pytest.raises(LlamaError, match="HTTP 400.*prompt too long"):
        client.complete([1, 2], 4)
    state.status, state.reply = 200, b"not json"
    with pytest.raises(LlamaError, match="unexpected answer"):
        client.complete([1, 2], 4)
    state.reply = b'{"content": "x"}'  # no tokens, no timings
    with pytest.raises(LlamaError, match="unexpected answer"):
        client.complete([1, 2], 4)


def test_client_unreachable_is_an_error_and_not_healthy() -> None:
    client = LlamaClient(f"http://127.0.0.1:{real.free_port()}", timeout_s=5)
    assert not client.healthy()
    with pytest.raises(LlamaError, match="failed"):
        client.complete([1], 1)


@pytest.mark.parametrize(
    "timings, passes",
    [
        ({"prompt_ms": 1.0, "predicted_n": 8, "predicted_ms": 2.0}, 8),  # plain: one token per pass
        ({"prompt_ms": 1.0, "predicted_n": 8, "predicted_ms": 2.0, "draft_n": 9, "draft_n_accepted": 6}, 2),
        ({"prompt_ms": 1.0, "predicted_n": 0, "predicted_ms": 0.0}, 0),  # nothing generated: no pass
    ],
)
def test_parse_completion_passes(timings: dict[str, float], passes: int) -> None:
    # wrong answer 8 for the draft row: counting every token as a pass ignores the accepted drafts
    n = int(timings["predicted_n"])
    assert parse_completion({"tokens": list(range(n)), "timings": timings}, 1.0).passes == passes


# -- the llama-server process (a stub binary that speaks the same HTTP) ------------------------------

_STUB_BINARY = """#!{python}
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
argv = sys.argv[1:]
with open({argv_log!r}, "a") as f:
    f.write(json.dumps(argv) + "\\n")
if {mode!r} == "crash":
    print("error: failed to load model", flush=True)
    sys.exit(3)
port = int(argv[argv.index("--port") + 1])
answer = {answer}
class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        self.send_response(200 if {mode!r} == "ok" else 503)
        self.end_headers()
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        data = json.dumps(answer(body)).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def _answer_src() -> str:
    return (
        "lambda b: {'tokens': list(reversed(b['prompt']))[: b['n_predict']], 'timings': "
        "{'prompt_ms': 5.0, 'predicted_n': min(b['n_predict'], len(b['prompt'])), 'predicted_ms': 9.0}}"
    )


def _stub_binary(tmp_path: Path, mode: str) -> tuple[str, Path]:
    path = tmp_path / f"llama-server-{mode}"
    argv_log = tmp_path / f"argv-{mode}.jsonl"
    path.write_text(
        _STUB_BINARY.format(python=sys.executable, argv_log=str(argv_log), mode=mode, answer=_answer_src())
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path), argv_log


def _server(binary: str, tmp_path: Path, config: LlamaConfig, timeout_s: float = 60.0) -> LlamaServer:
    return LlamaServer(binary, "target.gguf", config, 1, 2048, timeout_s, 30.0, tmp_path)


def test_server_starts_on_loopback_with_our_threads_and_stops(tmp_path: Path) -> None:
    binary, argv_log = _stub_binary(tmp_path, "ok")
    config = llama_configs("draft.gguf", 1)["llama-draft"]
    server = _server(binary, tmp_path, config)
    server.start()
    try:
        r = server.client.complete([1, 2, 3], 2)
        assert r.tokens == [3, 2]
        argv = json.loads(argv_log.read_text().splitlines()[-1])
        assert argv[argv.index("--host") + 1] == "127.0.0.1"
        assert argv[argv.index("--port") + 1] == str(server.port)
        assert argv[argv.index("-m") + 1] == "target.gguf"
        assert argv[argv.index("-md") + 1] == "draft.gguf"
        for flag in ("-t", "-tb", "-td", "-tbd"):  # every thread pool pinned to the bench's count
            assert argv[argv.index(flag) + 1] == "1"
    finally:
        server.stop()
    assert not server.client.healthy()  # the process is gone
    server.stop()  # twice is harmless


def test_server_that_exits_reports_its_output(tmp_path: Path) -> None:
    binary, _ = _stub_binary(tmp_path, "crash")
    server = _server(binary, tmp_path, LlamaConfig("llama-plain"))
    with pytest.raises(LlamaError, match="exited with 3.*failed to load model"):
        server.start()


def test_server_never_ready_is_stopped_and_reported(tmp_path: Path) -> None:
    binary, _ = _stub_binary(tmp_path, "loading")  # /health answers 503 forever
    server = _server(binary, tmp_path, LlamaConfig("llama-plain"), timeout_s=1.0)
    with pytest.raises(LlamaError, match="not ready"):
        server.start()
    assert server._proc is None  # stopped, not left running


def test_llama_configs_are_plain_draft_and_ngram() -> None:
    c = llama_configs("d.gguf", 2)
    assert list(c) == list(real.LLAMA)
    assert c["llama-plain"].extra == ()
    assert c["llama-ngram"].extra == ("--spec-type", "ngram-simple")
    m = c["llama-ngram-map"].extra
    assert m[m.index("--spec-type") + 1] == "ngram-map-k4v"
    # wrong: llama.cpp's defaults (12-token lookup, 48-token drafts) were slower in the sweep
    assert m[m.index("--spec-ngram-map-k4v-size-n") + 1] == "4"
    assert m[m.index("--spec-ngram-map-k4v-size-m") + 1] == "16"
    draft = c["llama-draft"].extra
    assert draft[draft.index("-md") + 1] == "d.gguf"
    # wrong: -md alone (build 11434 loads the draft model and drafts nothing without a spec type)
    assert draft[draft.index("--spec-type") + 1] == "draft-simple"


def test_selected_methods_always_carry_plain_and_their_references() -> None:
    assert real.selected([]) == {*real.SPECLS, *real.LLAMA, *real.HF}
    assert real.selected(["hybrid"]) == {"plain", "hybrid"}
    assert real.selected(["llama-ngram", "hf-assisted"]) == {
        "plain",
        "llama-ngram",
        "llama-plain",
        "hf-assisted",
        "hf-greedy",
    }


def test_find_llama_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(LlamaError, match="not found"):
        find_llama_server(str(tmp_path / "missing"))
    binary, _ = _stub_binary(tmp_path, "ok")
    assert find_llama_server(binary) == binary
    monkeypatch.setenv("SPECLS_LLAMA_SERVER", binary)
    assert find_llama_server(None) == binary
    monkeypatch.setenv("SPECLS_LLAMA_SERVER", str(tmp_path / "missing"))
    monkeypatch.setattr(real, "LLAMA_CACHE_BIN", tmp_path / "nothing")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(LlamaError, match="build-llama-server.sh"):
        find_llama_server(None)


# -- stops ---------------------------------------------------------------------------------------


def test_end_of_line_and_cut_at_newline() -> None:
    assert end_of_line("abc\ndef") == 3
    assert end_of_line("abc") is None
    text = {1: "ab", 2: "c\nd", 3: "e", 4: "\n"}

    def decode(ts: Any) -> str:
        return "".join(text[t] for t in ts)

    assert cut_at_newline([1, 2, 3, 4], decode) == [1, 2]  # wrong: [1, 2, 3, 4] (tokens past the stop)
    assert cut_at_newline([1, 3], decode) == [1, 3]  # no newline: unchanged
    assert cut_at_newline([], decode) == []


@pytest.mark.parametrize(
    "prefix_chars, suffix_chars, prefix, suffix",
    [
        (None, None, "abcdef", "uvwxyz"),  # unchanged
        (2, 3, "ef", "uvw"),  # wrong: "ab" (the start of the prefix; the cursor is at its end)
        (0, 0, "", ""),
        (100, 100, "abcdef", "uvwxyz"),  # longer than the text: all of it
    ],
)
def test_cut_context_keeps_the_text_next_to_the_cursor(
    prefix_chars: int | None, suffix_chars: int | None, prefix: str, suffix: str
) -> None:
    p = real.cut_context(real.Point("f.py", "mid", "abcdef", "uvwxyz", "MID"), prefix_chars, suffix_chars)
    assert (p.prefix, p.suffix, p.middle, p.kind) == (prefix, suffix, "MID", "mid")


# -- the table -------------------------------------------------------------------------------------


def _run(n: int, prefill: float, decode: float, passes: int, e2e: float, first: int = 1) -> Run:
    return Run(list(range(first, first + n)), e2e, prefill, decode, passes)


def test_record_counts_identical_and_the_first_divergence() -> None:
    cell = Cell()
    ref = Run([1, 2, 3, 4], 1.0, 0.0, 1.0, 4)
    record(cell, Run([1, 2, 3, 4], 1.0, 0.0, 1.0, 2), ref)
    record(cell, Run([1, 2, 9, 9], 1.0, 0.0, 1.0, 2), ref)
    record(cell, Run([1, 2], 1.0, 0.0, 1.0, 1), ref)  # a prefix is not identical
    assert (cell.identical, cell.compared) == (1, 3)
    assert [d["position"] for d in cell.first_divergence] == [2, 2]
    assert cell.first_divergence[0]["got"] == [9, 9]
    record(cell, Run([5], 1.0, 0.0, 1.0, 1), None)  # the reference itself
    assert cell.identical == 2
    assert cell.first_divergence[0]["top2_margin"] is None  # no margin function: none made up


def test_record_asks_the_margin_at_the_divergence() -> None:
    cell = Cell()
    asked: list[tuple[list[int], int]] = []

    def margin(tokens: list[int], j: int) -> float:
        asked.append((tokens, j))
        return 0.046

    ref = Run([1, 2, 3, 4], 1.0, 0.0, 1.0, 4)
    record(cell, Run([1, 2, 3, 4], 1.0, 0.0, 1.0, 2), ref, point=3, margin=margin)
    assert not asked  # identical: nothing to explain
    record(cell, Run([1, 7, 3], 1.0, 0.0, 1.0, 2), ref, point=5, margin=margin)
    assert asked == [([1, 2, 3, 4], 1)]  # the reference's tokens, where they first differ. Not the run's
    assert cell.first_divergence == [
        {"point": 5, "position": 1, "ref": [2, 3, 4], "got": [7, 3], "top2_margin": 0.046}
    ]
    record(cell, Run([1, 2, 3, 4, 5], 1.0, 0.0, 1.0, 2), ref, point=6, margin=margin)
    assert cell.first_divergence[-1]["top2_margin"] is None  # longer than the reference: no position


def test_summarize_uses_totals_for_rates_and_medians_for_latency() -> None:
    cell = Cell()
    record(cell, _run(64, 100.0, 6400.0, 16, 7000.0), None)
    record(cell, _run(2, 300.0, 200.0, 2, 600.0), None)
    record(cell, _run(4, 200.0, 400.0, 1, 700.0), None)
    s = summarize(cell)
    # wrong answers: mean of per-point rates (4+1+4)/3 = 3.0 tok/pass; (10+10+10)/3 tok/s ... equal here
    assert s["tokens_per_pass"] == pytest.approx(70 / 19)
    assert s["decode_tok_s"] == pytest.approx(1e3 * 70 / 7000.0)
    assert s["prefill_ms"] == 200.0 and s["e2e_ms"] == 700.0
    assert s["e2e_total_ms"] == 8300.0
    assert s["identical"] == 1.0
    assert s["rows_per_token"] == pytest.approx(19 / 70)  # no drafts: one row per pass


def test_rows_per_token_counts_the_drafted_rows() -> None:
    cell = Cell()
    record(cell, Run([1, 2, 3, 4], 1.0, 0.0, 1.0, passes=2, drafted=6, accepted=2), None)
    assert summarize(cell)["rows_per_token"] == pytest.approx(8 / 4)  # Not 6/4: each pass's own row too


def test_summarize_without_a_prefill_split_reports_end_to_end_only() -> None:
    cell = Cell()
    record(cell, Run([1, 2], 500.0, 0.0, 500.0, 0), None)  # HF generate: no passes, no split
    s = summarize(cell)
    assert s["tokens_per_pass"] is None and s["decode_tok_s"] is None and s["prefill_ms"] is None
    assert s["e2e_ms"] == 500.0


def test_ratios_against_specls_plain() -> None:
    nums: dict[str, dict[str, float | None]] = {
        "plain": {"decode_tok_s": 5.0, "e2e_total_ms": 1000.0},
        "hybrid": {"decode_tok_s": 12.5, "e2e_total_ms": 400.0},
        "hf-greedy": {"decode_tok_s": None, "e2e_total_ms": 4000.0},
    }
    r = ratios(nums)
    assert r["plain"] == {"decode_x": 1.0, "after_first_x": None, "e2e_x": 1.0}
    assert r["hybrid"] == {"decode_x": 2.5, "after_first_x": None, "e2e_x": 2.5}  # wrong: 0.4 (upside down)
    assert r["hf-greedy"] == {"decode_x": None, "after_first_x": None, "e2e_x": 0.25}


def test_after_the_first_token_compares_llama_and_specls_like_for_like() -> None:
    """llama-server samples the first token from its prompt pass (predicted_ms covers tokens 2..n);
    specls' decode_ms also holds the pass over the last prompt token. Plain decoders at the same
    100 ms a pass must come out equal after the first token."""
    llama = parse_completion(
        {"tokens": [1, 2, 3, 4], "timings": {"prompt_ms": 1000.0, "predicted_n": 4, "predicted_ms": 300.0}},
        1300.0,
    )
    assert (llama.first_ms, llama.first_tokens) == (0.0, 1)
    specls = Run([1, 2, 3, 4], 1300.0, 900.0, 400.0, 4, first_ms=100.0, first_tokens=1)
    cells = {"plain": Cell(), "llama-plain": Cell()}
    record(cells["plain"], specls, None)
    record(cells["llama-plain"], llama, None)
    nums = {m: summarize(c) for m, c in cells.items()}
    assert nums["plain"]["decode_tok_s"] == pytest.approx(10.0)
    assert nums["llama-plain"]["decode_tok_s"] == pytest.approx(1e3 * 4 / 300)  # one pass fewer: 1.33x
    assert (
        nums["plain"]["after_first_tok_s"] == nums["llama-plain"]["after_first_tok_s"] == pytest.approx(10.0)
    )
    assert nums["plain"]["ttft_ms"] == nums["llama-plain"]["ttft_ms"] == 1000.0  # specls: Not its 900 prefill
    assert ratios(nums)["llama-plain"]["after_first_x"] == pytest.approx(1.0)
    # a first pass that verified a draft: its extra tokens are not counted as free decode tokens
    spec = Run([1, 2, 3, 4], 1200.0, 900.0, 300.0, 2, drafted=2, accepted=2, first_ms=200.0, first_tokens=3)
    cell = Cell()
    record(cell, spec, None)
    assert summarize(cell)["after_first_tok_s"] == pytest.approx(10.0)  # 1 token in 100 ms. Not 30


@pytest.mark.parametrize(
    ("llama", "want"),
    [
        # llama-ngram is llama.cpp's best for decode, llama-plain after the first token: each figure
        # against its own best. Not 1.5x for decode (against llama-plain)
        (
            {"llama-plain": (20.0, 22.0), "llama-ngram": (24.0, 20.0)},
            {
                "decode_x": 1.25,
                "decode_best": "llama-ngram",
                "after_first_x": 1.5,
                "after_first_best": "llama-plain",
            },
        ),
        # a llama method without a figure is not a rival for it; llama-draft's 40 tok/s wins decode
        (
            {"llama-plain": (20.0, None), "llama-draft": (40.0, 30.0)},
            {
                "decode_x": 0.75,
                "decode_best": "llama-draft",
                "after_first_x": 1.1,
                "after_first_best": "llama-draft",
            },
        ),
        # no llama method has an after-first figure: None, not a division by zero
        (
            {"llama-plain": (15.0, None)},
            {"decode_x": 2.0, "decode_best": "llama-plain", "after_first_x": None, "after_first_best": None},
        ),
    ],
)
def test_against_llama_takes_llama_cpps_best_per_figure(
    llama: dict[str, tuple[float | None, float | None]], want: dict[str, object]
) -> None:
    nums: dict[str, dict[str, float | None]] = {
        "plain": {"decode_tok_s": 10.0, "after_first_tok_s": 11.0},
        "hybrid": {"decode_tok_s": 30.0, "after_first_tok_s": 33.0},
    }
    nums |= {m: {"decode_tok_s": d, "after_first_tok_s": a} for m, (d, a) in llama.items()}
    got = against_llama(nums)
    assert got is not None
    for key, value in want.items():
        assert getattr(got, key) == (pytest.approx(value) if isinstance(value, float) else value), key


def test_against_llama_needs_both_sides() -> None:
    plain: dict[str, float | None] = {"decode_tok_s": 10.0, "after_first_tok_s": 10.0}
    assert against_llama({"plain": plain, "hybrid": plain}) is None  # no llama method ran
    assert against_llama({"plain": plain, "llama-plain": plain}) is None  # no hybrid
    assert against_llama({"plain": plain, "lookup": plain, "llama-plain": plain}, "lookup") is not None


def _fake_results() -> dict[str, dict[str, Cell]]:
    results: dict[str, dict[str, Cell]] = {}
    for task, scale in (("64", 1.0), ("short", 0.25)):
        cells = {m: Cell() for m in ("plain", "hybrid", "llama-plain", "llama-ngram")}
        plain = _run(int(64 * scale), 1000.0, 8000.0 * scale, int(64 * scale), 9000.0 * scale)
        record(cells["plain"], plain, None)
        record(cells["hybrid"], _run(int(64 * scale), 1000.0, 2000.0 * scale, int(16 * scale), 3000.0), plain)
        lp = _run(int(64 * scale), 900.0, 8000.0 * scale, int(64 * scale), 8900.0 * scale, first=100)
        record(cells["llama-plain"], lp, None)
        record(cells["llama-ngram"], _run(3, 900.0, 300.0, 3, 1200.0, first=200), lp)
        results[task] = cells
    return results


def test_render_table_rows_ratios_and_identical() -> None:
    methods = ["plain", "lookup", "hybrid", "llama-plain", "llama-ngram"]  # lookup not run: no row
    text = render_table(_fake_results(), methods)
    rows = {tuple(line.split()[:2]): line.split() for line in text.splitlines()[2:]}
    assert set(rows) == {
        (t, m) for t in ("64", "short") for m in ("plain", "hybrid", "llama-plain", "llama-ngram")
    }
    plain, hybrid, ngram = rows[("64", "plain")], rows[("64", "hybrid")], rows[("64", "llama-ngram")]
    assert plain[2:4] == ["1.00", "8.00"] and plain[7:9] == ["1.00x", "1.00x"]
    assert hybrid[2] == "4.00" and hybrid[3] == "32.00"
    assert hybrid[7:9] == ["4.00x", "3.00x"]  # decode 32/8, e2e 9000/3000
    assert hybrid[6] == "100%"
    assert ngram[6] == "0%"  # different tokens from llama-plain
    short = rows[("short", "hybrid")]
    assert short[7] == "4.00x"  # against the short class's own plain, not the 64-token one
    md = render_table(_fake_results(), methods, markdown=True)
    assert md.splitlines()[0].startswith("| task | method |") and md.splitlines()[1].startswith("|---")
    assert "| 64 | hybrid | 4.00 | 32.00 |" in md


def test_render_against_llama_has_a_line_per_task_class() -> None:
    summaries = {t: {m: summarize(c) for m, c in cells.items()} for t, cells in _fake_results().items()}
    lines = render_against_llama(summaries)
    assert [line.split(":")[0] for line in lines] == ["64", "short"]
    # hybrid 32 tok/s: 4x its plain's 8, 3.2x llama-ngram's 10 (llama.cpp's best). Not 4x llama-plain's 8
    assert (
        "specls hybrid 32.00 tok/s decode = 4.00x specls plain, 3.20x llama.cpp's best (llama-ngram)"
        in lines[0]
    )
    no_llama = {"64": {"plain": summarize(Cell()), "hybrid": summarize(Cell())}}
    assert render_against_llama(no_llama) == []  # no llama.cpp: no line


def test_bench_real_is_registered() -> None:
    from specls.cli import build_parser

    args = build_parser().parse_args(
        ["bench", "real", "--model", "m", "--draft", "d", "--gguf-target", "t.gguf", "--gguf-draft", "d.gguf"]
    )
    opt = real.options_from_args(args)
    assert (opt.model, opt.gguf_draft, opt.threads, opt.tasks, opt.hf) == (
        "m",
        "d.gguf",
        1,
        ("64", "short"),
        False,
    )
    bad = build_parser().parse_args(
        [
            "bench",
            "real",
            "--model",
            "m",
            "--draft",
            "d",
            "--gguf-target",
            "t",
            "--gguf-draft",
            "d",
            "--tasks",
            "long",
        ]
    )
    with pytest.raises(SystemExit, match="--tasks"):
        real.options_from_args(bad)
    base = ["bench", "real", "--gguf-target", "t", "--gguf-draft", "d"]
    assert real.options_from_args(
        build_parser().parse_args([*base, "--methods", "hybrid, llama-draft"])
    ).methods == (
        "hybrid",
        "llama-draft",
    )
    with pytest.raises(SystemExit, match="unknown --methods"):
        real.options_from_args(build_parser().parse_args([*base, "--methods", "turbo"]))
    assert real.options_from_args(build_parser().parse_args(base)).learn_costs  # learning is the default
    assert not real.options_from_args(build_parser().parse_args([*base, "--no-learn-costs"])).learn_costs


# -- the whole run: bundled specls pair + the stub llama-server binary -------------------------------


@pytest.mark.slow
def test_bench_real_end_to_end_with_a_stub_llama_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    binary, argv_log = _stub_binary(tmp_path, "ok")
    gguf_t, gguf_d = tmp_path / "t.gguf", tmp_path / "d.gguf"
    gguf_t.write_bytes(b"GGUF")
    gguf_d.write_bytes(b"GGUF")
    out = tmp_path / "real.json"
    opt = real.RealBenchOptions(
        gguf_target=str(gguf_t),
        gguf_draft=str(gguf_d),
        llama_server=binary,
        n=2,
        max_tokens=8,
        json_out=str(out),
    )
    assert real.run_bench(opt) == 0
    data = json.loads(out.read_text())
    for task in ("64", "short"):
        for m in real.SPECLS:
            assert data["results"][task][m]["identical"] == 1.0  # speculation == plain greedy
        assert data["results"][task]["llama-plain"]["identical"] == 1.0
        assert data["results"][task]["plain"]["decode_x"] == 1.0
    launched = [json.loads(line) for line in argv_log.read_text().splitlines()]
    assert len(launched) == len(real.LLAMA) == 4  # one server per llama configuration
    assert any("ngram-simple" in a for a in launched) and any("-md" in a for a in launched)
    assert any("ngram-map-k4v" in a for a in launched)
    policy = data["drafting_policy"]  # the costs the hybrid planned by, calibrated at load
    assert policy["verify_cost"][0] == 1.0 and policy["draft_step_cost"] > 0
    assert sum(policy["choices"].values()) > 0  # the hybrid's passes were planned
    alone = data["lookup_policy"]  # lookup alone: planned too, learned apart
    assert sum(alone["choices"].values()) > 0 and set(alone["choices"]) <= {"plain", "lookup"}
    assert alone["verify_cost_calibrated"] == policy["verify_cost_calibrated"]  # one calibration
    assert policy["costs_learned_from_passes"] > 0  # then each learned from its own passes
    for task in ("64", "short"):  # the hybrid against llama.cpp's best, from the same run's figures
        vs, figures = data["against_llama"][task], data["results"][task]
        best = max(real.LLAMA, key=lambda m: figures[m]["decode_tok_s"] or 0.0)
        assert vs["decode_best"] == best
        assert vs["decode_x"] == pytest.approx(
            figures["hybrid"]["decode_tok_s"] / figures[best]["decode_tok_s"]
        )
    table = capsys.readouterr().out
    assert "llama-ngram" in table and "hybrid" in table
    assert "64: specls hybrid " in table and "llama.cpp's best (" in table
    assert "drafting policy (hybrid): {" in table and "drafting policy (lookup): {" in table


def _short_run(
    tmp_path: Path, llama_server: str, methods: tuple[str, ...]
) -> tuple[real.RealBenchOptions, Path]:
    """One bundled-pair point, short task, ``methods``; the GGUF files are stand-ins for llama."""
    (tmp_path / "t.gguf").write_bytes(b"GGUF")
    (tmp_path / "d.gguf").write_bytes(b"GGUF")
    out = tmp_path / "real.json"
    opt = real.RealBenchOptions(
        gguf_target=str(tmp_path / "t.gguf"),
        gguf_draft=str(tmp_path / "d.gguf"),
        llama_server=llama_server,
        n=1,
        max_tokens=4,
        tasks=("short",),
        methods=methods,
        prefix_chars=200,
        suffix_chars=50,
        json_out=str(out),
    )
    return opt, out


@pytest.mark.slow
def test_bench_real_subset_starts_only_the_servers_it_needs(tmp_path: Path) -> None:
    binary, argv_log = _stub_binary(tmp_path, "ok")
    opt, out = _short_run(tmp_path, binary, ("llama-ngram",))
    assert real.run_bench(opt) == 0
    assert set(json.loads(out.read_text())["results"]["short"]) == {"plain", "llama-plain", "llama-ngram"}
    launched = [json.loads(line) for line in argv_log.read_text().splitlines()]
    assert len(launched) == 2 and not any("-md" in a for a in launched)


@pytest.mark.slow
def test_bench_real_without_llama_methods_needs_no_llama_server(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-llama-server")  # Not an error: no llama method runs
    opt, out = _short_run(tmp_path, missing, ("lookup",))
    assert real.run_bench(opt) == 0
    assert set(json.loads(out.read_text())["results"]["short"]) == {"plain", "lookup"}


@pytest.mark.slow
@pytest.mark.parametrize("learn_costs", [True, False])
def test_bench_real_learns_pass_costs_unless_told_not_to(tmp_path: Path, learn_costs: bool) -> None:
    opt, out = _short_run(tmp_path, str(tmp_path / "no-such-llama-server"), ("lookup",))
    assert real.run_bench(replace(opt, learn_costs=learn_costs)) == 0
    alone = json.loads(out.read_text())["lookup_policy"]
    assert (alone["costs_learned_from_passes"] > 0) is learn_costs  # Not > 0 with --no-learn-costs
    if not learn_costs:
        assert alone["verify_cost"] == alone["verify_cost_calibrated"]


def test_docstring_examples_hold() -> None:
    import doctest

    result = doctest.testmod(real)
    assert result.attempted >= 5 and result.failed == 0
