"""`evalgate bisect commits` end to end: a real git repository, real `git bisect run`, through the real
CLI. The culprit is found once on the real vLLM CPU engine (tiny local model); the other behaviours
(interrupts, bounds, refusals) are evalgate's and git's, and run on the fake test engine
(evalgate/engines/fake.py), whose outputs change with the prompt text just as a real engine's do.

The repository (`make_repo`): commit c0 holds a suite and its prompts (the database is .gitignored next to
the suite file), then eight commits c1..c8 of which only c6 changes outputs (one prompt's text, the
"prompt template"); c4 adds a file that makes the setup command `test ! -e BROKEN` fail and c5 removes it.
git's first midpoint between c0 and c8 is c4 (checked below), so the skip really happens: git then tests
c6 (bad), c3 (good), c5 (good) and names c6. c4 is not next to the culprit, so the skip cannot make the
answer ambiguous.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers import database_url, db_exists, db_query, read_json, write_suite

pytestmark = pytest.mark.e2e

PROMPTS = ["Alpha: the quick brown fox jumps over", "Bravo: once upon a time in a small town",
           "Charlie: the capital of the country is", "Delta: a list of prime numbers starts with"]
CHANGED = "Bravo: once upon a time in a large city"  # c6's new text for request p001
SETUP = "test ! -e BROKEN"


def git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=check)


def make_repo(repo: Path, model: Path, kind: str = "fake") -> dict[str, str]:
    """The repository described above, on branch main; returns {"c0": sha, ..., "c8": sha}."""
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.name", "Test")
    git(repo, "config", "user.email", "test@example.invalid")
    # the fake engine's slow waves leave time to interrupt a step mid-run
    write_suite(repo, model, PROMPTS, max_tokens=8, concurrency=(1,), shuffles=0, name="bisect-commits", kind=kind,
                extra_engine="fake_seconds_per_wave = 0.5" if kind == "fake" else "")
    (repo / ".gitignore").write_text("evalgate.sqlite*\n")
    (repo / "notes.txt").write_text("c0\n")
    shas = {}
    for i in range(9):
        if i:
            (repo / "notes.txt").write_text(f"c{i}\n")  # a harmless change in every commit
        if i == 4:
            (repo / "BROKEN").write_text("this commit does not build\n")
        if i == 5:
            (repo / "BROKEN").unlink()
        if i == 6:
            lines = (repo / "prompts.jsonl").read_text().splitlines()
            lines[1] = json.dumps({"id": "p001", "prompt": CHANGED})
            (repo / "prompts.jsonl").write_text("\n".join(lines) + "\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"c{i}" + (": reword the Bravo prompt" if i == 6 else ""))
        shas[f"c{i}"] = git(repo, "rev-parse", "HEAD").stdout.strip()
    return shas


def assert_untouched(repo: Path, head: str, branch: str = "main") -> None:
    """On its original branch and commit, no bisect in progress, no tracked change."""
    assert git(repo, "bisect", "log", check=False).returncode != 0, "a bisect is still in progress"
    assert git(repo, "symbolic-ref", "--short", "HEAD").stdout.strip() == branch
    assert git(repo, "rev-parse", "HEAD").stdout.strip() == head
    assert git(repo, "status", "--porcelain", "--untracked-files=no").stdout == ""


def trials(db: str) -> list[tuple]:
    return db_query(db, "select t.step, t.label, t.outcome, t.run_id from bisect_trials t order by t.id")


def test_git_first_midpoint_is_the_broken_commit(tmp_path, tiny_model):
    """The premise of the skip assertions below, checked on the real git (no engine)."""
    repo = tmp_path / "repo"
    shas = make_repo(repo, tiny_model)
    out = git(repo, "bisect", "start", shas["c8"], shas["c0"]).stdout
    try:
        assert git(repo, "rev-parse", "HEAD").stdout.strip() == shas["c4"], out
    finally:
        git(repo, "bisect", "reset", "main")


def test_bisect_commits_names_the_culprit_and_skips_a_broken_setup(cli, tmp_path, tiny_model):
    repo = tmp_path / "repo"
    shas = make_repo(repo, tiny_model, kind="vllm")
    suite = repo / "evalgate.toml"
    t0 = time.monotonic()
    proc = cli("bisect", "commits", suite, "--good", "HEAD~8", "--bad", "main", "--setup", SETUP,
               "--json-report", tmp_path / "bisect.json", check=0)
    seconds = time.monotonic() - t0
    report = read_json(tmp_path / "bisect.json")

    assert report["status"] == "found"
    assert report["first_bad"] == {"commit": shas["c6"], "subject": "c6: reword the Bravo prompt"}
    assert f"first bad commit: {shas['c6']} c6: reword the Bravo prompt" in proc.stdout
    assert report["keys"] == ["p001"]  # only the changed prompt differs, and only it ran in the steps
    assert report["good"] == shas["c0"] and report["bad"] == shas["c8"]
    assert_untouched(repo, shas["c8"])

    db = database_url(suite)
    rows = trials(db)
    by_commit = {label.split()[0]: outcome for _, label, outcome, _ in rows[2:]}
    assert [outcome for _, _, outcome, _ in rows[:2]] == ["reference", "reference"]
    assert by_commit[shas["c4"][:10]] == "skip"  # the broken setup: skipped, not blamed
    assert by_commit[shas["c6"][:10]] == "bad"
    assert all(by_commit.get(shas[c][:10], "good") == "good" for c in ("c1", "c2", "c3", "c5"))
    assert [s["commit"] for s in report["skipped"]] == [shas["c4"]]
    assert "setup failed" in report["skipped"][0]["reason"]
    assert f"skipped: {shas['c4'][:10]} c4 (setup failed" in proc.stdout
    assert "[trial 3/~" in proc.stderr and "-> skip" in proc.stderr  # live progress from the steps

    # the steps ran only the differing request, each in a bisect run of one request
    step_runs = [run_id for _, _, outcome, run_id in rows[2:] if run_id is not None]
    assert step_runs and all(db_query(db, "select count(*) from outputs where run_id = :r", r=r) == [(1,)]
                             for r in step_runs)
    assert db_query(db, "select distinct kind, status from runs") == [("bisect", "complete")]
    session = db_query(db, "select status from bisect_sessions")
    assert session == [("complete",)]

    # engine runs vs a linear scan over the 8 commits (plus the good reference)
    assert report["commits_in_range"] == 8 and report["naive_engine_runs"] == 9
    assert report["engine_runs"] == len([r for r in rows if r[3] is not None]) < report["naive_engine_runs"]
    print(f"\nbisect commits: {report['engine_runs']} engine runs ({report['references']} references + "
          f"{report['engine_runs'] - report['references']} steps, {len(rows) - 2} steps in all) vs "
          f"{report['naive_engine_runs']} for a linear scan; {seconds:.0f} s")

    shown = cli("bisect", "show", str(report["bisect"]), "--db", db, "--json", check=0)
    assert json.loads(shown.stdout)["status"] == "complete"


def test_interrupted_bisect_leaves_the_repository_as_found(cli, tmp_path, tiny_model):
    repo = tmp_path / "repo"
    shas = make_repo(repo, tiny_model)
    suite = repo / "evalgate.toml"
    db = database_url(suite)
    proc = cli.popen("bisect", "commits", suite, "--good", shas["c0"], "--bad", "main", "--setup", SETUP)
    try:
        # wait until the references and the first step (c4, skipped) are stored: git has gone on to the
        # next step, whose engine is starting or running when the interrupt comes
        deadline = time.monotonic() + 600
        while not (db_exists(db) and _count(db) >= 3):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the bisect made no progress"
            time.sleep(0.3)
        time.sleep(2)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3, stderr
    assert "interrupted" in stderr
    assert_untouched(repo, shas["c8"])

    session_id, status = db_query(db, "select id, status from bisect_sessions")[0]
    assert status == "interrupted"
    shown = json.loads(cli("bisect", "show", str(session_id), "--db", db, "--json", check=0).stdout)
    assert shown["status"] == "interrupted"
    assert [t["outcome"] for t in shown["trials"]][:3] == ["reference", "reference", "skip"]
    # the interrupted step's engine run is stored as incomplete, never left "running"
    assert db_query(db, "select count(*) from runs where status = 'running'") == [(0,)]


def test_bounds_stop_the_bisect_inconclusive(cli, tmp_path, tiny_model):
    """--max-steps 3 allows the two references and one step (c4, skipped): the next step stops git, and the
    result is inconclusive (exit 1) with the commits not ruled out yet."""
    repo = tmp_path / "repo"
    shas = make_repo(repo, tiny_model)
    suite = repo / "evalgate.toml"
    proc = cli("bisect", "commits", suite, "--good", shas["c0"], "--bad", shas["c8"], "--setup", SETUP,
               "--max-steps", "3", "--json-report", tmp_path / "bisect.json", check=1)
    report = read_json(tmp_path / "bisect.json")
    assert report["status"] == "inconclusive" and "--max-steps 3 reached" in report["reason"]
    assert report["first_bad"] is None
    assert {c["commit"] for c in report["candidates"]} == {shas[f"c{i}"] for i in range(1, 9)}
    assert "inconclusive: --max-steps 3 reached" in proc.stdout
    assert_untouched(repo, shas["c8"])
    db = database_url(suite)
    assert [outcome for _, _, outcome, _ in trials(db)] == ["reference", "reference", "skip"]
    assert db_query(db, "select status from bisect_sessions") == [("inconclusive",)]


def test_identical_good_and_bad_is_inconclusive(cli, tmp_path, tiny_model):
    """c0..c3 change only notes.txt: nothing to bisect, said so, exit 1, no step run."""
    repo = tmp_path / "repo"
    shas = make_repo(repo, tiny_model)
    suite = repo / "evalgate.toml"
    proc = cli("bisect", "commits", suite, "--good", shas["c0"], "--bad", shas["c3"], check=1)
    assert "good and bad give identical outputs" in proc.stdout
    assert_untouched(repo, shas["c8"])
    assert [outcome for _, _, outcome, _ in trials(database_url(suite))] == ["reference", "reference"]


def _count(db: str) -> int:
    try:
        return db_query(db, "select count(*) from bisect_trials")[0][0]
    except Exception:  # the tables are being created
        return 0


def test_refusals_leave_the_repository_untouched(cli, tmp_path, tiny_model):
    """Bad input is exit 2, names the problem, and writes nothing (no engine runs)."""
    repo = tmp_path / "repo"
    shas = make_repo(repo, tiny_model)
    suite = repo / "evalgate.toml"

    unknown = cli("bisect", "commits", suite, "--good", "no-such-rev", "--bad", "main", check=2)
    assert "no-such-rev" in unknown.stderr
    backwards = cli("bisect", "commits", suite, "--good", "main", "--bad", shas["c0"], check=2)
    assert "not an ancestor" in backwards.stderr

    (repo / "notes.txt").write_text("a local change\n")
    dirty = cli("bisect", "commits", suite, "--good", shas["c0"], "--bad", "main", check=2)
    assert "notes.txt" in dirty.stderr and "commit or stash" in dirty.stderr
    git(repo, "checkout", "-q", "--", "notes.txt")

    tracked_db = repo / "tracked.sqlite"
    tracked_db.write_bytes(b"")
    git(repo, "add", "-f", "tracked.sqlite")
    git(repo, "commit", "-q", "-m", "c9: a tracked database")
    head = git(repo, "rev-parse", "HEAD").stdout.strip()
    tracked = cli("bisect", "commits", suite, "--good", shas["c0"], "--bad", "main", "--db", tracked_db, check=2)
    assert "tracked by git" in tracked.stderr

    git(repo, "bisect", "start", "main", shas["c0"])
    try:
        busy = cli("bisect", "commits", suite, "--good", shas["c0"], "--bad", "main", check=2)
        assert "already in progress" in busy.stderr
    finally:
        git(repo, "bisect", "reset", "main")

    assert_untouched(repo, head)
    assert not (repo / "evalgate.sqlite").exists()  # refused before opening the database


def test_not_a_git_repository(cli, tmp_path, tiny_model):
    suite = write_suite(tmp_path / "plain", tiny_model, PROMPTS, max_tokens=8, concurrency=(1,), shuffles=0,
                        kind="fake")
    proc = cli("bisect", "commits", suite, "--good", "a", "--bad", "b", check=2)
    assert "not inside a git work tree" in proc.stderr
