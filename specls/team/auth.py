"""Token auth for the team service.

A token file holds one token per line, optionally ``name:token`` (the name is what logs and metrics
show; a bare token gets a name derived from its line number). Blank lines and ``#`` comments are
ignored. Tokens are compared in constant time and never logged. Binding to anything but a loopback
address requires a token file.

Clients present their token in ``initializationOptions`` as ``{"token": ...}`` or
``{"specls": {"token": ...}}`` (``teamToken`` also accepted, as the editor extensions send it); the HTTP engine API takes ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

MIN_TOKEN_LENGTH = 8


class AuthError(Exception):
    """A client (or an operator's configuration) failed authentication. The message is safe to show:
    it never contains a token."""


@dataclass(frozen=True)
class TokenEntry:
    name: str
    token: bytes


class TokenStore:
    """Valid tokens, checked in constant time against every entry (so timing does not reveal which
    entry nearly matched)."""

    def __init__(self, entries: tuple[TokenEntry, ...]) -> None:
        if not entries:
            raise AuthError("token file holds no tokens")
        self._entries = entries

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> TokenStore:
        """Refuses (AuthError) a file that group or others may read or write, as ssh refuses such a
        private key: anyone who can read it can impersonate every client in it."""
        p = Path(path)
        try:
            mode = p.stat().st_mode
            if mode & 0o077:
                raise AuthError(
                    f"token file {p} is accessible by group/others (mode {mode & 0o777:03o}); "
                    f"run: chmod 600 {p}"
                )
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise AuthError(f"cannot read token file {p}: {exc.strerror or exc}") from None
        return cls(parse_token_file(text, source=str(p)))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(e.name for e in self._entries)

    def authenticate(self, token: object) -> str | None:
        """The client name for ``token``, or None when it matches no entry."""
        if not isinstance(token, str) or not token:
            return None
        presented = token.encode("utf-8")
        found: str | None = None
        for entry in self._entries:  # no early exit: constant work whatever matches
            if hmac.compare_digest(presented, entry.token) and found is None:
                found = entry.name
        return found


def parse_token_file(text: str, source: str = "token file") -> tuple[TokenEntry, ...]:
    entries: list[TokenEntry] = []
    names: set[str] = set()
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, token = line.partition(":")
        if not sep:
            name, token = f"client{lineno}", line
        name, token = name.strip(), token.strip()
        if not name or not token:
            raise AuthError(f"{source}:{lineno}: expected 'token' or 'name:token'")
        if len(token) < MIN_TOKEN_LENGTH:
            raise AuthError(f"{source}:{lineno}: token for {name!r} is shorter than {MIN_TOKEN_LENGTH} chars")
        if name in names:
            raise AuthError(f"{source}:{lineno}: duplicate client name {name!r}")
        names.add(name)
        entries.append(TokenEntry(name=name, token=token.encode("utf-8")))
    return tuple(entries)


TOKEN_KEYS = ("token", "teamToken", "team_token")


def token_from_init_options(options: object) -> str | None:
    """The token a client put in ``initializationOptions``: ``{"token": ..}`` or
    ``{"specls": {"token": ..}}``; ``teamToken``/``team_token`` (the editor extensions' setting name)
    are accepted in either place. None when there is none."""
    if not isinstance(options, Mapping):
        return None
    for section in (options, options.get("specls")):
        if not isinstance(section, Mapping):
            continue
        for key in TOKEN_KEYS:
            token = section.get(key)
            if isinstance(token, str) and token:
                return token
    return None


def is_loopback_host(host: str) -> bool:
    """True when ``host`` only ever binds to loopback (127.0.0.0/8, ::1, 'localhost')."""
    h = host.strip().strip("[]")
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        pass
    try:  # a host name: loopback only if every address it resolves to is
        infos = socket.getaddrinfo(h, None)
    except OSError:
        return False
    addrs = {info[4][0] for info in infos}
    return bool(addrs) and all(ipaddress.ip_address(str(a).split("%")[0]).is_loopback for a in addrs)


def require_auth_for_bind(host: str, token_file: str | None) -> TokenStore | None:
    """Load the token store for a server about to bind ``host``. Without a token file only loopback
    binds are allowed; raises AuthError with an operator-facing message otherwise."""
    if token_file:
        return TokenStore.from_file(token_file)
    if not is_loopback_host(host):
        raise AuthError(
            f"refusing to listen on {host}: binding to a non-loopback address requires --token-file "
            "(one token per line, or name:token); or bind 127.0.0.1 behind a TLS proxy"
        )
    return None
