"""Unit tests of `evalgate bisect commits` (evalgate/bisect/commits.py) that need git but no engine: parsing
git's answers, the result's rendering, and a step's answers to git when it cannot or must not run the
engine (bounds reached, setup failing, the differing requests gone, an unreadable state file)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from helpers import write_suite

from evalgate.bisect.commits import _FIRST_BAD, SKIP, STOP, CommitsResult, _skipped_candidates, step
from evalgate.processes import group_members
from evalgate.store import open_store

A, B = "a" * 40, "b" * 40


def test_parses_git_bisect_run_answers():
    found = f"running  'x'\n{B} is the first bad commit\ncommit {B}\n"
    assert _FIRST_BAD.search(found).group(1) == B
    skipped = (f"running  'x'\nThere are only 'skip'ped commits left to test.\nThe first bad commit could be any "
               f"of:\n{A}\n{B}\nWe cannot bisect more!\n")
    assert _FIRST_BAD.search(skipped) is None
    assert _skipped_candidates(skipped) == [A, B]


def test_result_lines_and_dict():
    result = CommitsResult(session_id=7, database="sqlite:////x/e.sqlite", good=A, bad=B, status="found",
                           first_bad={"commit": B, "subject": "change the template"}, keys=["p1", "p2"],
                           references=2, steps=4, engine_runs=5, commits_in_range=8, seconds=61.2,
                           skipped=[{"commit": A, "subject": "broken", "reason": "setup failed, exit 1\nmore",
                                     "engine_run": False}])
    assert result.exit_code == 0
    lines = result.lines()
    assert lines[0] == f"first bad commit: {B} change the template"
    assert "2 request(s) differ between good and bad: p1, p2" in lines
    assert f"skipped: {A[:10]} broken (setup failed, exit 1 more)" in lines
    assert any(line.startswith("engine runs: 5 (2 reference(s) + 3 step(s); a linear scan would need up to 9)")
               for line in lines)
    assert lines[-1] == "bisect 7: see `evalgate bisect show 7 --db sqlite:////x/e.sqlite`"
    doc = result.to_dict()
    assert doc["engine_runs"] == 5 and doc["naive_engine_runs"] == 9 and doc["first_bad"]["commit"] == B
    json.dumps(doc)

    inconclusive = CommitsResult(session_id=8, database="", good=A, bad=B, status="inconclusive",
                                 reason="only skipped commits are left to test",
                                 candidates=[{"commit": A, "subject": "x"}, {"commit": B, "subject": "y"}])
    assert inconclusive.exit_code == 1
    assert inconclusive.lines()[:3] == ["inconclusive: only skipped commits are left to test",
                                        "the first bad commit is one of these 2:", f"  {A} x"]


def test_group_members_sees_a_live_group_only():
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert proc.pid in group_members(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert group_members(proc.pid) == {}


def test_unreadable_state_stops_git(tmp_path):
    assert step(tmp_path / "missing.json") == STOP


@pytest.fixture
def repo_state(tmp_path, fake_model):
    """A one-commit repository with a suite, a bisect session in a store outside it, and a step's state."""
    repo = tmp_path / "repo"
    write_suite(repo, fake_model, ["one", "two"], concurrency=(1,), shuffles=0, kind="fake")
    for args in (["init", "-q"], ["add", "-A"],
                 ["-c", "user.name=t", "-c", "user.email=t@t.invalid", "commit", "-q", "-m", "c0"]):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)
    url = f"sqlite:///{tmp_path / 'e.sqlite'}"
    session = open_store(url).start_bisect("commits", "test", {})
    state = {"db": url, "session": session, "root": str(repo), "suite": "evalgate.toml", "keys": ["p000"],
             "good_run": None, "setup": None, "bounds": {"max_steps": 64, "max_seconds": 3600.0},
             "started": time.time(), "estimate": 5, "stop_file": str(tmp_path / "stop.json")}

    def write(**changes) -> Path:
        path = tmp_path / "state.json"
        path.write_text(json.dumps({**state, **changes}))
        return path

    return write, url, session, tmp_path


def _trials(url, session):
    return [(t.outcome, (t.detail or {}).get("reason", "")) for t in open_store(url).bisect(session)[1]]


def test_step_stops_git_at_the_bounds(repo_state):
    write, url, session, tmp = repo_state
    assert step(write(bounds={"max_steps": 64, "max_seconds": 10.0}, started=time.time() - 11)) == STOP
    assert json.loads((tmp / "stop.json").read_text()) == {"why": "bounds", "reason": "--max-seconds 10 reached"}
    open_store(url).add_trial(session, label="good", config={}, outcome="reference")
    assert step(write(bounds={"max_steps": 1, "max_seconds": 3600.0})) == STOP
    assert json.loads((tmp / "stop.json").read_text())["reason"] == "--max-steps 1 reached"
    assert _trials(url, session) == [("reference", "")]  # a stopped step records no trial


def test_step_skips_a_failing_setup_and_missing_requests(repo_state):
    write, url, session, _ = repo_state
    assert step(write(setup="echo cannot build; exit 3")) == SKIP
    assert step(write(keys=["not-in-the-suite"])) == SKIP
    assert step(write(suite="no-such-suite.toml")) == SKIP
    assert _trials(url, session) == [("skip", "setup failed, exit 3: cannot build"),
                                     ("skip", "none of the differing requests exist at this commit"),
                                     ("skip", _trials(url, session)[2][1])]
    assert _trials(url, session)[2][1].startswith("the suite does not load")
