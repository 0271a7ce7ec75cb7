"""Every test gets its own XDG cache dir, so that state specls keeps per machine (the drafting
policy's pass costs, specls.pass_costs_cache) never carries from one test, or one run, to the next.

Module- and session-scoped fixtures (an engine loaded once per module) are set up before any
function-scoped fixture, so the whole session first gets a dir of its own: nothing a test run does
reaches the user's ``~/.cache``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session", autouse=True)
def _session_xdg_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache-session")))
        yield


@pytest.fixture(autouse=True)
def _own_xdg_cache(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
