"""Resuming a run whose process died (SIGKILL, an engine death, a preempted node): the same run goes on, its
stored waves kept, only the rest run (`--resume`, docs/usage.md "Resuming a run").

A pass is stored a whole wave at a time (store `OutputWriter`), and a pass's waves are a function of its
requests and its condition (configuration/schedule.py `waves`), so a resumed pass skips the waves stored
and runs the others as the first process would have: a resumed run stores the same outputs and gets the
same verdicts as one never interrupted. What cannot go on is redone: a probe's pass whole (its proof reads
the engine that ran it), a hot pass's cache warmed again (it died with the engine), and a rescoring's
missing requests.

A resume is refused when the stored outputs would not match what this process would record: another
fingerprint (model, engine, evalgate, hardware, ...), another schedule, or a run that another live process
still owns.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from ..fingerprint import delta, fingerprint_hash
from ..owners import owner_alive
from ..store import Store

UNFINISHED = ("running", "failed", "interrupted")  # the statuses `--resume` continues
FRESH_RUN = "run it without --resume to start a new run"  # the fix a refused resume names


def run_to_resume(store: Store, suite_name: str, kind: str, *, shard: str | None, group: str | None,
                  run_id: int | None = None) -> int | None:
    """The run a resume continues: `run_id`, checked, or else the newest unfinished run of this suite, kind,
    shard and group that no live process owns (None: there is none, and the run starts afresh)."""
    if run_id is None:
        return next((run.id for run in store.unfinished_runs(suite_name, kind, str(shard) if shard else None, group)
                     if not _owned_here(run)), None)
    run = store.get_run(run_id)
    wanted = {"suite": suite_name, "kind": kind, "shard": str(shard) if shard else None}
    found = {"suite": run.suite_name, "kind": run.kind, "shard": run.shard}
    wrong = [f"{name} {found[name]!r}, not {wanted[name]!r}" for name in wanted if found[name] != wanted[name]]
    if wrong:
        raise ConfigError(f"run {run_id} cannot be resumed here: it has {'; '.join(wrong)}",
                          fix="resume it with the command, suite and --shard that started it (see `evalgate runs list`)")
    if run.status not in UNFINISHED:
        raise ConfigError(f"run {run_id} is {run.status}: there is nothing to resume", fix=FRESH_RUN)
    if _owned_here(run):
        raise ConfigError(f"run {run_id} is running in process {run.owner['pid']} on this machine",
                          fix="wait for it, or stop that process first")
    return run_id


def _owned_here(run) -> bool:
    """Whether a live process on this machine is still writing the run (one on another host cannot be told)."""
    return run.status == "running" and owner_alive(run.owner) is True


@dataclass
class Resumed:
    """A run being continued: what it stored before, by pass (the waves) and by rescoring (the requests)."""

    run_id: int
    record: dict  # the run's stored schedule record: its passes, and what did not run
    waves: dict[int, set[int]] = field(default_factory=dict)
    rescored: dict[int, set[str]] = field(default_factory=dict)

    def stored(self, pass_index: int, wave: int) -> bool:
        return wave in self.waves.get(pass_index, ())

    @property
    def pass_indexes(self) -> set[int]:
        return {p["index"] for p in self.record["passes"]}


def resume_run(store: Store, run_id: int, fingerprint: dict, record: dict, labels: Mapping[str, Any]) -> Resumed:
    """Check that this process would record what run `run_id` stored (its fingerprint, its schedule record),
    then make the run this process's: running again, owned here (`labels`: the request's, its owner and engine
    log among them)."""
    run = store.get_run(run_id)
    if fingerprint_hash(fingerprint) != run.fingerprint_hash:
        changed = delta(store.fingerprint_of(run_id), fingerprint) or ["the fingerprint"]
        raise ConfigError(f"run {run_id} was recorded with another {', '.join(changed)}: its stored outputs would not "
                          "match this run's", fix=FRESH_RUN)
    stored = run.schedule or {}
    knobs = [name for name in record if name not in ("passes", "not_run", "cold_by", "gate", "timings")
             and _plain(record[name]) != _plain(stored.get(name))]
    planned = {p["index"]: _plain(p) for p in record["passes"]}
    if knobs or any(planned.get(p["index"]) != _plain(p) for p in stored.get("passes", [])):
        raise ConfigError(f"run {run_id} ran another schedule ({', '.join(knobs) or 'its passes'} differ)",
                          fix=f"resume with the schedule options that started it, or {FRESH_RUN}")
    store.reopen_run(run_id, owner=labels.get("owner"), engine_log=labels.get("engine_log"))
    return Resumed(run_id, stored, store.stored_waves(run_id), store.rescored_keys(run_id))


def _plain(value) -> object:
    """A value as stored JSON reads back (tuples as lists), to compare a plan with a stored record."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))
