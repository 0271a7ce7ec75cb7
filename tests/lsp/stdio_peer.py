"""A raw client for a server subprocess on stdio: bytes in, responses out by id, with a bound on waiting
(a response that never comes fails the test instead of hanging it)."""

from __future__ import annotations

import json
import subprocess
import threading
from typing import Any

from .lsp_helpers import ROOT, RawConnection, raw_stdio


class StdioPeer:
    def __init__(self, cmd: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            cmd, env=env, cwd=str(ROOT), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        self.conn: RawConnection = raw_stdio(self.proc)
        self.messages: list[dict[str, Any]] = []
        self.eof = False
        self._cond = threading.Condition()
        self._stderr: list[bytes] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._drain_stderr, daemon=True).start()

    def _read(self) -> None:
        try:
            while True:
                msg = self.conn.read()
                with self._cond:
                    self.messages.append(msg)
                    self._cond.notify_all()
        except (EOFError, OSError, ValueError):
            with self._cond:
                self.eof = True
                self._cond.notify_all()

    def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line)

    @property
    def stderr(self) -> str:
        return b"".join(self._stderr[-50:]).decode("utf-8", "replace")

    def write(self, data: bytes) -> None:
        self.conn.write(data)

    def send(self, message: dict[str, Any]) -> None:
        self.write(encode(message))

    def response(self, msg_id: Any, timeout: float = 60) -> dict[str, Any]:
        """The response to ``msg_id``; fails when the server ends or ``timeout`` passes first."""
        with self._cond:
            found = self._cond.wait_for(lambda: self._find(msg_id) is not None or self.eof, timeout)
            msg = self._find(msg_id)
        if msg is None:
            why = "the server closed its stdout" if found else f"no response in {timeout} s"
            raise AssertionError(f"no response to {msg_id!r}: {why}; stderr:\n{self.stderr}")
        return msg

    def _find(self, msg_id: Any) -> dict[str, Any] | None:
        for m in self.messages:
            if "method" not in m and m.get("id") == msg_id:
                return m
        return None

    def errors(self) -> list[dict[str, Any]]:
        with self._cond:
            return [m for m in self.messages if "error" in m]

    def close(self) -> int:
        """Shut down and exit; the exit code."""
        self.send({"jsonrpc": "2.0", "id": "bye", "method": "shutdown"})
        assert "result" in self.response("bye")
        self.send({"jsonrpc": "2.0", "method": "exit"})
        return self.proc.wait(60)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def encode(message: dict[str, Any]) -> bytes:
    body = json.dumps(message).encode()
    return b"Content-Length: %d\r\n\r\n" % len(body) + body
