"""One pull-request comment per suite, kept up to date (docs/ci.md "The PR comment").

The body is the job summary's GitHub-flavoured Markdown (reports/github.py `step_summary`, with the first
few differing requests and their tokens), a hidden marker naming the suite, and links to the workflow run
(its job summary) and the HTML report artifact. `post_or_update` finds the comment carrying the marker
through GitHub's REST API (list the issue's comments; then PATCH that comment, or POST a new one): one
comment per PR and suite, updated in place on every push. A fork PR's token cannot write: `pull_request`
says so from the event, and a refusal (401/403/404) is `CannotComment`, which the caller turns into a note
in the job summary: the PR comment never fails a job.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Mapping

from ..judgement.report import Report
from .github import md_text, step_summary

MAX_DIVERGENCES = 5
MAX_BODY = 65_000  # GitHub refuses a comment body over 65,536 characters
TIMEOUT = 30  # seconds per REST call


def marker(suite_name: str) -> str:
    """The hidden line that identifies a suite's comment (`--` cannot occur inside an HTML comment)."""
    return f"<!-- evalgate-pr-comment suite={suite_name.replace('--', '- -')} -->"


def run_url(environ: Mapping[str, str]) -> str | None:
    """The workflow run's page (its job summary), from the variables every Actions job has."""
    server, repo, run = (environ.get(k) for k in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_RUN_ID"))
    return f"{server}/{repo}/actions/runs/{run}" if server and repo and run else None


def comment_body(report: Report, *, run_link: str | None = None, artifact: str | None = None) -> str:
    """The comment: the marker, the summary (verdict, counts, changed components, the first few divergences
    with their tokens, metrics) and where the whole report is."""
    summary = step_summary(report, max_rows=MAX_DIVERGENCES).rstrip("\n")
    links = []
    if run_link:
        links.append(f"[job summary]({run_link})")
        if artifact:
            links.append(f"HTML report: artifact `{md_text(artifact)}` of [this run]({run_link}#artifacts)")
    footer = [" · ".join(links)] if links else []
    body = "\n".join([marker(report.suite_name), summary, "", *footer,
                      "<sub>updated in place by evalgate on every push</sub>", ""])
    if len(body) > MAX_BODY:
        body = body[:MAX_BODY] + "\n\n... (cut: the whole report is in the job summary)\n"
    return body


@dataclass(frozen=True)
class PullRequest:
    """Where a comment goes: the API, the repository (owner/name) and the PR number; `fork`: the PR comes
    from another repository, so the workflow's token cannot write to this one."""

    api_url: str
    repository: str
    number: int
    fork: bool = False


def pull_request(environ: Mapping[str, str]) -> PullRequest | None:
    """The PR of this workflow run, read from its event (None: the run is not for a pull request)."""
    path = environ.get("GITHUB_EVENT_PATH")
    if not path or not environ.get("GITHUB_REPOSITORY"):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            event = json.load(f)
    except (OSError, ValueError):
        return None
    pr = event.get("pull_request") if isinstance(event, dict) else None
    if not isinstance(pr, dict) or not isinstance(pr.get("number"), int):
        return None
    head = ((pr.get("head") or {}).get("repo") or {}).get("full_name")
    base = ((pr.get("base") or {}).get("repo") or {}).get("full_name")
    return PullRequest(environ.get("GITHUB_API_URL", "https://api.github.com").rstrip("/"), environ["GITHUB_REPOSITORY"],
                       pr["number"], fork=bool(head and base and head != base))


class CannotComment(Exception):
    """The token may not write the comment (a fork PR, a missing permission) or GitHub did not answer."""


@dataclass(frozen=True)
class Posted:
    action: str  # "created" or "updated"
    comment_id: int
    url: str | None


def _call(method: str, url: str, token: str, body: dict | None = None):
    request = urllib.request.Request(url, method=method, data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {token}", "Accept": "application/vnd.github+json",
                                              "X-GitHub-Api-Version": "2022-11-28", "Content-Type": "application/json",
                                              "User-Agent": "evalgate"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            return json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        why = {401: "the token was refused", 403: "the token may not write here (a fork PR's token is read-only; "
               "give the job `permissions: pull-requests: write`)", 404: "not found, or not visible to the token"}
        raise CannotComment(f"{method} {url}: HTTP {exc.code}: {why.get(exc.code, exc.reason)}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise CannotComment(f"{method} {url}: {exc}") from None


def find_comment(pr: PullRequest, token: str, tag: str) -> dict | None:
    """The PR's comment carrying `tag` (its first line), paging through the issue's comments."""
    page = 1
    while True:
        comments = _call("GET", f"{pr.api_url}/repos/{pr.repository}/issues/{pr.number}/comments?per_page=100&page={page}",
                         token)
        if not comments:
            return None
        for comment in comments:
            if (comment.get("body") or "").startswith(tag):
                return comment
        page += 1


def post_or_update(pr: PullRequest, token: str, body: str) -> Posted:
    """Update the suite's comment (found by the marker the body starts with), or create it."""
    if pr.fork:
        raise CannotComment(f"pull request #{pr.number} comes from a fork: its workflow token cannot write comments")
    tag = body.split("\n", 1)[0]
    found = find_comment(pr, token, tag)
    if found is not None:
        done = _call("PATCH", f"{pr.api_url}/repos/{pr.repository}/issues/comments/{found['id']}", token, {"body": body})
        return Posted("updated", found["id"], (done or {}).get("html_url"))
    done = _call("POST", f"{pr.api_url}/repos/{pr.repository}/issues/{pr.number}/comments", token, {"body": body})
    return Posted("created", done["id"], done.get("html_url"))


def fallback_note(reason: str) -> str:
    """What the job summary says when the comment could not be written."""
    return (f"> **evalgate:** no PR comment ({md_text(reason)}). The verdict is this job summary; the HTML report "
            "is the run's artifact.\n\n")


def environment_token(environ: Mapping[str, str] | None = None) -> str | None:
    environ = os.environ if environ is None else environ
    return environ.get("GITHUB_TOKEN") or environ.get("GH_TOKEN")
