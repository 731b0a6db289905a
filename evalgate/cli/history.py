"""Looking at history: `runs list/show`, `baseline accept/list`, `diff RUN_A RUN_B`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from .common import console, database_url_for, handled, open_store_for, print_json, print_table

DbOpt = typer.Option(None, "--db", help="Database URL or SQLite path")
SuiteOpt = typer.Option(None, "--suite", help="Take the database from this suite file")


def _when(dt) -> str:
    return dt.strftime("%Y-%m-%d %H:%M:%S") if dt else ""


JsonRowsOpt = typer.Option(False, "--json", help="Print the rows as JSON, for scripts")


@handled
def runs_list(db: Optional[str] = DbOpt, suite: Optional[Path] = SuiteOpt,
              name: Optional[str] = typer.Option(None, "--name", help="Only this suite name"),
              limit: int = typer.Option(50, help="How many runs, newest first"), json_out: bool = JsonRowsOpt):
    """List runs, newest first."""
    from ..store.listing import run_rows

    rows = run_rows(database_url_for(db, suite), name, limit)
    if json_out:
        print_json(rows)
        return
    print_table(["run", "suite", "kind", "status", "verdict", "counts", "started", "baseline"],
                [[str(r["run"]), r["suite"], r["kind"], r["status"], r["verdict"] or "",
                  ", ".join(f"{k} {v}" for k, v in r["counts"].items()), r["started"] or "", "yes" if r["baseline"] else ""]
                 for r in rows])


@handled
def runs_history(suite: Optional[str] = typer.Argument(None, help="A suite file, or a suite's name (default: "
                                                                  "./evalgate.toml)"),
                 db: Optional[str] = DbOpt, limit: int = typer.Option(20, help="How many runs, newest first"),
                 json_out: bool = JsonRowsOpt):
    """A suite's judged runs at a glance: one line per run, with its verdict counts, what changed since its
    baseline, and each lm-eval metric with its delta."""
    from ..configuration.suite_file import find_suite, holds_suite
    from ..store.listing import history_rows

    path = Path(suite) if suite else find_suite(required=False)
    if path is not None and holds_suite(path):
        from ..configuration.suite import read_suite_header

        header = read_suite_header(path, database=db)  # the [suite] table alone: no model, lock or Hub
        name, url = header.name, header.database
    elif suite:
        name, url = suite, database_url_for(db, None)
    else:
        raise typer.BadParameter("no suite file here (./evalgate.toml or [tool.evalgate] in ./pyproject.toml): name a "
                                 "suite file or a suite", param_hint="SUITE")
    rows = history_rows(url, name, limit)
    if json_out:
        print_json([r.to_dict() for r in rows])
        return
    print_table(["run", "finished", "kind", "verdict", "counts", "changed", "metrics"],
                [[str(r.run), r.finished or "", r.kind, r.verdict or "",
                  ", ".join(f"{k} {v}" for k, v in r.counts.items()),
                  "?" if r.changed is None else ", ".join(r.changed) or "-",
                  "?" if r.metrics is None else "; ".join(metric_text(m) for m in r.metrics)]
                 for r in rows])


def metric_text(m: dict) -> str:
    """`evalgate_capitals acc,none 0.75 (-0.25)`: a metric's value and its delta from the run's baseline."""
    from ..reports.explain import delta_text, number_text

    delta = f" ({delta_text(m['delta'])})" if m["delta"] is not None else ""
    return f"{m['task']} {m['metric']} {number_text(m['current']) or '-'}{delta}"


@handled
def runs_show(run_id: int, db: Optional[str] = DbOpt, suite: Optional[Path] = SuiteOpt,
              json_out: bool = typer.Option(False, "--json", help="Print the run as JSON")):
    """Show one run: status, schedule, fingerprint components, and its stored report (verdicts, factors)."""
    from ..judgement.judging import stored_report
    from ..reports.terminal import render_report
    from ..store import display_status

    store = open_store_for(db, suite)
    run, fingerprint = store.get_run(run_id), store.fingerprint_of(run_id)
    requests, outputs = store.run_size(run_id)  # counted: a leaderboard-sized run is never loaded to be shown
    report = stored_report(store, run_id)
    info = {
        "run": run.id, "suite": run.suite_name, "suite_path": run.suite_path, "kind": run.kind, "status": display_status(run),
        "verdict": run.verdict, "exit_code": run.exit_code, "baseline_run_id": run.baseline_run_id,
        "started_at": _when(run.started_at), "finished_at": _when(run.finished_at), "error": run.error,
        "summary": run.summary, "owner": run.owner, "engine_log": run.engine_log, "schedule": run.schedule,
        "fingerprint": {name: comp["hash"][:16] for name, comp in fingerprint.items()},
        "engine": fingerprint.engine or None, "requests": requests, "outputs": outputs,
        "scores": [{"task": sc.task, "metric": sc.metric, "value": sc.value, "stderr": sc.stderr}
                   for sc in store.load_scores(run_id)[0]],
        # the stored report holds the verdicts of the requests that differ; a run never judged has only its rows
        "report": report.to_dict() if report is not None else None,
        **({} if report is not None else {"verdicts": store.verdicts(run_id)}),
    }
    if json_out:
        console.print_json(json.dumps(info, default=str))
        return
    for key, value in info.items():
        if key in ("verdicts", "schedule", "engine", "scores", "report"):
            continue
        console.print(f"[bold]{key}[/]: {value}")
    console.print(f"[bold]schedule[/]: {json.dumps({k: v for k, v in run.schedule.items() if k not in ('passes', 'timings')})}")
    timings = {k: v for k, v in (run.schedule.get("timings") or {}).items() if k != "passes"}  # --json has them whole
    console.print(f"[bold]timings[/]: {json.dumps(timings)}")
    console.print(f"[bold]engine[/]: {json.dumps(info['engine'])}")
    for sc in info["scores"]:  # lm-eval metrics of the run's first pass
        console.print(f"  [bold]{sc['task']}[/] {sc['metric']} = {sc['value']}" + (f" ± {sc['stderr']:.3g}" if sc["stderr"] else ""))
    if report is not None:  # the report the run was judged with, read back as written
        console.print()
        render_report(console, report)


@handled
def baseline_accept(run_id: int, db: Optional[str] = DbOpt, suite: Optional[Path] = SuiteOpt):
    """Promote a complete run to be the baseline of its suite on its hardware class."""
    from .. import baselines

    store = open_store_for(db, suite)
    run = baselines.accept(store, run_id)
    console.print(f"run {run.id} is now the baseline for suite {run.suite_name!r} (hardware {run.hardware_class[:12]})")


@handled
def baseline_adopt(run_id: int, db: Optional[str] = DbOpt, suite: Optional[Path] = SuiteOpt):
    """Make a check judged against another hardware class's baseline, with no confident flip, the baseline of
    its own class; its receipt (against which run and class, counts, envelope) shows in `baseline list`."""
    from .. import baselines

    store = open_store_for(db, suite)
    run = baselines.adopt_run(store, run_id)
    console.print(f"run {run.id} is now the baseline for suite {run.suite_name!r} on hardware {run.hardware_class[:12]}, "
                  f"adopted by proof against run {run.baseline_run_id}")


@handled
def baseline_list(db: Optional[str] = DbOpt, suite: Optional[Path] = SuiteOpt, json_out: bool = JsonRowsOpt):
    """List the current baseline of each suite and hardware class, with each class's lineage (adopted from
    which run and class, and what that check found)."""
    from ..store.listing import baseline_rows

    rows = baseline_rows(database_url_for(db, suite))
    if json_out:
        print_json(rows)
        return
    print_table(["suite", "hardware class", "hardware", "run", "promoted", "lineage"],
                [[r["suite"], r["hardware_class"][:12], r["hardware"], str(r["run"]), r["promoted"] or "", r["lineage"]]
                 for r in rows])


@handled
def diff(run_a: int, run_b: int, db: Optional[str] = DbOpt, suite: Optional[Path] = SuiteOpt,
         json_report: Optional[Path] = typer.Option(None, "--json-report", help="Also write the diff as JSON")):
    """Compare two runs: fingerprint components that differ, then per-request differences (B against A)."""
    from ..judgement.judging import compare_runs
    from ..reports.json_report import write_json
    from ..reports.terminal import render_report

    store = open_store_for(db, suite)
    report = compare_runs(store, run_a, run_b)
    render_report(console, report)
    if json_report:
        write_json(report, json_report)
