"""``specls bench team --clients N --duration S``: many editors typing into one shared specls.

Starts ``specls serve --tcp 127.0.0.1:0`` with a fresh token file (token auth on, one token per
client), or uses ``--connect HOST:PORT`` (with ``--token``). Each client is a small asyncio LSP client
that opens a held-out file (stdlib test directories, never trained on) with a region cut out and types
that region back keystroke by keystroke: ``didChange`` + ``textDocument/inlineCompletion`` per
keystroke, ``$/cancelRequest`` for the previous request when the next key comes first (as editors do),
and a pause at the end of each line's text (before Enter) where it waits for the suggestion. Prints p50/p95
keystroke->result latency of answered requests, completions served, errors (must be 0),
cancellations, and the server's RSS at start (engine loaded, before clients) and end (all clients
gone).

``--batching-micro`` instead prints the batched-vs-sequential ONNX pass micro-benchmark that decided
whether the scheduler batches target passes (it does not: see docs/team.md)."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import re
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from specls.model_options import resolve_threads
from specls.stats import percentile

NAN = float("nan")  # a percentile of nothing

CANCELLED = -32800


@dataclass(frozen=True)
class TypingSettings:
    chars_per_s: float = 8.0  # a brisk typist
    line_pause_s: float = 0.6  # reading the suggestion at the end of a line
    region_lines: int = 12  # lines cut out of a file and typed back
    result_timeout_s: float = 60.0
    seed: int = 0


@dataclass
class ClientStats:
    keystrokes: int = 0
    requests: int = 0
    answered: int = 0  # a response (possibly an empty list)
    served: int = 0  # a response with a suggestion
    cancellations: int = 0  # $/cancelRequest sent
    errors: list[str] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)


def _utf16_len(s: str) -> int:
    return len(s.encode("utf-16-le")) // 2


class LspClient:
    """A minimal JSON-RPC/LSP client on asyncio streams."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.ids = itertools.count(1)
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.task = asyncio.ensure_future(self._read_loop())

    @classmethod
    async def connect(cls, host: str, port: int) -> LspClient:
        reader, writer = await asyncio.open_connection(host, port, limit=64 * 1024 * 1024)
        return cls(reader, writer)

    def _send(self, msg: dict[str, Any]) -> None:
        body = json.dumps(msg).encode("utf-8")
        self.writer.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)

    def notify(self, method: str, params: Any) -> None:
        self._send({"jsonrpc": "2.0", "method": method, "params": params})

    def request(self, method: str, params: Any) -> tuple[int, asyncio.Future[dict[str, Any]]]:
        rid = next(self.ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.pending[rid] = fut
        self._send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        return rid, fut

    async def call(self, method: str, params: Any, timeout: float = 60.0) -> dict[str, Any]:
        _, fut = self.request(method, params)
        return await asyncio.wait_for(fut, timeout)

    async def _read_loop(self) -> None:
        try:
            while True:
                length = None
                while True:
                    line = await self.reader.readline()
                    if not line:
                        raise ConnectionError("server closed the connection")
                    if line in (b"\r\n", b"\n"):
                        break
                    m = re.match(rb"content-length:\s*(\d+)", line, re.IGNORECASE)
                    if m:
                        length = int(m.group(1))
                if length is None:
                    continue
                msg = json.loads(await self.reader.readexactly(length))
                if "id" in msg and "method" in msg:  # a server->client request: answer null
                    self._send({"jsonrpc": "2.0", "id": msg["id"], "result": None})
                elif "method" in msg:
                    self.on_notification(msg)
                elif "id" in msg:
                    fut = self.pending.pop(msg["id"], None)
                    if fut is not None and not fut.done():
                        fut.set_result(msg)
        except (ConnectionError, asyncio.IncompleteReadError, OSError) as exc:
            for fut in self.pending.values():
                if not fut.done():
                    fut.set_exception(ConnectionError(str(exc)))
            self.pending.clear()

    def on_notification(self, msg: dict[str, Any]) -> None:
        """A server notification ($/progress, window/logMessage...): ignored here."""

    async def close(self) -> None:
        self.task.cancel()
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass


async def initialize(client: LspClient, token: str | None, timeout: float = 60.0) -> dict[str, Any]:
    opts: dict[str, Any] = {"maxTokens": 32}
    if token:
        opts["token"] = token
    resp = await client.call(
        "initialize",
        {"processId": os.getpid(), "capabilities": {}, "rootUri": None, "initializationOptions": opts},
        timeout,
    )
    if "error" not in resp:
        client.notify("initialized", {})
    return resp


def heldout_files(limit_bytes: int = 60_000) -> list[Path]:
    from specls.models.data import split_corpus

    files = [p for p in split_corpus().heldout if 2_000 < p.stat().st_size < limit_bytes]
    return sorted(files)


def _pick_region(
    rng: random.Random, files: list[Path], typing: TypingSettings
) -> tuple[Path, int, list[str], str] | None:
    """A seeded file and region: (path, first line, the region's lines, the text without them); None
    when the file is unreadable or too short."""
    path = rng.choice(files)
    try:
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    except (OSError, UnicodeDecodeError):
        return None
    if len(lines) < typing.region_lines + 4:
        return None
    start = rng.randrange(2, len(lines) - typing.region_lines)
    region = lines[start : start + typing.region_lines]
    return path, start, region, "".join(lines[:start] + lines[start + typing.region_lines :])


async def _read_suggestion(
    fut: asyncio.Future[dict[str, Any]], typing: TypingSettings, stats: ClientStats
) -> bool:
    """End of the line's text: wait for the suggestion and "read" it before Enter; False when the
    connection dropped."""
    try:
        await asyncio.wait_for(asyncio.shield(fut), typing.result_timeout_s)
    except TimeoutError:
        stats.errors.append("no result within the timeout")
    except ConnectionError as exc:
        stats.errors.append(f"connection: {exc}")
        return False
    await asyncio.sleep(typing.line_pause_s)
    return True


def _insert(client: LspClient, uri: str, version: int, line_no: int, col: int, ch: str) -> None:
    pos = {"line": line_no, "character": col}
    client.notify(
        "textDocument/didChange",
        {
            "textDocument": {"uri": uri, "version": version},
            "contentChanges": [{"range": {"start": pos, "end": pos}, "text": ch}],
        },
    )


def _ask(
    client: LspClient, uri: str, line_no: int, col: int, stats: ClientStats
) -> tuple[int, asyncio.Future[dict[str, Any]]]:
    """An inline completion at the cursor, recorded in `stats` when answered; (its id, its answer)."""
    sent = time.monotonic()
    rid, fut = client.request(
        "textDocument/inlineCompletion",
        {
            "textDocument": {"uri": uri},
            "position": {"line": line_no, "character": col},
            "context": {"triggerKind": 2},
        },
    )
    stats.requests += 1
    fut.add_done_callback(partial(_record, sent=sent, stats=stats))
    return rid, fut


async def _type_document(
    client: LspClient,
    uri: str,
    text: str,
    start: int,
    region: list[str],
    deadline: float,
    typing: TypingSettings,
    stats: ClientStats,
    rng: random.Random,
) -> bool:
    """Open `text`, type `region` back at line `start` (until the deadline) and close it; False when
    the connection dropped (the document is left open)."""
    version = 1
    client.notify(
        "textDocument/didOpen",
        {"textDocument": {"uri": uri, "languageId": "python", "version": version, "text": text}},
    )
    line_no = start
    pending: tuple[int, asyncio.Future[dict[str, Any]]] | None = None
    for typed_line in region:
        col = 0
        for ch in typed_line:
            if time.monotonic() >= deadline:
                break
            if ch == "\n" and pending is not None:
                if not await _read_suggestion(pending[1], typing, stats):
                    return False
                pending = None
            if pending is not None and not pending[1].done():
                client.notify("$/cancelRequest", {"id": pending[0]})
                stats.cancellations += 1
            version += 1
            _insert(client, uri, version, line_no, col, ch)
            stats.keystrokes += 1
            line_no, col = (line_no + 1, 0) if ch == "\n" else (line_no, col + _utf16_len(ch))
            pending = _ask(client, uri, line_no, col, stats)
            await asyncio.sleep(rng.expovariate(typing.chars_per_s))
        if time.monotonic() >= deadline:
            break
    client.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
    return True


async def typist(
    idx: int,
    host: str,
    port: int,
    token: str | None,
    files: list[Path],
    deadline: float,
    typing: TypingSettings,
    stats: ClientStats,
) -> None:
    rng = random.Random(typing.seed * 1000 + idx)
    client = await LspClient.connect(host, port)
    try:
        resp = await initialize(client, token)
        if "error" in resp:
            stats.errors.append(f"initialize refused: {resp['error'].get('message')}")
            return
        doc_no = 0
        while time.monotonic() < deadline:
            picked = _pick_region(rng, files, typing)
            if picked is None:
                continue
            path, start, region, text = picked
            doc_no += 1
            uri = f"file:///bench/c{idx}/{doc_no}/{path.name}"
            if not await _type_document(client, uri, text, start, region, deadline, typing, stats, rng):
                return
        try:
            await client.call("shutdown", None, 30)
            client.notify("exit", None)
        except (TimeoutError, ConnectionError) as exc:
            stats.errors.append(f"shutdown: {exc}")
    except ConnectionError as exc:
        stats.errors.append(f"connection: {exc}")
    finally:
        await client.close()


def _record(fut: asyncio.Future[dict[str, Any]], *, sent: float, stats: ClientStats) -> None:
    if fut.cancelled():
        return
    exc = fut.exception()
    if exc is not None:
        stats.errors.append(f"request failed: {exc}")
        return
    msg = fut.result()
    if "error" in msg:
        if msg["error"].get("code") != CANCELLED:
            stats.errors.append(f"error {msg['error'].get('code')}: {msg['error'].get('message')}")
        return
    stats.answered += 1
    result = msg.get("result") or {}
    items = result.get("items") if isinstance(result, dict) else result
    if items:
        stats.served += 1
        stats.latencies_ms.append((time.monotonic() - sent) * 1000)


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


async def server_stats(host: str, port: int, token: str | None) -> dict[str, Any]:
    client = await LspClient.connect(host, port)
    try:
        await initialize(client, token)
        resp = await client.call("specls/stats", {}, 60)
        await client.call("shutdown", None, 30)
        client.notify("exit", None)
        result = resp.get("result")
        return result if isinstance(result, dict) else {}
    finally:
        await client.close()


async def wait_ready(host: str, port: int, token: str | None, timeout: float = 600.0) -> dict[str, Any]:
    end = time.monotonic() + timeout
    while True:
        stats = await server_stats(host, port, token)
        state = stats.get("server", {}).get("state")
        if state == "ready":
            return stats
        if state == "failed" or time.monotonic() > end:
            raise RuntimeError(f"server not ready: {stats.get('server')}")
        await asyncio.sleep(0.5)


async def run_clients(
    host: str,
    port: int,
    tokens: list[str | None],
    duration: float,
    typing: TypingSettings,
    files: list[Path] | None = None,
) -> list[ClientStats]:
    files = files if files is not None else heldout_files()
    if not files:
        raise RuntimeError("no held-out files found (stdlib test directories)")
    deadline = time.monotonic() + duration
    all_stats = [ClientStats() for _ in tokens]
    await asyncio.gather(
        *(
            typist(i, host, port, tok, files, deadline, typing, st)
            for i, (tok, st) in enumerate(zip(tokens, all_stats, strict=True))
        )
    )
    await asyncio.sleep(0.2)
    return all_stats


def _start_server(args: argparse.Namespace, token_file: Path) -> tuple[subprocess.Popen[str], str, int]:
    cmd = [
        sys.executable,
        "-m",
        "specls",
        "serve",
        "--tcp",
        "127.0.0.1:0",
        "--token-file",
        str(token_file),
        "--require-token",
        "--per-client-queue",
        "2",
        "--max-queue",
        str(max(8, 2 * args.clients)),
    ]
    if args.engine != "onnx":
        cmd += ["--engine", args.engine]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if args.no_load_aware:
        cmd += ["--no-load-aware"]
    if args.batch is not None:
        cmd += ["--batch", str(args.batch)]
    cmd += args.server_arg or []
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    host, port = wait_listening(proc, cmd)
    return proc, host, port


def wait_listening(
    proc: subprocess.Popen[str], cmd: Sequence[str], timeout_s: float = 600
) -> tuple[str, int]:
    """The address a ``specls serve --tcp`` child logs on stderr once it listens; stderr is drained from
    then on (so the server never blocks on a full pipe). Kills the child and raises if it never does."""
    assert proc.stderr is not None
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        line = proc.stderr.readline()
        if not line:
            break
        m = re.search(r"listening on ([\w.:\[\]]+):(\d+)", line)
        if m:
            threading.Thread(target=_drain, args=(proc,), daemon=True).start()
            return m.group(1), int(m.group(2))
    proc.kill()
    raise RuntimeError(f"server did not start: {' '.join(cmd)}")


def _drain(proc: subprocess.Popen[str]) -> None:
    if proc.stderr is not None:
        for _ in proc.stderr:
            pass


def _report(label: str, stats: list[ClientStats], duration: float, rss: tuple[float, float]) -> None:
    lat = [x for s in stats for x in s.latencies_ms]
    errors = [e for s in stats for e in s.errors]
    print(f"== {label}")
    print(f"clients                 {len(stats)}")
    print(f"duration                {duration:.0f} s")
    print(f"keystrokes              {sum(s.keystrokes for s in stats)}")
    print(f"requests                {sum(s.requests for s in stats)}")
    print(f"answered                {sum(s.answered for s in stats)}")
    print(f"completions served      {sum(s.served for s in stats)}")
    print(f"cancellations           {sum(s.cancellations for s in stats)}")
    print(f"errors                  {len(errors)}")
    for e in sorted(set(errors))[:5]:
        print(f"  {e}")
    print(f"keystroke->result p50   {percentile(lat, 50, NAN):.0f} ms")
    print(f"keystroke->result p95   {percentile(lat, 95, NAN):.0f} ms")
    per_client = [len(s.latencies_ms) for s in stats]
    if per_client:
        print(f"served per client       min {min(per_client)} / median {statistics.median(per_client):.0f}")
    print(f"server RSS start/end    {rss[0]:.0f} MB / {rss[1]:.0f} MB")


@dataclass
class _Rounds:
    """What the rounds against a started server gave: the last round's client stats and duration, the
    server's RSS before the clients and after each round, its stats before and after."""

    stats: list[ClientStats]
    elapsed: float
    rss_start: float
    rounds_rss: list[float]
    before: dict[str, Any]
    after: dict[str, Any]


def _run_rounds(
    args: argparse.Namespace,
    typing: TypingSettings,
    proc: subprocess.Popen[str],
    host: str,
    port: int,
    tokens: list[str],
) -> _Rounds:
    """Wait for the server, then run the clients `args.rounds` times (the last token is the observer's)."""
    before = asyncio.run(wait_ready(host, port, tokens[-1]))
    rss_start = rss_mb(proc.pid)
    files = heldout_files()
    rounds_rss: list[float] = []
    for r in range(max(1, args.rounds)):
        t0 = time.monotonic()
        stats = asyncio.run(
            run_clients(
                host,
                port,
                list(tokens[: args.clients]),
                args.duration,
                replace(typing, seed=typing.seed + r),
                files,
            )
        )
        elapsed = time.monotonic() - t0
        time.sleep(1.0)
        rounds_rss.append(rss_mb(proc.pid))
    after = asyncio.run(server_stats(host, port, tokens[-1]))
    return _Rounds(stats, elapsed, rss_start, rounds_rss, before, after)


def _bench_team(args: argparse.Namespace) -> int:
    if args.batching_micro:
        return _batching_micro(args)
    typing = TypingSettings(chars_per_s=args.cps, seed=args.seed)
    if args.connect:
        host, _, port_s = args.connect.rpartition(":")
        stats = asyncio.run(
            run_clients(host or "127.0.0.1", int(port_s), [args.token] * args.clients, args.duration, typing)
        )
        _report(f"{args.clients} clients -> {args.connect}", stats, args.duration, (float("nan"),) * 2)
        return 0 if not any(s.errors for s in stats) else 1
    with tempfile.TemporaryDirectory() as tmp:
        tokens = [secrets.token_hex(16) for _ in range(args.clients + 1)]
        token_file = Path(tmp) / "tokens"
        token_file.write_text("".join(f"client{i}:{t}\n" for i, t in enumerate(tokens)))
        token_file.chmod(0o600)
        proc, host, port = _start_server(args, token_file)
        try:
            run = _run_rounds(args, typing, proc, host, port, tokens)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        rss = (run.rss_start, run.rounds_rss[-1])
        _report(f"{args.clients} clients, engine {args.engine}", run.stats, run.elapsed, rss)
        if len(run.rounds_rss) > 1:
            print(
                "server RSS after rounds  "
                + " / ".join(f"{x:.0f}" for x in run.rounds_rss)
                + " MB (last round shown)"
            )
        team = run.after.get("team") or {}
        if team:
            _print_team(team)
        eng = run.after.get("engine") or {}
        if eng:
            _print_engine(run.before.get("engine") or {}, eng)
        if args.json:
            print(json.dumps({"team": team, "engine": eng}, default=str))
    return 0 if not any(s.errors for s in run.stats) else 1


def _print_team(team: dict[str, Any]) -> None:
    spec = team.get("speculation", {})
    print(f"speculation decisions   {spec.get('decisions')}")
    print(
        f"scheduler               served {team.get('served')} cancelled {team.get('cancelled')} "
        f"superseded {team.get('superseded')} dropped {team.get('dropped')} max depth "
        f"{team.get('max_depth_seen')}"
    )
    print(f"scheduler workers       {team.get('workers')}")


def _print_engine(eng0: dict[str, Any], eng: dict[str, Any]) -> None:
    """The engine's documents, KV tokens, batching and acceptance (before the clients and after)."""
    docs0 = eng0.get("documents", eng0.get("open_documents"))
    docs1 = eng.get("documents", eng.get("open_documents"))
    print(f"engine documents        {docs0} before / {docs1} after clients left")
    if "kv_tokens" in eng:
        print(f"engine KV tokens        {eng0.get('kv_tokens')} before / {eng.get('kv_tokens')} after")
    b = eng.get("batching")
    if isinstance(b, dict):
        if b.get("enabled"):
            print(
                f"batching                on (max {b.get('max_batch')}): {b.get('passes')} passes, "
                f"{b.get('batched_passes')} batched, mean batch {b.get('mean_batch', 0.0):.2f}, "
                f"sizes {b.get('sizes')}"
            )
        else:
            print(f"batching                off (max_batch {b.get('max_batch')})")
    if "acceptance" in eng:
        print(
            f"engine acceptance       {eng.get('acceptance'):.3f}  tokens/pass {eng.get('tokens_per_pass'):.2f}"
        )


def _batching_micro(args: argparse.Namespace) -> int:
    from specls.models.loader import load_model, resolve_model_dir
    from specls.models.runtime import RuntimeSettings
    from specls.team.batching import BatchBenchSettings, format_table, measure_batching

    threads = resolve_threads(args.threads)  # 0: auto, as everywhere

    lm = load_model(
        resolve_model_dir(args.target, "target"), RuntimeSettings(threads=threads, provider="cpu")
    )
    for past in (128, 512):
        try:
            rows = measure_batching(lm, BatchBenchSettings(past_len=past))
        except ValueError as exc:
            print(f"batching micro-benchmark: {exc}")
            return 1
        print(f"== batched vs sequential target passes (past {past} tokens, {threads} thread(s))")
        print(format_table(rows))
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("team", help="many LSP clients typing into one shared server over loopback")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--duration", type=float, default=60.0, help="seconds of typing")
    p.add_argument("--cps", type=float, default=8.0, help="keystrokes per second per client")
    p.add_argument("--engine", choices=("onnx", "fake"), default="onnx")
    p.add_argument("--threads", type=int, default=0, help="server's onnxruntime threads (0 = auto)")
    p.add_argument("--no-load-aware", action="store_true", help="server: no speculation caps under load")
    p.add_argument(
        "--batch", type=int, default=None, help="server's --batch (1 = batching off; default: the server's)"
    )
    p.add_argument("--server-arg", action="append", help="extra argument for `specls serve` (repeatable)")
    p.add_argument("--connect", default=None, metavar="HOST:PORT", help="use a running server")
    p.add_argument("--token", default=None, help="token for --connect")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=1, help="repeat the run on the same server (RSS per round)")
    p.add_argument("--json", action="store_true", help="also print the server's final stats as JSON")
    p.add_argument("--batching-micro", action="store_true", help="only the batching micro-benchmark")
    p.add_argument("--target", default=None, help="--batching-micro: target model dir (default bundled)")
    p.set_defaults(func=_bench_team)
