"""Executing a suite: one engine load, every pass of the schedule, every output stored.

The engine is loaded once and reused by all passes. Each pass splits the requests into waves of its
concurrency; a wave is submitted to the engine together so its requests really share batches. Any
failure or interruption after the run row exists marks the run incomplete before the error propagates.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from dataclasses import asdict, dataclass, replace
from typing import Callable, Iterator

from ..configuration.prompts import SCORING_TYPES
from ..configuration.schedule import ROTATING, UNKNOWN, Pass, Schedule, in_sample, plan_passes, waves
from ..configuration.shard import Shard
from ..configuration.suite import Suite
from ..configuration.trace import DEFAULT_STEP_SECONDS
from ..engines import Engine, start_engine
from ..errors import ConfigError, EngineError, EvalgateError
from ..fingerprint import build_fingerprint
from ..records import Completion
from ..store import Store
from .probes import Wave, WaveContext, get_probe
from .replay import replay, total_stats
from .rescore import Rescore, rescore_run

# progress(done, total, label): requests completed across all passes.
Progress = Callable[[int, int, str], None]


class Timings(dict):
    """Seconds spent per phase (`engine_load`, `inference`, `evalgate`), plus `passes`: per-pass figures
    (concurrency, requests, output tokens, seconds, wave seconds). Stored with the run; read by benchmarks/."""

    def phases(self) -> dict[str, float]:
        return {k: v for k, v in self.items() if isinstance(v, float)}

    def add(self, phase: str, seconds: float) -> None:
        self[phase] = self.get(phase, 0.0) + seconds

    @contextlib.contextmanager
    def phase(self, phase: str):
        """Add the time spent in the `with` block to `phase`."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(phase, time.perf_counter() - t0)


def tokenize_prompts(suite: Suite, engine: Engine) -> dict[str, list[int]]:
    """Prompt ids, checked against the engine's context length before anything is stored."""
    limit = engine.max_model_len
    prompt_ids = {}
    for p in suite.prompts:
        try:
            ids = engine.tokenize(p)
        except ConfigError as exc:  # a chat template that refuses the messages: name the line
            raise ConfigError(f"{suite.locations[p.key]}: {exc.message}", fix=exc.fix) from None
        # lm-eval scoring requests are built to fit (each window is its own engine request)
        if not p.segments and len(ids) >= limit:
            raise ConfigError(
                f"{suite.locations[p.key]}: prompt {p.key!r} is {len(ids)} tokens, the engine's max_model_len is {limit}",
                fix="shorten the prompt or raise engine.max_model_len in the suite file",
            )
        prompt_ids[p.key] = ids
    return prompt_ids


def execute_suite(suite: Suite, url: str, *, kind: str, schedule: Schedule, timings: Timings,
                  progress: Progress | None = None, on_run: Callable[[int], None] | None = None,
                  labels: dict | None = None, shard: Shard | None = None, keys: tuple[str, ...] | None = None,
                  rescore: Rescore | None = None) -> int:
    """Everything a run does in the engine's process, stage by stage: find the suite's lm-eval tasks
    (before the engine starts: a broken task file costs no engine start), start the engine, build the
    tasks' requests, keep this `shard`'s requests (or only `keys`, for bisect trials), record every pass
    (`record_run`), then let lm-eval score the first pass (whole suites only). Returns the run id."""
    from ..configuration.shard import select_keys, select_shard

    # vLLM's, lm-eval's and datasets' progress bars (read when tqdm is imported): evalgate shows its own.
    os.environ.setdefault("TQDM_DISABLE", "1")
    prepared = None
    if suite.lm_eval is not None:
        from ..lmeval.tasks import prepare

        with timings.phase("lm_eval"):
            prepared = prepare(suite.lm_eval, suite.path)
    with timings.phase("engine_load"):
        engine = start_engine(suite)
    tasks = None
    if prepared is not None:
        from ..lmeval.tasks import TaskRun

        with timings.phase("lm_eval"):
            tasks = TaskRun(prepared, engine.tokenizer, engine.max_model_len, suite.sampling)
            suite = tasks.build(suite)
    if shard is not None:
        suite = select_shard(suite, shard)
    if keys is not None:
        suite = select_keys(suite, keys)
    # Bisect trials run some requests and compare them with other trials: each wave starts from an empty
    # prefix cache, so an output never depends on which requests happened to run before it.
    labels = {**(labels or {}), "shard": str(shard) if shard else None}
    run_id = record_run(suite, url, engine, kind=kind, schedule=schedule, timings=timings, progress=progress,
                        on_run=on_run, labels=labels, cold_waves=kind == "bisect", rescore=rescore)
    if tasks is not None and shard is None and keys is None:  # part of a task: its metrics would mislead
        from ..store import open_store

        store = open_store(url)
        with incomplete_on_failure(store, run_id, "scoring with lm-eval: "), timings.phase("lm_eval"):
            first_pass = {key: outputs[0] for key, outputs in store.load(run_id).outputs.items()}
            scores, samples = tasks.score(first_pass)
            store.add_scores(run_id, scores, samples)
    return run_id


@contextlib.contextmanager
def incomplete_on_failure(store: Store, run_id: int, context: str = ""):
    """A run that cannot finish must never look complete: mark it before the error propagates."""
    try:
        yield
    except KeyboardInterrupt:
        store.mark_incomplete(run_id, "interrupted", "interrupted (SIGINT/SIGTERM)")
        raise
    except BaseException as exc:
        store.mark_incomplete(run_id, "failed", f"{context}{type(exc).__name__}: {exc}")
        raise


@dataclass
class RunPlan:
    """What a run will do, decided before its run row exists: the requests (tasks built, this shard's),
    their prompt ids, the identity, the schedule with its rotation turn, the passes (probes' included) and
    what of it cannot run here. `record_run` executes it; nothing about it changes while the passes run."""

    suite: Suite
    schedule: Schedule
    prompt_ids: dict[str, list[int]]
    fingerprint: dict
    passes: list[Pass]
    not_run: list[dict]
    salt: str | None  # one per run, so a server that outlives runs never serves a cold pass from an earlier run
    cold_waves: bool = False  # every wave from an empty prefix cache (bisect trials)
    rescore: Rescore | None = None  # the rescorings the run records (execution/rescore.py)

    def schedule_record(self) -> dict:
        """The run's stored `schedule`: the knobs, the passes and their conditions, and the judging policy."""
        return {**asdict(self.schedule), "passes": [p.to_dict() for p in self.passes], "not_run": list(self.not_run),
                "cold_by": "cache_salt" if self.salt else None,
                "gate": self.suite.gate.to_dict()}  # the judging policy: recorded, never identity


def plan_run(suite: Suite, engine: Engine, schedule: Schedule, prompt_ids: dict[str, list[int]], fingerprint: dict, *,
             cold_waves: bool = False, rescore: Rescore | None = None) -> RunPlan:
    """The plan of a run of these requests (`tokenize_prompts`) on this engine."""
    passes, not_run = plan_for(schedule, engine, suite, prompt_ids)
    salt = uuid.uuid4().hex[:16] if engine.salts_cache else None
    return RunPlan(suite, schedule, prompt_ids, fingerprint, passes, not_run, salt, cold_waves, rescore)


def record_run(suite: Suite, url: str, engine: Engine, *, kind: str, schedule: Schedule, timings: Timings,
               progress: Progress | None = None, on_run: Callable[[int], None] | None = None,
               labels: dict | None = None, cold_waves: bool = False, rescore: Rescore | None = None) -> int:
    """Plan the run, create its row, run every pass of the plan and store it; returns the run id (status
    still `running`). `cold_waves`: reset the engine's prefix cache before each wave (engines that have one).

    The database is opened only once the engine is up and every prompt fits, so a configuration error
    never leaves a database or a run behind."""
    from ..store import open_store

    with timings.phase("evalgate"):
        prompt_ids = tokenize_prompts(suite, engine)  # a prompt that does not fit: ConfigError, nothing stored
        fingerprint = build_fingerprint(suite, engine)
        store = open_store(url)
        if schedule.preset == ROTATING:
            schedule = replace(schedule, turn=rotation_turn(store, suite.name))
        plan = plan_run(suite, engine, schedule, prompt_ids, fingerprint, cold_waves=cold_waves, rescore=rescore)
        record = plan.schedule_record()
        run_id = store.create_run(suite, kind, record, plan.fingerprint, plan.prompt_ids, **(labels or {}))
    if on_run:
        on_run(run_id)
    with incomplete_on_failure(store, run_id):
        dropped = _run_passes(plan, store, engine, run_id, timings, progress)
        if dropped:  # planned, but could not run after all: not a pass to judge, a reason to report
            gone = {p.index for p, _ in dropped if p is not None}
            record["passes"] = [p for p in record["passes"] if p["index"] not in gone]
            record["not_run"] += [{"pass": f"probe {p.probe}" if p else "rescoring", "reason": reason}
                                  for p, reason in dropped]
            store.update_schedule(run_id, record)
    return run_id


TURN_ENV = "EVALGATE_ROTATION_TURN"


def rotation_turn(store: Store, suite_name: str) -> int:
    """The rotating preset's turn: the number of earlier complete baseline and check runs of the suite in
    this database, or $EVALGATE_ROTATION_TURN (for CI that does not keep the database between runs, e.g.
    the CI system's run number)."""
    given = os.environ.get(TURN_ENV)
    if given is None:
        return store.completed_runs(suite_name)
    try:
        turn = int(given)
    except ValueError:
        turn = -1
    if turn < 0:
        raise ConfigError(f"${TURN_ENV} is {given!r}, not a non-negative integer",
                          fix="set it to the CI run number (e.g. ${{ github.run_number }}), or unset it")
    return turn


def plan_for(schedule: Schedule, engine: Engine, suite: Suite,
             prompt_ids: dict[str, list[int]]) -> tuple[list[Pass], list[dict]]:
    """The schedule's passes on this engine, its probes' passes, and what of it cannot run here (with the
    reason: never reported as passed)."""
    from .probes import PlanContext, plan_probes

    not_run = []
    if not engine.salts_cache:
        # Without salts no pass is provably cold: every cache state is unknown, and a hot pass proves nothing.
        passes = [replace(p, cache=UNKNOWN) for p in plan_passes(schedule, prefix_caching=False)]
        if schedule.hot_pass:
            not_run.append({"pass": "prefix cache hot", "reason": f"the {engine.kind} engine cannot salt its prefix "
                            "cache, so passes cannot be made cold (cache state unknown)"})
        if schedule.probes:
            not_run.append({"pass": "probes", "reason": f"the {engine.kind} engine cannot salt its prefix cache: "
                            "a probe's difference could not be told from cache state"})
        return passes, not_run
    if schedule.hot_pass and engine.prefix_caching is False:
        not_run.append({"pass": "prefix cache hot", "reason": "the engine has prefix caching off "
                        "(enable_prefix_caching = false): there is no cache to warm"})
    passes = plan_passes(schedule, prefix_caching=engine.prefix_caching)
    context = PlanContext(
        schedule=schedule, passes=passes, requests=len(suite.prompts),
        generating=sum(1 for p in suite.prompts if p.request_type not in SCORING_TYPES),
        longest_prompt=max((len(ids) for ids in prompt_ids.values()), default=0),
        max_model_len=engine.max_model_len, capture_sizes=engine.capture_sizes, kv_block_size=engine.kv_block_size,
        starts_engines=engine.starts_probe_engines, prefix_caching=engine.prefix_caching, placement=engine.placement)
    probes, probes_not_run = plan_probes(schedule.probes, context)
    return passes + probes, not_run + probes_not_run


def pass_waves(pass_: Pass, keys: list[str], context: WaveContext) -> Iterator[Wave]:
    """The waves of a pass: the schedule's (every request recorded), or a probe's (execution/probes/)."""
    if pass_.probe:
        yield from get_probe(pass_.probe).waves(pass_, keys, context)
        return
    for wave in waves(keys, pass_):
        yield Wave.of([context.prompts[k] for k in wave])


def probe_engine(suite: Suite, current: Engine, pass_: Pass, timings: Timings) -> Engine:
    """A probe's own engine: the suite's settings with the probe's over them. The current engine is closed
    first, so only one engine holds memory (a GPU has room for one)."""
    current.close()
    with timings.phase("engine_load"):
        return start_engine(replace(suite, engine_args={**suite.engine_args, **json.loads(pass_.engine_args)}))


def _run_passes(plan: RunPlan, store: Store, engine: Engine, run_id: int, timings: Timings,
                progress: Progress | None) -> list[tuple[Pass | None, str]]:
    """Every pass of the plan, stored pass by pass, and the run's rescorings (execution/rescore.py). Returns
    what could not run after all, with the reason (a probe whose own engine did not start, or whose engine
    never preempted; None: the rescoring)."""
    suite, schedule, passes, prompt_ids, salt = plan.suite, plan.schedule, plan.passes, plan.prompt_ids, plan.salt
    dropped: list[tuple[Pass | None, str]] = []
    by_key = {p.key: p for p in suite.prompts}
    keys = [p.key for p in suite.prompts]
    total = sum(len(keys) if p.sample is None else sum(in_sample(k, p.sample) for k in keys) for p in passes)
    done = 0
    load = schedule.load
    run_trace = load.load_trace() if load is not None and load.trace else None  # read once for every loaded pass
    first_pass: dict[str, Completion] = {}

    rescore = plan.rescore

    def rescore_once() -> None:  # on the suite's own engine, before a probe's replaces it
        nonlocal rescore
        if rescore is not None:
            try:
                with timings.phase("rescore"):
                    rescore_run(rescore, engine, store, run_id, plan.prompt_ids, first_pass, plan.salt)
            except EngineError as exc:  # the run stands; judging it across hardware then lacks the envelope
                dropped.append((None, f"the engine could not score the tokens: {exc.message}"))
            rescore = None

    for pass_ in passes:
        probe = get_probe(pass_.probe) if pass_.probe else None
        if pass_.engine_args:
            rescore_once()
            try:
                engine = probe_engine(suite, engine, pass_, timings)
            except EvalgateError as exc:
                dropped.append((pass_, f"its engine ({pass_.engine_args}) did not start: {exc.message}"))
                continue
        before = probe.before(engine) if probe else None
        pass_outputs = []
        wave_seconds: list[float] = []
        # [load]: a server engine keeps filler traffic running through this pass (evalgate/configuration/load.py),
        # or each wave runs inside one replay of the trace (evalgate/execution/replay.py)
        loaded = load is not None and load.applies(pass_.concurrency) and not pass_.probe
        trace = run_trace if loaded else None
        replays: list[dict] = []
        filler = loaded and trace is None
        with (engine.under_load(load, pass_) if filler else contextlib.nullcontext({})) as load_stats:
            context = WaveContext(schedule, engine, by_key, prompt_ids, first_pass)
            for wave_index, wave in enumerate(pass_waves(pass_, keys, context)):
                if plan.cold_waves:
                    engine.reset_cache()
                t0 = time.perf_counter()
                cache_salt = f"{salt}-{pass_.salt_of}" if salt else None
                if wave.trace is not None or trace is not None:
                    # the traffic runs cold in each replay, so every replay is the same schedule
                    completions, stats = replay(
                        engine, wave.trace or trace, wave.prompts, seed=load.seed if load else schedule.seed,
                        cache_salt=cache_salt, traffic_salt=f"{salt}-{pass_.index}-{wave_index}-trace" if salt else None,
                        step_seconds=load.step_seconds if load else DEFAULT_STEP_SECONDS)
                    replays.append(stats)
                else:
                    completions = (engine.generate(wave.prompts, cache_salt=cache_salt) if salt
                                   else engine.generate(wave.prompts))
                wave_seconds.append(time.perf_counter() - t0)
                timings.add("inference", wave_seconds[-1])
                if len(completions) != len(wave.prompts):
                    raise EngineError(f"engine returned {len(completions)} outputs for {len(wave.prompts)} requests")
                for position, completion in enumerate(completions):
                    completion.pass_index, completion.concurrency = pass_.index, pass_.concurrency
                    completion.wave, completion.position = wave_index, position
                recorded = [c for c, keep in zip(completions, wave.recorded) if keep]  # companions are not stored
                pass_outputs.extend(recorded)
                done += len(recorded)
                if progress:
                    progress(min(done, total), total, pass_.label)
        if replays:
            load_stats = total_stats(replays)
        if pass_.index == 0:
            first_pass = {c.key: c for c in pass_outputs}
        proof, unproven = probe.proof(engine, before, pass_outputs) if probe else ({}, None)
        if unproven:
            dropped.append((pass_, unproven))
        # Per-pass throughput figures (read by `evalgate cost` and benchmarks/); a wave's time is the latency
        # of each of its requests, since a wave is submitted and returns together.
        timings.setdefault("passes", []).append({
            "index": pass_.index, "concurrency": pass_.concurrency, "cache": pass_.cache, "probe": pass_.probe,
            "requests": len(pass_outputs),
            "output_tokens": sum(len(c.output_ids) for c in pass_outputs),
            "seconds": sum(wave_seconds), "wave_seconds": wave_seconds, **({"load": load_stats} if loaded or replays else {}),
            **proof,
        })
        t0 = time.perf_counter()
        store.add_outputs(run_id, pass_outputs)
        timings.add("evalgate", time.perf_counter() - t0)
    rescore_once()
    return dropped
