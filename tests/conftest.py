"""Every test gets its own XDG cache dir, so that state specls keeps per machine (the drafting
policy's pass costs, specls.pass_costs_cache) never carries from one test, or one run, to the next."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _own_xdg_cache(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
