"""``specls serve-engine`` as a process: refuses a non-loopback bind without tokens; serves the fake
engine to a RemoteEngine."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from specls.decoder.api import CompletionRequest

from specls.team.fake import FakeEngine
from specls.team.remote import RemoteEngine, RemoteSettings

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def test_non_loopback_bind_without_token_file_is_refused() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "specls",
            "serve-engine",
            "--engine",
            "fake",
            "--host",
            "0.0.0.0",
            "--port",
            "0",
        ],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "requires --token-file" in proc.stderr


def test_serve_engine_process_serves_a_remote_front_end(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("ci:ci-token-123456\n")
    tokens.chmod(0o600)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "specls",
            "serve-engine",
            "--engine",
            "fake",
            "--fake-pass-ms",
            "1",
            "--port",
            "0",
            "--token-file",
            str(tokens),
            "--model-name",
            "fake-coder",
        ],
        cwd=ROOT,
        env=_env(),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        url = None
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            m = re.search(r"(http://[\d.]+:\d+)/v1/completions", line)
            url = m.group(1) if m else None
        assert url, "serve-engine did not report its address"
        remote = RemoteEngine(RemoteSettings(base_url=url, api_key="ci-token-123456"))
        remote.load()
        assert remote.stats()["model"] == "fake-coder"
        r = remote.complete(CompletionRequest("file:///m.py", "import os\n", "", max_tokens=5))
        assert r.text == FakeEngine().expected_text("import os\n", "", 5)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    assert proc.returncode == 0
