"""``specls datastore build|list`` and finding a datastore again for a model's tokenizer."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from specls.models.loader import bundled_dir
from specls.models.tokenizer import Tokenizer

from specls.cli import main
from specls.datastore_cache import corpus_files, datastore_dir, open_datastore, tokenizer_key


@pytest.fixture
def corpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("SPECLS_CACHE", raising=False)
    folder = tmp_path / "lib"
    (folder / "tests").mkdir(parents=True)
    (folder / "shapes.py").write_text("def area(width, height):\n    return width * height\n" * 3)
    (folder / "more.py").write_text("import math\n\ndef circle(r):\n    return math.pi * r * r\n")
    return folder


def _tokenizer() -> Tokenizer:
    return Tokenizer.from_file(bundled_dir("target") / "tokenizer.json")


def test_build_then_the_engine_finds_it_by_corpus(corpus: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["datastore", "build", "--from", str(corpus)]) == 0
    out = capsys.readouterr().out
    assert "2 files" in out and "MiB" in out
    tok = _tokenizer()
    where = datastore_dir(str(corpus), tokenizer_key(tok))
    assert (where / "datastore.json").is_file()
    store = open_datastore(str(corpus), tok)
    assert store is not None and store.documents == 2
    m = store.match(tok.encode("def circle(r):\n    return math"), 6)
    assert m is not None and tok.decode(m.tokens).startswith(".pi")
    assert open_datastore(str(where), tok) is not None  # or by its folder
    assert main(["datastore", "list"]) == 0
    assert "from " + str(corpus) in capsys.readouterr().out


def test_a_missing_datastore_warns_with_the_command(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert open_datastore("stdlib", _tokenizer()) is None
    assert "specls datastore build --from stdlib" in caplog.text


def test_stdlib_leaves_its_tests_out() -> None:
    files = corpus_files("stdlib")
    assert files and not any("test" in p.parts[:-1] for p in files)
    with pytest.raises(ValueError, match="not stdlib"):
        corpus_files("/no/such/folder")
