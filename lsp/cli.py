"""``specls serve`` (stdio, or ``--tcp [HOST:]PORT`` for many clients sharing one engine) and
``specls stats --tcp [HOST:]PORT`` (asks a running server for its counters)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import signal
import sys
from typing import Any

from specls.lsp.settings import ENGINE_FIELDS, ServerSettings

from specls import __version__
from specls.api import Engine

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
    from specls.engine import OnnxEngine
    from specls.model_options import engine_settings

    return OnnxEngine(engine_settings(settings.engine_options()))


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    """The server's settings from ``serve``'s arguments: the shared model options by their one name
    (``specls.model_options``; what was not given keeps its default), and the server's own."""
    given = {name: value for name, value in vars(args).items() if name in ENGINE_FIELDS and value is not None}
    if args.no_line_first:
        given["line_first"] = False
    if args.max_tokens is not None:
        given["max_tokens"] = args.max_tokens
    return dataclasses.replace(ServerSettings(), **given)


EXIT_LOAD_FAILED = 3  # ``specls serve --tcp``: the engine could not be loaded (docs/team.md)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

# Options of the team service; over stdio there is one editor and no network, so they mean nothing.
_TCP_ONLY = {
    "token_file": "--token-file",
    "require_token": "--require-token",
    "metrics_port": "--metrics-port",
}


def _serve(args: argparse.Namespace) -> int:
    from specls.lsp.server import create_server

    from specls.api import EngineError
    from specls.team.cli import engine_override_from_args

    settings = settings_from_args(args)
    try:  # --engine remote|fake (None: the in-process ONNX engine)
        override = engine_override_from_args(args)
    except EngineError as exc:
        print(f"specls serve: {exc}", file=sys.stderr)
        return 2
    if args.tcp is not None:
        return _serve_tcp(args, settings, override)
    given = [flag for dest, flag in _TCP_ONLY.items() if getattr(args, dest) not in (None, False)]
    if given:
        print(
            f"specls serve: {', '.join(given)}: only with --tcp (over stdio there is one editor)",
            file=sys.stderr,
        )
        return 2
    if override is not None:  # the engine the flags name, for any editor settings
        server = create_server(settings, override)
    else:
        server = create_server(settings, make_engine(settings), factory=make_engine)
    try:
        return _serve_stdio(server)
    finally:
        _close_engine(override)


def _serve_stdio(server: Any) -> int:
    """One editor on stdin/stdout; SIGTERM/SIGINT end the session as an ``exit`` after ``shutdown``
    would (in-flight work cancelled, exit status 0)."""
    from specls.lsp.transport import serve_stdio

    def on_signal(signum: int, frame: object) -> None:
        try:
            loop = asyncio.get_running_loop()  # the signal interrupts the main thread's event loop
        except RuntimeError:  # before the loop runs: nothing to clean up yet
            raise SystemExit(0) from None
        loop.call_soon_threadsafe(server.session.exit_requested, True)

    previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
    try:
        return serve_stdio(server)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _serve_tcp(args: argparse.Namespace, settings: ServerSettings, override: Engine | None) -> int:
    from specls.lsp.server import EngineHost, create_server

    from specls.team.auth import AuthError
    from specls.team.cli import tune_for_team
    from specls.team.glue import team_hooks_from_args
    from specls.team.listener import Listener

    address, port = args.tcp
    engine = override or tune_for_team(make_engine(settings), args)
    host = EngineHost(engine)
    try:  # auth (a non-loopback bind needs --token-file), fair scheduling, metrics
        hooks = team_hooks_from_args(args, address, engine)
    except AuthError as exc:
        print(f"specls serve: {exc}", file=sys.stderr)
        _close_engine(override)
        return 2
    host.team = hooks
    service = hooks.service
    listener = Listener(
        host,
        lambda h: create_server(settings, h.engine, host=h),
        service.settings.connections,
        service.metrics,
    )
    status = {"rc": 0}

    def announce(bound: int) -> None:
        print(f"specls listening on {address}:{bound}", file=sys.stderr, flush=True)

    def load_failed() -> None:
        service.load_failed(host.error)
        print(
            f"specls serve: the engine could not be loaded: {host.error}; exiting (status {EXIT_LOAD_FAILED})",
            file=sys.stderr,
            flush=True,
        )
        status["rc"] = EXIT_LOAD_FAILED
        listener.stop()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, listener.stop)
        # a shared server loads at once, not on the first client; /healthz shows its progress
        load = host.start_load(service.load_progress)

        def loaded(future: Any) -> None:  # on the engine thread
            if not future.cancelled() and future.exception() is not None:
                loop.call_soon_threadsafe(load_failed)

        load.add_done_callback(loaded)
        await listener.serve(address, port, announce)

    try:
        asyncio.run(main())
    finally:
        _close_engine(override)  # a remote engine still waiting for its back end stops waiting
        hooks.close()
        host.close()
    return status["rc"]


def _close_engine(engine: Engine | None) -> None:
    from specls.team.remote import RemoteEngine

    if isinstance(engine, RemoteEngine):
        engine.close()


async def fetch_stats(address: str, port: int, timeout: float = 30.0) -> dict[str, Any]:
    """Connect as a minimal LSP client: initialize, specls/stats, shutdown, exit."""
    from lsprotocol import types
    from pygls.lsp.client import LanguageClient
    from specls.lsp.server import STATS_METHOD

    client = LanguageClient("specls-stats", __version__)
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
    from specls.model_options import add_model_arguments
    from specls.team.cli import add_engine_arguments, add_team_arguments

    serve = sub.add_parser("serve", help="run the language server (stdio, or TCP for many clients)")
    serve.add_argument(
        "--tcp", type=parse_address, metavar="[HOST:]PORT", help="listen on TCP instead of stdio"
    )
    add_model_arguments(serve)  # --model, --preset, --draft, --no-draft, --threads, ... (one place)
    serve.add_argument(
        "--no-line-first",
        action="store_true",
        help="in a multi-line context wait for the whole block (default: the first line first)",
    )
    serve.add_argument("--max-tokens", type=int, metavar="N", help="tokens per completion (default 64)")
    add_engine_arguments(serve)  # --engine onnx|remote|fake
    add_team_arguments(serve)  # --token-file, --metrics-port, queue limits, request logs (TCP only)
    serve.set_defaults(func=_serve)

    stats = sub.add_parser("stats", help="print a running TCP server's statistics as JSON")
    stats.add_argument("--tcp", type=parse_address, required=True, metavar="[HOST:]PORT")
    stats.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for each answer")
    stats.set_defaults(func=_stats)
