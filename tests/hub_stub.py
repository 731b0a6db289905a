"""A stand-in for the Hugging Face Hub's HTTP API on loopback (HF_ENDPOINT=stub.url), for the calls
huggingface_hub and datasets make to resolve a revision and download a snapshot (../shared/DESIGN.md §5):

- GET  /api/{models|datasets}/{repo}[/revision/{rev}]      the commit (`sha`) and the files (`siblings`)
- GET  /api/{models|datasets}/{repo}/tree/{rev}[/{dir}]    the files, recursively or one directory
- HEAD/GET /{repo}/resolve/{rev}/{file}, /datasets/{repo}/resolve/{rev}/{file}   a file, with its commit

A repo holds commits (each a full set of files) and branches; `move` points a branch at another commit. A
gated repo answers 401 unless the request carries its token. Every request's path and Authorization header
is logged, so a test can see what was asked.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit


@dataclass
class StubRepo:
    repo_type: str
    repo: str
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)
    token: str | None = None  # gated: only this bearer token may read

    def commit(self, files: dict[str, bytes], branch: str = "main") -> str:
        """A new commit of exactly these files, on `branch`; its sha (a 40-hex digest of the content)."""
        sha = hashlib.sha1(json.dumps({k: hashlib.sha256(v).hexdigest() for k, v in sorted(files.items())})
                           .encode() + self.repo.encode()).hexdigest()
        self.commits[sha] = dict(files)
        self.branches[branch] = sha
        return sha

    def resolve(self, revision: str) -> str | None:
        revision = unquote(revision)
        if revision in self.commits:
            return revision
        return self.branches.get(revision)


class StubHub:
    def __init__(self):
        self.repos: dict[tuple[str, str], StubRepo] = {}
        self.log: list[tuple[str, str, str | None]] = []  # (method, path, Authorization)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> StubHub:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def model(self, repo: str, token: str | None = None) -> StubRepo:
        return self.repos.setdefault(("model", repo), StubRepo("model", repo, token=token))

    def dataset(self, repo: str) -> StubRepo:
        return self.repos.setdefault(("dataset", repo), StubRepo("dataset", repo))

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_HEAD(self):
                self._serve(head=True)

            def do_GET(self):
                self._serve(head=False)

            def _send(self, status: int, body: bytes = b"", headers: dict | None = None, head: bool = False):
                self.send_response(status)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _error(self, status: int, code: str, message: str, head: bool):
                self._send(status, json.dumps({"error": message}).encode(),
                           {"X-Error-Code": code, "X-Error-Message": message, "Content-Type": "application/json"}, head)

            def _json(self, value, head: bool):
                self._send(200, json.dumps(value).encode(), {"Content-Type": "application/json"}, head)

            def _repo(self, repo_type: str, parts: list[str], head: bool) -> tuple[StubRepo | None, list[str]]:
                repo = hub.repos.get((repo_type, "/".join(parts[:2])))
                if repo is None:
                    self._error(404, "RepoNotFound", "Repository not found", head)
                    return None, []
                if repo.token and self.headers.get("Authorization") != f"Bearer {repo.token}":
                    self._error(401, "GatedRepo", f"Access to model {repo.repo} is restricted. You must have access "
                                                  "to it and be authenticated to access it.", head)
                    return None, []
                return repo, parts[2:]

            def _serve(self, head: bool):
                path = urlsplit(self.path).path
                query = urlsplit(self.path).query
                hub.log.append((self.command, self.path, self.headers.get("Authorization")))
                parts = [unquote(p) for p in path.strip("/").split("/")]
                if parts[:1] == ["api"] and len(parts) >= 4 and parts[1] in ("models", "datasets"):
                    repo, rest = self._repo(parts[1][:-1], parts[2:], head)
                    if repo is None:
                        return
                    revision = rest[1] if len(rest) >= 2 and rest[0] in ("revision", "tree") else "main"
                    commit = repo.resolve(revision)
                    if commit is None:
                        return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}", head)
                    files = repo.commits[commit]
                    if not rest or rest[0] == "revision":
                        return self._json({"id": repo.repo, "sha": commit, "private": False, "gated": bool(repo.token),
                                           "siblings": [{"rfilename": n} for n in sorted(files)]}, head)
                    if rest[0] == "tree":
                        return self._json(self._tree(files, "/".join(rest[2:]), "recursive=true" in query.lower()), head)
                    return self._error(404, "EntryNotFound", "unknown API route", head)
                repo_type = "model"
                if parts[:1] == ["datasets"]:
                    repo_type, parts = "dataset", parts[1:]
                if len(parts) >= 5 and parts[2] == "resolve":
                    repo, rest = self._repo(repo_type, parts, head)
                    if repo is None:
                        return
                    commit = repo.resolve(rest[1])
                    if commit is None:
                        return self._error(404, "RevisionNotFound", f"Invalid rev id: {rest[1]}", head)
                    name = "/".join(rest[2:])
                    body = repo.commits[commit].get(name)
                    if body is None:
                        return self._error(404, "EntryNotFound", f"{name} does not exist", head)
                    etag = hashlib.sha256(body).hexdigest()
                    return self._send(200, body, {"X-Repo-Commit": commit, "ETag": f'"{etag}"',
                                                  "Content-Type": "application/octet-stream"}, head)
                self._error(404, "EntryNotFound", "not served by the stand-in", head)

            @staticmethod
            def _tree(files: dict[str, bytes], directory: str, recursive: bool) -> list[dict]:
                prefix = f"{directory}/" if directory else ""
                entries, dirs = [], set()
                for name, body in sorted(files.items()):
                    if not name.startswith(prefix):
                        continue
                    rest = name[len(prefix):]
                    if "/" in rest and not recursive:
                        dirs.add(prefix + rest.split("/", 1)[0])
                        continue
                    entries.append({"type": "file", "path": name, "size": len(body),
                                    "oid": hashlib.sha1(b"blob %d\0" % len(body) + body).hexdigest()})
                if recursive:
                    for name in files:
                        if name.startswith(prefix):
                            parts = name[len(prefix):].split("/")[:-1]
                            dirs.update(prefix + "/".join(parts[: i + 1]) for i in range(len(parts)))
                return [{"type": "directory", "path": d, "oid": hashlib.sha1(d.encode()).hexdigest(), "size": 0}
                        for d in sorted(dirs)] + entries

        return Handler


def directory_files(directory) -> dict[str, bytes]:
    """Every file under a local directory, by its relative path: a model built here, as a repo's content."""
    from pathlib import Path

    root = Path(directory)
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
