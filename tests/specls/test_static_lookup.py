"""The engine drafting from the workspace's files not open and from a code datastore: the output is
plain greedy's, and what the sources hold is drafted (fake models, a character tokenizer)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from specls.api import CompletionRequest
from specls.engine import EngineSettings, OnnxEngine
from specls.workspace_index import build_workspace
from tests.specls.fakes import SOURCE, fake_models

POS = SOURCE.index("print(total)")


def _request(doc: str) -> CompletionRequest:
    return CompletionRequest(doc_id=doc, prefix=SOURCE[:POS], suffix=SOURCE[POS:], max_tokens=48)


def _reference_text() -> tuple[list[int], str]:
    """Plain greedy's completion at POS and the file text that holds it (for a source to copy)."""
    models = fake_models(allow_eos=False)
    plain = OnnxEngine(EngineSettings(speculation=False), models)
    plain.complete(_request("file:///elsewhere/a.py"))
    tokens = list(plain.last_tokens)
    return tokens, SOURCE[:POS] + models.tokenizer.decode(tokens)


def _project(tmp_path: Path, text: str) -> Path:
    root = tmp_path / "proj"
    (root / ".git").mkdir(parents=True)
    (root / "other.py").write_text(text)  # a file of the project, not open
    return root


def _run(settings: EngineSettings, doc: str, wait_for_workspace: bool = False) -> tuple[list[int], int]:
    engine = OnnxEngine(settings, fake_models(allow_eos=False))
    engine.update_document(doc, SOURCE)
    if wait_for_workspace:
        engine.complete(_request(doc))  # the first request starts the index (it needs the tokenizer)
        static = engine._docs.static
        assert static is not None and static.workspace is not None
        static.workspace.join(30)
        engine = engine.with_settings(settings)  # a fresh engine: no completion cache, no type-ahead
        engine._docs.static = static  # the same sources, now indexed
        engine.update_document(doc, SOURCE)
    r = engine.complete(_request(doc))
    return list(engine.last_tokens), r.accepted


@pytest.mark.parametrize("draft_model", [False, True])
def test_drafting_from_the_workspace_equals_plain_and_copies_from_it(
    tmp_path: Path, draft_model: bool
) -> None:
    ref, text = _reference_text()
    root = _project(tmp_path, text)
    doc = (root / "a.py").as_uri()
    base = EngineSettings(draft_model=draft_model, completion_reuse=False, lru_size=0, type_ahead=False)
    buffers_only, accepted_buffers = _run(base, doc)
    with_ws, accepted_ws = _run(replace(base, workspace=True), doc, True)
    assert buffers_only == ref and with_ws == ref  # Not a drafter's guess
    if not draft_model:
        assert accepted_ws > accepted_buffers  # the workspace held the continuation


def test_drafting_from_datastores_equals_plain_and_copies_from_them(tmp_path: Path) -> None:
    ref, text = _reference_text()
    tok = fake_models().tokenizer
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "x.py").write_text(text)
    build_workspace([tmp_path / "lib" / "x.py"], tok).save(tmp_path / "store")
    base = EngineSettings(draft_model=False, completion_reuse=False, lru_size=0, type_ahead=False)
    _, accepted_buffers = _run(base, "a.py")
    missing_then_store = f"{tmp_path / 'none'},{tmp_path / 'store'}"  # a missing one is skipped
    with_ds, accepted_ds = _run(replace(base, datastore=missing_then_store), "a.py")
    assert with_ds == ref
    assert accepted_ds > accepted_buffers


def test_stats_say_what_each_source_holds(tmp_path: Path) -> None:
    tok = fake_models().tokenizer
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "x.py").write_text(SOURCE)
    build_workspace([tmp_path / "lib" / "x.py"], tok).save(tmp_path / "store")
    plain = OnnxEngine(EngineSettings(), fake_models())
    assert plain.stats()["lookup_sources"] is None  # the buffers only: nothing to report
    engine = OnnxEngine(EngineSettings(datastore=str(tmp_path / "store")), fake_models())
    engine.update_document("a.py", SOURCE)
    engine.complete(_request("a.py"))  # the first drafting request opens the sources
    sources = engine.stats()["lookup_sources"]
    assert isinstance(sources, dict) and "datastore_open_ms" in sources
    assert any(isinstance(v, dict) and v.get("tokens", 0) > 0 for v in sources.values()), sources
