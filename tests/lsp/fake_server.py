"""Test-only server entry point: ``create_server`` with a deterministic fake Engine.

Run as ``python tests/lsp/fake_server.py [--tcp PORT]``. Behaviour from the environment:
SPECLS_FAKE_LOAD_MS (load time), SPECLS_FAKE_FAIL_LOAD (load raises EngineError with this text),
SPECLS_FAKE_PASS_MS (time per "target pass"), SPECLS_FAKE_TOKENS (passes per completion).

The completion for a request is ``fake_completion(prefix)``: a function of the text before the cursor,
so a test can tell which document version an answer was computed for.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
import zlib
from collections.abc import Callable

from specls.decoder.api import CancelCheck, DecodeResult, never_cancelled
from specls.lsp.server import EngineHost, create_server
from specls.lsp.settings import ServerSettings

from specls.api import (
    CompletionRequest,
    CompletionResult,
    EngineError,
    NextEditRequest,
    NextEditResult,
    no_next_edit,
)
from specls.next_edit.edits import Position, Region, TextEdit, split_lines


def fake_completion(prefix: str) -> str:
    return f"_{len(prefix)}_{zlib.crc32(prefix.encode('utf-8', 'replace')) % 9973}"


class FakeEngine:
    def __init__(
        self, load_ms: float = 0, fail: str = "", pass_ms: float = 0, tokens: int = 4, model: str = ""
    ) -> None:
        self.model = model
        self.load_ms = load_ms
        self.fail = fail
        self.pass_ms = pass_ms
        self.tokens = max(1, tokens)
        self._ready = False
        self.lock = threading.Lock()
        self.counts = {"complete": 0, "cancelled_seen": 0, "updates": 0, "closes": 0, "loads": 0}
        self.docs: dict[str, str] = {}
        self.next_edit_rule = os.environ.get("SPECLS_FAKE_NEXT_EDIT", "")

    def load(self, progress: Callable[[str, float], None] | None = None) -> None:
        self.counts["loads"] += 1
        steps = 4
        for i in range(steps):
            if progress:
                progress(f"step {i}", i / steps)
            time.sleep(self.load_ms / 1000 / steps)
        if self.fail:
            raise EngineError(self.fail)
        self._ready = True

    @property
    def ready(self) -> bool:
        return self._ready

    def update_document(self, doc_id: str, text: str) -> None:
        with self.lock:
            self.counts["updates"] += 1
            self.docs[doc_id] = text

    def close_document(self, doc_id: str) -> None:
        with self.lock:
            self.counts["closes"] += 1
            self.docs.pop(doc_id, None)

    def complete(
        self, request: CompletionRequest, cancelled: CancelCheck = never_cancelled
    ) -> CompletionResult:
        self.counts["complete"] += 1
        full = fake_completion(request.prefix)
        # reveal the text over self.tokens passes
        step = max(1, -(-len(full) // self.tokens))
        text = ""
        passes = 0
        for start in range(0, len(full), step):
            passes += 1
            if self.pass_ms:
                time.sleep(self.pass_ms / 1000)
            if cancelled():
                self.counts["cancelled_seen"] += 1
                return CompletionResult(text=text, tokens=passes, stop_reason="cancelled", cancelled=True)
            text = full[: start + step]
            if request.stop is not None:
                keep = request.stop(text)
                if keep is not None:
                    return CompletionResult(text=text[:keep], tokens=passes, stop_reason="stop")
        return CompletionResult(
            text=text,
            tokens=passes,
            stop_reason="eos",
            decode=DecodeResult(tokens=[], prefill_tokens=len(request.prefix)),
        )

    def next_edit(self, request: NextEditRequest, cancelled: CancelCheck = never_cancelled) -> NextEditResult:
        """Scripted by ``next_edit_rule`` ("old=>new", env ``SPECLS_FAKE_NEXT_EDIT``): the first
        ``old`` at or below the cursor's line becomes ``new``; no rule or no match: no edit."""
        self.counts["next_edit"] = self.counts.get("next_edit", 0) + 1
        if self.pass_ms:
            time.sleep(self.pass_ms / 1000)
        if cancelled():
            return no_next_edit(request, "cancelled", provider="fake")
        old, sep, new = self.next_edit_rule.partition("=>")
        lines = split_lines(request.text)
        for n in range(max(0, request.line), len(lines)) if sep and old else ():
            col = lines[n].find(old)
            if col >= 0:
                start = len(lines[n][:col].encode("utf-16-le")) // 2
                end = start + len(old.encode("utf-16-le")) // 2
                edit = TextEdit(Position(n, start), Position(n, end), new)
                rewritten = lines[n][:col] + new + lines[n][col + len(old) :]
                return NextEditResult((edit,), Region(n, n + 1), rewritten, tokens=1, provider="fake")
        return no_next_edit(request, "unchanged", provider="fake")

    def interrupt(self) -> None:
        """A fake has no passes to stop."""

    def stats(self) -> dict[str, object]:
        with self.lock:
            return {**self.counts, "docs": sorted(self.docs), "model": self.model}


def engine_from_env(settings: ServerSettings | None = None) -> FakeEngine:
    env = os.environ
    return FakeEngine(
        model=(settings.model or "") if settings else "",
        load_ms=float(env.get("SPECLS_FAKE_LOAD_MS", "0")),
        fail=env.get("SPECLS_FAKE_FAIL_LOAD", ""),
        pass_ms=float(env.get("SPECLS_FAKE_PASS_MS", "0")),
        tokens=int(env.get("SPECLS_FAKE_TOKENS", "4")),
    )


def main(argv: list[str]) -> int:
    import logging

    logging.basicConfig(level=os.environ.get("SPECLS_FAKE_LOG", "WARNING"), stream=sys.stderr)
    from specls.lsp.transport import serve_stdio

    from specls.team.listener import Listener

    settings = ServerSettings()
    if len(argv) >= 2 and argv[0] == "--tcp":  # the TCP listener of `specls serve --tcp`, no team service
        port = int(argv[1])
        host = EngineHost(engine_from_env())
        host.start_load()
        listener = Listener(host, lambda h: create_server(settings, h.engine, host=h))

        def ready(bound: int) -> None:
            print(f"listening {bound}", file=sys.stderr, flush=True)

        asyncio.run(listener.serve("127.0.0.1", port, ready))
        return 0
    return serve_stdio(create_server(settings, engine_from_env(), factory=engine_from_env))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
