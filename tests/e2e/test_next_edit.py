"""Next-edit suggestions end to end in the real editors, against the fake server with a scripted next
edit (``SPECLS_FAKE_NEXT_EDIT``: the first ``3.14`` at or below the cursor's line becomes ``math.pi``):
after a change the next edit appears, the accept key jumps to it and then applies exactly it, and the
server counted it (``specls/stats``: shown and accepted)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import (
    REPO,
    Editors,
    clean_env,
    free_port,
    listening_server,
    run_nvim_script,
    run_vscode_driver,
)

pytestmark = pytest.mark.e2e

FAKE_SERVER = REPO / "tests" / "lsp" / "fake_server.py"
NVIM_SCRIPT = Path(__file__).with_name("nvim_next_edit_e2e.lua")
VSCODE_DRIVER = Path(__file__).with_name("vscode_next_edit_e2e.js")
RULE = "3.14=>math.pi"
SOURCE = "def area(r):\n    return 3.14 * r * r\n\n\ndef volume(r, h):\n    return 3.14 * r * r * h\n"
TIMEOUT_S = 60


# what the fake server needs: this checkout's tests importable, the scripted next edit
FAKE_SERVER_ENV = {"PYTHONPATH": str(REPO), "SPECLS_FAKE_NEXT_EDIT": RULE}


def fake_env(tmp: Path) -> dict[str, str]:
    env = clean_env(tmp)
    env.update(FAKE_SERVER_ENV)
    return env


def run_nvim(nvim: Path, tmp: Path, name: str) -> dict[str, object]:
    env = {
        **FAKE_SERVER_ENV,
        "SPECLS_E2E_TIMEOUT_MS": str(TIMEOUT_S * 1000),
        "SPECLS_E2E_CMD": json.dumps([sys.executable, str(FAKE_SERVER)]),
    }
    return run_nvim_script(nvim, NVIM_SCRIPT, tmp, name, ("shapes.py", SOURCE), env, timeout_s=TIMEOUT_S + 90)


def check_nvim(result: dict[str, object]) -> None:
    assert result["dismissed"] is True, "Esc did not dismiss the next edit"
    before = str(result["before"])
    assert before == "import math\n\n" + SOURCE.rstrip("\n")
    # the edit shown: line 3's constant (the buffer has two lines above the source now)
    shown = result["shown"]
    assert isinstance(shown, dict)
    assert shown["text"] == "math.pi"
    assert shown["range"] == {"start": {"line": 3, "character": 11}, "end": {"line": 3, "character": 15}}
    assert result["delete_hl"] == [3, 11, 3, 15], "the removed text is not highlighted"
    assert result["virt_lines"] == ["    return math.pi * r * r"], "the new line is not shown below"
    # the first press jumps to it, the second applies exactly it
    assert result["cursor_before"] == [2, 0]  # on `def area(r):`, which the inserted lines moved down
    assert result["jumped_to"] == [3, 11]
    assert result["after_jump"] == before
    assert result["after"] == before.replace("3.14", "math.pi", 1)
    stats = result["stats"]
    assert isinstance(stats, dict)
    counters = stats["server"]["next_edit"]
    assert counters["answered"] >= 2 and counters["shown"] >= 2 and counters["accepted"] == 1, counters
    assert counters["stale_dropped"] >= 0 and stats["server"]["errors"] == 0


def test_nvim011_next_edit(editors: Editors, tmp_path: Path) -> None:
    check_nvim(run_nvim(editors.nvim011, tmp_path, "nvim011-next-edit"))


def test_nvim012_next_edit(editors: Editors, tmp_path: Path) -> None:
    if editors.nvim012 is None:
        pytest.skip(editors.nvim012_skip)
    check_nvim(run_nvim(editors.nvim012, tmp_path, "nvim012-next-edit"))


@pytest.fixture
def fake_tcp_server(tmp_path: Path) -> Iterator[int]:
    """The fake server's TCP listener: the editor connects as a team client would, and the test reads
    the server's counters over a second connection."""
    port = free_port()
    cmd = [sys.executable, str(FAKE_SERVER), "--tcp", str(port)]
    env = fake_env(tmp_path / "server-env")
    with listening_server("the fake server", cmd, env, port, tmp_path / "fake-tcp.log", 60):
        yield port


def server_stats(port: int) -> dict[str, object]:
    from specls.lsp.cli import fetch_stats

    stats: dict[str, object] = asyncio.run(fetch_stats("127.0.0.1", port, 30))
    return stats


def test_vscode_next_edit(editors: Editors, fake_tcp_server: int, tmp_path: Path) -> None:
    result = run_vscode_driver(
        editors,
        VSCODE_DRIVER,
        tmp_path,
        "vscode-next-edit",
        {"shapes.py": SOURCE},
        TIMEOUT_S + 180,
        E2E_TEAM_SERVER=f"127.0.0.1:{fake_tcp_server}",
        E2E_TIMEOUT_MS=str(TIMEOUT_S * 1000),
    )
    # shown: the removed text struck through, the new text after it
    assert result["removed"] == "3.14", result
    assert "math.pi" in str(result["added"]), result
    after = str(result["after"])
    assert after == "import math\n" + SOURCE.replace("3.14", "math.pi", 1), after
    stats = server_stats(fake_tcp_server)
    counters = stats["server"]["next_edit"]  # type: ignore[index]
    assert counters["shown"] >= 1 and counters["accepted"] == 1, counters
