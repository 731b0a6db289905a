"""The one PR comment (evalgate/reports/pr_comment.py): its body as a file (golden Markdown, and what
Chromium shows of it rendered as GitHub-flavoured Markdown), and the create-then-update logic against a
local stub of GitHub's two REST calls (list an issue's comments; create or update one), through the CLI
on the fake engine. A fork PR and a refused token fall back to the job summary and exit 0."""

from __future__ import annotations

import html.parser
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from helpers import GREEN_PROMPTS, bare_model, chromium, run_chromium, write_suite

from evalgate.judgement.report import Report
from evalgate.reports.pr_comment import comment_body, marker

DATA = Path(__file__).resolve().parents[1] / "data" / "pr_comment"
RUN_LINK = "https://github.com/owner/repo/actions/runs/42"


def fixture_body() -> str:
    report = Report.from_dict(json.loads((DATA / "report.json").read_text(encoding="utf-8")))
    return comment_body(report, run_link=RUN_LINK, artifact="evalgate-report")


def test_the_body_is_the_golden_markdown():
    """The fixture is a stored report of a weight swap on the fake engine (request keys and token texts with
    Markdown specials: `|`, `*`, control bytes). Regenerate with EVALGATE_UPDATE_GOLDEN=1 after an intended change."""
    body = fixture_body()
    if os.environ.get("EVALGATE_UPDATE_GOLDEN"):
        (DATA / "golden.md").write_text(body, encoding="utf-8")
    assert body == (DATA / "golden.md").read_text(encoding="utf-8")
    assert body.startswith(marker("pr-demo") + "\n")


class Cells(html.parser.HTMLParser):
    """The rendered page's table cells, links and visible text."""

    def __init__(self):
        super().__init__()
        self.rows, self.links, self.text, self._cell = [], [], [], None

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = ""
        elif tag == "a":
            self.links.append(dict(attrs)["href"])

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append(self._cell.strip())
            self._cell = None

    def handle_data(self, data):
        self.text.append(data)
        if self._cell is not None:
            self._cell += data


def test_the_body_renders_as_github_flavoured_markdown_in_chromium(tmp_path):
    from markdown_it import MarkdownIt

    exe = chromium()
    rendered = MarkdownIt("commonmark", {"html": True}).enable("table").render((DATA / "golden.md").read_text(encoding="utf-8"))
    page = tmp_path / "comment.html"
    page.write_text(f"<!doctype html><meta charset=utf-8><body>{rendered}</body>", encoding="utf-8")
    dom = run_chromium(exe, tmp_path / "profile", page.as_uri(), "--dump-dom").stdout
    cells = Cells()
    cells.feed(dom)
    text = "".join(cells.text)
    assert "evalgate-pr-comment" not in text  # the marker stays hidden
    header = next(row for row in cells.rows if row and row[0] == "request")
    differing = cells.rows[cells.rows.index(header) + 1:]
    assert len(differing) == 5 and all(len(row) == len(header) for row in differing)  # no cell broken by a `|`
    assert differing[0][:2] == ["q|pipe", "explained_change"] and differing[0][3] == "0"
    assert "'*'" in differing[0][4]  # the token text shown literally, not as emphasis
    assert ["explained_change", "8"] in cells.rows
    assert RUN_LINK in cells.links and f"{RUN_LINK}#artifacts" in cells.links


class GitHubStub:
    """GitHub's issue-comment calls, in memory: GET .../issues/N/comments (paged), POST .../issues/N/comments,
    PATCH .../issues/comments/ID. `refuse`: answer every call 403, as for a read-only token."""

    def __init__(self, comments: list[dict] | None = None, refuse: bool = False):
        self.comments = list(comments or [])
        self.calls: list[tuple[str, str]] = []
        self.refuse = refuse
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self, status: int, value) -> None:
                data = json.dumps(value).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self):
                stub.calls.append((self.command, self.path))
                assert self.headers["Authorization"] == "Bearer secret-token"
                if stub.refuse:
                    return self._answer(403, {"message": "Resource not accessible by integration"})
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"null")
                path, _, query = self.path.partition("?")
                if self.command == "GET" and path == "/repos/owner/repo/issues/7/comments":
                    page = int(dict(p.split("=") for p in query.split("&"))["page"])
                    return self._answer(200, stub.comments[(page - 1) * 100: page * 100])
                if self.command == "POST" and path == "/repos/owner/repo/issues/7/comments":
                    comment = {"id": 1000 + len(stub.comments), "body": body["body"],
                               "html_url": f"https://github.com/owner/repo/pull/7#issuecomment-{1000 + len(stub.comments)}"}
                    stub.comments.append(comment)
                    return self._answer(201, comment)
                if self.command == "PATCH" and path.startswith("/repos/owner/repo/issues/comments/"):
                    comment = next(c for c in stub.comments if c["id"] == int(path.rsplit("/", 1)[1]))
                    comment["body"] = body["body"]
                    return self._answer(200, comment)
                return self._answer(404, {"message": "Not Found"})

            do_GET = do_POST = do_PATCH = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def checked(inline_cli, tmp_path):
    """A suite with a baseline and a check after a weight swap (explained changes to comment on)."""
    model = bare_model(tmp_path / "model")
    suite = write_suite(tmp_path / "ws", model, GREEN_PROMPTS[:6], concurrency=(1, 4), shuffles=0, kind="fake", name="pr")
    inline_cli("baseline", "create", suite, check=0)
    bare_model(model, seed=1)
    inline_cli("check", suite, check=0)
    return suite


def on_pr(inline_cli, tmp_path, api: str, *, fork: bool = False) -> Path:
    event = {"pull_request": {"number": 7, "head": {"repo": {"full_name": "someone/fork" if fork else "owner/repo"}},
                              "base": {"repo": {"full_name": "owner/repo"}}}}
    (tmp_path / "event.json").write_text(json.dumps(event))
    summary = tmp_path / "summary.md"
    inline_cli.env.update({"GITHUB_ACTIONS": "true", "GITHUB_EVENT_PATH": str(tmp_path / "event.json"),
                           "GITHUB_REPOSITORY": "owner/repo", "GITHUB_API_URL": api, "GITHUB_TOKEN": "secret-token",
                           "GITHUB_STEP_SUMMARY": str(summary), "GITHUB_SERVER_URL": "https://github.com",
                           "GITHUB_RUN_ID": "42"})
    return summary


def test_creates_the_comment_then_updates_the_same_one(inline_cli, tmp_path, checked):
    others = [{"id": i, "body": f"a reviewer's comment {i}"} for i in range(150)]  # the marker is on page 2
    others.append({"id": 500, "body": marker("another-suite") + "\nanother suite's comment"})
    stub = GitHubStub(others)
    try:
        on_pr(inline_cli, tmp_path, stub.url)
        out = inline_cli("pr-comment", "--latest", "--suite", checked, "--artifact", "evalgate-report", check=0).stdout
        assert "created the PR comment" in out
        created = stub.comments[-1]
        assert created["body"].startswith(marker("pr") + "\n") and "explained_change" in created["body"]
        assert f"{RUN_LINK}#artifacts" in created["body"]
        assert [c for c in stub.calls if c[0] != "GET"] == [("POST", "/repos/owner/repo/issues/7/comments")]

        stub.calls.clear()
        inline_cli("check", checked, check=0)  # a second push: a new run
        out = inline_cli("pr-comment", "--latest", "--suite", checked, check=0).stdout
        assert "updated the PR comment" in out
        assert [c for c in stub.calls if c[0] != "GET"] == [("PATCH", f"/repos/owner/repo/issues/comments/{created['id']}")]
        assert len(stub.comments) == 152 and stub.comments[-1]["id"] == created["id"]
        assert "against baseline run 1" in created["body"] and "run 3" in created["body"]  # the newer run, in place
        assert stub.comments[150]["body"].endswith("another suite's comment")  # not ours: untouched
    finally:
        stub.close()


def test_a_fork_pr_falls_back_to_the_job_summary(inline_cli, tmp_path, checked):
    stub = GitHubStub()
    try:
        summary = on_pr(inline_cli, tmp_path, stub.url, fork=True)
        proc = inline_cli("pr-comment", "--latest", "--suite", checked, check=0)
        assert stub.calls == [] and "no PR comment" in proc.stderr
        assert "comes from a fork" in summary.read_text()
    finally:
        stub.close()


def test_a_refused_token_falls_back_to_the_job_summary(inline_cli, tmp_path, checked):
    stub = GitHubStub(refuse=True)
    try:
        summary = on_pr(inline_cli, tmp_path, stub.url)
        proc = inline_cli("pr-comment", "--latest", "--suite", checked, check=0)
        assert stub.calls and "HTTP 403" in proc.stderr
        assert "no PR comment" in summary.read_text() and "pull-requests: write" in summary.read_text()
    finally:
        stub.close()


def test_outside_a_pull_request_the_body_is_written_and_nothing_posted(inline_cli, tmp_path, checked):
    proc = inline_cli("pr-comment", "--latest", "--suite", checked, "--body-file", tmp_path / "c.md", check=0)
    assert "not posted" in proc.stdout
    assert (tmp_path / "c.md").read_text().startswith(marker("pr"))
