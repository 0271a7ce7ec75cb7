"""A local HTTP server speaking the part of the Hugging Face hub's API that downloads use, so tests
run huggingface_hub (``HF_ENDPOINT``) against repos made in the test, without a network.

Answers ``GET /api/models/ORG/NAME[/revision/REV]`` (JSON with ``id``, ``sha``, ``siblings``),
``GET /api/models/ORG/NAME/tree/REV`` (``[{type, path, size, oid}]``) and ``HEAD``/``GET
/ORG/NAME/resolve/REV/FILE`` (``ETag``, ``X-Repo-Commit``, ``Content-Length``, ``Range`` -> 206), with the
hub's ``X-Error-Code`` on 404s (RepoNotFound, RevisionNotFound, EntryNotFound). ``drop_once`` makes
the next full GET of a file stop half-way and close the connection (an interrupted download);
``requests`` records what was asked.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import unquote, urlsplit


@dataclass
class HubRepo:
    files: dict[str, bytes]
    commit: str
    refs: dict[str, str] = field(default_factory=dict)  # branch/tag -> commit


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    range: str | None


def _commit_of(files: dict[str, bytes]) -> str:
    h = hashlib.sha1()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + hashlib.sha1(files[name]).digest())
    return h.hexdigest()


class HubServer:
    """``with HubServer() as hub: hub.add_repo("org/tiny", {...}); os.environ["HF_ENDPOINT"] = hub.url``."""

    def __init__(self) -> None:
        self.repos: dict[str, HubRepo] = {}
        self.requests: list[Request] = []
        self.drop_once: set[tuple[str, str]] = set()  # (repo, file): cut the next full GET half-way
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()  # open keep-alive connections, closed by stop()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._port = 0

    # repos
    def add_repo(self, repo_id: str, files: dict[str, bytes]) -> str:
        """Publish ``files`` as ``repo_id`` at a new commit (main points at it); returns the commit."""
        commit = _commit_of(files)
        self.repos[repo_id] = HubRepo(dict(files), commit, {"main": commit})
        return commit

    def add_dir(self, repo_id: str, directory: Path) -> str:
        files = {
            p.relative_to(directory).as_posix(): p.read_bytes() for p in directory.rglob("*") if p.is_file()
        }
        return self.add_repo(repo_id, files)

    # lifecycle
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def start(self) -> HubServer:
        handler = _handler_for(self)
        self._httpd = ThreadingHTTPServer(("127.0.0.1", self._port), handler)
        self._httpd.daemon_threads = True
        self._port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="hub-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop answering, pooled keep-alive connections included (a later ``start`` serves on the
        same port again)."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def file_gets(self, name: str) -> list[Request]:
        """The GETs of files ending in ``name``."""
        return [
            r for r in self.requests if r.method == "GET" and "/resolve/" in r.path and r.path.endswith(name)
        ]

    # answers
    def _commit(self, repo: HubRepo, rev: str) -> str | None:
        if rev in repo.refs:
            return repo.refs[rev]
        return repo.commit if rev == repo.commit else None


def send_json(handler: BaseHTTPRequestHandler, data: Any) -> None:
    """``data`` as a 200 JSON answer (a test server's reply)."""
    body = json.dumps(data).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


class _HubHandler(BaseHTTPRequestHandler):
    """Answers one connection's requests from ``hub`` (set on the subclass _handler_for makes)."""

    hub: ClassVar[HubServer]
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        with self.hub._lock:
            self.hub._conns.add(self.connection)

    def finish(self) -> None:
        with self.hub._lock:
            self.hub._conns.discard(self.connection)
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:  # quiet test output
        pass

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_GET(self) -> None:
        self._serve(head=False)

    def _error(self, status: int, code: str | None, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if code:
            self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, data: Any) -> None:
        send_json(self, data)

    def _serve(self, head: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        with self.hub._lock:
            self.hub.requests.append(Request(self.command, path, self.headers.get("Range")))
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            self._api(parts[2:])
        elif len(parts) >= 5 and parts[2] == "resolve":
            self._file("/".join(parts[:2]), parts[3], "/".join(parts[4:]), head)
        else:
            self._error(404, None, f"no route {path}")

    def _repo(self, repo_id: str) -> HubRepo | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", f"Repository {repo_id} not found")
        return repo

    def _api(self, parts: list[str]) -> None:
        repo_id = "/".join(parts[:2])
        repo = self._repo(repo_id)
        if repo is None:
            return
        rest = parts[2:]
        rev = rest[1] if len(rest) >= 2 and rest[0] in ("revision", "tree") else "main"
        commit = self.hub._commit(repo, rev)
        if commit is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            return
        if rest and rest[0] == "tree":
            self._json(
                [
                    {
                        "type": "file",
                        "path": name,
                        "size": len(data),
                        "oid": hashlib.sha1(data).hexdigest(),
                    }
                    for name, data in sorted(repo.files.items())
                ]
            )
            return
        self._json(
            {
                "id": repo_id,
                "modelId": repo_id,
                "sha": commit,
                "private": False,
                "siblings": [{"rfilename": name} for name in sorted(repo.files)],
            }
        )

    def _file(self, repo_id: str, rev: str, name: str, head: bool) -> None:
        repo = self._repo(repo_id)
        if repo is None:
            return
        commit = self.hub._commit(repo, rev)
        if commit is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            return
        data = repo.files.get(name)
        if data is None:
            self._error(404, "EntryNotFound", f"{name} does not exist at {rev}")
            return
        start, status = 0, 200
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes=") and not head:
            first = rng[len("bytes=") :].split("-", 1)[0]
            start, status = int(first or 0), 206
        body = data[start:]
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        self.send_header("X-Repo-Commit", commit)
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        if head:
            return
        key = (repo_id, name)
        with self.hub._lock:
            drop = status == 200 and key in self.hub.drop_once and len(body) > 1
            self.hub.drop_once.discard(key)
        if drop:  # half the bytes, then hang up: the client sees a short body
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(body)


def _handler_for(hub: HubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(_HubHandler):
        pass

    Handler.hub = hub
    return Handler


__all__ = ["HubRepo", "HubServer", "Request"]
