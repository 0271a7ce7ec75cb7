"""``specls serve`` as a subprocess for the process-level tests: a blocking stdio LSP client, and the
addresses a TCP server prints (``specls listening on``, ``metrics on``) read from its stderr."""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 60.0  # hang bound for a subprocess's answer (start-up imports numpy/pygls), never asserted


def env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def specls(*args: str, stdin: bool = False) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "specls", *args],
        cwd=ROOT,
        env=env(),
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


class StderrWatch:
    """Collects a process's stderr on a thread; ``wait_for(pattern)`` returns the first match."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stderr is not None
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._stream = proc.stderr
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for raw in self._stream:
            with self._cond:
                self.lines.append(raw.decode("utf-8", "replace"))
                self._cond.notify_all()
        with self._cond:
            self.lines.append("")  # EOF marker
            self._cond.notify_all()

    def wait_for(self, pattern: str, timeout: float = WAIT_S) -> re.Match[str]:
        end = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                for line in self.lines[seen:]:
                    m = re.search(pattern, line)
                    if m:
                        return m
                seen = len(self.lines)
                if self.lines and self.lines[-1] == "":
                    raise AssertionError(f"process ended without {pattern!r}:\n{self.text}")
                left = end - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {pattern!r} within {timeout} s:\n{self.text}")
                self._cond.wait(left)

    @property
    def text(self) -> str:
        with self._cond:
            return "".join(self.lines)


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=WAIT_S) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


def poll_health(url: str, want: str, tries: int = 3000) -> tuple[int, str]:
    """GET ``url`` until its body contains ``want`` (bounded: ``tries`` x 20 ms plus answer times)."""
    status, body = 0, ""
    for _ in range(tries):
        status, body = http_get(url)
        if want in body:
            return status, body
        time.sleep(0.02)
    raise AssertionError(f"{url} never said {want!r}; last {status} {body!r}")


class StdioClient:
    """Blocking JSON-RPC over a subprocess's stdin/stdout."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        self.proc = proc
        self.ids = 0
        self.messages: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.notifications: list[dict[str, Any]] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        out = self.proc.stdout
        assert out is not None
        while True:
            length = None
            while True:
                line = out.readline()
                if not line:
                    self.messages.put(None)
                    return
                if line in (b"\r\n", b"\n"):
                    break
                m = re.match(rb"content-length:\s*(\d+)", line, re.IGNORECASE)
                if m:
                    length = int(m.group(1))
            if length is not None:
                self.messages.put(json.loads(out.read(length)))

    def send(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        body = json.dumps(msg).encode()
        self.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.proc.stdin.flush()

    def notify(self, method: str, params: Any) -> None:
        self.send({"jsonrpc": "2.0", "method": method, "params": params})

    def request(self, method: str, params: Any) -> int:
        self.ids += 1
        self.send({"jsonrpc": "2.0", "id": self.ids, "method": method, "params": params})
        return self.ids

    def response(self, rid: int, timeout: float = WAIT_S) -> dict[str, Any]:
        end = time.monotonic() + timeout
        while True:
            msg = self.messages.get(timeout=max(0.01, end - time.monotonic()))
            if msg is None:
                raise ConnectionError("the server closed stdout")
            if "method" in msg and "id" in msg:  # a server->client request: answer null
                self.send({"jsonrpc": "2.0", "id": msg["id"], "result": None})
            elif "method" in msg:
                self.notifications.append(msg)
            elif msg.get("id") == rid:
                return msg

    def call(self, method: str, params: Any, timeout: float = WAIT_S) -> dict[str, Any]:
        return self.response(self.request(method, params), timeout)

    def initialize(self, options: dict[str, Any] | None = None) -> dict[str, Any]:
        resp = self.call(
            "initialize", {"processId": None, "capabilities": {}, "initializationOptions": options or {}}
        )
        self.notify("initialized", {})
        return resp
