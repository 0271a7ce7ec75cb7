"""Token file parsing, constant-time lookup, bind rules and token extraction (no network)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from specls.team.auth import (
    AuthError,
    TokenStore,
    is_loopback_host,
    parse_token_file,
    require_auth_for_bind,
    token_from_init_options,
)

TOKENS = "# team tokens\nalice:alice-secret-1\n\nbob-secret-22\n"


def test_parse_names_and_bare_tokens() -> None:
    entries = parse_token_file(TOKENS)
    assert [e.name for e in entries] == ["alice", "client4"]
    assert entries[1].token == b"bob-secret-22"


@pytest.mark.parametrize(
    "text",
    ["", "# only a comment\n", "alice:\n", "alice:short\n", "a:abcdefgh1\na:abcdefgh2\n"],
)
def test_bad_token_files_are_refused(text: str) -> None:
    with pytest.raises(AuthError):
        TokenStore(parse_token_file(text))


def test_authenticate(tmp_path: Path) -> None:
    p = tmp_path / "tokens"
    p.write_text(TOKENS)
    p.chmod(0o600)
    store = TokenStore.from_file(p)
    assert store.authenticate("alice-secret-1") == "alice"
    assert store.authenticate("bob-secret-22") == "client4"
    assert store.authenticate("alice-secret-") is None
    assert store.authenticate("alice-secret-1x") is None
    assert store.authenticate("") is None
    assert store.authenticate(None) is None
    assert store.authenticate(12345678) is None


def test_missing_token_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(AuthError, match="cannot read token file"):
        TokenStore.from_file(tmp_path / "nope")


def test_token_extraction() -> None:
    assert token_from_init_options({"token": "t0ken-abc"}) == "t0ken-abc"
    assert token_from_init_options({"specls": {"token": "t0ken-def"}}) == "t0ken-def"
    assert token_from_init_options({"teamToken": "t0ken-vsc", "maxTokens": 3}) == "t0ken-vsc"
    assert token_from_init_options({"specls": {"teamToken": "t0ken-nv"}}) == "t0ken-nv"
    assert token_from_init_options({"specls": {"other": 1}}) is None
    assert token_from_init_options({"token": 5}) is None
    assert token_from_init_options(None) is None
    assert token_from_init_options("t0ken-abc") is None


def test_loopback_detection() -> None:
    assert is_loopback_host("127.0.0.1")
    assert is_loopback_host("127.8.9.1")
    assert is_loopback_host("::1")
    assert is_loopback_host("[::1]")
    assert is_loopback_host("localhost")
    assert not is_loopback_host("0.0.0.0")
    assert not is_loopback_host("::")
    assert not is_loopback_host("10.1.2.3")


def test_non_loopback_bind_needs_a_token_file(tmp_path: Path) -> None:
    with pytest.raises(AuthError, match="requires --token-file"):
        require_auth_for_bind("0.0.0.0", None)
    assert require_auth_for_bind("127.0.0.1", None) is None
    p = tmp_path / "tokens"
    p.write_text(TOKENS)
    p.chmod(0o600)
    store = require_auth_for_bind("0.0.0.0", str(p))
    assert store is not None and store.names == ("alice", "client4")


def test_tokens_never_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    p = tmp_path / "tokens"
    p.write_text(TOKENS)
    p.chmod(0o644)  # provokes the permissions refusal, which must not print the token
    caplog.set_level(logging.DEBUG)
    with pytest.raises(AuthError) as refused:
        TokenStore.from_file(p)
    p.chmod(0o600)
    store = TokenStore.from_file(p)
    store.authenticate("wrong-token-xyz")
    with pytest.raises(AuthError) as info:
        TokenStore(parse_token_file("alice:short\n"))
    assert "short" not in str(info.value).replace("shorter", "")
    messages = [str(refused.value)] + [rec.getMessage() for rec in caplog.records]
    for msg in messages:
        assert "alice-secret-1" not in msg and "bob-secret-22" not in msg and "wrong-token" not in msg


@pytest.mark.parametrize(
    "mode",
    [0o640, 0o604, 0o620, 0o660, 0o644, 0o666, 0o601],  # wrong answer before the fix: loaded, warned
)
def test_token_file_others_can_access_is_refused(tmp_path: Path, mode: int) -> None:
    p = tmp_path / "tokens"
    p.write_text(TOKENS)
    p.chmod(mode)
    with pytest.raises(AuthError, match=rf"mode {mode:03o}.*chmod 600"):
        TokenStore.from_file(p)
    with pytest.raises(AuthError, match="chmod 600"):
        require_auth_for_bind("0.0.0.0", str(p))


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_token_file_only_its_owner_can_read_is_loaded(tmp_path: Path, mode: int) -> None:
    p = tmp_path / "tokens"
    p.write_text(TOKENS)
    p.chmod(mode)
    assert TokenStore.from_file(p).names == ("alice", "client4")
