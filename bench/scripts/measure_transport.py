"""Measure the stdio transport (issue 13): framing work and time, a large didOpen's delay on the next
answer, and the server's RSS around large messages. Prints one line per measurement.

    .venv/bin/python bench/scripts/measure_transport.py framer            # 2/4/8 MB bodies, 64 KB reads
    .venv/bin/python bench/scripts/measure_transport.py open --mb 20      # fake engine over stdio
    .venv/bin/python bench/scripts/measure_transport.py open --mb 20 --bundled   # `specls serve`, bundled model
    .venv/bin/python bench/scripts/measure_transport.py rss               # 200 MB (refused) and 50 MB messages
    .venv/bin/python bench/scripts/measure_transport.py rss --big-mb 20   # ... and 20 MB ones

``--transport PATH`` loads another copy of lsp/transport.py for the framer measurement (e.g. the one
before the fix: ``git show main:lsp/transport.py > /tmp/old_transport.py``)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CHUNK = 65536


def _framer_class(path: str | None) -> Any:
    if path is None:
        from specls.lsp.transport import Framer

        return Framer
    spec = importlib.util.spec_from_file_location("other_transport", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Framer


def did_open(uri: str, text: str) -> dict[str, Any]:
    doc = {"uri": uri, "languageId": "python", "version": 1, "text": text}
    return {"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": doc}}


def frame(message: dict[str, Any]) -> bytes:
    body = json.dumps(message).encode()
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


def source_text(n: int) -> str:
    line = "    result = compute(value, other) + 1  # some code\n"
    return (line * (n // len(line) + 1))[:n]


def measure_framer(transport: str | None) -> None:
    framer_class = _framer_class(transport)
    for mb in (2, 4, 8):
        stream = frame(did_open("file:///big.py", source_text(mb << 20)))
        framer = framer_class()
        started = time.perf_counter()
        count = 0
        for i in range(0, len(stream), CHUNK):
            framer.feed(stream[i : i + CHUNK])
            count += sum(1 for _ in framer.messages())
        took = time.perf_counter() - started
        scanned = getattr(framer, "scanned", None)
        print(f"framer {mb} MB: {took:.3f} s, {count} message(s), scanned={scanned} ({len(stream)} bytes)")


class Peer:
    """A stdio server subprocess and a reader thread that records when each response arrives."""

    def __init__(self, cmd: list[str]) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
        self.proc = subprocess.Popen(
            cmd,
            cwd=str(ROOT),
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self.arrived: dict[Any, tuple[float, dict[str, Any]]] = {}
        self.cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        out = self.proc.stdout
        while True:
            header = b""
            while not header.endswith(b"\r\n\r\n"):
                byte = out.read(1)
                if not byte:
                    return
                header += byte
            length = int(header.split(b"Content-Length:")[1].split(b"\r\n")[0])
            msg = json.loads(out.read(length))
            if "method" not in msg:
                with self.cond:
                    self.arrived[msg.get("id")] = (time.perf_counter(), msg)
                    self.cond.notify_all()

    def write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send(self, message: dict[str, Any]) -> None:
        self.write(frame(message))

    def wait(self, msg_id: Any, timeout: float = 600) -> tuple[float, dict[str, Any]]:
        with self.cond:
            if not self.cond.wait_for(lambda: msg_id in self.arrived, timeout):
                raise SystemExit(f"no response to {msg_id!r} in {timeout} s")
            return self.arrived[msg_id]

    def request(self, msg_id: Any, method: str, params: Any = None) -> dict[str, Any]:
        self.send({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})
        return self.wait(msg_id)[1]

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def start(self, wait_ready: bool = True) -> None:
        self.request("init", "initialize", {"capabilities": {}})
        self.send({"jsonrpc": "2.0", "method": "initialized", "params": {}})
        while wait_ready:
            state = self.request(f"ready{time.monotonic()}", "specls/stats", {})["result"]["server"]["state"]
            if state == "ready":
                return
            if state == "failed":
                raise SystemExit("the engine failed to load")
            time.sleep(0.2)

    def stop(self) -> int:
        self.request("bye", "shutdown")
        self.send({"jsonrpc": "2.0", "method": "exit"})
        return self.proc.wait(120)


def server_cmd(bundled: bool) -> list[str]:
    if bundled:
        return [str(ROOT / ".venv" / "bin" / "specls"), "serve"]
    return [sys.executable, str(ROOT / "tests" / "lsp" / "fake_server.py")]


def measure_open(mb: int, bundled: bool, rounds: int) -> None:
    peer = Peer(server_cmd(bundled))
    peer.start()
    small = "def add(a, b):\n    return "
    peer.send(did_open("file:///small.py", small))
    inline = {
        "textDocument": {"uri": "file:///small.py"},
        "position": {"line": 1, "character": 11},
        "context": {"triggerKind": 2},
    }
    peer.request("warm", "textDocument/inlineCompletion", inline)
    for r in range(rounds):
        data = frame(did_open(f"file:///big{r}.py", source_text(mb << 20)))
        started = time.perf_counter()
        peer.write(data)
        written = time.perf_counter()
        peer.send(
            {"jsonrpc": "2.0", "id": f"next{r}", "method": "textDocument/inlineCompletion", "params": inline}
        )
        sent = time.perf_counter()
        at, msg = peer.wait(f"next{r}")
        items = msg["result"]["items"] if "result" in msg else msg
        print(
            f"{'bundled' if bundled else 'fake'} {mb} MB didOpen ({len(data)} bytes): write {written - started:.2f} s, "
            f"next inlineCompletion answered {at - sent:.2f} s after it was sent "
            f"({at - started:.2f} s after the didOpen began), items={len(items) if isinstance(items, list) else items}"
        )
    print(f"rss {peer.rss_mb():.0f} MB; exit code {peer.stop()}")


def _write_streamed(peer: Peer, declared: int, uri: str) -> None:
    """A didOpen of ``declared`` body bytes, written in 1 MB pieces (never held whole here)."""
    head = json.dumps(did_open(uri, "")).encode()
    cut = head.index(b'"text": ""') + len(b'"text": "')
    prefix, suffix = head[:cut], head[cut:]
    filler = declared - len(prefix) - len(suffix)
    peer.write(b"Content-Length: %d\r\n\r\n" % declared + prefix)
    piece = b"x" * (1 << 20)
    left = filler
    while left > 0:
        peer.write(piece[: min(left, len(piece))])
        left -= len(piece)
    peer.write(suffix)


def measure_rss(rounds: int, big_mb: int, cmd: list[str]) -> None:
    peer = Peer(cmd)
    peer.start()
    print(f"rss after start: {peer.rss_mb():.0f} MB")
    for r in range(rounds):
        _write_streamed(peer, 200 << 20, f"file:///huge{r}.py")
        answer = peer.request(f"after200-{r}", "specls/stats", {})
        docs = answer["result"]["session"]["open_documents"]
        print(f"round {r}: after a 200 MB didOpen: rss {peer.rss_mb():.0f} MB, open documents {docs}")
        _write_streamed(peer, big_mb << 20, f"file:///big{r}.py")
        answer = peer.request(f"after-big-{r}", "specls/stats", {})
        docs = answer["result"]["session"]["open_documents"]
        print(f"round {r}: after a {big_mb} MB didOpen: rss {peer.rss_mb():.0f} MB, open documents {docs}")
        close = {"textDocument": {"uri": f"file:///big{r}.py"}}
        peer.send({"jsonrpc": "2.0", "method": "textDocument/didClose", "params": close})
        peer.request(f"closed{r}", "specls/stats", {})
        time.sleep(0.5)  # the engine thread drops its copy
        peer.request(f"closed2-{r}", "specls/stats", {})
        print(f"round {r}: after its didClose: rss {peer.rss_mb():.0f} MB")
    print(f"exit code {peer.stop()}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("what", choices=["framer", "open", "rss"])
    parser.add_argument("--transport", help="path of another lsp/transport.py (framer only)")
    parser.add_argument("--mb", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bundled", action="store_true", help="`specls serve` with the bundled model")
    parser.add_argument("--big-mb", type=int, default=50, help="rss: the accepted message's size")
    parser.add_argument("--cmd", nargs="+", help="rss: this server command instead of the fake server")
    args = parser.parse_args()
    if args.what == "framer":
        measure_framer(args.transport)
    elif args.what == "open":
        measure_open(args.mb, args.bundled, args.rounds)
    else:
        measure_rss(args.rounds, args.big_mb, args.cmd or server_cmd(False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
