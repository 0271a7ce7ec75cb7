"""The session's next-edit wiring in process: didOpen/didChange/didClose feed the edit history, and a
request hands it to the engine (the history, the edit not to undo, the other open files); the
engine's edits become one item."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from lsprotocol import types
from specls.decoder.api import CancelCheck, never_cancelled
from specls.lsp.documents import Document
from specls.lsp.next_edit_feature import merged_edit
from specls.lsp.server import EngineHost, SpeclsServer, create_server
from specls.lsp.settings import ServerSettings

from specls.api import NextEditRequest, NextEditResult
from specls.next_edit.edits import Position, TextEdit

from .fake_server import FakeEngine

URI = "file:///w/pkg/a.py"
OTHER = "file:///w/pkg/b.py"
TEXT = "def f(a, b):\n    return a + b\n\n\ndef g(a, b):\n    return a * b\n"


class RecordingEngine(FakeEngine):
    def __init__(self) -> None:
        super().__init__()
        self.next_edit_rule = "a, b=>x, y"
        self.requests: list[NextEditRequest] = []

    def next_edit(self, request: NextEditRequest, cancelled: CancelCheck = never_cancelled) -> NextEditResult:
        self.requests.append(request)
        return super().next_edit(request, cancelled)


def session_with(engine: RecordingEngine) -> Any:
    host = EngineHost(engine)
    host.start_load().result(30)
    server = create_server(ServerSettings(), engine, host=host)
    assert isinstance(server, SpeclsServer)
    return server.session


def open_doc(session: Any, uri: str, text: str, version: int = 1) -> None:
    item = types.TextDocumentItem(uri=uri, language_id="python", version=version, text=text)
    session.did_open(types.DidOpenTextDocumentParams(text_document=item))


def type_at(session: Any, uri: str, version: int, line: int, character: int, text: str) -> None:
    pos = types.Position(line=line, character=character)
    change = types.TextDocumentContentChangePartial(range=types.Range(start=pos, end=pos), text=text)
    session.did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[change],
        )
    )


def params(uri: str, version: int | None, line: int, character: int) -> dict[str, Any]:
    doc: dict[str, Any] = {"uri": uri} if version is None else {"uri": uri, "version": version}
    return {"textDocument": doc, "position": {"line": line, "character": character}}


async def test_the_request_carries_the_edit_history_of_every_open_document() -> None:
    engine = RecordingEngine()
    session = session_with(engine)
    open_doc(session, URI, TEXT)
    open_doc(session, OTHER, "x = 1\n")
    type_at(session, OTHER, 2, 0, 5, "0")  # x = 10
    version = 1
    for i, ch in enumerate("c, "):  # def f(c, a, b): typed key by key: one hunk
        version += 1
        type_at(session, URI, version, 0, 6 + i, ch)
    answer = await session.next_edits.request(params(URI, version, 0, 9))
    (request,) = engine.requests
    assert request.text == TEXT.replace("f(a, b)", "f(c, a, b)")
    assert (request.line, request.character, request.path) == (0, 9, "/w/pkg/a.py")
    assert [(d.path, d.old, d.new) for d in request.history] == [
        ("/w/pkg/b.py", "x = 1\n", "x = 10\n"),
        ("/w/pkg/a.py", "def f(a, b):\n", "def f(c, a, b):\n"),
    ]
    assert request.last_edit is not None
    assert (request.last_edit.start_line, request.last_edit.new) == (0, "def f(c, a, b):\n")
    assert [uri for uri, _ in request.context_docs] == [OTHER]
    (item,) = answer["edits"]
    assert item["textDocument"] == {"uri": URI, "version": version}
    assert item["text"] == "x, y"
    # closing a document drops its edits from the history
    session.did_close(types.DidCloseTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=OTHER)))
    await session.next_edits.request(params(URI, None, 0, 0))  # no version: taken as the current one
    assert [d.path for d in engine.requests[-1].history] == ["/w/pkg/a.py"]
    assert engine.requests[-1].context_docs == ()


class ConfidentEngine(RecordingEngine):
    """Its edits come with the confidence the engine measured on them."""

    def next_edit(self, request: NextEditRequest, cancelled: CancelCheck = never_cancelled) -> NextEditResult:
        result = super().next_edit(request, cancelled)
        return replace(result, confidence=3.14159) if result.edits else result


async def test_a_shown_edit_carries_its_confidence() -> None:
    session = session_with(ConfidentEngine())
    open_doc(session, URI, TEXT)
    (item,) = (await session.next_edits.request(params(URI, 1, 0, 0)))["edits"]
    assert item["confidence"] == 3.142 and item["text"] == "x, y"
    plain = session_with(RecordingEngine())  # none measured: no field
    open_doc(plain, URI, TEXT)
    (item,) = (await plain.next_edits.request(params(URI, 1, 0, 0)))["edits"]
    assert "confidence" not in item


async def test_not_ready_and_languages_answer_empty() -> None:
    engine = RecordingEngine()
    host = EngineHost(engine)  # never loaded
    server = create_server(ServerSettings(languages=("lua",)), engine, host=host)
    session = server.session  # type: ignore[attr-defined]
    open_doc(session, URI, TEXT)
    assert await session.next_edits.request(params(URI, 1, 0, 0)) == {"edits": []}
    host.start_load().result(30)
    assert await session.next_edits.request(params(URI, 1, 0, 0)) == {"edits": []}  # python not enabled
    assert engine.requests == []
    counters = host.counters.next_edit
    assert (counters.not_ready, counters.empty, counters.requests) == (1, 1, 2)


def test_merged_edit_spans_the_edits_and_keeps_the_text_between() -> None:
    doc = Document(URI, "python", 1, TEXT)
    first = TextEdit(Position(0, 6), Position(0, 7), "c")
    second = TextEdit(Position(1, 11), Position(1, 12), "c")
    found = merged_edit(doc, [second, first])
    assert found is not None
    rng, text = found
    assert (rng.start.line, rng.start.character, rng.end.line, rng.end.character) == (0, 6, 1, 12)
    assert text == "c, b):\n    return c"
    insertion = merged_edit(doc, [TextEdit(Position(2, 0), Position(2, 0), "# x\n")])
    assert insertion is not None and insertion[1] == "# x\n"
    assert merged_edit(doc, [TextEdit(Position(9, 0), Position(9, 1), "z")]) is None  # not in the document
    overlapping = [
        TextEdit(Position(0, 0), Position(0, 5), "a"),
        TextEdit(Position(0, 3), Position(0, 6), "b"),
    ]
    assert merged_edit(doc, overlapping) is None
    assert merged_edit(doc, []) is None
