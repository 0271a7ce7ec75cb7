"""``specls bench lsp``: type held-out real files into ``specls serve`` through a real LSP client.

Picks files from the stdlib test directories (held out from training; seeded choice), cuts a region of
whole lines out of each, opens the rest and types the region back character by character over stdio:
one ``didChange`` per keystroke, an ``textDocument/inlineCompletion`` after a short debounce (as
editors do), and ``$/cancelRequest`` for a request still in flight when the next key arrives. Typing
speed varies (seeded) and pauses at line ends, where a suggestion has time to arrive
(``--wait-at-line-end``: until it has arrived, the way a user waits for a slow engine's ghost text;
``--read-ms``: and then reads it, long enough for a line-first answer's block to be decoded).

``--next-edit``: also asks for a next edit (``textDocument/copilotInlineEdit``) at every pause, as
next-edit clients do (after ``next_edit_debounce_ms`` without a keystroke; a keystroke cancels it), and
reports its latency, the edits that named a version other than the request's (stale: must be 0) and
the completions' keystroke latency of the same replay without next edits (a second server), to show
that completions do not wait for next edits.

Prints keystroke->result latency p50/p95 (client side: from the keystroke's didChange to the answer of
the request it triggered), answered/served/cancelled counts, and the server's counters from
``specls/stats``: prefill tokens per request, prefix-reuse and completion-reuse rates, tokens wasted by
cancellation.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from specls import __version__
from specls.stats import percentile

NAN = float("nan")  # a percentile of nothing

CANCELLED = -32800


@dataclass(frozen=True)
class LspBenchSettings:
    files: int = 3
    chars: int = 160  # characters typed per file (whole lines, about)
    seed: int = 0
    debounce_ms: float = 30.0  # editor-side debounce before asking
    min_key_ms: float = 40.0  # fastest and slowest gap between keystrokes
    max_key_ms: float = 220.0
    line_pause_ms: float = 400.0  # pause after Enter (reading the suggestion)
    # after Enter, wait for the answer (up to timeout_s) before typing on: a user who waits for the
    # ghost text, so a slow engine's latency is measured instead of every request being cancelled
    wait_at_line_end: bool = False
    # ... and then read it this long before typing on: a pause long enough for the server's background
    # block after a line-first answer (it starts 0.3 s after the last request or edit)
    read_ms: float = 0.0
    threads: int = 1
    max_tokens: int = 32
    server: tuple[str, ...] = ()  # extra `specls serve` arguments (--model, --draft, --no-draft)
    next_edit: bool = False  # also ask for next edits at pauses (and replay once more without them)
    next_edit_debounce_ms: float = 300.0  # a pause this long asks for a next edit
    timeout_s: float = 120.0


@dataclass
class Tally:
    keystrokes: int = 0
    requests: int = 0
    answered: int = 0  # a response, possibly empty
    served: int = 0  # a response with a suggestion
    cancel_sent: int = 0
    cancelled: int = 0  # came back as RequestCancelled
    errors: list[str] = field(default_factory=list)
    latency_ms: list[float] = field(default_factory=list)  # keystroke -> answer (answered ones)
    served_latency_ms: list[float] = field(default_factory=list)
    # keystroke -> answer, split by the keystroke: one that typed the next character of the suggestion
    # on screen ("through") or any other
    through_latency_ms: list[float] = field(default_factory=list)
    other_latency_ms: list[float] = field(default_factory=list)
    request_ms: list[float] = field(default_factory=list)  # request sent -> answer
    next_edit: NextEditTally = field(default_factory=lambda: NextEditTally())


@dataclass
class NextEditTally:
    requests: int = 0
    answered: int = 0  # a response, possibly empty
    edits: int = 0  # a response with an edit
    cancel_sent: int = 0
    cancelled: int = 0  # came back as RequestCancelled
    stale: int = 0  # an edit for a version other than the one its request named (must be 0)
    late: int = 0  # an edit that arrived after the next keystroke (the client drops it by its version)
    errors: list[str] = field(default_factory=list)
    latency_ms: list[float] = field(default_factory=list)  # request sent -> answer (answered ones)
    edit_latency_ms: list[float] = field(default_factory=list)  # ... with an edit


class NextEditAsker:
    """The replay's next-edit client: after a pause it asks at the cursor for the current version; a
    keystroke cancels the pending ask and the request in flight."""

    def __init__(self, client: Any, uri: str, s: LspBenchSettings, tally: NextEditTally) -> None:
        self.client, self.uri, self.s, self.tally = client, uri, s, tally
        self.version = 0
        self.timer: asyncio.TimerHandle | None = None
        self.inflight: dict[str, asyncio.Future[Any]] = {}
        self.done: list[asyncio.Future[None]] = []
        self.seq = 0

    def keystroke(self, version: int, line: int, character: int) -> None:
        from lsprotocol import types

        if self.timer is not None:
            self.timer.cancel()
        for msg_id in list(self.inflight):
            self.client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id=msg_id))
            self.tally.cancel_sent += 1
        self.version = version
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(self.s.next_edit_debounce_ms / 1000, self.ask, version, line, character)

    def ask(self, version: int, line: int, character: int) -> None:
        self.seq += 1
        msg_id = f"e{self.seq}:{self.uri}"
        params = {
            "textDocument": {"uri": self.uri, "version": version},
            "position": {"line": line, "character": character},
        }
        fut = asyncio.wrap_future(
            self.client.protocol.send_request("textDocument/copilotInlineEdit", params, msg_id=msg_id)
        )
        self.inflight[msg_id] = fut
        self.tally.requests += 1
        self.done.append(asyncio.ensure_future(self.finish(msg_id, fut, version, time.perf_counter())))

    async def finish(self, msg_id: str, fut: asyncio.Future[Any], version: int, sent: float) -> None:
        from pygls.exceptions import JsonRpcException

        try:
            result = _plain(await asyncio.wait_for(fut, self.s.timeout_s))
        except JsonRpcException as exc:
            if _is_cancel(exc):
                self.tally.cancelled += 1
            else:
                self.tally.errors.append(str(exc))
            return
        except TimeoutError:
            self.tally.errors.append(f"next edit {msg_id} timed out")
            return
        finally:
            self.inflight.pop(msg_id, None)
        ms = (time.perf_counter() - sent) * 1000
        self.tally.answered += 1
        self.tally.latency_ms.append(ms)
        edits = (result or {}).get("edits") or []
        if edits:
            self.tally.edits += 1
            self.tally.edit_latency_ms.append(ms)
            named = [e.get("textDocument", {}).get("version") for e in edits]
            self.tally.stale += sum(1 for v in named if v != version)
            self.tally.late += int(self.version != version)

    async def wait(self) -> None:
        """Wait for the pending ask to be sent and answered (a user waiting at a line end)."""
        await asyncio.sleep(self.s.next_edit_debounce_ms / 1000 + 0.01)
        await asyncio.gather(*[asyncio.shield(f) for f in self.inflight.values()], return_exceptions=True)

    async def drain(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        await asyncio.gather(*self.done)


def _utf16_len(s: str) -> int:
    return len(s.encode("utf-16-le", "surrogatepass")) // 2


def pick_regions(settings: LspBenchSettings) -> list[tuple[str, str, str]]:
    """(name, text without the region, region) for seeded held-out files."""
    from specls.models.data import read_source, split_corpus

    split = split_corpus()
    rng = random.Random(settings.seed)
    candidates = list(split.heldout)
    rng.shuffle(candidates)
    out: list[tuple[str, str, str]] = []
    for path in candidates:
        if len(out) >= settings.files:
            break
        text = read_source(path)
        if not text or len(text) < 4 * settings.chars or len(text) > 400_000 or "\r" in text:
            continue
        lines = text.split("\n")
        start = rng.randrange(len(lines) // 4, max(len(lines) // 4 + 1, len(lines) - 40))
        end = start
        size = 0
        while end < len(lines) and size < settings.chars:
            size += len(lines[end]) + 1
            end += 1
        region = "\n".join(lines[start:end]) + "\n"
        if not region.strip() or len(region) > 3 * settings.chars:
            continue
        before = "\n".join(lines[:start]) + ("\n" if start else "")
        after = "\n".join(lines[end:])
        out.append((str(path.relative_to(split.root)), before + "\x00" + after, region))  # \x00: the cursor
    return out


def _is_cancel(exc: Exception) -> bool:
    """A JSON-RPC error that says the request was cancelled."""
    return getattr(exc, "code", None) == CANCELLED or "cancel" in str(exc).lower()


class CompletionAsker:
    """The replay's completion client for one file: each keystroke cancels what is in flight and
    restarts the debounce; the request it triggers is timed from the keystroke, and the latest answer
    is the suggestion on screen."""

    def __init__(self, client: Any, uri: str, s: LspBenchSettings, tally: Tally) -> None:
        self.client, self.uri, self.s, self.tally = client, uri, s, tally
        self.inflight: dict[str, tuple[asyncio.Future[Any], float, float]] = {}  # id -> (future, key t, sent)
        self.shown: tuple[int, int, str] | None = None  # the suggestion on screen: line, character, its text
        self.latest = ""  # the id of the request of the last keystroke
        self.timer: asyncio.TimerHandle | None = None
        self.seq = 0
        self.done: list[asyncio.Future[None]] = []

    def keystroke(self, ch: str, line: int, col: int) -> bool:
        """A new keystroke typing `ch` at (line, col): the editor cancels what is in flight; whether it
        typed the next character of the suggestion on screen."""
        from lsprotocol import types

        if self.timer is not None:
            self.timer.cancel()
        for msg_id in list(self.inflight):
            self.client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id=msg_id))
            self.tally.cancel_sent += 1
        shown = self.shown
        self.latest = ""  # an answer to an older keystroke no longer puts a suggestion on screen
        return shown is not None and shown[:2] == (line, col) and ch != "\n" and shown[2].startswith(ch)

    def typed(self, ch: str, through: bool, key_t: float, line: int, col: int) -> None:
        """`ch` is in the document and the cursor at (line, col): keep the rest of a suggestion typed
        through on screen, and ask after the debounce."""
        rest = self.shown[2][len(ch) :] if self.shown is not None and through else ""
        self.shown = (line, col, rest) if rest else None  # the editor keeps the rest of it on screen
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(self.s.debounce_ms / 1000, self.ask, key_t, line, col, through)

    def ask(self, key_t: float, ln: int, ch: int, through: bool) -> None:
        from lsprotocol import types

        self.seq += 1
        msg_id = f"b{self.seq}"
        self.latest = msg_id
        params = types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=self.uri),
            position=types.Position(line=ln, character=ch),
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic),
        )
        fut = asyncio.wrap_future(
            self.client.protocol.send_request(types.TEXT_DOCUMENT_INLINE_COMPLETION, params, msg_id=msg_id)
        )
        sent = time.perf_counter()
        self.inflight[msg_id] = (fut, key_t, sent)
        self.tally.requests += 1
        self.done.append(asyncio.ensure_future(self.finish(msg_id, fut, key_t, sent, (ln, ch, through))))

    async def finish(
        self, msg_id: str, fut: asyncio.Future[Any], key_t: float, sent_t: float, at: tuple[int, int, bool]
    ) -> None:
        from pygls.exceptions import JsonRpcException

        tally = self.tally
        try:
            result = await asyncio.wait_for(fut, self.s.timeout_s)
        except JsonRpcException as exc:
            if _is_cancel(exc):
                tally.cancelled += 1
            else:
                tally.errors.append(str(exc))
            return
        except TimeoutError:
            tally.errors.append(f"request {msg_id} timed out")
            return
        finally:
            self.inflight.pop(msg_id, None)
        now = time.perf_counter()
        tally.answered += 1
        tally.latency_ms.append((now - key_t) * 1000)
        tally.request_ms.append((now - sent_t) * 1000)
        (tally.through_latency_ms if at[2] else tally.other_latency_ms).append((now - key_t) * 1000)
        items = [] if result is None else list(getattr(result, "items", result) or [])
        if items:
            tally.served += 1
            tally.served_latency_ms.append((now - key_t) * 1000)
            text = items[0].insert_text
            if msg_id == self.latest and isinstance(text, str) and text:
                self.shown = (at[0], at[1], text)

    async def wait(self) -> None:
        """Wait for the request to be sent after the debounce and answered (a user waiting at a line end)."""
        await asyncio.sleep(self.s.debounce_ms / 1000)
        await asyncio.gather(
            *[asyncio.shield(f) for f, _, _ in self.inflight.values()], return_exceptions=True
        )

    async def drain(self) -> None:
        await asyncio.sleep(self.s.debounce_ms / 1000 + 0.01)
        if self.done:
            await asyncio.gather(*self.done)


def did_insert(client: Any, uri: str, version: int, line: int, col: int, ch: str) -> None:
    """Insert `ch` at (line, col): a didChange of an empty range (a client's keystroke)."""
    from lsprotocol import types

    pos = types.Position(line=line, character=col)
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[
                types.TextDocumentContentChangePartial(range=types.Range(start=pos, end=pos), text=ch)
            ],
        )
    )


async def _type_file(
    client: Any, uri: str, text: str, region: str, s: LspBenchSettings, tally: Tally
) -> None:
    from lsprotocol import types

    before, after = text.split("\x00")
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(
                uri=uri, language_id="python", version=1, text=before + after
            )
        )
    )
    rng = random.Random(f"{s.seed}:{uri}")
    line = before.count("\n")
    col = _utf16_len(before.rsplit("\n", 1)[-1])
    version = 1
    completions = CompletionAsker(client, uri, s, tally)
    edits = NextEditAsker(client, uri, s, tally.next_edit) if s.next_edit else None
    for ch in region:
        through = completions.keystroke(ch, line, col)
        version += 1
        did_insert(client, uri, version, line, col, ch)
        key_t = time.perf_counter()
        tally.keystrokes += 1
        line, col = (line + 1, 0) if ch == "\n" else (line, col + _utf16_len(ch))
        completions.typed(ch, through, key_t, line, col)
        if edits is not None:
            edits.keystroke(version, line, col)
        gap = rng.uniform(s.min_key_ms, s.max_key_ms) + (s.line_pause_ms if ch == "\n" else 0.0)
        await asyncio.sleep(gap / 1000)
        if ch == "\n":
            await _line_end(s, completions, edits)
    await completions.drain()
    if edits is not None:
        await edits.drain()
    client.text_document_did_close(
        types.DidCloseTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri))
    )


async def _line_end(s: LspBenchSettings, completions: CompletionAsker, edits: NextEditAsker | None) -> None:
    """After Enter's pause: wait for the answers (--wait-at-line-end), then read them (--read-ms)."""
    if s.wait_at_line_end:
        await completions.wait()
        if edits is not None:
            await edits.wait()
    if s.read_ms > 0:
        await asyncio.sleep(s.read_ms / 1000)


def _plain(value: Any) -> Any:
    if hasattr(value, "_asdict"):
        return {k: _plain(v) for k, v in value._asdict().items()}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


_SERVER_KEYS = (
    "engine_calls",
    "prefill_tokens_per_call",
    "prefix_reuse_rate",
    "completion_reuse_rate",
    "cache_hit_rate",
    "type_ahead_rate",
    "tokens_generated",
    "tokens_wasted",
    "cancelled",
    "stale_dropped",
    "continuations",
    "continued",
    "continuations_preempted",
    "empty",
    "latency_ms",
    "keystroke_to_result_ms",
)


def _client(messages: list[str]) -> Any:
    """A language client that keeps the server's log and shown messages in `messages`."""
    from lsprotocol import types
    from pygls.lsp.client import LanguageClient

    client = LanguageClient("specls-bench", __version__)

    @client.feature(types.WINDOW_LOG_MESSAGE)
    def _log(params: types.LogMessageParams) -> None:
        messages.append(params.message)

    @client.feature(types.WINDOW_SHOW_MESSAGE)
    def _show(params: types.ShowMessageParams) -> None:
        messages.append(params.message)

    return client


async def _initialize(client: Any, s: LspBenchSettings) -> float:
    """Initialize with inline completion and wait for the model; the seconds it took to load."""
    from lsprotocol import types

    caps = types.ClientCapabilities(
        text_document=types.TextDocumentClientCapabilities(
            inline_completion=types.InlineCompletionClientCapabilities()
        )
    )
    await asyncio.wait_for(client.initialize_async(types.InitializeParams(capabilities=caps)), s.timeout_s)
    client.initialized(types.InitializedParams())
    started = time.perf_counter()
    while True:  # wait for the model
        st = _plain(await client.protocol.send_request_async("specls/stats", {}))
        if st["server"]["state"] == "ready":
            break
        if st["server"]["state"] == "failed":
            raise RuntimeError(f"the server could not load its model: {st['server']['error']}")
        if time.perf_counter() - started > s.timeout_s:
            raise RuntimeError("the server did not load its model in time")
        await asyncio.sleep(0.1)
    return time.perf_counter() - started


async def _stop(client: Any) -> None:
    """End the server process, whether or not it shut down."""
    await asyncio.sleep(0.2)
    proc = getattr(client, "_server", None)
    if proc is not None and proc.returncode is None:
        proc.terminate()
    try:
        await asyncio.wait_for(client.stop(), 10)
    except Exception:
        pass


async def run_bench(s: LspBenchSettings) -> dict[str, Any]:
    regions = pick_regions(s)
    if not regions:
        raise RuntimeError("no held-out files found (stdlib test directories)")
    cmd = [
        sys.executable,
        "-m",
        "specls",
        "serve",
        "--threads",
        str(s.threads),
        "--max-tokens",
        str(s.max_tokens),
    ]
    cmd += list(s.server)
    messages: list[str] = []
    client = _client(messages)
    await client.start_io(*cmd)
    tally = Tally()
    try:
        load_s = await _initialize(client, s)
        t0 = time.perf_counter()
        for i, (name, text, region) in enumerate(regions):
            await _type_file(client, f"file:///bench/{i}/{Path(name).name}", text, region, s, tally)
        elapsed = time.perf_counter() - t0
        server_stats = _plain(await client.protocol.send_request_async("specls/stats", {}))
        await asyncio.wait_for(client.shutdown_async(None), s.timeout_s)
        client.exit(None)
    finally:
        await _stop(client)
    return _report(s, [name for name, _, _ in regions], load_s, elapsed, tally, server_stats)


def _report(
    s: LspBenchSettings,
    files: list[str],
    load_s: float,
    elapsed: float,
    tally: Tally,
    server_stats: dict[str, Any],
) -> dict[str, Any]:
    srv = server_stats["server"]
    return {
        "settings": asdict(s),
        "files": files,
        "load_s": round(load_s, 2),
        "typing_s": round(elapsed, 1),
        "keystrokes": tally.keystrokes,
        "requests": tally.requests,
        "answered": tally.answered,
        "served": tally.served,
        "cancel_sent": tally.cancel_sent,
        "cancelled": tally.cancelled,
        "errors": tally.errors[:5],
        "error_count": len(tally.errors),
        "keystroke_to_result_ms": _percentiles(tally.latency_ms),
        "keystroke_to_suggestion_ms": _percentiles(tally.served_latency_ms),
        "through_keystroke_to_result_ms": _percentiles(tally.through_latency_ms),
        "other_keystroke_to_result_ms": _percentiles(tally.other_latency_ms),
        "request_to_result_ms": {
            "p50": round(percentile(tally.request_ms, 50, NAN), 1),
            "p95": round(percentile(tally.request_ms, 95, NAN), 1),
            "mean": round(statistics.fmean(tally.request_ms), 1) if tally.request_ms else float("nan"),
        },
        "server": {k: srv.get(k) for k in _SERVER_KEYS},
        "engine": server_stats.get("engine", {}),
        **({"next_edit": _next_edit_report(tally.next_edit, srv)} if s.next_edit else {}),
    }


def _next_edit_report(t: NextEditTally, srv: dict[str, Any]) -> dict[str, Any]:
    return {
        "requests": t.requests,
        "answered": t.answered,
        "edits": t.edits,
        "cancel_sent": t.cancel_sent,
        "cancelled": t.cancelled,
        "stale": t.stale,
        "late": t.late,
        "errors": t.errors[:5],
        "error_count": len(t.errors),
        "request_to_result_ms": _percentiles(t.latency_ms),
        "request_to_edit_ms": _percentiles(t.edit_latency_ms),
        "server": srv.get("next_edit", {}),
    }


async def run_next_edit_bench(s: LspBenchSettings) -> dict[str, Any]:
    """The replay with next edits, then the same replay without them on a fresh server: the
    completions' keystroke latency side by side."""
    report = await run_bench(s)
    without = await run_bench(replace(s, next_edit=False))
    report["without_next_edits"] = {
        k: without[k]
        for k in ("keystroke_to_result_ms", "keystroke_to_suggestion_ms", "request_to_result_ms", "served")
    }
    report["error_count"] += without["error_count"]
    return report


def _percentiles(ms: list[float]) -> dict[str, float | int]:
    return {"p50": round(percentile(ms, 50, NAN), 1), "p95": round(percentile(ms, 95, NAN), 1), "n": len(ms)}


def _print(report: dict[str, Any]) -> None:
    k = report["keystroke_to_result_ms"]
    sv = report["keystroke_to_suggestion_ms"]
    srv = report["server"]
    print(f"files: {', '.join(report['files'])}")
    print(
        f"keystrokes {report['keystrokes']}  requests {report['requests']}  answered {report['answered']}  "
        f"with suggestion {report['served']}  cancelled {report['cancelled']} ({report['cancel_sent']} sent)  "
        f"errors {report['error_count']}"
    )
    print(f"keystroke->result  p50 {k['p50']:.1f} ms  p95 {k['p95']:.1f} ms  (n={k['n']}, includes debounce)")
    print(f"keystroke->suggestion  p50 {sv['p50']:.1f} ms  p95 {sv['p95']:.1f} ms  (n={sv['n']})")
    for kind, what in (("through", "typed the suggestion's next character"), ("other", "any other")):
        t = report[f"{kind}_keystroke_to_result_ms"]
        print(f"  {kind} keystrokes ({what}): p50 {t['p50']:.1f} ms  p95 {t['p95']:.1f} ms  (n={t['n']})")
    r = report["request_to_result_ms"]
    print(f"request->result  p50 {r['p50']:.1f} ms  p95 {r['p95']:.1f} ms")
    print(
        f"server: engine calls {srv['engine_calls']}  prefill tokens/call {srv['prefill_tokens_per_call']}  "
        f"prefix reuse {srv['prefix_reuse_rate']:.1%}  completion reuse {srv['completion_reuse_rate']:.1%}  "
        f"cache hits {srv['cache_hit_rate']:.1%}  type-ahead {float(srv.get('type_ahead_rate') or 0):.1%}"
    )
    print(
        f"server: tokens generated {srv['tokens_generated']}  wasted by cancellation {srv['tokens_wasted']}  "
        f"cancelled {srv['cancelled']}  stale dropped {srv['stale_dropped']}"
    )
    print(
        f"server: line-first blocks decoded in the background {srv.get('continuations')}  "
        f"finished {srv.get('continued')}  preempted {srv.get('continuations_preempted')}"
    )
    if "next_edit" in report:
        _print_next_edit(report)
    eng = report.get("engine") or {}
    if "latency_ms_p50" in eng:
        print(
            f"engine: latency p50 {float(eng['latency_ms_p50']):.1f} ms  p95 {float(eng.get('latency_ms_p95', 0)):.1f} ms  "
            f"tokens/pass {float(eng.get('tokens_per_pass', 0)):.2f}  acceptance {float(eng.get('acceptance', 0)):.1%}"
        )


def _run(args: argparse.Namespace) -> int:
    server: list[str] = []
    if args.model:
        server += ["--model", args.model]
    if args.draft:
        server += ["--draft", args.draft]
    if args.no_draft:
        server.append("--no-draft")
    if args.no_speculation:
        server.append("--no-speculation")
    if args.no_type_ahead:
        server.append("--no-type-ahead")
    if args.no_line_first:
        server.append("--no-line-first")
    settings = LspBenchSettings(
        files=args.files,
        chars=args.chars,
        seed=args.seed,
        debounce_ms=args.debounce_ms,
        threads=args.threads,
        max_tokens=args.max_tokens,
        wait_at_line_end=args.wait_at_line_end,
        read_ms=args.read_ms,
        server=tuple(server),
        next_edit=args.next_edit,
    )
    try:
        report = asyncio.run(run_next_edit_bench(settings) if settings.next_edit else run_bench(settings))
    except RuntimeError as exc:
        print(f"specls bench lsp: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        _print(report)
    return 0 if report["error_count"] == 0 else 1


def register(kinds: Any) -> None:
    p = kinds.add_parser("lsp", help="type held-out files into `specls serve` over stdio; latency and reuse")
    d = LspBenchSettings()
    p.add_argument("--files", type=int, default=d.files, help="held-out files to type into")
    p.add_argument("--chars", type=int, default=d.chars, help="characters typed per file")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--debounce-ms", type=float, default=d.debounce_ms)
    p.add_argument("--threads", type=int, default=d.threads, help="server onnxruntime threads")
    p.add_argument("--max-tokens", type=int, default=d.max_tokens)
    p.add_argument("--model", metavar="DIR")
    p.add_argument("--draft", metavar="DIR")
    p.add_argument("--no-draft", action="store_true")
    p.add_argument("--no-speculation", action="store_true")
    p.add_argument("--no-type-ahead", action="store_true", help="the server decodes every keystroke again")
    p.add_argument("--no-line-first", action="store_true", help="the server waits for whole blocks")
    p.add_argument(
        "--wait-at-line-end",
        action="store_true",
        help="after Enter, wait for the answer before typing on (measures a slow engine's latency)",
    )
    p.add_argument(
        "--read-ms",
        type=float,
        default=d.read_ms,
        help="after Enter (and the wait), pause this long before typing on: lets line-first blocks finish",
    )
    p.add_argument(
        "--next-edit",
        action="store_true",
        help="also ask for next edits at pauses; their latency, stale answers (must be 0), and the "
        "completions' latency of the same replay without next edits",
    )
    p.add_argument("--json", action="store_true", help="print the full report as JSON")
    p.set_defaults(func=_run)


def _print_next_edit(report: dict[str, Any]) -> None:
    n = report["next_edit"]
    r, e = n["request_to_result_ms"], n["request_to_edit_ms"]
    print(
        f"next edits: requests {n['requests']}  answered {n['answered']}  with an edit {n['edits']}  "
        f"cancelled {n['cancelled']} ({n['cancel_sent']} sent)  stale {n['stale']} (must be 0)  "
        f"late {n['late']}  errors {n['error_count']}"
    )
    print(f"next edit request->result  p50 {r['p50']:.1f} ms  p95 {r['p95']:.1f} ms  (n={r['n']})")
    print(f"next edit request->edit  p50 {e['p50']:.1f} ms  p95 {e['p95']:.1f} ms  (n={e['n']})")
    srv = n["server"]
    print(
        f"server next edits: answered {srv.get('answered')}  cancelled {srv.get('cancelled')}  "
        f"stale dropped {srv.get('stale_dropped')}  tokens wasted {srv.get('tokens_wasted')}"
    )
    recent = report.get("engine", {}).get("next_edit", {}).get("recent_requests") or []
    if recent:
        prefill = sorted(float(r["prefill_tokens"]) for r in recent)
        ms = sorted(float(r["prefill_ms"]) for r in recent)
        print(
            f"next edit prefill per request: tokens p50 {prefill[len(prefill) // 2]:.0f}  ms p50 "
            f"{ms[len(ms) // 2]:.0f}  max {ms[-1]:.0f}  (n={len(recent)})"
        )
    k, w = report["keystroke_to_result_ms"], report["without_next_edits"]["keystroke_to_result_ms"]
    print(
        f"completions keystroke->result  with next edits p50 {k['p50']:.1f} ms  p95 {k['p95']:.1f} ms  |  "
        f"without p50 {w['p50']:.1f} ms  p95 {w['p95']:.1f} ms"
    )
