"""Real VS Code (code-server 4.139.1 in Debian's Chromium, driven by playwright-core) with the packaged
.vsix against a real `specls serve` and the bundled model: open a Python file from the Explorer, type,
ghost text appears, Tab accepts, the saved file contains it. Screenshots go to test-artifacts/."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.e2e.conftest import (
    ARTIFACTS,
    GHOST_TIMEOUT_S,
    HUB_MODEL,
    PY_SOURCE,
    PY_TYPED,
    Editors,
    TcpServer,
    hub_env,
    run_vscode_driver,
)

pytestmark = pytest.mark.e2e

DRIVER = Path(__file__).with_name("vscode_e2e.js")


def squash(text: str) -> str:
    """Whitespace-insensitive form (the DOM renders indentation and line breaks its own way)."""
    return "".join(text.split())


# by-name: specls.model names a model on a local hub (a fresh cache): the status bar shows it being
# prepared, then the same ghost text and Tab
@pytest.mark.parametrize("transport", ["stdio", "tcp", "by-name"])
def test_vscode_ghost_text_and_tab(
    editors: Editors, specls_bin: Path, tmp_path: Path, transport: str, request: pytest.FixtureRequest
) -> None:
    team_server = ""
    if transport == "tcp":  # specls.teamServer: the extension connects to a shared `specls serve --tcp`
        server: TcpServer = request.getfixturevalue("tcp_server")
        team_server = f"{server.host}:{server.port}"
    by_name: dict[str, str] = {}
    if transport == "by-name":
        by_name = {"E2E_MODEL": HUB_MODEL, **hub_env(request.getfixturevalue("model_hub"), tmp_path)}
    result = run_vscode_driver(
        editors,
        DRIVER,
        tmp_path,
        f"vscode-{transport}",
        {"stack.py": PY_SOURCE, "notes.txt": "plain text: no completions here\n"},
        GHOST_TIMEOUT_S + 180,
        SPECLS_BIN=str(specls_bin),
        E2E_OTHER_FILE="notes.txt",
        E2E_TYPE=PY_TYPED,
        E2E_TIMEOUT_MS=str(int(GHOST_TIMEOUT_S * 1000)),
        E2E_TEAM_SERVER=team_server,
        E2E_TAG=f"vscode-{transport}",
        **by_name,
    )

    assert Path(str(result["screenshot"])).is_file()
    if transport == "by-name":
        seen = [str(t) for t in result["status_seen"]]  # type: ignore[attr-defined]
        assert any(re.search(r"specls: downloading \d+%$", t) for t in seen), seen
        assert any("specls: converting: " in t for t in seen), seen
    ghost_inline = "".join(result["ghost_inline"])  # type: ignore[arg-type]
    ghost_below = "".join(result["ghost_below"])  # type: ignore[arg-type]
    assert ghost_inline.strip() or ghost_below.strip(), "ghost text elements were empty"

    after = str(result["after"])
    typed = PY_SOURCE + PY_TYPED
    assert after.startswith(typed), f"the saved file does not start with what was typed: {after!r}"
    inserted = after[len(typed) :]
    assert inserted.strip(), f"Tab inserted nothing: {after!r}"
    first, _, rest = inserted.partition("\n")
    # what was shown at the cursor is what Tab inserted: the first line exactly, the lines below
    # (rendered in a view zone) up to whitespace
    assert first == ghost_inline, (first, ghost_inline)
    assert squash(rest) == squash(ghost_below), (rest, ghost_below)

    # the status bar tooltip: live stats, and the accept reported to the server (specls/accepted)
    tooltip = str(result["tooltip"])
    # (a tiny random model given by name may never have a draft accepted: n/a)
    rate = r"(\d+(\.\d)?%|n/a)" if transport == "by-name" else r"\d+(\.\d)?%"
    assert re.search(rf"draft acceptance rate: {rate}", tooltip), tooltip
    assert re.search(r"p50 latency: \d+ ms", tooltip), tooltip
    assert re.search(r"suggestions accepted: [1-9]\d* of [1-9]", tooltip), tooltip
    # a plain-text file (not in specls.enabledLanguages): disabled there, ready again in the Python file
    assert result["disabled_shown"] is True
    assert result["ready_again"] is True

    # every setting the extension sent (its initializationOptions) is one the server knows, with a
    # valid value: the server logs each problem as "specls settings: ..." (window/logMessage)
    client_log = ARTIFACTS / f"vscode-{transport}-specls.log"
    assert "specls: model loaded" in client_log.read_text(), client_log
    assert "specls settings:" not in client_log.read_text(), client_log.read_text()[-2000:]


def test_vscode_reports_missing_server(editors: Editors, tmp_path: Path) -> None:
    """specls.serverPath pointing nowhere: an error status and a notification that names the setting."""
    result = run_vscode_driver(
        editors,
        DRIVER,
        tmp_path,
        "vscode-missing-server",
        {"stack.py": PY_SOURCE},
        240,
        SPECLS_BIN=str(tmp_path / "no-such-dir" / "specls"),
        E2E_TYPE=PY_TYPED,
        E2E_TIMEOUT_MS="60000",
        E2E_EXPECT_ERROR="1",
        E2E_TAG="vscode-missing-server",
    )
    assert "error" in str(result["status_error"])
    notification = str(result["notification"])
    assert "specls.serverPath" in notification and "no-such-dir" in notification, notification
