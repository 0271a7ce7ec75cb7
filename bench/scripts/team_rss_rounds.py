"""Server RSS across identical rounds of typing clients (the memory check of issue 13): starts
``specls serve --tcp`` on loopback with tokens (bundled model unless ``--engine fake``), runs ROUNDS
rounds of CLIENTS typists for DURATION seconds each -- the same files, cuts and keystrokes every round
(``specls bench team --rounds`` changes the seed per round) -- and prints the server's RSS and engine
document counts after each round, once every client has left.

Usage: .venv/bin/python bench/scripts/team_rss_rounds.py [--clients 8] [--duration 60] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from specls.bench.team import (
    TypingSettings,
    heldout_files,
    rss_mb,
    run_clients,
    server_stats,
    wait_listening,
    wait_ready,
)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--duration", type=float, default=60.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--engine", choices=("onnx", "fake"), default="onnx")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    tokens = [secrets.token_hex(16) for _ in range(args.clients + 1)]
    with tempfile.TemporaryDirectory() as tmp:
        token_file = Path(tmp) / "tokens"
        token_file.write_text("".join(f"client{i}:{t}\n" for i, t in enumerate(tokens)))
        token_file.chmod(0o600)
        cmd = [
            sys.executable,
            "-m",
            "specls",
            "serve",
            "--tcp",
            "127.0.0.1:0",
            "--token-file",
            str(token_file),
        ]
        cmd += ["--require-token", "--per-client-queue", "2", "--max-queue", str(max(8, 2 * args.clients))]
        if args.engine != "onnx":
            cmd += ["--engine", args.engine]
        proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        try:
            port = wait_listening(proc, proc.args)[1]
            asyncio.run(wait_ready("127.0.0.1", port, tokens[-1]))
            print(f"server RSS loaded: {rss_mb(proc.pid):.0f} MB", flush=True)
            files = heldout_files()
            typing = TypingSettings(seed=args.seed)
            figures = []
            for r in range(args.rounds):
                stats = asyncio.run(
                    run_clients("127.0.0.1", port, tokens[: args.clients], args.duration, typing, files)
                )
                time.sleep(2.0)
                after = asyncio.run(server_stats("127.0.0.1", port, tokens[-1]))
                engine = after.get("engine", {})
                figures.append(rss_mb(proc.pid))
                print(
                    f"round {r + 1}: served {sum(s.served for s in stats)}, errors "
                    f"{sum(len(s.errors) for s in stats)}, engine documents {engine.get('documents')}, "
                    f"RSS {figures[-1]:.0f} MB",
                    flush=True,
                )
            spread = (max(figures) - min(figures)) / min(figures) * 100
            print(
                "RSS after rounds " + " / ".join(f"{x:.0f}" for x in figures) + f" MB (spread {spread:.1f}%)"
            )
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
