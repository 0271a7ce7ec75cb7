"""The worked examples in the docstrings of bench/scripts' analysis scripts hold (their pure parts:
candidate matching, replay, data shares), so a diagnostic that a results file quotes still computes
what its docstring says."""

from __future__ import annotations

import doctest
import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "bench" / "scripts"


@pytest.mark.parametrize("name", ["candidate_oracle", "head_data_scaling", "head_needed"])
def test_docstring_examples(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(SCRIPTS))  # the scripts import each other by file name
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, mod)
    spec.loader.exec_module(mod)
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no worked example"
    assert result.failed == 0
