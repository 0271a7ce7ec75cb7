"""``specls serve-engine`` as a process: refuses a non-loopback bind without tokens; serves the fake
engine to a RemoteEngine."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from specls.api import CompletionRequest
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


def test_batch_option_reaches_engine_and_scheduler() -> None:
    import argparse

    import pytest

    from specls.engine import EngineSettings, OnnxEngine
    from specls.team.cli import (
        add_engine_arguments,
        add_team_arguments,
        scheduler_settings_from_args,
        tune_for_team,
    )

    p = argparse.ArgumentParser()
    add_engine_arguments(p)
    add_team_arguments(p)
    args = p.parse_args(["--batch", "4"])
    assert scheduler_settings_from_args(args).workers == 4
    engine = tune_for_team(OnnxEngine(EngineSettings()), args)
    assert isinstance(engine, OnnxEngine) and engine.settings.batching.max_batch == 4
    default = p.parse_args([])
    assert scheduler_settings_from_args(default).workers == 1  # off unless asked for
    assert scheduler_settings_from_args(p.parse_args(["--batch", "4", "--engine", "fake"])).workers == 1
    for bad in ("0", "65", "x"):
        with pytest.raises(SystemExit):
            p.parse_args(["--batch", bad])
