"""The team service inside ``specls serve --tcp``: what the language server's ``EngineHost`` and
``Session`` call when a ``TeamHooks`` is attached (``host.team``); it is the language server's ``Team``
protocol (``specls.lsp.team_auth``).

- ``open(session, initialization_options)`` on ``initialize``: checks the client's token (when the
  server requires tokens) and returns the session's engine view (a ``ClientSession`` of the fair
  scheduler). A refused client gets a JSON-RPC error for its ``initialize`` and its connection is closed
  right after the error is written.
- ``submit(fn)``: runs a generation on the team's thread pool instead of the engine host's single
  thread, so requests of many sessions reach the scheduler together and it can pick fairly (the
  scheduler still runs the engine one request at a time).
- ``stats()``: scheduler/speculation state for ``specls/stats``.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import logging
from collections.abc import Callable
from typing import TypeVar

from pygls.exceptions import JsonRpcException

from specls.api import Engine
from specls.lsp.team_auth import TeamClient
from specls.team.auth import AuthError
from specls.team.scheduler import ClientSession
from specls.team.service import TeamService, TeamSettings

log = logging.getLogger(__name__)

T = TypeVar("T")

UNAUTHORIZED = -32001  # JSON-RPC server-defined error range


class TeamAuthRefused(JsonRpcException):
    CODE = UNAUTHORIZED
    MESSAGE = "specls: unauthorized"


class TeamHooks:
    def __init__(self, service: TeamService, max_parallel: int = 64) -> None:
        self.service = service
        # One thread per in-flight generation: they mostly wait in the scheduler's queue.
        self.executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=max(2, max_parallel), thread_name_prefix="specls-team"
        )

    def open(self, session: TeamClient, initialization_options: object) -> ClientSession:
        """Authenticate an ``initialize`` and open the client's scheduler session. ``session`` is the
        language server's Session (its ``exit_requested`` closes the connection)."""
        try:
            client = self.service.authenticate(initialization_options)
        except AuthError as exc:
            self._close_soon(session)
            raise TeamAuthRefused(str(exc), data={"retry": False}) from None
        return self.service.open_session(client)

    @staticmethod
    def _close_soon(session: TeamClient) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        # after pygls has written the error response for this initialize
        loop.call_later(0.05, session.exit_requested, False)

    def submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        return self.executor.submit(fn)

    def stats(self) -> dict[str, object]:
        out = self.service.scheduler.scheduler_stats()
        out["auth_required"] = self.service.auth_required
        out["load"] = self.service.load_status()
        out["clients"] = self.service.scheduler.clients()
        return out

    def close(self) -> None:
        self.service.close()
        self.executor.shutdown(wait=False, cancel_futures=True)


def team_hooks(settings: TeamSettings, engine: Engine) -> TeamHooks:
    """Raises AuthError when the bind address needs a token file and none was given."""
    service = TeamService(settings, engine)
    service.start_metrics()
    return TeamHooks(service, max_parallel=settings.scheduler.max_queue + 8)


def team_hooks_from_args(args: argparse.Namespace, host: str, engine: Engine) -> TeamHooks:
    from specls.team.cli import team_settings_from_args
    from specls.team.logs import install_json_handler

    hooks = team_hooks(team_settings_from_args(args, host), engine)
    if getattr(args, "log_requests", False):
        install_json_handler()
    server = hooks.service._server
    if server is not None:
        mhost, mport = server.address
        log.warning("metrics on http://%s:%d/metrics", mhost, mport)
    return hooks
