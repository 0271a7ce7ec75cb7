"""Team mode's side of a session (``specls serve --tcp``): the typed protocols the language server
and the team service (``specls.team.glue.TeamHooks``) meet at, and ``TeamAuth``, one session's
standing with the service.

Outside team mode (``EngineHost.team`` None) every session is authenticated and uses the host's engine.
In team mode a session is authenticated once its ``initialize`` presented a valid token; then its
documents and completions go to its own fair-queue view of the shared engine (``TeamEngine``) and its
generations run on the team's thread pool, so the scheduler sees every session's requests at once.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TypeVar

from specls.api import Engine

if TYPE_CHECKING:
    from specls.lsp.server import EngineHost

T = TypeVar("T")


class TeamEngine(Engine, Protocol):
    """One client's view of the shared engine (the scheduler's ``ClientSession``)."""

    def close(self) -> None:
        """The client went away: cancel its requests and free its documents."""
        ...


class TeamClient(Protocol):
    """What the team service may do to a session: end its connection (a refused token)."""

    def exit_requested(self, clean: bool) -> None: ...


class Team(Protocol):
    """The team service as the language server uses it."""

    def open(self, client: TeamClient, initialization_options: object) -> TeamEngine:
        """Check the token in ``initialization_options`` (raises a JSON-RPC error when refused) and
        open the client's engine view."""
        ...

    def submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Run a generation on the team's threads."""
        ...

    def stats(self) -> dict[str, object]: ...


class TeamAuth:
    """One session's standing with the team service of ``host`` (read at each use: the service is
    attached to the host, not to the session)."""

    def __init__(self, host: EngineHost) -> None:
        self.host = host
        self.engine: TeamEngine | None = None  # set once initialize had a valid token
        self._team: Team | None = None  # the service that opened ``engine``

    @property
    def authenticated(self) -> bool:
        """Serving requests: always outside team mode; in team mode once initialize had a valid token."""
        return self.host.team is None or self.engine is not None

    def authenticate(self, client: TeamClient, initialization_options: object) -> None:
        """In team mode, once: the token check (raises a JSON-RPC error), then the client's engine view."""
        team = self.host.team
        if team is not None and self.engine is None:
            self.engine = team.open(client, initialization_options)
            self._team = team

    def engine_or(self, own: Engine) -> Engine:
        """Where the session's documents and completions go: its team view, else ``own``."""
        return self.engine if self.engine is not None else own

    def submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T] | None:
        """Run ``fn`` on the team's threads; None outside team mode (the caller runs it itself)."""
        if self.engine is None or self._team is None:
            return None
        return self._team.submit(fn)

    def close(self) -> None:
        """Cancel the session's queued and running requests and free its documents' KV."""
        if self.engine is not None:
            self.engine.close()

    def stats(self) -> dict[str, object] | None:
        team = self.host.team
        return team.stats() if team is not None else None
