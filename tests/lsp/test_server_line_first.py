"""Line-first answers (``ServerSettings.line_first``) in one in-process session on the bundled
models: the first line at once, the whole block decoded in the background once nothing happens, and
any request or edit preempting that background decode."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from lsprotocol import types
from specls.lsp import continuation as continuation_module
from specls.lsp.job import Job
from specls.lsp.server import EngineHost, Session, SpeclsServer, create_server
from specls.lsp.settings import ServerSettings

from specls.engine import EngineSettings, OnnxEngine
from specls.team.fake import FakeEngine

from .lsp_helpers import inline_params
from .test_server_real import SOURCE, URI, Reference

CURSOR = (19, 15)  # after "return " at the end of the file: a multi-line context


@pytest.fixture(scope="module")
def reference() -> Reference:
    return Reference()


def offset_of(line: int, char: int) -> int:
    return sum(len(x) + 1 for x in SOURCE.split("\n")[:line]) + char


def open_session(line_first: bool = True) -> tuple[Session, EngineHost]:
    engine = OnnxEngine(EngineSettings(threads=1))
    host = EngineHost(engine)
    host.start_load().result(120)
    server = create_server(ServerSettings(max_tokens=24, line_first=line_first), engine, host=host)
    assert isinstance(server, SpeclsServer)
    session = server.session
    item = types.TextDocumentItem(uri=URI, language_id="python", version=1, text=SOURCE)
    session.did_open(types.DidOpenTextDocumentParams(text_document=item))
    return session, host


async def ask(session: Session, msg_id: int, line: int, char: int) -> str | None:
    params = inline_params(URI, line, char)
    session.request_arrived(msg_id, params)
    got = await session.complete(params)
    return None if got is None else got[0].text


async def until(check, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_first_line_then_the_block_once_idle(reference, monkeypatch):
    monkeypatch.setattr(continuation_module, "CONTINUE_AFTER_S", 0.01)
    first_line = reference.answer(SOURCE, offset_of(*CURSOR))
    block = reference.answer(SOURCE, offset_of(*CURSOR), line_first=False)
    assert first_line and block and "\n" in block and block.startswith(first_line)  # Not one line
    session, host = open_session()
    try:
        counters = host.counters
        assert await ask(session, 1, *CURSOR) == first_line  # the plain greedy answer, cut at its line
        await until(lambda: counters.continued == 1)
        assert counters.continuations == 1 and counters.continuations_preempted == 0
        # asked again at the cursor (or the line accepted): the whole block, not decoded again
        assert await ask(session, 2, *CURSOR) == block
        assert counters.continuations == 1  # Not another background decode: the answer was whole
    finally:
        host.close()


async def test_a_failed_background_decode_is_an_error_not_a_preemption(reference, monkeypatch):
    monkeypatch.setattr(continuation_module, "CONTINUE_AFTER_S", 0.01)
    session, host = open_session()
    try:
        counters = host.counters
        assert await ask(session, 1, *CURSOR) == reference.answer(SOURCE, offset_of(*CURSOR))

        def boom(self, request, cancelled=None):
            raise RuntimeError("engine broke")

        monkeypatch.setattr(OnnxEngine, "complete", boom)
        await until(lambda: counters.errors == 1)
        assert counters.continuations == 1
        assert counters.continuations_preempted == 0 and counters.continued == 0  # Not "preempted"
    finally:
        host.close()


async def test_a_request_before_the_pause_means_no_background_decode(reference, monkeypatch):
    monkeypatch.setattr(continuation_module, "CONTINUE_AFTER_S", 0.5)
    session, host = open_session()
    try:
        assert await ask(session, 1, *CURSOR) == reference.answer(SOURCE, offset_of(*CURSOR))
        params = inline_params(URI, 8, 15)  # mid-line: a one-line context, no block of its own
        session.request_arrived(2, params)  # within the pause: the block for (19, 15) never starts
        await session.complete(params)
        await asyncio.sleep(0.6)
        assert host.counters.continuations == 0
    finally:
        host.close()


async def test_line_first_off_waits_for_the_block(reference):
    session, host = open_session(line_first=False)
    try:
        assert await ask(session, 1, *CURSOR) == reference.answer(
            SOURCE, offset_of(*CURSOR), line_first=False
        )
        await asyncio.sleep(0.5)
        assert host.counters.continuations == 0
    finally:
        host.close()


async def test_a_next_edit_the_client_asked_for_is_not_preempted_by_a_block(reference, monkeypatch):
    """A completion answered line-first while a next edit waits for the engine: its block, due after
    the pause, must not cancel that edit (it was asked for; the block is speculation); it starts once
    the edit is answered."""
    monkeypatch.setattr(continuation_module, "CONTINUE_AFTER_S", 0.01)
    session, host = open_session()
    try:
        release = threading.Event()
        asked = Job(URI, None, inline_params(URI, 0, 0), None, started=time.monotonic())
        # the completion's answer comes first (the engine thread is free), then the edit is asked
        assert await ask(session, 1, *CURSOR) == reference.answer(SOURCE, offset_of(*CURSOR))
        edit = host.submit_background(asked, lambda: "edit" if not release.wait(30) else "done")
        assert host.asked_pending()
        await until(lambda: session.continuation.deferred)  # the block's pause is over
        assert not asked.cancelled and host.counters.continuations == 0  # Not preempted by the block
        release.set()
        assert edit.result(30) == "done" and not host.asked_pending()
        await until(lambda: host.counters.continuations == 1)  # Not lost: the block runs after it
        assert not session.continuation.deferred
    finally:
        host.close()


def test_preempt_cancels_the_background_work_and_only_it():
    host = EngineHost(OnnxEngine(EngineSettings()))
    try:
        started = threading.Event()
        background = Job(URI, None, inline_params(URI, 0, 0), None, started=time.monotonic())

        def work() -> str:
            started.set()
            return "preempted" if background.event.wait(30) else "ran out"

        future = host.submit_background(background, work)
        assert started.wait(30)
        host.preempt()
        assert future.result(30) == "preempted" and background.reason == "preempted"
        host.preempt()  # nothing left to cancel: a no-op
        second = Job(URI, None, inline_params(URI, 0, 0), None, started=time.monotonic())
        host.submit_background(second, lambda: None).result(30)
        third = Job(URI, None, inline_params(URI, 0, 0), None, started=time.monotonic())
        host.submit_background(third, lambda: None).result(30)
        assert second.cancelled and not third.cancelled  # one at a time: the newest replaces the last
    finally:
        host.close()


async def test_a_block_deferred_for_an_asked_edit_is_dropped_by_an_edit(reference, monkeypatch):
    monkeypatch.setattr(continuation_module, "CONTINUE_AFTER_S", 0.01)
    session, host = open_session()
    try:
        release = threading.Event()
        asked = Job(URI, None, inline_params(URI, 0, 0), None, started=time.monotonic())
        assert await ask(session, 1, *CURSOR) is not None
        edit = host.submit_background(asked, lambda: release.wait(30))
        await until(lambda: session.continuation.deferred)
        change = types.TextDocumentContentChangeWholeDocument(text=SOURCE + "x")
        session.did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=URI, version=2),
                content_changes=[change],
            )
        )
        release.set()
        edit.result(30)
        await asyncio.sleep(0.2)  # the edit's done-callback has had its turn on the loop
        assert host.counters.continuations == 0  # Not started: the document changed
    finally:
        host.close()


class InterruptCounting(FakeEngine):
    def __init__(self) -> None:
        super().__init__()
        self.interrupts = 0

    def interrupt(self) -> None:
        self.interrupts += 1


@pytest.mark.parametrize("asked", [True, False])
def test_preempting_a_running_next_edit_stops_its_pass_in_flight(asked):
    engine = InterruptCounting()
    host = EngineHost(engine)
    try:
        started, release = threading.Event(), threading.Event()
        running = Job(URI, None, inline_params(URI, 0, 0), None, started=time.monotonic())

        def work() -> None:
            started.set()
            release.wait(30)

        future = host.submit_background(running, work, asked=asked)
        assert started.wait(30)
        host.preempt()
        # a next edit's pass in flight is stopped; Not a block's (its finished pass can be typed through)
        assert running.cancelled and engine.interrupts == int(asked)
        release.set()
        future.result(30)
        done = Job(URI, None, inline_params(URI, 0, 0), None, started=time.monotonic())
        host.submit_background(done, lambda: None, asked=asked).result(30)
        host.preempt()
        assert done.cancelled and engine.interrupts == int(asked)  # no pass of it in flight to stop
    finally:
        release.set()
        host.close()


@pytest.mark.parametrize("event", ["request", "edit", "close"])
def test_a_request_an_edit_or_a_close_preempts_the_background_decode(event):
    session, host = open_session()
    try:
        background = Job(URI, None, inline_params(URI, 0, 0), None, started=time.monotonic())
        host.submit_background(background, lambda: None).result(30)
        if event == "request":
            session.request_arrived(1, inline_params(URI, 1, 0))
        elif event == "edit":
            change = types.TextDocumentContentChangeWholeDocument(text=SOURCE + "x")
            session.did_change(
                types.DidChangeTextDocumentParams(
                    text_document=types.VersionedTextDocumentIdentifier(uri=URI, version=2),
                    content_changes=[change],
                )
            )
        else:
            session.did_close(
                types.DidCloseTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=URI))
            )
        assert background.cancelled and background.reason == "preempted"
    finally:
        host.close()
