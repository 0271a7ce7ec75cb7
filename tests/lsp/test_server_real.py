"""End-to-end tests of `specls serve` with the real bundled model pair (stdio and TCP)."""

from __future__ import annotations

import asyncio
import os
import subprocess
from functools import partial

import pytest
from lsprotocol import types
from specls.decoder.api import CompletionRequest
from specls.lsp.cli import fetch_stats, make_engine
from specls.lsp.postprocess import finalize, make_context, stop_point
from specls.lsp.settings import ServerSettings

from .lsp_helpers import SPECLS, inline, open_doc, stats, stdio_client, tcp_client, tcp_server, wait_state

pytestmark = pytest.mark.slow

URI = "file:///work/shapes.py"
SOURCE = """import math


class Circle:
    def __init__(self, radius):
        self.radius = radius

    def area(self):
        return math.pi * self.radius ** 2

    def perimeter(self):
        return 2 * math.pi * self.radius


class Square:
    def __init__(self, side):
        self.side = side

    def area(self):
        return """
# cursors: (line, character) of real positions in SOURCE
CURSORS = [(19, 15), (16, 24), (11, 15)]


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["OMP_NUM_THREADS"] = "1"
    return e


def serve_cmd(*extra: str) -> list[str]:
    return [SPECLS, "serve", "--threads", "1", "--max-tokens", "24", *extra]


def expected_completions() -> dict[tuple[int, int], str | None]:
    """What the server must answer: post-processed plain greedy decoding of the same engine."""
    engine = make_engine(ServerSettings(threads=1, drafting=False))
    engine.load()
    engine.update_document(URI, SOURCE)
    lines = SOURCE.split("\n")
    out: dict[tuple[int, int], str | None] = {}
    for line, char in CURSORS:
        offset = sum(len(x) + 1 for x in lines[:line]) + char
        prefix, suffix = SOURCE[:offset], SOURCE[offset:]
        ctx = make_context(prefix, suffix)
        request = CompletionRequest(
            doc_id=URI, prefix=prefix, suffix=suffix, max_tokens=24, stop=partial(stop_point, ctx)
        )
        result = engine.complete(request)
        done = finalize(ctx, result.text, truncated=result.stop_reason == "max_tokens")
        out[(line, char)] = None if done is None else done.text
    return out


@pytest.fixture(scope="module")
def expected() -> dict[tuple[int, int], str | None]:
    return expected_completions()


async def test_real_completion_over_stdio(expected):
    async with stdio_client(serve_cmd(), env()) as (client, init):
        assert init is not None and init.capabilities.inline_completion_provider is not None
        await wait_state(client, ("ready", "failed"))
        s = await stats(client)
        assert s["server"]["state"] == "ready", s["server"]["error"]
        open_doc(client, URI, SOURCE)
        answers = {}
        for line, char in CURSORS:
            items = await inline(client, URI, line, char)
            answers[(line, char)] = items[0].insert_text if items else None
        # speculative decoding in the server == plain greedy here, token for token
        assert answers == expected
        assert any(a for a in answers.values()), "no real cursor got a completion"
        s = await stats(client)
        assert s["server"]["engine_calls"] == len(CURSORS) and s["engine"]


async def test_real_completion_over_tcp_and_stats_command(expected):
    async with tcp_server(serve_cmd("--tcp", "127.0.0.1:0"), env()) as (port, _proc):
        async with tcp_client(port) as client:
            await wait_state(client, ("ready", "failed"))
            open_doc(client, URI, SOURCE)
            line, char = next(c for c in CURSORS if expected[c])
            items = await inline(client, URI, line, char)
            assert items and items[0].insert_text == expected[(line, char)]
            s = await fetch_stats("127.0.0.1", port)
            assert s["server"]["answered"] >= 1
        # `specls stats --tcp` as a process prints the JSON
        out = await asyncio.get_running_loop().run_in_executor(
            None,
            lambda: subprocess.run(
                [SPECLS, "stats", "--tcp", f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=60
            ),
        )
        assert out.returncode == 0, out.stderr
        assert '"answered": 1' in out.stdout


async def test_missing_model_one_message_then_empty(tmp_path):
    missing = str(tmp_path / "no-such-model")
    async with stdio_client(serve_cmd("--model", missing), env()) as (client, _):
        await wait_state(client, ("failed",))
        open_doc(client, URI, SOURCE)
        for line, char in CURSORS:
            assert await inline(client, URI, line, char) == []
        await stats(client)
        errors = [m for m in client.messages if m.type == types.MessageType.Error]
        assert len(errors) == 1
        assert "no-such-model" in errors[0].message
