"""Shared pieces of the real-editor end-to-end tests.

The editors come from ``scripts/setup-editors.sh``, which writes ``.cache/editors.env`` with their paths.
A missing or failed install is a test failure (the Neovim 0.12 route alone may be skipped, with the
reason the install recorded). The server is the real ``specls serve`` of this checkout's venv with the
bundled model pair.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENV_FILE = REPO / ".cache" / "editors.env"
ARTIFACTS = REPO / "test-artifacts"
NVIM_PLUGIN = REPO / "editors" / "nvim"
# Ghost text must appear within this (the first completion includes the model load on a busy 2-core box).
GHOST_TIMEOUT_S = float(os.environ.get("SPECLS_E2E_GHOST_TIMEOUT", "90"))

# A Python buffer with an obvious continuation (the cursor ends up after `self.items.`).
PY_SOURCE = "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"
PY_TYPED = "        self.items."


@dataclass(frozen=True)
class Editors:
    node: Path
    code_server: Path
    chromium: Path
    nvim011: Path
    nvim012: Path | None
    nvim012_skip: str
    vsix: Path
    node_path: Path


def _read_env_file(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


def _must_exist(name: str, value: str) -> Path:
    path = Path(value)
    if not value or not path.exists():
        pytest.fail(
            f"{name} ({value or 'unset'}) is missing: run `bash scripts/setup-editors.sh`", pytrace=False
        )
    return path


@pytest.fixture(scope="session")
def editors() -> Editors:
    if not ENV_FILE.is_file():
        pytest.fail(f"{ENV_FILE} not found: run `bash scripts/setup-editors.sh` first", pytrace=False)
    env = _read_env_file(ENV_FILE)
    nvim012 = env.get("NVIM012", "")
    return Editors(
        node=_must_exist("NODE", env.get("NODE", "")),
        code_server=_must_exist("CODE_SERVER", env.get("CODE_SERVER", "")),
        chromium=_must_exist("CHROMIUM", env.get("CHROMIUM", "")),
        nvim011=_must_exist("NVIM011", env.get("NVIM011", "")),
        nvim012=Path(nvim012) if nvim012 and Path(nvim012).exists() else None,
        nvim012_skip=env.get("NVIM012_SKIP", "") or f"Neovim 0.12 not installed ({nvim012 or 'no path'})",
        vsix=_must_exist("VSIX", env.get("VSIX", "")),
        node_path=_must_exist("NODE_PATH", env.get("NODE_PATH", "")),
    )


@pytest.fixture(scope="session")
def specls_bin() -> Path:
    """The `specls` entry point of the running interpreter's environment, which must have `serve`."""
    path = Path(sys.executable).parent / "specls"
    if not path.exists():
        pytest.fail(f"{path} not found: run `bash scripts/setup.sh`", pytrace=False)
    probe = subprocess.run([str(path), "serve", "--help"], capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        pytest.fail(f"`specls serve --help` failed:\n{probe.stdout}{probe.stderr}", pytrace=False)
    return path


@pytest.fixture
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


def clean_env(tmp: Path) -> dict[str, str]:
    """A fresh HOME and XDG dirs for an editor run; one onnxruntime thread so the box stays usable."""
    env = dict(os.environ)
    for name in ("home", "config", "data", "cache", "state"):
        (tmp / name).mkdir(parents=True, exist_ok=True)
    env.update(
        HOME=str(tmp / "home"),
        XDG_CONFIG_HOME=str(tmp / "config"),
        XDG_DATA_HOME=str(tmp / "data"),
        XDG_CACHE_HOME=str(tmp / "cache"),
        XDG_STATE_HOME=str(tmp / "state"),
        OMP_NUM_THREADS="1",
    )
    return env


def listening(port: int) -> bool:
    """Whether something LISTENs on ``port`` (read from /proc/net/tcp{,6}: a probing connect would be
    taken by the server as its client)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 3 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                return True
    return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class TcpServer:
    host: str
    port: int
    log: Path


@contextlib.contextmanager
def listening_server(
    what: str, cmd: list[str], env: dict[str, str], port: int, log: Path, timeout_s: float
) -> Iterator[None]:
    """``cmd`` (a server, output to ``log``) started in its own process group and waited for by its
    LISTEN socket on ``port``; stopped on leaving."""
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout_s
        while not listening(port):
            if proc.poll() is not None:
                pytest.fail(f"{what} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                pytest.fail(
                    f"{what} did not listen on {port} within {timeout_s:.0f} s:\n{log.read_text()[-3000:]}"
                )
            time.sleep(0.1)
        yield
    finally:
        stop(proc)


@pytest.fixture
def tcp_server(specls_bin: Path, tmp_path: Path) -> Iterator[TcpServer]:
    """`specls serve --tcp 127.0.0.1:PORT`, waited for by its LISTEN socket, stopped afterwards."""
    port = free_port()
    log = tmp_path / "specls-tcp.log"
    cmd = [str(specls_bin), "serve", "--tcp", f"127.0.0.1:{port}", "--threads", "1"]
    with listening_server("specls serve --tcp", cmd, clean_env(tmp_path / "server-env"), port, log, 120):
        yield TcpServer("127.0.0.1", port, log)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)


def run_bounded(
    cmd: list[str], env: dict[str, str] | None, timeout: float, cwd: Path | None = None
) -> tuple[int, str]:
    """Run ``cmd`` in its own process group; kill the whole group at ``timeout``. Returns (rc, output)."""
    proc = subprocess.Popen(
        cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return 124, out.decode(errors="replace")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    # an editor may leave children (the stdio server) behind in its group
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return proc.returncode, out.decode(errors="replace")


def load_result(path: Path, output: str) -> dict[str, object]:
    if not path.is_file():
        pytest.fail(f"the editor wrote no result; its output:\n{output[-4000:]}")
    result: dict[str, object] = json.loads(path.read_text())
    return result


def editor_result(name: str, rc: int, started: float, path: Path, output: str) -> dict[str, object]:
    """The result an editor run wrote to ``path``, its log printed; fails unless the run says ok."""
    result = load_result(path, output)
    print(f"[{name}] rc={rc} wall={time.monotonic() - started:.1f}s " + json.dumps(result.get("log")))
    assert result.get("ok"), (
        f"{result.get('error')}\nlog: {json.dumps(result.get('log'), indent=1)}\n{output[-3000:]}"
    )
    return result


def run_nvim_script(
    nvim: Path,
    script: Path,
    tmp: Path,
    name: str,
    source: tuple[str, str],
    env: dict[str, str],
    timeout_s: float,
) -> dict[str, object]:
    """``script`` in headless Neovim with editors/nvim on ``source`` (file name, text) in a fresh project
    under ``tmp``; ``env`` adds the run's own SPECLS_E2E_* settings to a clean environment. The editor
    gets ``timeout_s``; its lsp.log is kept. Returns the result the script wrote (it must say ok)."""
    project = tmp / "project"
    project.mkdir()
    (project / ".git").mkdir()  # a root marker, as in a real checkout
    path = project / source[0]
    path.write_text(source[1])
    result_path = tmp / "result.json"
    run_env = clean_env(tmp / "env")
    run_env.update(
        SPECLS_E2E_PLUGIN=str(NVIM_PLUGIN),
        SPECLS_E2E_FILE=str(path),
        SPECLS_E2E_RESULT=str(result_path),
        **env,
    )
    started = time.monotonic()
    cmd = [str(nvim), "--headless", "--clean", "-S", str(script)]
    rc, output = run_bounded(cmd, run_env, timeout=timeout_s, cwd=project)
    keep_artifact(tmp / "env" / "state" / "nvim" / "lsp.log", f"{name}-lsp.log")
    return editor_result(name, rc, started, result_path, output)


def run_vscode_driver(
    editors: Editors, driver: Path, tmp: Path, name: str, files: dict[str, str], timeout_s: float, **e2e: str
) -> dict[str, object]:
    """``driver`` (Node) with a clean environment on a fresh workspace under ``tmp`` holding ``files``
    (name -> text; the first is E2E_FILE); ``e2e`` adds the driver's own E2E_* settings. The driver gets
    ``timeout_s``. Returns the result it wrote (it must say ok)."""
    workspace = tmp / "workspace"
    workspace.mkdir()
    for file_name, text in files.items():
        (workspace / file_name).write_text(text)
    result_path = tmp / "result.json"
    env = clean_env(tmp / "env")
    env.update(
        NODE_PATH=str(editors.node_path),
        CODE_SERVER=str(editors.code_server),
        CHROMIUM=str(editors.chromium),
        VSIX=str(editors.vsix),
        E2E_WORKSPACE=str(workspace),
        E2E_FILE=next(iter(files)),
        E2E_RUN_DIR=str(tmp / "run"),
        E2E_ARTIFACTS=str(ARTIFACTS),
        E2E_RESULT=str(result_path),
        **e2e,
    )
    started = time.monotonic()
    rc, output = run_bounded([str(editors.node), str(driver)], env, timeout=timeout_s)
    return editor_result(name, rc, started, result_path, output)


# A model given by name: the tiny random checkpoint of tests/models served by a local hub
# (tests/hub_server.py); the server downloads and converts it into a fresh cache on first use.
HUB_MODEL = "org/tiny"


@pytest.fixture(scope="session")
def model_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The local hub's URL (HF_ENDPOINT), serving ``HUB_MODEL``."""
    from tests.hub_server import HubServer
    from tests.models.conftest import build_checkpoint

    ckpt = build_checkpoint(tmp_path_factory.mktemp("e2e-hub") / "qwen2", "qwen2")
    with HubServer() as hub:
        hub.add_dir(HUB_MODEL, ckpt)
        yield hub.url


def hub_env(hub_url: str, tmp: Path) -> dict[str, str]:
    """The environment a server needs to take ``HUB_MODEL`` from the local hub into a fresh cache."""
    return {
        "HF_ENDPOINT": hub_url,
        "HF_HUB_CACHE": str(tmp / "hf-cache"),
        "SPECLS_CACHE": str(tmp / "specls-models"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }


def keep_artifact(src: Path, name: str) -> None:
    if src.is_file():
        ARTIFACTS.mkdir(exist_ok=True)
        shutil.copy(src, ARTIFACTS / name)
