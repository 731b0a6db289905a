"""`evalgate bisect commits --good REV --bad REV [--setup CMD]`: the first commit that changes outputs.

How it works (and why):

1. Validate before touching anything (ConfigError, exit 2, nothing written): the suite file lies in a git
   work tree, both revisions are commits and --good is an ancestor of --bad, no bisect is in progress, the
   tracked files are clean (every checkout would carry a local change along, or refuse), and the database
   is not a file git tracks anywhere in the range (a checkout would rewrite it under the bisect). The
   database URL is resolved once, to an absolute one, and every step uses it.
2. Two reference runs, at --good and at --bad (each after the setup command; a failing setup there is an
   error, not a skip): every request, each one alone (concurrency 1). Alone, a request's output does not
   depend on which other requests run, so a later step can run only the requests that differ between good
   and bad and compare them with the good reference. Those differing requests are the whole predicate:
   steps are fast because they run few requests.
3. `git bisect start BAD GOOD` then `git bisect run python -m evalgate bisect commit-step STATE`, where
   STATE is a JSON file in a temporary directory outside the repository. Each step (`step`) is a separate
   process: it appends its trial to the same bisect session in the database, prints its progress line
   ("[trial 4/~5] 1a2b3c4d5e subject -> bad (6.1 s)") on the inherited stderr, and answers git with
   0 good (every differing request equals the good reference), 1 bad (one differs), 125 skip (setup failed,
   the suite does not load, the engine failed: such a commit cannot be judged, so it is never blamed), or
   255 to stop git (bounds reached, interrupted, an unexpected error; the reason is left in a file beside
   STATE for the parent to report).
4. The parent reads git's stdout for "<sha> is the first bad commit" or "There are only 'skip'ped commits
   left to test" and returns a result (exit 0 found, 1 inconclusive).
5. Whatever happens (success, error, Ctrl-C, SIGTERM), the repository is left as it was found: the
   `git bisect run` process group is stopped first (it runs in its own session, so a terminal's Ctrl-C
   reaches only evalgate, which then stops the step and its engine cleanly), then `git bisect reset
   <original branch or commit>` (or a plain checkout when no bisect was started yet).

Counting engine runs: a trial whose engine started counts (the references, and the steps that got past
the setup and the suite); a step skipped by its setup does not. The naive figure is a linear scan: the good
reference plus, at worst, every commit of good..bad in order.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..codec import to_json
from ..configuration.config import resolve_database_url
from ..configuration.suite import load_suite
from ..errors import ConfigError, EngineError, EvalgateError
from ..judgement.compare import first_divergence
from ..processes import group_members, is_python, signal_quietly
from ..store import open_store
from ..store.db import sqlite_path
from .ddmin import BudgetExhausted
from .session import Bisection, Bounds, TrialCallback, TrialOutcome
from .trials import differing_keys, run_trial, same

KIND = "commits"
GOOD, BAD, SKIP = 0, 1, 125  # `git bisect run`'s protocol
STOP = 255  # any code >= 128 makes `git bisect run` stop; the reason is in the stop file
STOP_FILE = "stop.json"
STOP_WAIT_SECONDS = 90  # the step's engine may take the worker's grace period (60 s) to mark its run incomplete
OUTPUT_TAIL = 2000  # characters of a failing setup command's output kept in the trial
_FIRST_BAD = re.compile(r"^([0-9a-f]{40,64}) is the first bad commit", re.MULTILINE)
_ROUGHLY = re.compile(r"\(roughly (\d+) steps?\)")
_ONLY_SKIPPED = "There are only 'skip'ped commits left to test"


# --- git ------------------------------------------------------------------------------------------------

class Git:
    def __init__(self, root: Path):
        self.root = root

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run(["git", "-c", "advice.detachedHead=false", *args], cwd=self.root,
                              capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if check and proc.returncode != 0:
            raise EngineError(f"git {' '.join(args)} failed (exit {proc.returncode}): "
                              f"{(proc.stderr or proc.stdout).strip()[-OUTPUT_TAIL:]}")
        return proc

    def out(self, *args: str) -> str:
        return self.run(*args).stdout.strip()

    def ok(self, *args: str) -> bool:
        return self.run(*args, check=False).returncode == 0

    def commit(self, rev: str, option: str) -> str:
        proc = self.run("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", check=False)
        if proc.returncode != 0:
            raise ConfigError(f"{option} {rev!r} is not a commit of the repository at {self.root}",
                              fix="pass a branch, tag or commit sha (see `git log`)")
        return proc.stdout.strip()

    def subject(self, rev: str) -> str:
        return self.out("log", "-1", "--format=%s", rev)

    def bisecting(self) -> bool:
        return self.ok("bisect", "log")

    def checkout(self, rev: str) -> None:
        self.run("checkout", "-q", rev)


def _repo_root(suite_path: Path) -> Path:
    try:
        proc = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=suite_path.parent, capture_output=True,
                              text=True, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise ConfigError("git is not installed",
                          fix="install git: `evalgate bisect commits` drives git bisect") from None
    if proc.returncode != 0:
        raise ConfigError(f"{suite_path} is not inside a git work tree",
                          fix="bisect a suite file that lives in the repository whose history you bisect")
    return Path(proc.stdout.strip()).resolve()


# --- the result -----------------------------------------------------------------------------------------

@dataclass
class CommitsResult:
    session_id: int
    database: str
    good: str
    bad: str
    status: str  # found | inconclusive
    reason: str = ""
    first_bad: dict | None = None  # {"commit", "subject"}
    candidates: list[dict] = field(default_factory=list)  # inconclusive: where the first bad commit must be
    keys: list[str] = field(default_factory=list)  # requests that differ between good and bad
    added: list[str] = field(default_factory=list)  # requests only at bad / only at good: not bisected
    removed: list[str] = field(default_factory=list)
    references: int = 0  # engine runs at --good and --bad
    steps: int = 0  # trials at commits between good and bad
    skipped: list[dict] = field(default_factory=list)  # {"commit", "subject", "reason"}
    engine_runs: int = 0
    commits_in_range: int = 0
    seconds: float = 0.0

    @property
    def exit_code(self) -> int:
        return 0 if self.status == "found" else 1

    @property
    def naive_engine_runs(self) -> int:
        """A linear scan: the good reference, then each commit of good..bad in order (at worst all)."""
        return self.commits_in_range + 1

    def to_dict(self) -> dict:
        return {"bisect": self.session_id, "kind": KIND, "status": self.status, "reason": self.reason,
                "good": self.good, "bad": self.bad, "first_bad": self.first_bad, "candidates": self.candidates,
                "keys": self.keys, "added_keys": self.added, "removed_keys": self.removed,
                "references": self.references, "steps": self.steps,
                "skipped": self.skipped, "engine_runs": self.engine_runs,
                "commits_in_range": self.commits_in_range, "naive_engine_runs": self.naive_engine_runs,
                "seconds": round(self.seconds, 1), "database": self.database}

    def lines(self) -> list[str]:
        out = []
        if self.first_bad:
            out.append(f"first bad commit: {self.first_bad['commit']} {self.first_bad['subject']}")
        else:
            out.append(f"inconclusive: {self.reason}")
            if self.candidates:
                out.append(f"the first bad commit is one of these {len(self.candidates)}:")
                out += [f"  {c['commit']} {c['subject']}" for c in self.candidates]
        if self.keys:
            shown = ", ".join(self.keys[:10]) + (f", ... ({len(self.keys) - 10} more)" if len(self.keys) > 10 else "")
            out.append(f"{len(self.keys)} request(s) differ between good and bad: {shown}")
        if self.added or self.removed:
            out.append(f"requests only at bad: {', '.join(self.added) or '-'}; only at good: "
                       f"{', '.join(self.removed) or '-'} (not bisected)")
        for s in self.skipped:
            reason = " ".join(s["reason"].split())
            reason = reason if len(reason) <= 160 else reason[:160] + "..."
            out.append(f"skipped: {s['commit'][:10]} {s['subject']} ({reason})")
        skipped_early = len([s for s in self.skipped if not s.get("engine_run")])
        out.append(f"engine runs: {self.engine_runs} ({self.references} reference(s) + "
                   f"{self.engine_runs - self.references} step(s); a linear scan would need up to "
                   f"{self.naive_engine_runs}); {self.steps} step(s) in all, {skipped_early} skipped before the "
                   f"engine; {self.seconds:.0f} s")
        db = f" --db {self.database}" if self.database else ""
        out.append(f"bisect {self.session_id}: see `evalgate bisect show {self.session_id}{db}`")
        return out


# --- the parent: `evalgate bisect commits` ---------------------------------------------------------------

def bisect_commits(suite_path: Path, *, good: str, bad: str, setup: str | None = None, db: str | None = None,
                   bounds: Bounds | None = None, on_trial: TrialCallback | None = None) -> CommitsResult:
    started = time.time()
    suite_path = Path(suite_path).resolve()
    if not suite_path.is_file():
        raise ConfigError(f"{suite_path}: no such suite file", fix="pass the suite file inside the repository")
    root = _repo_root(suite_path)
    git = Git(root)
    rel = suite_path.relative_to(root).as_posix()
    good_sha, bad_sha = git.commit(good, "--good"), git.commit(bad, "--bad")
    if good_sha == bad_sha:
        raise ConfigError("--good and --bad are the same commit", fix="pass an older --good or a newer --bad")
    if not git.ok("merge-base", "--is-ancestor", good_sha, bad_sha):
        raise ConfigError(f"--good {good} is not an ancestor of --bad {bad}",
                          fix="pass the older revision as --good (git bisect looks for the first bad commit after it)")
    if git.bisecting():
        raise ConfigError(f"a git bisect is already in progress in {root}",
                          fix="finish it or run `git bisect reset` first")
    dirty = git.run("status", "--porcelain", "--untracked-files=no").stdout  # "XY path" lines: not stripped
    if dirty.strip():
        files = [line[3:] for line in dirty.splitlines() if line.strip()]
        raise ConfigError(f"tracked files have local changes: {', '.join(files[:10])}",
                          fix="commit or stash them: every bisect step checks out another commit")
    # where to return at the end: the branch checked out, or the commit of a detached HEAD
    original = (git.run("symbolic-ref", "-q", "--short", "HEAD", check=False).stdout.strip()
                or git.out("rev-parse", "HEAD"))
    current = load_suite(suite_path)  # as checked out now: the suite's name and its database
    url = resolve_database_url(db, Path.cwd(), where="--db") if db else current.database
    _check_database_untracked(git, url, good_sha, bad_sha)
    in_range = int(git.out("rev-list", "--count", f"{good_sha}..{bad_sha}"))

    store = open_store(url)
    subject = {"good": good_sha, "bad": bad_sha, "good_rev": good, "bad_rev": bad, "suite": rel,
               "repository": str(root), "setup": setup}
    bisection = Bisection(store, KIND, current.name, subject, bounds=bounds, on_trial=on_trial)
    bisection.estimate = 2 + math.ceil(math.log2(max(in_range, 1)))
    result = CommitsResult(session_id=bisection.session_id, database=url, good=good_sha, bad=bad_sha,
                           status="inconclusive", commits_in_range=in_range)
    state_dir = Path(tempfile.mkdtemp(prefix="evalgate-bisect-"))
    runner = _BisectRun()
    finished = False
    try:
        with bisection.guard():
            _bisect(git, bisection, result, rel=rel, url=url, setup=setup, started=started, state_dir=state_dir,
                    runner=runner)
            _summarise(store, result, started)
            bisection.finish("complete" if result.status == "found" else "inconclusive", result.to_dict())
        finished = True
        return result
    finally:
        try:
            runner.stop()
            _restore(git, original)
        except EvalgateError as exc:
            if finished:
                raise
            print(f"warning: {exc}", file=sys.stderr)  # never hide the bisect's own error behind this one
        finally:
            shutil.rmtree(state_dir, ignore_errors=True)


def _check_database_untracked(git: Git, url: str, good: str, bad: str) -> None:
    """A database file tracked by git, at HEAD or anywhere in good..bad, would be rewritten by checkouts."""
    path = sqlite_path(url)
    if path is None:
        return
    try:
        rel = path.resolve().relative_to(git.root).as_posix()
    except ValueError:
        return  # outside the repository
    tracked = (git.ok("ls-files", "--error-unmatch", "--", rel) or git.ok("cat-file", "-e", f"{good}:{rel}")
               or bool(git.out("log", "--format=%h", f"{good}..{bad}", "--", rel)))
    if tracked:
        raise ConfigError(f"the database {path} is tracked by git: checking out other commits would rewrite it",
                          fix=f"bisect on a copy outside the repository: cp {path} /tmp/evalgate-bisect.sqlite, "
                              "then add --db /tmp/evalgate-bisect.sqlite (a committed baseline stays as it is)")


def _bisect(git: Git, bisection: Bisection, result: CommitsResult, *, rel: str, url: str, setup: str | None,
            started: float, state_dir: Path, runner: "_BisectRun") -> None:
    root = git.root
    try:
        refs = {}
        for role, sha in (("good", result.good), ("bad", result.bad)):
            git.checkout(sha)
            label = f"{role} {sha[:10]} {git.subject(sha)}"
            outcome = bisection.trial(label, {"commit": sha, "role": role},
                                      lambda role=role: _reference(root, rel, url, setup, role, bisection))
            refs[role] = outcome.run_id
    except BudgetExhausted as exc:
        result.reason = f"{exc} before the references were run"
        return
    store = bisection.store
    good_out = {k: v[0] for k, v in store.load(refs["good"]).outputs.items()}
    bad_out = {k: v[0] for k, v in store.load(refs["bad"]).outputs.items()}
    result.keys = differing_keys(good_out, bad_out)
    result.added = [k for k in bad_out if k not in good_out]
    result.removed = [k for k in good_out if k not in bad_out]
    if not result.keys:
        shared = ""
        if result.added or result.removed:
            shared = f" on the {len([k for k in good_out if k in bad_out])} requests they share"
        result.reason = f"good and bad give identical outputs{shared}: nothing to bisect"
        return

    state = {"db": url, "session": bisection.session_id, "root": str(root), "suite": rel, "keys": result.keys,
             "good_run": refs["good"], "setup": setup,
             "bounds": {"max_steps": bisection.bounds.max_steps, "max_seconds": bisection.bounds.max_seconds},
             "started": started, "estimate": bisection.estimate, "stop_file": str(state_dir / STOP_FILE)}
    state_file = state_dir / "state.json"
    state_file.write_text(json.dumps(state), encoding="utf-8")

    start = git.run("bisect", "start", result.bad, result.good)
    found = _FIRST_BAD.search(start.stdout)  # adjacent commits: git knows at once
    if not found:
        roughly = _ROUGHLY.search(start.stdout)
        if roughly:  # "roughly K steps" after this one
            bisection.estimate = bisection.steps + int(roughly.group(1)) + 1
            state["estimate"] = bisection.estimate
            state_file.write_text(json.dumps(state), encoding="utf-8")
        code, output = runner.run(root, state_file)
        found = _FIRST_BAD.search(output)
        if not found:
            stop = _read_json(state_dir / STOP_FILE)
            if _ONLY_SKIPPED in output:
                result.reason = "only skipped commits are left to test"
                result.candidates = [_commit(git, sha) for sha in _skipped_candidates(output)]
            elif stop and stop.get("why") == "bounds":
                result.reason = stop["reason"]
                result.candidates = [_commit(git, sha) for sha in _remaining(git)]
            elif stop and stop.get("why") == "interrupted":
                raise KeyboardInterrupt()
            elif stop:
                raise EngineError(f"a bisect step failed: {stop['reason']}")
            else:
                raise EngineError(f"git bisect run failed (exit {code}): {output.strip()[-OUTPUT_TAIL:]}")
            return
    result.status = "found"
    result.first_bad = _commit(git, found.group(1))


def _reference(root: Path, rel: str, url: str, setup: str | None, role: str, bisection: Bisection) -> TrialOutcome:
    """Every request of the suite, each alone, at --good or --bad. Any failure here is an error."""
    if setup:
        ok, output = _run_setup(setup, root, _remaining_seconds(bisection))
        if not ok:
            raise ConfigError(f"--setup failed at --{role}: {output}",
                              fix=f"make the setup command succeed at --{role}, or pick another --{role}")
    suite = load_suite(root / rel, database=url)
    run_id, outputs = run_trial(suite, url, None, concurrency=1)
    return TrialOutcome("reference", run_id, {"role": role, "requests": len(outputs), "engine_run": True})


def _remaining_seconds(bisection: Bisection) -> float:
    return max(bisection.bounds.max_seconds - (time.monotonic() - bisection.started), 1.0)


def _run_setup(command: str, root: Path, timeout: float) -> tuple[bool, str]:
    """(succeeded, why not: exit status and the tail of its output)."""
    try:
        proc = subprocess.run(command, shell=True, cwd=root, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout:.0f} s (the --max-seconds budget)"
    if proc.returncode == 0:
        return True, ""
    tail = proc.stdout.strip()[-OUTPUT_TAIL:]
    return False, f"exit {proc.returncode}" + (f": {tail}" if tail else "")


class _BisectRun:
    """`git bisect run` in its own session (process group): a terminal's Ctrl-C reaches only evalgate,
    which stops the whole group itself, so the step and its engine shut down cleanly before the reset."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None

    def run(self, root: Path, state_file: Path) -> tuple[int, str]:
        # -P (3.11+): do not put the repository (the cwd of git's steps) first on sys.path, so the evalgate
        # that runs the steps is this one, not a directory that happens to be named evalgate.
        python = [sys.executable, "-P"] if sys.version_info >= (3, 11) else [sys.executable]
        command = ["git", "-c", "advice.detachedHead=false", "bisect", "run", *python, "-m", "evalgate",
                   "bisect", "commit-step", str(state_file)]
        # stdout is parsed (git's verdict); stderr is inherited, so the steps' progress lines show live.
        self.proc = subprocess.Popen(command, cwd=root, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     text=True, errors="replace", start_new_session=True)
        lines = []
        for line in self.proc.stdout:
            lines.append(line)
        code = self.proc.wait()
        self.proc.stdout.close()
        self._wait_group(self.proc.pid, 10)  # a step git no longer waits for (it stopped us) must end too
        self.proc = None
        return code, "".join(lines)

    def stop(self) -> None:
        """Stop a running `git bisect run`: SIGTERM its step processes only (a step then marks its engine run
        interrupted and answers git "stop", so git ends by itself, never killed halfway through a checkout),
        wait for the whole group to end, and SIGKILL it if it has not within STOP_WAIT_SECONDS or on a
        second Ctrl-C."""
        if self.proc is None:
            return
        pgid = self.proc.pid
        try:
            signalled: set[int] = set()
            deadline = time.monotonic() + STOP_WAIT_SECONDS
            while self.proc.poll() is None and time.monotonic() < deadline:
                for pid in _steps_in_group(pgid):  # a step git starts meanwhile is stopped too
                    if pid not in signalled:
                        signal_quietly(pid, signal.SIGTERM)
                        signalled.add(pid)
                time.sleep(0.2)
            graceful = self._wait_group(pgid, STOP_WAIT_SECONDS)
        except KeyboardInterrupt:  # asked twice: no more waiting
            graceful = False
        if not graceful:
            signal_quietly(pgid, signal.SIGKILL, group=True)
            self._wait_group(pgid, 10)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc = None

    @staticmethod
    def _wait_group(pgid: int, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while group_members(pgid):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        return True


def _steps_in_group(pgid: int) -> list[int]:
    """The step processes: Python processes of the group whose parent is not one (that is git's shell or
    helper). Their own children, the engine processes, are stopped by the step itself (evalgate/execution/worker.py),
    and a second SIGTERM from here could cut that clean-up short."""
    members = group_members(pgid)
    return [pid for pid, parent in members.items() if is_python(pid) and not (parent in members and is_python(parent))]


def _restore(git: Git, original: str) -> None:
    """Back to the original branch (or commit) with no bisect in progress."""
    if git.bisecting():
        proc = git.run("bisect", "reset", original, check=False)
    else:
        proc = git.run("checkout", "-q", original, check=False)
    if proc.returncode != 0 or git.bisecting():
        raise EngineError(f"could not return the repository {git.root} to {original}: "
                          f"{(proc.stderr or proc.stdout).strip()[-OUTPUT_TAIL:]}",
                          fix=f"run `git bisect reset {original}` (or `git checkout {original}`) there yourself")


def _commit(git: Git, sha: str) -> dict:
    return {"commit": sha, "subject": git.subject(sha)}


def _skipped_candidates(output: str) -> list[str]:
    """The shas git lists after "The first bad commit could be any of:"."""
    tail = output.split(_ONLY_SKIPPED, 1)[1]
    return re.findall(r"^([0-9a-f]{40,64})\s*$", tail.split("We cannot bisect more", 1)[0], re.MULTILINE)


def _remaining(git: Git) -> list[str]:
    """Commits git has not ruled out yet (where the first bad commit must be), newest first."""
    goods = git.out("for-each-ref", "--format=%(objectname)", "refs/bisect/good-*").split()
    return git.out("rev-list", "refs/bisect/bad", "--not", *goods).split()


def _summarise(store, result: CommitsResult, started: float) -> None:
    _, trials = store.bisect(result.session_id)
    result.references = len([t for t in trials if t.outcome == "reference"])
    result.steps = len(trials) - result.references
    result.engine_runs = len([t for t in trials if (t.detail or {}).get("engine_run")])
    result.skipped = [{"commit": (t.config or {}).get("commit", ""), "subject": t.label.split(" ", 1)[-1],
                       "reason": (t.detail or {}).get("reason", ""),
                       "engine_run": bool((t.detail or {}).get("engine_run"))}
                      for t in trials if t.outcome == "skip"]
    result.seconds = time.time() - started


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


# --- one step: `evalgate bisect commit-step STATE` (run by git bisect run at each commit) ----------------

def step(state: Path) -> int:
    """Judge the checked-out commit: 0 good, 1 bad, 125 skip, 255 stop git (reason in the stop file).
    Nothing escapes as an exception: evalgate's exit codes 2 and 3 would read as "bad" to git."""
    data = _read_json(Path(state))
    if data is None:
        print(f"error: cannot read the bisect state file {state}", file=sys.stderr)
        return STOP
    try:
        return _step(data)
    except BudgetExhausted as exc:
        _stop(data, "bounds", str(exc))
    except KeyboardInterrupt:
        _stop(data, "interrupted", "interrupted")
    except Exception as exc:  # a bug or a broken database: stop rather than blame or skip the commit
        _stop(data, "error", f"{type(exc).__name__}: {exc}")
    return STOP


def _stop(state: dict, why: str, reason: str) -> None:
    try:
        Path(state["stop_file"]).write_text(json.dumps({"why": why, "reason": reason}), encoding="utf-8")
    except OSError:
        pass


def _step(state: dict) -> int:
    git = Git(Path(state["root"]))
    sha = git.out("rev-parse", "HEAD")
    store = open_store(state["db"], create=False)
    _, trials = store.bisect(state["session"])
    bisection = Bisection(store, KIND, None, {}, bounds=Bounds(**state["bounds"]), on_trial=_print_trial,
                          session_id=state["session"])
    # This process is one of many: continue the session's count and clock, so the bounds hold across steps.
    bisection.steps = len(trials)
    bisection.started = time.monotonic() - (time.time() - state["started"])
    bisection.estimate = max(state["estimate"], bisection.steps + 1 + _steps_left(git))
    outcome = bisection.trial(f"{sha[:10]} {git.subject(sha)}", {"commit": sha}, lambda: _judge(state, git, bisection))
    return {"good": GOOD, "bad": BAD}.get(outcome.outcome, SKIP)


def _steps_left(git: Git) -> int:
    """git's own estimate of the steps after this one (for the progress line; skips make it approximate)."""
    try:
        goods = git.out("for-each-ref", "--format=%(objectname)", "refs/bisect/good-*").split()
        out = git.out("rev-list", "--bisect-vars", "refs/bisect/bad", "--not", *goods)
        return int(re.search(r"^bisect_steps=(\d+)", out, re.MULTILINE).group(1))
    except (EvalgateError, AttributeError, ValueError):
        return 0


def _judge(state: dict, git: Git, bisection: Bisection) -> TrialOutcome:
    root = git.root
    if state["setup"]:
        ok, output = _run_setup(state["setup"], root, _remaining_seconds(bisection))
        if not ok:
            return TrialOutcome("skip", None, {"reason": f"setup failed, {output}"})
    try:
        suite = load_suite(root / state["suite"], database=state["db"])
    except ConfigError as exc:
        return TrialOutcome("skip", None, {"reason": f"the suite does not load: {exc.message}"})
    # lm-eval requests are built in the engine process: their keys are checked there (a missing one fails the
    # trial, which skips the commit)
    at_commit = {p.key for p in suite.prompts} | (set(state["keys"]) if suite.lm_eval is not None else set())
    keys = [k for k in state["keys"] if k in at_commit]
    # A differing request the suite does not have at this commit cannot be compared. If another one already
    # differs, the change is here (bad); if all the others are equal, the missing one might have been the
    # one to differ, so the commit cannot be judged: skip (git then tests its neighbours instead).
    missing = [k for k in state["keys"] if k not in at_commit]
    if not keys:
        return TrialOutcome("skip", None, {"reason": "none of the differing requests exist at this commit",
                                           "missing": missing})
    try:
        run_id, outputs = run_trial(suite, state["db"], keys, concurrency=1)
    except EvalgateError as exc:
        return TrialOutcome("skip", None, {"reason": f"the engine failed: {exc.message}", "engine_run": True})
    reference = bisection.store.load(state["good_run"]).outputs
    differ = {}
    for key in keys:
        if not same(reference[key][0], outputs[key]):
            divergence = first_divergence(reference[key][0], outputs[key])
            differ[key] = to_json(divergence)
    detail = {"engine_run": True, "requests": len(keys), "differing": list(differ), "first_divergence": differ}
    if missing:
        detail["missing"] = missing
    if differ:
        return TrialOutcome("bad", run_id, detail)
    if missing:
        return TrialOutcome("skip", run_id, {**detail, "reason": f"request(s) {', '.join(missing)} missing here"})
    return TrialOutcome("good", run_id, detail)


def _print_trial(step: int, estimate: int, label: str, outcome: TrialOutcome, seconds: float) -> None:
    """The step's progress line on stderr (inherited from git, so from `evalgate bisect commits`)."""
    why = f": {outcome.detail['reason']}" if outcome.outcome == "skip" and outcome.detail.get("reason") else ""
    print(f"[trial {step}/~{estimate}] {label} -> {outcome.outcome}{why[:300]} ({seconds:.1f} s)",
          file=sys.stderr, flush=True)
