"""No test reaches the user's cache dir: not even a module-scoped fixture, which pytest sets up before
any function-scoped one (tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specls.pass_costs_cache import default_path


@pytest.fixture(scope="module")
def module_cache_path() -> Path:
    return default_path()  # where an engine loaded by a module fixture keeps its pass costs


def test_module_fixture_cache_is_the_sessions(
    module_cache_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    base = tmp_path_factory.getbasetemp().resolve()
    assert module_cache_path.resolve().is_relative_to(base), module_cache_path  # not ~/.cache/specls/...


def test_each_test_has_its_own_cache(
    module_cache_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    here = default_path()
    assert here.resolve().is_relative_to(tmp_path_factory.getbasetemp().resolve())
    assert here != module_cache_path  # the function-scoped dir, not the session's
