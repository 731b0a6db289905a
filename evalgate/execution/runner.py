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
from array import array
from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Iterator, Mapping, Sequence

from ..codec import to_json
from ..configuration.prompts import SCORING_TYPES
from ..configuration.schedule import ROTATING, UNKNOWN, Pass, Schedule, in_sample, plan_passes, waves
from ..configuration.suite import Suite
from ..engines import Engine, start_engine
from ..errors import ConfigError, EngineError, EvalgateError
from ..fingerprint import build_fingerprint
from ..probes import Wave, WaveContext, get_probe
from ..records import Completion
from ..store import OutputWriter, Store
from ..timings import Timings
from .replay import Salts
from .request import Progress, RunRequest
from .rescore import RecordedRun, rescore_run
from .resume import Resumed, resume_run
from .traffic import Traffic, traffic_for

OnRun = Callable[[int], None]  # called with the run id once the run row exists


def tokenize_prompts(suite: Suite, engine: Engine) -> dict[str, Sequence[int]]:
    """Prompt ids, checked against the engine's context length before anything is stored. Each as an int32
    array, held for the whole run: 4 bytes a token, not a list's 36 (a leaderboard suite's few-shot prompts
    are hundreds of tokens each)."""
    limit = engine.max_model_len
    prompt_ids = {}
    for p in suite.prompts:
        try:
            ids = engine.tokenize(p)
        except ConfigError as exc:  # a chat template that refuses the messages: name the line
            raise ConfigError(f"{suite.location_of(p)}: {exc.message}", fix=exc.fix) from None
        # lm-eval scoring requests are built to fit (each window is its own engine request)
        if not p.segments and len(ids) >= limit:
            raise ConfigError(
                f"{suite.location_of(p)}: prompt {p.key!r} is {len(ids)} tokens, the engine's max_model_len is {limit}",
                fix="shorten the prompt or raise engine.max_model_len in the suite file",
            )
        prompt_ids[p.key] = array("i", ids)
    return prompt_ids


def rendered_chats(suite: Suite, engine: Engine, prompt_ids: dict[str, Sequence[int]]) -> dict[str, str]:
    """Each chat request's prompt as the engine saw it, as text (its ids decoded, special tokens included):
    stored with the run, so a check can show where a rendered prompt moved."""
    return {p.key: engine.decode(list(prompt_ids[p.key])) for p in suite.prompts
            if p.messages is not None and p.prompt_ids is None}


def execute_suite(request: RunRequest, timings: Timings, progress: Progress | None = None,
                  on_run: OnRun | None = None) -> int:
    """Everything a run does in the engine's process, stage by stage: find the suite's lm-eval tasks
    (before the engine starts: a broken task file costs no engine start), start the engine, build the
    tasks' requests, keep this shard's requests (or only the request's `keys`, for bisect trials), record
    every pass (`record_run`), then let lm-eval score the first pass (whole suites only). Returns the run id."""
    from ..configuration.shard import select_keys, select_shard

    # vLLM's, lm-eval's and datasets' progress bars (read when tqdm is imported): evalgate shows its own.
    os.environ.setdefault("TQDM_DISABLE", "1")
    suite, prepared = request.suite, None

    def announce(step: str) -> None:  # a step with no requests to count: a model's engine can take minutes to start
        if progress:
            progress(0, 0, step, 0, 0)

    if suite.lm_eval is not None:
        from ..lmeval.tasks import prepare

        announce("reading the lm-eval tasks")
        with timings.phase("lm_eval"):
            prepared = prepare(suite.lm_eval, suite.path)
    log = request.labels.get("engine_log")
    announce(f"starting the {suite.engine_kind} engine" + (f" (its output: {log})" if log else ""))
    with timings.phase("engine_load"):
        engine = start_engine(suite)
    tasks = None
    if prepared is not None:
        from ..lmeval.tasks import TaskRun

        announce("building the lm-eval tasks' requests")
        with timings.phase("lm_eval"):
            tasks = TaskRun(prepared, engine.tokenizer, engine.max_model_len, suite.sampling, clock=engine.template_clock)
            suite = tasks.build(suite)
    if request.shard is not None:
        suite = select_shard(suite, request.shard)
    if request.keys is not None:
        suite = select_keys(suite, request.keys)
    labels = {**request.labels, "shard": str(request.shard) if request.shard else None}
    run_id = record_run(replace(request, suite=suite, labels=labels), engine, timings, progress, on_run)
    if tasks is not None and request.whole_suite:  # part of a task: its metrics would mislead
        from ..store import open_store

        store = open_store(request.url)
        announce("scoring with lm-eval")
        with incomplete_on_failure(store, run_id, "scoring with lm-eval: "), timings.phase("lm_eval"):
            # pass 0 read back a window at a time, in the order lm-eval asks for it (the order it built the
            # requests in): an MMLU-sized pass held whole is about 4 KB a request
            first_pass = store.pass_outputs(run_id, 0, [p.key for p in suite.prompts])
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
    """What a run will do, decided before its run row exists: the request (its suite with the tasks built and
    this shard's requests, its schedule with the rotation turn), the prompt ids, the identity, the passes
    (probes' included) and what of it cannot run here. `record_run` executes it; nothing about it changes
    while the passes run."""

    request: RunRequest
    prompt_ids: dict[str, Sequence[int]]
    fingerprint: dict
    passes: list[Pass]
    not_run: list[dict]
    salt: str | None  # one per run, so a server that outlives runs never serves a cold pass from an earlier run

    @property
    def suite(self) -> Suite:
        return self.request.suite

    @property
    def schedule(self) -> Schedule:
        return self.request.schedule

    def schedule_record(self) -> dict:
        """The run's stored `schedule`: the knobs, the passes and their conditions, and the judging policy."""
        return {**asdict(self.schedule), "passes": [p.to_dict() for p in self.passes], "not_run": list(self.not_run),
                "cold_by": "cache_salt" if self.salt else None,
                "gate": to_json(self.suite.gate)}  # the judging policy: recorded, never identity


def plan_run(request: RunRequest, engine: Engine, prompt_ids: dict[str, Sequence[int]], fingerprint: dict) -> RunPlan:
    """The plan of a run of these requests (`tokenize_prompts`) on this engine."""
    passes, not_run = plan_for(request.schedule, engine, request.suite, prompt_ids)
    salt = uuid.uuid4().hex[:16] if engine.salts_cache else None
    return RunPlan(request, prompt_ids, fingerprint, passes, not_run, salt)


def record_run(request: RunRequest, engine: Engine, timings: Timings, progress: Progress | None = None,
               on_run: OnRun | None = None) -> int:
    """Plan the run, create its row, run every pass of the plan and store it; returns the run id (status
    still `running`).

    The database is opened only once the engine is up and every prompt fits, so a configuration error
    never leaves a database or a run behind."""
    from ..store import open_store

    suite, resumed = request.suite, None
    with timings.phase("evalgate"):
        prompt_ids = tokenize_prompts(suite, engine)  # a prompt that does not fit: ConfigError, nothing stored
        fingerprint = build_fingerprint(suite, engine)
        store = open_store(request.url)
        if request.resume is not None:  # the run's own rotation turn, not the count of runs since
            turn = (store.get_run(request.resume).schedule or {}).get("turn", 0)
            request = replace(request, schedule=replace(request.schedule, turn=turn))
        elif request.schedule.preset == ROTATING:
            request = replace(request, schedule=replace(request.schedule, turn=rotation_turn(store, suite.name)))
        plan = plan_run(request, engine, prompt_ids, fingerprint)
        record = plan.schedule_record()
        if request.resume is None:
            run_id = store.create_run(suite, request.kind, record, plan.fingerprint, plan.prompt_ids,
                                      rendered=rendered_chats(suite, engine, prompt_ids), **request.labels)
        else:
            resumed = resume_run(store, request.resume, plan.fingerprint, record, request.labels)
            run_id, record = resumed.run_id, resumed.record
            plan = replace(plan, passes=[p for p in plan.passes if p.index in resumed.pass_indexes])
    if on_run:
        on_run(run_id)
    with incomplete_on_failure(store, run_id):
        recording = Recording(plan, store, run_id, engine, timings, progress, resumed)
        dropped = recording.run()
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
             prompt_ids: dict[str, Sequence[int]]) -> tuple[list[Pass], list[dict]]:
    """The schedule's passes on this engine, its probes' passes, and what of it cannot run here (with the
    reason: never reported as passed)."""
    from ..probes import PlanContext, plan_probes

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
        starts_engines=engine.starts_probe_engines, prefix_caching=engine.prefix_caching, placement=engine.placement,
        adapters=tuple(sorted(suite.adapters)))
    probes, probes_not_run = plan_probes(schedule.probes, context)
    return passes + probes, not_run + probes_not_run


def pass_waves(pass_: Pass, keys: list[str], context: WaveContext) -> Iterator[Wave]:
    """The waves of a pass: the schedule's (every request recorded), or a probe's (probes/)."""
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


Dropped = list[tuple[Pass | None, str]]  # what could not run after all, with the reason (None: the rescoring)


@dataclass
class Recording:
    """A plan being executed: the engine it runs on now (a probe may start its own), where it stores, and
    how far it got. `run` reads straight down; each step is one method."""

    plan: RunPlan
    store: Store
    run_id: int
    engine: Engine
    timings: Timings
    progress: Progress | None = None
    resumed: Resumed | None = None  # a run continued (execution/resume.py): what it stored before
    dropped: Dropped = field(default_factory=list)
    done: int = 0
    total: int = 0
    label: str = ""  # the pass (or rescoring) now running
    pass_done: int = 0
    pass_total: int = 0
    rescored: bool = False
    whole_here: set[int] = field(default_factory=set)  # passes run whole by this process (their cache is here)

    def run(self) -> Dropped:
        """Every pass of the plan, stored pass by pass, and the run's rescorings (execution/rescore.py)."""
        load = self.plan.schedule.load
        trace = load.load_trace() if load is not None and load.trace else None  # read once for every loaded pass
        keys = [p.key for p in self.plan.suite.prompts]
        sizes = {p.index: len(keys) if p.sample is None else sum(in_sample(k, p.sample) for k in keys)
                 for p in self.plan.passes}
        rescore = self.plan.request.rescore
        self.total = sum(sizes.values()) + (self.rescoring_size * rescore.count if rescore else 0)
        for pass_ in self.plan.passes:
            if pass_.engine_args and not self.switch_engine(pass_):
                continue
            self.label, self.pass_done, self.pass_total = pass_.label, 0, sizes[pass_.index]
            probe = get_probe(pass_.probe) if pass_.probe else None
            before = probe.before(self.engine) if probe else None
            traffic = traffic_for(pass_, self.plan.schedule, trace)
            stored, writer = StoredPass(pass_, self.plan.request.wave_timings), OutputWriter(self.store, self.run_id)
            proved: list[Completion] = []  # a probe's proof reads its pass's outputs
            if probe and self.resumed is not None and pass_.index in self.resumed.waves:
                self.store.delete_outputs(self.run_id, pass_.index)  # a probe's pass is redone whole
            with traffic.during(self.engine, pass_):
                for index, wave in enumerate(pass_waves(pass_, keys, self.wave_context())):
                    if not probe and self.resumed is not None and self.resumed.stored(pass_.index, index):
                        stored.kept(sum(wave.recorded))
                        self.count(sum(wave.recorded))
                        continue
                    recorded, seconds = self.submit(pass_, index, wave, traffic)
                    stored.add(recorded, seconds)
                    if probe:
                        proved += recorded
                    with self.timings.phase("evalgate"):
                        writer.add(recorded)
            with self.timings.phase("evalgate"):
                writer.flush()
            if not stored.kept_requests:
                self.whole_here.add(pass_.index)
            proof, unproven = probe.proof(self.engine, before, proved) if probe else ({}, None)
            if unproven:
                self.dropped.append((pass_, unproven))
            self.timings.setdefault("passes", []).append(
                stored.figures({**proof, **_load_record(traffic.pass_stats())}))
        self.rescore_once()
        return self.dropped

    @property
    def first_pass(self) -> Mapping[str, Completion]:
        """Pass 0's outputs by key, read back from the store as they are wanted (a probe's waves, the rescoring):
        a leaderboard-sized pass is never held, and a resumed run's was stored by another process."""
        return self.store.pass_outputs(self.run_id, 0, [p.key for p in self.plan.suite.prompts])

    def wave_context(self) -> WaveContext:
        by_key = {p.key: p for p in self.plan.suite.prompts}
        return WaveContext(self.plan.schedule, self.engine, by_key, self.plan.prompt_ids, self.first_pass)

    def switch_engine(self, pass_: Pass) -> bool:
        """Start a probe's own engine (rescoring on the suite's first): whether it started."""
        self.rescore_once()
        if self.progress:
            self.progress(self.done, self.total, f"starting the engine of probe {pass_.probe}", 0, 0)
        try:
            self.engine = probe_engine(self.plan.suite, self.engine, pass_, self.timings)
        except EvalgateError as exc:
            self.dropped.append((pass_, f"its engine ({pass_.engine_args}) did not start: {exc.message}"))
            return False
        return True

    def submit(self, pass_: Pass, index: int, wave: Wave, traffic: Traffic) -> tuple[list[Completion], float]:
        """One wave through the pass's traffic: its recorded requests' outputs, placed in the pass, and the
        wave's seconds."""
        if self.plan.request.cold_waves:
            self.engine.reset_cache()
        salt = self.plan.salt
        salts = Salts(f"{salt}-{pass_.salt_of}", f"{salt}-{pass_.index}-{index}-trace") if salt else Salts()
        if self.resumed is not None and salt and pass_.salt_of != pass_.index and pass_.salt_of not in self.whole_here:
            # a resumed run's hot pass whose reference ran in the process that died: its cache died with that
            # engine, so warm it again with these requests under the reference's salt (nothing is recorded)
            self.engine.generate(wave.prompts, cache_salt=salts.requests)
        t0 = time.perf_counter()
        completions, _ = traffic.run(self.engine, wave, salts)
        seconds = time.perf_counter() - t0
        self.timings.add("inference", seconds)
        if len(completions) != len(wave.prompts):
            raise EngineError(f"engine returned {len(completions)} outputs for {len(wave.prompts)} requests")
        for position, completion in enumerate(completions):
            completion.pass_index, completion.concurrency = pass_.index, pass_.concurrency
            completion.wave, completion.position = index, position
        recorded = [c for c, keep in zip(completions, wave.recorded) if keep]  # companions are not stored
        self.count(len(recorded))
        return recorded, seconds

    def count(self, requests: int) -> None:
        """Requests done (run here, or stored before a resume), told to `progress`."""
        self.done += requests
        self.pass_done += requests
        if self.progress:
            self.progress(min(self.done, self.total), self.total, self.label, min(self.pass_done, self.pass_total),
                          self.pass_total)

    @property
    def rescoring_size(self) -> int:
        """The requests a rescoring gets past: those that generate (a scoring request already is one)."""
        return sum(1 for p in self.plan.suite.prompts if p.request_type not in SCORING_TYPES)

    def rescoring_progress(self, label: str, ended: bool) -> None:
        """A rescoring's progress (execution/rescore.py), counted as a pass's; at its end, whatever it had
        nothing to score is done too."""
        if label != self.label:
            self.label, self.pass_done, self.pass_total = label, 0, self.rescoring_size
        left = self.pass_total - self.pass_done if ended else 1
        if left > 0:
            self.count(left)

    def rescore_once(self) -> None:
        """The run's rescorings, once, on the suite's own engine (before a probe's replaces it)."""
        rescore = self.plan.request.rescore
        if rescore is None or self.rescored:
            return
        self.rescored = True
        try:
            with self.timings.phase("rescore"):
                rescored = self.resumed.rescored if self.resumed is not None else {}
                rescore_run(rescore, self.engine, RecordedRun(self.store, self.run_id, self.plan.prompt_ids,
                                                              self.plan.salt, self.first_pass, rescored,
                                                              self.rescoring_progress))
        except EngineError as exc:  # the run stands; judging it across hardware then lacks the envelope
            self.dropped.append((None, f"the engine could not score the tokens: {exc.message}"))


@dataclass
class StoredPass:
    """A pass's throughput figures, counted as its waves return (read by `evalgate cost` and benchmarks/); a
    wave's time (`per_wave`) is the latency of each of its requests, since a wave is submitted and returns
    together."""

    pass_: Pass
    per_wave: bool = False  # each wave's seconds too (RunRequest.wave_timings)
    requests: int = 0
    output_tokens: int = 0
    seconds: float = 0.0
    wave_seconds: list[float] = field(default_factory=list)
    kept_requests: int = 0  # stored by the process a resumed run continues: not timed here

    def add(self, recorded: list[Completion], seconds: float) -> None:
        self.requests += len(recorded)
        self.output_tokens += sum(len(c.output_ids) for c in recorded)
        self.seconds += seconds
        if self.per_wave:
            self.wave_seconds.append(seconds)

    def kept(self, requests: int) -> None:
        self.kept_requests += requests

    def figures(self, extra: dict) -> dict:
        p = self.pass_
        optional = {"wave_seconds": self.wave_seconds} if self.per_wave else {}
        if self.kept_requests:
            optional["resumed_with"] = self.kept_requests
        return {"index": p.index, "concurrency": p.concurrency, "cache": p.cache, "probe": p.probe,
                "requests": self.requests, "output_tokens": self.output_tokens, "seconds": self.seconds,
                **optional, **extra}


def _load_record(stats: dict | None) -> dict:
    return {"load": stats} if stats is not None else {}
