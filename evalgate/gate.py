"""The gate, as a library: create a baseline, check against it, accept a run. The CLI wraps these.

A run's inference happens in a supervised child process (evalgate/worker.py); this process only opens
the database, judges the stored outputs and finishes the run.
"""

from __future__ import annotations

import time

from .errors import ConfigError, NoBaselineError
from .fingerprint import hardware_component
from .runner import Progress, Timings
from .schedule import with_overrides
from .store import Store, open_store
from .store.db import sqlite_path
from .suite import Schedule, Suite
from .verdict import Report, judge
from .worker import run_in_worker


def _database(suite: Suite, store: Store | str | None) -> str:
    if isinstance(store, Store):
        return store.url
    return store or suite.database


def _existing_store(url: str) -> Store | None:
    """The store if its database exists (opening it refuses foreign or newer databases before any engine
    starts); None for a SQLite file not created yet, which the run creates once its input is valid."""
    path = sqlite_path(url)
    if path is not None and not path.exists():
        return None
    return open_store(url)


def _run_and_judge(suite: Suite, url: str, *, kind: str, schedule: Schedule | None, baseline_run_id: int | None,
                   strict: bool, promote_if, progress: Progress | None, timings: Timings) -> Report:
    run_id = run_in_worker(suite, url, kind=kind, schedule=schedule or suite.schedule, timings=timings,
                           progress=progress)
    store = open_store(url)
    try:
        t0 = time.perf_counter()
        current = store.load(run_id)
        baseline = store.load(baseline_run_id) if baseline_run_id is not None else None
        report = judge(current, baseline, kind=kind, strict=strict)
        report.promoted = promote_if(report)
        timings.add("evalgate", time.perf_counter() - t0)
        store.finish_run(
            run_id, status="complete", verdict=report.status, exit_code=int(report.exit_code),
            summary=report.counts, verdicts=[v.to_dict() for v in report.verdicts if v.verdict != "stable"],
            schedule={**current.run.schedule, "timings": dict(timings)}, baseline_run_id=baseline_run_id,
            promote=report.promoted,
        )
    except BaseException as exc:
        store.mark_incomplete(run_id, "failed", f"{type(exc).__name__}: {exc}")
        raise
    return report


def create_baseline(suite: Suite, store: Store | str | None = None, *, schedule: Schedule | None = None,
                    allow_variance: bool = False, progress: Progress | None = None,
                    timings: Timings | None = None) -> Report:
    """Run the suite and make it the baseline of this suite on this hardware class, unless its passes
    disagree (batch variance): a baseline must be reproducible. `allow_variance` promotes it anyway,
    with the first pass of each request as the reference. `store`: a Store or URL (default: the suite's)."""
    url = _database(suite, store)
    _existing_store(url)
    return _run_and_judge(
        suite, url, kind="baseline", schedule=schedule, baseline_run_id=None, strict=False,
        promote_if=lambda report: allow_variance or not report.failing, progress=progress,
        timings=timings if timings is not None else Timings(),
    )


def find_baseline(suite: Suite, store: Store | None, url: str) -> int:
    hardware = hardware_component()["hash"]
    run_id = store.baseline_for(suite.name, hardware) if store else None
    if run_id is None:
        others = store.baselines(suite.name) if store else []
        hint = (f" (baselines exist for {len(others)} other hardware class(es): a baseline is per hardware)"
                if others else "")
        raise NoBaselineError(
            f"no baseline for suite {suite.name!r} on this hardware in {url}{hint}",
            fix=f"evalgate baseline create {suite.path}",
        )
    return run_id


def check(suite: Suite, store: Store | str | None = None, *, schedule: Schedule | None = None,
          strict: bool = False, progress: Progress | None = None, timings: Timings | None = None) -> Report:
    """Run the suite and judge it against the baseline (exit 4 before any inference if there is none)."""
    url = _database(suite, store)
    baseline_run_id = find_baseline(suite, _existing_store(url), url)
    return _run_and_judge(
        suite, url, kind="check", schedule=schedule, baseline_run_id=baseline_run_id, strict=strict,
        promote_if=lambda report: False, progress=progress, timings=timings if timings is not None else Timings(),
    )


def accept(store: Store, run_id: int):
    """Promote a complete run to be the baseline of its suite on its hardware class."""
    return store.promote(run_id)


def compare_runs(store: Store, run_a: int, run_b: int) -> Report:
    """Judge run B against run A as if A were the baseline (for `evalgate diff`)."""
    a, b = store.load(run_a), store.load(run_b)
    if not a.outputs or not b.outputs:
        raise ConfigError(f"run {run_a if not a.outputs else run_b} has no outputs to compare",
                          fix="pick runs that got past engine start (see `evalgate runs list`)")
    return judge(b, a, kind="diff")


def resolve_schedule(suite: Suite, concurrency=None, shuffles=None, repeats=None) -> Schedule:
    return with_overrides(suite.schedule, concurrency, shuffles, repeats)
