"""Command line of the team service.

- ``specls serve-engine``: the engine behind the OpenAI-compatible completions API.
- ``add_team_arguments`` / ``team_settings_from_args`` / ``engine_from_args``: the options
  ``specls serve --tcp`` shares (token file, metrics port, scheduler limits, engine choice:
  in-process ONNX, a remote OpenAI-compatible server, or the fake engine for load tests).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from typing import Any

from specls.api import Engine, EngineError
from specls.team.remote import RemoteSettings
from specls.team.service import ConnectionSettings

log = logging.getLogger(__name__)


def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    """``--engine onnx|remote|fake`` and the remote and fake engines' options (the in-process model's
    options are ``specls.model_options.add_model_arguments``, shared with ``serve`` and ``complete``)."""
    g = p.add_argument_group("engine")
    g.add_argument(
        "--engine",
        choices=("onnx", "remote", "fake"),
        default="onnx",
        help="onnx: in-process models (default); remote: an OpenAI-compatible server (--remote-url); "
        "fake: a model-free engine for load tests",
    )
    g.add_argument("--remote-url", default=None, help="base URL of the remote /v1/completions server")
    g.add_argument("--remote-model", default="", help="model name to request (default: first listed)")
    g.add_argument(
        "--remote-key-env",
        default="SPECLS_REMOTE_API_KEY",
        help="environment variable holding the remote API key (default SPECLS_REMOTE_API_KEY)",
    )
    g.add_argument(
        "--remote-fim",
        choices=("suffix", "qwen"),
        default="suffix",
        help="suffix: send the API's suffix field (specls serve-engine); qwen: build the Qwen2.5-Coder "
        "FIM prompt here (vLLM, llama.cpp)",
    )
    g.add_argument(
        "--load-wait-s",
        type=float,
        default=RemoteSettings.load_wait_s,
        help="remote engine: how long to wait (retrying with backoff) for a back end that is still "
        f"starting (HTTP 503 'Loading model', connection refused) before failing (default "
        f"{RemoteSettings.load_wait_s:.0f}; 0 = one attempt)",
    )
    g.add_argument("--fake-pass-ms", type=float, default=20.0, help="fake engine: ms per target pass")


def add_team_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("team service")
    g.add_argument("--token-file", default=None, help="client tokens, one per line or name:token")
    g.add_argument("--require-token", action="store_true", help="require tokens even on a loopback address")
    g.add_argument("--metrics-port", type=int, default=None, help="serve /metrics and /healthz on this port")
    g.add_argument("--metrics-host", default="127.0.0.1", help="address of the metrics endpoint")
    g.add_argument(
        "--kv-documents", type=int, default=64, help="in-process engine: documents whose KV caches are kept"
    )
    g.add_argument(
        "--batch",
        type=_batch_size,
        default=DEFAULT_BATCH,
        help="run up to N requests at once and join their target passes into one batched pass "
        "(in-process engine with a dynamic-batch target graph; the bundled one has it); 1 = off "
        f"(default {DEFAULT_BATCH}: on a CPU it measured slower, see docs/team.md)",
    )
    g.add_argument("--max-queue", type=int, default=64, help="queued requests over all clients")
    g.add_argument("--per-client-queue", type=int, default=4, help="queued requests per client")
    g.add_argument("--no-load-aware", action="store_true", help="never cap speculation under load")
    g.add_argument(
        "--speculation-policy",
        choices=("depth", "acceptance", "off"),
        default="depth",
        help="load-aware speculation: depth = shrink gamma with queue depth, drafting off when deep; "
        "acceptance = drafting off under load only when acceptance is low; off = never cap",
    )
    c = ConnectionSettings()
    g.add_argument(
        "--auth-timeout-s",
        type=float,
        default=c.auth_timeout_s,
        help=f"close a connection that has not sent initialize with a valid token by then (default {c.auth_timeout_s:g})",
    )
    g.add_argument(
        "--idle-timeout-s",
        type=float,
        default=c.idle_timeout_s,
        help=f"close a connection silent this long with nothing in flight (default {c.idle_timeout_s:g}; 0 = never)",
    )
    g.add_argument(
        "--max-connections",
        type=int,
        default=c.max_connections,
        help=f"open connections (default {c.max_connections})",
    )
    g.add_argument(
        "--max-per-address",
        type=int,
        default=c.max_per_address,
        help=f"open connections from one address (default {c.max_per_address}; behind a local proxy all "
        "clients share 127.0.0.1)",
    )
    g.add_argument("--log-requests", action="store_true", help="one JSON line per request on stderr")
    g.add_argument(
        "--log-completion-text",
        action="store_true",
        help="include completion text in request logs (off by default: no code in logs)",
    )


# Off by default: on a CPU, batching served fewer completions at higher latency than one request at a
# time (docs/team.md, "Batching"); measure with your model and hardware.
DEFAULT_BATCH = 1


def _batch_size(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--batch takes a whole number, not {text!r}") from None
    if not 1 <= n <= 64:
        raise argparse.ArgumentTypeError(f"--batch must be between 1 and 64, not {n}")
    return n


def scheduler_settings_from_args(args: argparse.Namespace) -> Any:
    from specls.team.scheduler import SchedulerSettings

    return SchedulerSettings(
        max_queue=args.max_queue,
        per_client_queue=args.per_client_queue,
        load_aware=not args.no_load_aware,
        policy=args.speculation_policy,
        # the fake engine models one pass at a time: concurrent requests would overlap its sleeps
        workers=1 if getattr(args, "engine", "onnx") == "fake" else getattr(args, "batch", 1),
    )


def team_settings_from_args(args: argparse.Namespace, host: str) -> Any:
    from specls.team.logs import RequestLogSettings
    from specls.team.service import TeamSettings

    return TeamSettings(
        host=host,
        token_file=args.token_file,
        require_token=args.require_token,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        scheduler=scheduler_settings_from_args(args),
        request_log=RequestLogSettings(include_text=args.log_completion_text),
        connections=ConnectionSettings(
            auth_timeout_s=args.auth_timeout_s,
            idle_timeout_s=args.idle_timeout_s,
            max_connections=args.max_connections,
            max_per_address=args.max_per_address,
        ),
    )


def engine_override_from_args(args: argparse.Namespace) -> Engine | None:
    """The fake or remote engine when ``--engine`` asks for one, else None (in-process ONNX)."""
    if getattr(args, "engine", "onnx") == "onnx":
        return None
    return engine_from_args(args)


def tune_for_team(engine: Engine, args: argparse.Namespace) -> Engine:
    """A shared server keeps KV caches for many more documents than one editor needs (the in-process
    engine's default is sized for one user) and batches concurrent requests' target passes."""
    from dataclasses import replace

    from specls.decoder.batching import BatchSettings
    from specls.engine import OnnxEngine

    if isinstance(engine, OnnxEngine) and not engine.ready:
        return OnnxEngine(
            replace(
                engine.settings,
                kv_documents=max(1, args.kv_documents),
                batching=BatchSettings(max_batch=getattr(args, "batch", 1)),
            )
        )
    return engine


def engine_from_args(args: argparse.Namespace) -> Engine:
    """The engine the options ask for (not loaded yet)."""
    if args.engine == "fake":
        from specls.team.fake import FakeEngine, FakeEngineSettings

        return FakeEngine(FakeEngineSettings(pass_s=args.fake_pass_ms / 1000.0))
    if args.engine == "remote":
        from specls.team.remote import QWEN_FIM, QWEN_STOPS, RemoteEngine

        if not args.remote_url:
            raise EngineError("--engine remote needs --remote-url http://host:port")
        qwen = args.remote_fim == "qwen"
        return RemoteEngine(
            RemoteSettings(
                base_url=args.remote_url,
                model=args.remote_model,
                api_key=os.environ.get(args.remote_key_env) or None,
                fim_template=QWEN_FIM if qwen else None,
                stop=QWEN_STOPS if qwen else (),
                load_wait_s=max(0.0, args.load_wait_s),
            )
        )
    from specls.decoder.batching import BatchSettings
    from specls.engine import EngineSettings, OnnxEngine
    from specls.model_options import engine_settings

    base = EngineSettings(kv_documents=args.kv_documents, batching=BatchSettings(max_batch=args.batch))
    return OnnxEngine(engine_settings(vars(args), base))


def _serve_engine(args: argparse.Namespace) -> int:
    from specls.team.auth import AuthError, require_auth_for_bind
    from specls.team.logs import RequestLog, RequestLogSettings, install_json_handler
    from specls.team.metrics import Metrics, MetricsServer, MetricsSettings
    from specls.team.serve_engine import EngineHTTPServer, ServeEngineSettings
    from specls.team.service import TeamMetricsObserver, declare_scheduler_gauges

    try:
        tokens = require_auth_for_bind(args.host, args.token_file)
    except AuthError as exc:
        print(f"specls serve-engine: {exc}", file=sys.stderr)
        return 2
    try:
        engine = engine_from_args(args)
        engine.load(lambda msg, frac: log.info("%3.0f%% %s", frac * 100, msg))
    except EngineError as exc:
        print(f"specls serve-engine: {exc}", file=sys.stderr)
        return 1
    if args.log_requests:
        install_json_handler()
    try:
        server = EngineHTTPServer(
            ServeEngineSettings(
                host=args.host,
                port=args.port,
                model_name=args.model_name,
                max_tokens_limit=args.max_tokens_limit,
            ),
            engine,
            tokens,
            scheduler_settings_from_args(args),
        )
    except OSError as exc:
        print(f"specls serve-engine: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    metrics = Metrics()
    request_log = RequestLog(RequestLogSettings(include_text=args.log_completion_text))
    server.scheduler.add_observer(TeamMetricsObserver(metrics, request_log if args.log_requests else None))
    declare_scheduler_gauges(metrics, server.scheduler)
    metrics_server = None
    if args.metrics_port is not None:
        metrics_server = MetricsServer(MetricsSettings(args.metrics_host, args.metrics_port), metrics).start()
    signal.signal(signal.SIGTERM, _interrupt)
    print(f"specls serve-engine: {server.url}/v1/completions (model {args.model_name!r})", file=sys.stderr)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        if metrics_server is not None:
            metrics_server.close()
        server.close()
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def register(sub: Any) -> None:
    p = sub.add_parser(
        "serve-engine",
        help="expose the completion engine over the OpenAI-compatible /v1/completions API",
        description="Serve the completion engine over the OpenAI-compatible /v1/completions API "
        "(prompt, suffix, max_tokens, stop, stream; SSE streaming) for specls front ends "
        "(--engine remote) and other clients.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (non-loopback needs --token-file)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model-name", default="specls", help="the model id /v1/models reports")
    p.add_argument("--max-tokens-limit", type=int, default=512)
    from specls.model_options import add_model_arguments

    add_model_arguments(p.add_argument_group("model"))  # --model, --preset, --draft, --threads, ...
    add_engine_arguments(p)
    add_team_arguments(p)
    p.set_defaults(func=_serve_engine)
