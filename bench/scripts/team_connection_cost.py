"""What an idle connection costs a ``specls serve --tcp`` server (the figures behind the connection
caps in docs/team.md): starts the server with the fake engine (no model: only the per-connection cost
is measured), opens N connections that stay silent, then N that initialize with a token and stay
idle, and prints the server's RSS growth per connection.

Usage: .venv/bin/python bench/scripts/team_connection_cost.py [N]
"""

from __future__ import annotations

import asyncio
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from specls.bench.team import LspClient, initialize, rss_mb, wait_listening


async def settle(pid: int) -> float:
    """RSS once it stops moving (the server handles the last connections asynchronously)."""
    last = rss_mb(pid)
    for _ in range(50):
        await asyncio.sleep(0.2)
        now = rss_mb(pid)
        if abs(now - last) < 0.05:
            return now
        last = now
    return last


async def measure(n: int) -> int:
    token = secrets.token_hex(16)
    with tempfile.TemporaryDirectory() as tmp:
        tokens = Path(tmp) / "tokens"
        tokens.write_text(f"probe:{token}\n")
        tokens.chmod(0o600)
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "specls", "serve", "--tcp", "127.0.0.1:0", "--engine", "fake",
                "--token-file", str(tokens), "--max-connections", str(4 * n + 8),
                "--max-per-address", str(4 * n + 8), "--auth-timeout-s", "600",
            ],
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        try:
            port = wait_listening(proc, proc.args)[1]
            warm = [await LspClient.connect("127.0.0.1", port) for _ in range(8)]  # first-use allocations
            for c in warm:
                await initialize(c, token)
            base = await settle(proc.pid)
            silent = [await LspClient.connect("127.0.0.1", port) for _ in range(n)]
            after_silent = await settle(proc.pid)
            idle = [await LspClient.connect("127.0.0.1", port) for _ in range(n)]
            t0 = time.monotonic()
            for c in idle:
                assert "result" in await initialize(c, token)
            after_idle = await settle(proc.pid)
            print(f"server RSS with 8 warm-up clients: {base:.1f} MB")
            print(
                f"{n} silent (unauthenticated) connections: +{after_silent - base:.1f} MB, "
                f"{(after_silent - base) * 1024 / n:.0f} KB each"
            )
            print(
                f"{n} idle authenticated connections: +{after_idle - after_silent:.1f} MB, "
                f"{(after_idle - after_silent) * 1024 / n:.0f} KB each "
                f"(initialize x{n} in {time.monotonic() - t0:.1f} s)"
            )
            for c in silent + idle + warm:
                await c.close()
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(measure(int(sys.argv[1]) if len(sys.argv) > 1 else 200)))
