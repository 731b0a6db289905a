"""What every bisector needs: the configuration a stored run ran with, a trial run of some of its requests
under that configuration (or a changed one) in a fresh engine process, and "do these outputs differ".

A trial is a run of kind `bisect` (never promotable, never a `report --latest`), restricted to the requests
under study. It starts a new engine process each time, so nothing stale (engine state, environment, caches
in the process) carries over from one trial to the next.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..configuration.schedule import Schedule
from ..configuration.suite import Suite, load_suite
from ..execution.request import BISECT_KIND, RunRequest
from ..fingerprint import REDACTED, env_snapshot
from ..judgement.compare import first_divergence
from ..records import Completion
from ..store import RunRecord, Store

RUN_KIND = BISECT_KIND


@dataclass(frozen=True)
class RunConfig:
    """The settings a run's engine ran with, as its fingerprint recorded them: the pass-through [engine]
    arguments, whether batch invariance was requested, and the allow-listed environment."""

    engine_args: dict[str, Any]
    batch_invariant: bool
    env: dict[str, str]

    @classmethod
    def of(cls, record: RunRecord) -> "RunConfig":
        engine = record.fingerprint.engine
        return cls(engine_args=dict(engine.get("args", {})),
                   batch_invariant=bool(engine.get("batch_invariance", {}).get("requested", False)),
                   env=dict(record.fingerprint.env))

    def worker_env(self) -> dict[str, str | None]:
        """The environment changes that make a child process start its engine with exactly this allow-listed
        environment: set what the run had, unset the allow-listed names it did not have. A redacted value
        cannot be restored and keeps this process's value."""
        env: dict[str, str | None] = {name: None for name in env_snapshot() if name not in self.env}
        env.update({name: value for name, value in self.env.items() if value != REDACTED})
        return env


def suite_of(record: RunRecord, config: RunConfig | None = None, database: str | None = None) -> Suite:
    """The run's suite file, loaded as it is now, with the engine settings of `config` (default: the run's)."""
    config = config or RunConfig.of(record)
    suite = load_suite(record.run.suite_path, database=database)
    return replace(suite, engine_args=dict(config.engine_args), batch_invariant=config.batch_invariant)


def run_trial(suite: Suite, url: str, keys: list[str] | None, *, concurrency: int = 1,
              env: dict[str, str | None] | None = None, progress=None) -> tuple[int, dict[str, Completion]]:
    """Run `keys` of the suite (all requests if None) in one pass at `concurrency`, in a fresh engine process
    with `env`. Returns the trial's run id and its output per request key."""
    from ..execution.worker import execute_in_worker

    schedule = Schedule(concurrency=(concurrency,), shuffles=0, repeats=1, hot_pass=False)
    request = RunRequest(suite, url, BISECT_KIND, schedule, keys=tuple(keys) if keys is not None else None, env=env)
    result = execute_in_worker(request, progress)
    store = _store(url)
    record = store.load(result.run_id)
    store.finish_run(result.run_id, status="complete", schedule={**record.run.schedule, "timings": dict(result.timings)})
    return result.run_id, {key: outputs[0] for key, outputs in record.outputs.items()}


def _store(url: str) -> Store:
    from ..store import open_store

    return open_store(url)


def same(a: Completion, b: Completion, on: str = "bits") -> bool:
    """Whether two outputs agree: on `tokens` (ids only) or on `bits` (ids and every logprob bit)."""
    if on == "tokens":
        return a.output_ids.tolist() == b.output_ids.tolist()
    return first_divergence(a, b) is None


def differing_keys(reference: dict[str, Completion], other: dict[str, Completion], on: str = "bits") -> list[str]:
    """Keys present in both whose outputs differ, in `reference` order."""
    return [key for key in reference if key in other and not same(reference[key], other[key], on)]
