"""End-to-end tests of `specls serve` with the real bundled model pair (stdio and TCP)."""

from __future__ import annotations

import asyncio
import os
import subprocess
from functools import partial

import pytest
from lsprotocol import types
from pygls.exceptions import JsonRpcRequestCancelled
from specls.lsp.cli import fetch_stats, make_engine
from specls.lsp.postprocess import finalize, first_line_point, make_context, stop_point
from specls.lsp.settings import ServerSettings

from specls.api import CompletionRequest
from specls.engine import OnnxEngine

from .lsp_helpers import (
    SPECLS,
    inline,
    inline_params,
    insert,
    open_doc,
    stats,
    stdio_client,
    tcp_client,
    tcp_server,
    wait_state,
)

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


class Reference:
    """What the server must answer: post-processed plain greedy decoding (no speculation) of the
    same models, computed in this process."""

    def __init__(self) -> None:
        engine = make_engine(ServerSettings(threads=1, speculation=False))
        assert isinstance(engine, OnnxEngine)
        engine.load()
        self.engine = engine

    def answer(self, text: str, offset: int, uri: str = URI, line_first: bool = True) -> str | None:
        # a fresh engine on the loaded models: a block another answer decoded at this cursor would
        # be replayed whole (as the server would), and the answer must not depend on their order
        engine = self.engine.with_settings(self.engine.settings)
        engine.update_document(uri, text)
        prefix, suffix = text[:offset], text[offset:]
        ctx = make_context(prefix, suffix)
        early = partial(first_line_point, ctx) if line_first and ctx.multiline else None
        request = CompletionRequest(
            doc_id=uri,
            prefix=prefix,
            suffix=suffix,
            max_tokens=24,
            stop=partial(stop_point, ctx),
            early_stop=early,
        )
        result = engine.complete(request)
        done = finalize(ctx, result.text, truncated=result.stop_reason == "max_tokens")
        return None if done is None else done.text


@pytest.fixture(scope="module")
def reference() -> Reference:
    return Reference()


def expected_completions(reference: Reference, line_first: bool = True) -> dict[tuple[int, int], str | None]:
    lines = SOURCE.split("\n")
    out: dict[tuple[int, int], str | None] = {}
    for line, char in CURSORS:
        offset = sum(len(x) + 1 for x in lines[:line]) + char
        out[(line, char)] = reference.answer(SOURCE, offset, line_first=line_first)
    return out


@pytest.fixture(scope="module")
def expected(reference: Reference) -> dict[tuple[int, int], str | None]:
    return expected_completions(reference)


@pytest.mark.parametrize("line_first", [True, False])
async def test_real_completion_over_stdio(reference, line_first):
    expected = expected_completions(reference, line_first)
    if line_first:  # Not the blocks: a line-first answer stops at its first line
        assert expected != expected_completions(reference, line_first=False)
    flags = () if line_first else ("--no-line-first",)
    async with stdio_client(serve_cmd(*flags), env()) as (client, init):
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


EMOJI = "\U0001f600"


async def test_real_utf16_storm_cancel_and_bad_positions(reference):
    async with stdio_client(serve_cmd(), env()) as (client, _):
        await wait_state(client, ("ready",))
        # UTF-16: emoji before the cursor; the answer must be the one for exactly this prefix
        text = f'label = "{EMOJI} ok"\nprint(label)\ndef show(items):\n    for item in '
        uri = "file:///work/emoji.py"
        open_doc(client, uri, text)
        last = text.split("\n")[-1]
        items = await inline(client, uri, 3, len(last))
        want = reference.answer(text, len(text), uri)
        assert (items[0].insert_text if items else None) == want
        # out of range: empty, no error
        assert await inline(client, uri, 40, 0) == []
        assert await inline(client, uri, 0, 10) == []  # inside the emoji's surrogate pair
        # a storm of keystrokes with requests in between: every answer is for its own version
        typed = "items:\n        total = total + item.price * item.count  # running sum\n"
        pending = []
        version, line, col = 1, 3, len(last)
        for i, ch in enumerate(typed):
            version += 1
            insert(client, uri, version, line, col, ch)
            text += ch
            line, col = (line + 1, 0) if ch == "\n" else (line, col + 1)
            if i % 7 == 6 or i == len(typed) - 1:
                fut = asyncio.ensure_future(
                    client.text_document_inline_completion_async(inline_params(uri, line, col))
                )
                pending.append((fut, text))
        results = [await asyncio.wait_for(f, 120) for f, _ in pending]
        for result, snapshot in zip(results, [t for _, t in pending], strict=True):
            got = list(result.items) if isinstance(result, types.InlineCompletionList) else []
            if got:
                assert got[0].insert_text == reference.answer(snapshot, len(snapshot), uri)
        s = await stats(client)
        assert s["server"]["requests"] == 3 + len(pending)
        # $/cancelRequest right after sending: it returns (cancelled or answered), the server goes on
        fut = asyncio.ensure_future(
            client.protocol.send_request_async(
                types.TEXT_DOCUMENT_INLINE_COMPLETION, inline_params(uri, line, col), msg_id="real-cancel"
            )
        )
        await asyncio.sleep(0)
        client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id="real-cancel"))
        try:
            await asyncio.wait_for(fut, 120)
        except JsonRpcRequestCancelled:
            pass
        assert (await stats(client))["server"]["state"] == "ready"
