"""``specls serve`` (stdio, or ``--tcp [HOST:]PORT`` for many clients sharing one engine) and
``specls stats --tcp [HOST:]PORT`` (asks a running server for its counters)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
from typing import Any

from specls.decoder.api import Engine
from specls.lsp.settings import ServerSettings

DEFAULT_HOST = "127.0.0.1"


def parse_address(value: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``PORT`` (host 127.0.0.1)."""
    host, sep, port = value.rpartition(":")
    if not sep:
        host, port = DEFAULT_HOST, value
    host = host.strip("[]") or DEFAULT_HOST
    try:
        number = int(port)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad address {value!r}: expected HOST:PORT") from None
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"bad port {number}")
    return host, number


def make_engine(settings: ServerSettings) -> Engine:
    """The in-process ONNX engine for these settings (heavy imports happen here)."""
    from specls.engine import EngineSettings, OnnxEngine

    updates: dict[str, Any] = {
        "target_dir": settings.model or None,
        "draft_dir": settings.draft or None,
        "use_draft": settings.draft_model,
        "speculate": settings.drafting,
        "gamma": settings.gamma,
    }
    if settings.threads > 0:
        updates["threads"] = settings.threads
    return OnnxEngine(dataclasses.replace(EngineSettings(), **updates))


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    settings = ServerSettings()
    updates: dict[str, Any] = {}
    if args.model:
        updates["model"] = args.model
    if args.draft:
        updates["draft"] = args.draft
    if args.no_draft:
        updates["draft_model"] = False
    if args.no_speculation:
        updates["drafting"] = False
    if args.threads is not None:
        updates["threads"] = args.threads
    if args.max_tokens is not None:
        updates["max_tokens"] = args.max_tokens
    return dataclasses.replace(settings, **updates)


def _serve(args: argparse.Namespace) -> int:
    from specls.lsp.server import EngineHost, create_server
    from specls.lsp.transport import serve_stdio, serve_tcp

    settings = settings_from_args(args)
    if args.tcp is None:
        server = create_server(settings, make_engine(settings), factory=make_engine)
        return serve_stdio(server)
    address, port = args.tcp
    from specls.team.auth import AuthError
    from specls.team.cli import engine_override_from_args, tune_for_team
    from specls.team.glue import team_hooks_from_args

    engine = engine_override_from_args(args) or tune_for_team(make_engine(settings), args)
    host = EngineHost(engine)
    try:  # auth (a non-loopback bind needs --token-file), fair scheduling, metrics
        host.team = team_hooks_from_args(args, address, engine)
    except AuthError as exc:
        print(f"specls serve: {exc}", file=sys.stderr)
        return 2
    host.start_load()  # a shared server loads at once, not on the first client

    def announce(bound: int) -> None:
        print(f"specls listening on {address}:{bound}", file=sys.stderr, flush=True)

    try:
        asyncio.run(
            serve_tcp(host, lambda h: create_server(settings, h.engine, host=h), address, port, announce)
        )
    finally:
        host.team.close()
        host.close()
    return 0


async def fetch_stats(address: str, port: int, timeout: float = 30.0) -> dict[str, Any]:
    """Connect as a minimal LSP client: initialize, specls/stats, shutdown, exit."""
    from lsprotocol import types
    from pygls.lsp.client import LanguageClient
    from specls.lsp.server import STATS_METHOD

    client = LanguageClient("specls-stats", "0.1.0")
    await client.start_tcp(address, port)
    try:
        await asyncio.wait_for(
            client.initialize_async(types.InitializeParams(capabilities=types.ClientCapabilities())), timeout
        )
        client.initialized(types.InitializedParams())
        result = await asyncio.wait_for(client.protocol.send_request_async(STATS_METHOD, {}), timeout)
        await asyncio.wait_for(client.shutdown_async(None), timeout)
        client.exit(None)
    finally:
        client._stop_event.set()
    stats = plain(result)
    return stats if isinstance(stats, dict) else {"result": stats}


def plain(value: Any) -> Any:
    """pygls hands untyped results over as namedtuples ("Object"): back to dicts and lists."""
    if hasattr(value, "_asdict"):
        return {k: plain(v) for k, v in value._asdict().items()}
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def _stats(args: argparse.Namespace) -> int:
    address, port = args.tcp
    try:
        stats = asyncio.run(fetch_stats(address, port, args.timeout))
    except (OSError, TimeoutError) as exc:
        print(f"specls stats: cannot reach {address}:{port}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(stats, indent=2, sort_keys=True))
    return 0


def register(sub: Any) -> None:
    serve = sub.add_parser("serve", help="run the language server (stdio, or TCP for many clients)")
    serve.add_argument(
        "--tcp", type=parse_address, metavar="[HOST:]PORT", help="listen on TCP instead of stdio"
    )
    serve.add_argument("--model", metavar="DIR", help="target model directory (default: bundled)")
    serve.add_argument("--draft", metavar="DIR", help="draft model directory (default: bundled)")
    serve.add_argument("--no-draft", action="store_true", help="no draft model (prompt lookup drafts only)")
    serve.add_argument(
        "--no-speculation", action="store_true", help="plain greedy decoding on the target (reference path)"
    )
    serve.add_argument("--threads", type=int, metavar="N", help="onnxruntime intra-op threads")
    serve.add_argument("--max-tokens", type=int, metavar="N", help="tokens per completion (default 64)")
    from specls.team.cli import add_engine_arguments, add_team_arguments

    add_engine_arguments(serve, model_args=False)  # --engine onnx|remote|fake (TCP only)
    add_team_arguments(serve)  # --token-file, --metrics-port, queue limits, request logs (TCP only)
    serve.set_defaults(func=_serve)

    stats = sub.add_parser("stats", help="print a running TCP server's statistics as JSON")
    stats.add_argument("--tcp", type=parse_address, required=True, metavar="[HOST:]PORT")
    stats.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for each answer")
    stats.set_defaults(func=_stats)
