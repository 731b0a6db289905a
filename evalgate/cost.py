"""`evalgate cost`: the price of determinism, measured (docs/cost.md).

The suite's schedule runs once per candidate engine configuration, each in its own engine process
(evalgate/execution/worker.py), and is stored as a run of kind `cost`. For every candidate:

- throughput: output tokens/s per concurrency level, the median over that level's passes. A pass's figure
  is its output tokens over the seconds its waves took (the runner's `timings["passes"]`).
- latency: p50/p90/p99 per level. The offline engine takes a wave and returns it whole, so the wave's
  seconds are the latency of each of its requests.
- warm-up: the first wave of the run pays one-off costs (first kernels, allocator growth); it is left out
  of the timings (its outputs still count for invariance). Engine start is timed on its own.
- memory: the peak RSS (VmHWM) of the engine process, read from /proc by this process while the engine
  runs; where /proc has no VmHWM, the growth of RUSAGE_CHILDREN's ru_maxrss (None if it did not grow).
- invariance: the number of requests whose passes differ, judged exactly as `baseline create` does
  (verdict.judge without a baseline). A candidate that asks for batch invariance on a platform without
  it is `unavailable` and never invariant.

The result names the fastest invariant candidate and its cost ratio: its output tokens/s at the highest
concurrency divided by the fastest candidate's.
"""

from __future__ import annotations

import json
import math
import re
import resource
import sys
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .codec import to_json
from .configuration.config import check_keys, not_json, read_toml
from .configuration.schedule import Schedule
from .configuration.suite import Suite
from .engines.base import COMMON_KEYS, INVARIANCE_PLATFORMS
from .errors import ConfigError, EngineError, EvalgateError, ExitCode, MissingDependency
from .processes import peak_rss
from .store import existing_store

if TYPE_CHECKING:
    from .judgement.verdict import FactorRow

COST_SCHEMA = "evalgate.cost/1"
RUN_KIND = "cost"
PERCENTILES = (50, 90, 99)
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,99}$")
ENV_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
CANDIDATE_KEYS = {"name", "batch_invariant", "engine", "env"}
COST_KEYS = {"defaults", "candidates"}


# --- candidates ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """An engine configuration to measure: the suite's engine with `engine_args` over its own, batch
    invariance requested or not, and `env` set in the candidate's engine process only."""

    name: str
    engine_args: dict[str, Any] = field(default_factory=dict)
    batch_invariant: bool = False
    env: dict[str, str] = field(default_factory=dict)
    origin: str = "default"  # default | suite file | candidates file | --candidate

    def config(self) -> dict[str, Any]:
        """For reports and the store: env values of secret-looking names are never written."""
        from .fingerprint import REDACTED, SECRET_NAME

        return {"engine_args": dict(sorted(self.engine_args.items())), "batch_invariant": self.batch_invariant,
                "env": {k: REDACTED if SECRET_NAME.search(k) else v for k, v in sorted(self.env.items())},
                "origin": self.origin}


def default_candidates() -> list[Candidate]:
    """The suite's own configuration with batch invariance requested and not, then the remedies of the batch
    and prefix-cache factors as their declarations give them (configuration/remedy.py): one sequence at a
    time (`max_num_seqs=1`, invariance by construction) and no prefix cache."""
    from .judgement.factors import remedy_settings

    return [
        Candidate("batch-invariant", batch_invariant=True),
        Candidate("batched", batch_invariant=False),
        Candidate("max-num-seqs-1", engine_args=remedy_settings("batch_size"), batch_invariant=False),
        Candidate("no-prefix-cache", engine_args=remedy_settings("prefix_cache"), batch_invariant=False),
    ]


def _check_name(name: Any, where: str, field_name: str) -> str:
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise ConfigError(f"{where}: `{field_name}` must be a name of letters, digits, `.`, `_`, `+` or `-` "
                          f"(at most 100, starting with a letter or digit), got {name!r}",
                          fix="name the candidate, e.g. name = \"no-prefix-cache\"")
    return name


def _check_engine_args(args: dict, where: str, field_name: str) -> dict[str, Any]:
    for key, value in args.items():
        if key in COMMON_KEYS:
            fix = ("set `batch_invariant` on the candidate itself" if key == "batch_invariant"
                   else "a cost candidate changes how the suite's model is served, not the model: use another suite")
            raise ConfigError(f"{where}: `{field_name}.{key}` cannot be set per candidate", fix=fix)
        reason = not_json(value)
        if reason:
            raise ConfigError(f"{where}: `{field_name}.{key}` holds {reason}",
                              fix="use a string, a finite number, true/false, a list or a table")
    return dict(args)


def _check_env(env: dict, where: str, field_name: str) -> dict[str, str]:
    for key, value in env.items():
        if not ENV_NAME_PATTERN.match(key):
            raise ConfigError(f"{where}: `{field_name}.{key}` is not an environment variable name",
                              fix="use letters, digits and `_`, not starting with a digit")
        if key == "VLLM_BATCH_INVARIANT":
            raise ConfigError(f"{where}: `{field_name}.VLLM_BATCH_INVARIANT` is managed by evalgate",
                              fix="set `batch_invariant = true` on the candidate instead (it is only set where "
                                  "vLLM supports it)")
        if not isinstance(value, str):
            raise ConfigError(f"{where}: `{field_name}.{key}` must be a string, got {type(value).__name__} {value!r}",
                              fix=f'quote it: {key} = "{value}"')
    return dict(env)


def parse_cost_table(table: Any, where: str, prefix: str = "", origin: str = "suite file") -> tuple[bool, list[Candidate]]:
    """A `[cost]` table: `defaults` (bool, default true: include the built-in candidates) and
    `[[cost.candidates]]` (name, batch_invariant, engine = {...}, env = {...}). Strict, like suite files."""
    sec = f"{prefix}cost"
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: `{sec}` must be a table", fix=f"write it as [{sec}] and [[{sec}.candidates]]")
    check_keys(table, COST_KEYS, where, f"{sec}.")
    defaults = table.get("defaults", True)
    if not isinstance(defaults, bool):
        raise ConfigError(f"{where}: `{sec}.defaults` must be true or false, got {defaults!r}",
                          fix="defaults = false measures only your candidates")
    entries = table.get("candidates", [])
    if not isinstance(entries, list):
        raise ConfigError(f"{where}: `{sec}.candidates` must be an array of tables",
                          fix=f"write each candidate as [[{sec}.candidates]]")
    candidates = []
    for i, entry in enumerate(entries):
        field_name = f"{sec}.candidates[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: `{field_name}` must be a table", fix=f"write it as [[{sec}.candidates]]")
        check_keys(entry, CANDIDATE_KEYS, where, f"{field_name}.")
        if "name" not in entry:
            raise ConfigError(f"{where}: `{field_name}.name` is missing", fix='name the candidate, e.g. name = "eager"')
        name = _check_name(entry["name"], where, f"{field_name}.name")
        batch_invariant = entry.get("batch_invariant", False)
        if not isinstance(batch_invariant, bool):
            raise ConfigError(f"{where}: `{field_name}.batch_invariant` must be true or false, got {batch_invariant!r}",
                              fix="batch_invariant = true requests vLLM's batch-invariant kernels")
        for key in ("engine", "env"):
            if not isinstance(entry.get(key, {}), dict):
                raise ConfigError(f"{where}: `{field_name}.{key}` must be a table",
                                  fix=f"write it inline: {key} = {{ ... }}")
        candidates.append(Candidate(
            name=name, batch_invariant=batch_invariant, origin=origin,
            engine_args=_check_engine_args(entry.get("engine", {}), where, f"{field_name}.engine"),
            env=_check_env(entry.get("env", {}), where, f"{field_name}.env"),
        ))
    return defaults, candidates


_INT = re.compile(r"^[+-]?\d+$")
_FLOAT = re.compile(r"^[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?$")


def _scalar(text: str) -> Any:
    """A --candidate value: true/false, an integer, a finite decimal number, else the string (quotes optional)."""
    if text in ("true", "false"):
        return text == "true"
    if _INT.match(text):
        return int(text)
    if _FLOAT.match(text):
        return float(text)
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def parse_cli_candidate(text: str) -> Candidate:
    """`NAME:KEY=VALUE,KEY=VALUE`: `batch_invariant=true|false`, `env.NAME=VALUE` (set in the candidate's
    engine process only), any other key a vLLM engine argument over the suite's."""
    where = f"--candidate {text!r}"
    usage = "e.g. --candidate 'eager-32:max_num_seqs=32,env.OMP_NUM_THREADS=1' (NAME:KEY=VALUE,...)"
    name, _, settings = text.partition(":")
    if not NAME_PATTERN.match(name):
        raise ConfigError(f"{where}: the candidate name {name!r} must be letters, digits, `.`, `_`, `+` or `-`",
                          fix=usage)
    engine_args: dict[str, Any] = {}
    env: dict[str, str] = {}
    batch_invariant = False
    for item in filter(None, (s.strip() for s in settings.split(","))):
        key, eq, raw = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ConfigError(f"{where}: `{item}` is not KEY=VALUE", fix=usage)
        raw = raw.strip()
        if key == "batch_invariant":
            value = _scalar(raw)
            if not isinstance(value, bool):
                raise ConfigError(f"{where}: `batch_invariant` must be true or false, got {raw!r}", fix=usage)
            batch_invariant = value
        elif key.startswith("env."):
            env.update(_check_env({key[4:]: raw}, where, "env"))
        else:
            if key in engine_args:
                raise ConfigError(f"{where}: `{key}` is given twice", fix="give each key once")
            engine_args.update(_check_engine_args({key: _scalar(raw)}, where, "engine"))
    return Candidate(name=name, engine_args=engine_args, batch_invariant=batch_invariant, env=env,
                     origin="--candidate")


def load_candidates_file(path: str | Path) -> tuple[bool, list[Candidate]]:
    """A TOML file holding a `[cost]` table (the same table a suite file may hold)."""
    path = Path(path).resolve()
    data = read_toml(path)
    where = str(path)
    check_keys(data, {"cost"}, where, "")
    if "cost" not in data:
        raise ConfigError(f"{where}: no [cost] table", fix="add [[cost.candidates]] tables (docs/cost.md)")
    return parse_cost_table(data["cost"], where, origin="candidates file")


def suite_cost_table(suite: Suite) -> tuple[bool, list[Candidate]] | None:
    """The suite file's own `[cost]` table (or `[tool.evalgate.cost]`), kept unparsed by the suite loader."""
    if suite.cost_table is None:
        return None
    prefix = "tool.evalgate." if suite.path.name == "pyproject.toml" else ""
    return parse_cost_table(suite.cost_table, str(suite.path), prefix)


def resolve_candidates(suite: Suite | None, cli: list[str] = (), candidates_file: str | Path | None = None,
                       defaults: bool = True) -> list[Candidate]:
    """Default candidates (unless turned off), then the suite file's, the candidates file's and the CLI's.
    Names must be unique."""
    tables = []
    if suite is not None:
        table = suite_cost_table(suite)
        if table:
            tables.append(table)
    if candidates_file is not None:
        tables.append(load_candidates_file(candidates_file))
    use_defaults = defaults and all(d for d, _ in tables)
    result = default_candidates() if use_defaults else []
    if suite is not None and suite.engine_args.get("enable_prefix_caching") is False:
        result = [c for c in result if c.name != "no-prefix-cache"]  # the suite's own setting: `batched` is it
    for _, found in tables:
        result.extend(found)
    result.extend(parse_cli_candidate(text) for text in cli)
    seen: dict[str, str] = {}
    for c in result:
        if c.name in seen:
            raise ConfigError(f"candidate name {c.name!r} is used twice ({seen[c.name]} and {c.origin})",
                              fix="give every candidate its own name (the defaults are batch-invariant, batched, "
                                  "max-num-seqs-1 and no-prefix-cache)")
        seen[c.name] = c.origin
    if not result:
        raise ConfigError("no candidates to measure (the defaults are turned off and none is given)",
                          fix="add --candidate NAME:KEY=VALUE, or drop --no-defaults / `cost.defaults = false`")
    return result


def check_engine_arg_names(candidates: list[Candidate]) -> None:
    """Candidates' own engine arguments must be vLLM EngineArgs fields, of types they take: checked before any
    engine starts (imports vLLM, so only when some candidate has arguments of its own beyond the built-in ones).
    Every bad argument is named in one error."""
    custom = [c for c in candidates if c.origin != "default" and c.engine_args]
    if not custom:
        return
    from .engines.vllm_offline import engine_arg_problem, engine_args_error, known_engine_args

    known = known_engine_args()
    problems = [(f"candidate {c.name!r} ({c.origin}): {problem[0]}", problem[1]) for c in custom
                for key, value in c.engine_args.items() if (problem := engine_arg_problem(key, value, known))]
    if problems:
        raise engine_args_error(problems)


def candidate_suite(suite: Suite, candidate: Candidate) -> Suite:
    return replace(suite, engine_args={**suite.engine_args, **candidate.engine_args},
                   batch_invariant=candidate.batch_invariant)


def check_schedule(schedule: Schedule) -> None:
    from .configuration.schedule import HOT, plan_passes

    if len([p for p in plan_passes(schedule) if p.cache != HOT]) < 2:  # hot passes are not timed (level_figures)
        raise ConfigError("the schedule has one pass: invariance cannot be judged, nor a warm-up left out",
                          fix="use at least two passes, e.g. --concurrency 1,16 (docs/cost.md)")


# --- figures -----------------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between the closest ranks (numpy's default); None for no values."""
    xs = sorted(values)
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def median(values: list[float]) -> float | None:
    return percentile(values, 50)


def level_figures(passes: list[dict], wave_tokens: dict[tuple[int, int], int],
                  wave_requests: dict[tuple[int, int], int]) -> list[dict]:
    """Per concurrency level: tokens/s (median over its passes) and latency percentiles, without the
    warm-up wave (the first wave of the first pass). A level left with no wave keeps its warm-up wave
    and says so (`includes_warmup`)."""
    # served from the cache, or beside a probe's companions: not the level's price
    passes = [p for p in passes if p.get("cache") != "hot" and not p.get("probe")]
    if not passes:
        return []
    first = min(p["index"] for p in passes)

    def level(level_passes: list[dict], skip_warmup: bool) -> dict | None:
        rates, latencies = [], []
        for p in level_passes:
            tokens, seconds = 0, 0.0
            for w, secs in enumerate(p["wave_seconds"]):
                if skip_warmup and p["index"] == first and w == 0:
                    continue
                tokens += wave_tokens.get((p["index"], w), 0)
                seconds += secs
                latencies.extend([secs] * wave_requests.get((p["index"], w), 0))
            if seconds > 0:
                rates.append(tokens / seconds)
        if not rates:
            return None
        return {"tokens_per_second": median(rates), "pass_tokens_per_second": rates, "passes": len(rates),
                "latency_seconds": {f"p{q}": percentile(latencies, q) for q in PERCENTILES},
                "requests": len(latencies)}

    by_level: dict[int, list[dict]] = defaultdict(list)
    for p in passes:
        by_level[p["concurrency"]].append(p)
    out = []
    for concurrency in sorted(by_level):
        figures = level(by_level[concurrency], skip_warmup=True)
        includes_warmup = figures is None
        if figures is None:
            figures = level(by_level[concurrency], skip_warmup=False)
        if figures is None:
            continue
        out.append({"concurrency": concurrency, **figures, "includes_warmup": includes_warmup})
    return out


def varying_factors(factors: list[FactorRow]) -> dict[str, int]:
    """factor -> the most requests that differ under one comparison of it (verdict.factor_summary)."""
    out: dict[str, int] = {}
    for f in factors:
        if f.differing:
            name = f.factor or "unattributed"
            out[name] = max(out.get(name, 0), f.differing)
    return out


def cost_ratio(invariant_tps: float | None, fastest_tps: float | None) -> float | None:
    """The fastest invariant candidate's output tokens/s over the fastest candidate's (1.0: determinism is
    free here; 0.1: it costs 90% of the throughput)."""
    if invariant_tps is None or not fastest_tps:
        return None
    return invariant_tps / fastest_tps


@dataclass
class CandidateResult:
    candidate: Candidate
    position: int
    status: str  # measured | unavailable | failed
    reason: str | None = None
    run_id: int | None = None
    invariant: bool = False
    differing_requests: int | None = None
    requests: int | None = None
    varying: dict[str, int] = field(default_factory=dict)  # factor -> requests that vary under it (factors.py)
    batch_invariance: dict | None = None  # the engine's recorded {requested, in_force, reason}
    platform: str | None = None
    levels: list[dict] = field(default_factory=list)
    peak_rss_bytes: int | None = None
    engine_load_seconds: float | None = None
    wall_seconds: float | None = None
    error_exit_code: int | None = None  # for failed candidates: the exit code the failure maps to

    def tokens_per_second(self, concurrency: int) -> float | None:
        return next((lv["tokens_per_second"] for lv in self.levels if lv["concurrency"] == concurrency), None)

    def to_dict(self, highest: int) -> dict:
        return {
            "name": self.candidate.name, "origin": self.candidate.origin, "status": self.status,
            "reason": self.reason, "run_id": self.run_id, "config": self.candidate.config(),
            "batch_invariance": self.batch_invariance, "invariant": self.invariant,
            "differing_requests": self.differing_requests, "requests": self.requests, "varying": self.varying,
            "tokens_per_second": self.tokens_per_second(highest), "levels": self.levels,
            "peak_rss_bytes": self.peak_rss_bytes, "engine_load_seconds": self.engine_load_seconds,
            "wall_seconds": self.wall_seconds,
        }


@dataclass
class CostReport:
    suite_name: str
    session: str
    database: str
    schedule: Schedule
    platform: str | None
    results: list[CandidateResult]
    plot: str | None = None

    @property
    def highest_concurrency(self) -> int:
        return max(self.schedule.concurrency)

    @property
    def measured(self) -> list[CandidateResult]:
        return [r for r in self.results if r.status == "measured"]

    def _fastest(self, results: list[CandidateResult]) -> CandidateResult | None:
        top = self.highest_concurrency
        rated = [r for r in results if r.tokens_per_second(top) is not None]
        return max(rated, key=lambda r: r.tokens_per_second(top)) if rated else None

    @property
    def fastest(self) -> CandidateResult | None:
        return self._fastest(self.measured)

    @property
    def fastest_invariant(self) -> CandidateResult | None:
        return self._fastest([r for r in self.measured if r.invariant])

    @property
    def cost_ratio(self) -> float | None:
        inv, fast = self.fastest_invariant, self.fastest
        top = self.highest_concurrency
        return cost_ratio(inv.tokens_per_second(top) if inv else None, fast.tokens_per_second(top) if fast else None)

    @property
    def exit_code(self) -> ExitCode:
        """0 once the command ran; when every candidate that was tried failed, 3 (2 if all were config errors)."""
        tried = [r for r in self.results if r.status != "unavailable"]
        if tried and all(r.status == "failed" for r in tried):
            codes = {r.error_exit_code for r in tried}
            return ExitCode.USAGE if codes == {int(ExitCode.USAGE)} else ExitCode.INFRA
        return ExitCode.PASS

    def to_dict(self) -> dict:
        top = self.highest_concurrency
        inv, fast, ratio = self.fastest_invariant, self.fastest, self.cost_ratio

        def pick(r):
            return {"name": r.candidate.name, "tokens_per_second": r.tokens_per_second(top)} if r else None

        return {
            "schema": COST_SCHEMA,
            "suite": self.suite_name,
            "session": self.session,
            "database": self.database,
            "platform": self.platform,
            "schedule": {"concurrency": list(self.schedule.concurrency), "shuffles": self.schedule.shuffles,
                         "repeats": self.schedule.repeats, "seed": self.schedule.seed},
            "highest_concurrency": top,
            "candidates": [r.to_dict(top) for r in self.results],
            "fastest": pick(fast),
            "fastest_invariant": pick(inv),
            "cost_ratio": ratio,
            "slowdown": (1 / ratio) if ratio else None,
            "exit_code": int(self.exit_code),
            "plot": self.plot,
        }


# --- measuring -----------------------------------------------------------------------------------------------


class Listener:
    """What `run_cost` tells its caller (the CLI draws progress from it). `eta`: estimated seconds left
    for the whole command, None until there is something to estimate from."""

    def candidate_started(self, index: int, count: int, candidate: Candidate, eta: float | None) -> None: ...
    def candidate_progress(self, index: int, count: int, candidate: Candidate, done: int, total: int, label: str,
                           eta: float | None) -> None: ...
    def candidate_finished(self, index: int, count: int, result: CandidateResult) -> None: ...


class _PeakRss:
    """Samples the engine process's peak RSS each time it reports progress (in this process's main thread)."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.peak: int | None = None
        self.children_before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss

    def sample(self) -> None:
        import multiprocessing

        if self.pid is None:
            engine = [p for p in multiprocessing.active_children() if p.name == "evalgate-engine"]
            self.pid = engine[-1].pid if engine else None
        if self.pid is not None:
            value = peak_rss(self.pid)
            if value is not None:
                self.peak = max(self.peak or 0, value)

    def result(self) -> int | None:
        if self.peak is not None:
            return self.peak
        after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        if after > self.children_before:  # the largest child so far is this engine
            return after * (1 if sys.platform == "darwin" else 1024)
        return None


def run_cost(suite: Suite, candidates: list[Candidate], *, schedule: Schedule | None = None,
             listener: Listener | None = None, platform: str | None = None) -> CostReport:
    """Measure every candidate on the suite's schedule; store each candidate's run (kind `cost`) and its
    figures (table `cost_results`). `platform`: skip detection (tests)."""
    # the schedule's own passes: probes judge invariance, their companions and own engines would skew the price
    schedule = replace(schedule or suite.schedule, probes=())
    check_schedule(schedule)
    check_engine_arg_names(candidates)
    url = suite.database
    existing_store(url)
    listener = listener or Listener()
    if platform is None and any(c.batch_invariant for c in candidates):
        from .engines.vllm_offline import platform_name

        platform = platform_name()
    report = CostReport(suite_name=suite.name, session=uuid.uuid4().hex, database=url, schedule=schedule,
                        platform=platform, results=[])
    walls: list[float] = []
    count = len(candidates)
    for index, candidate in enumerate(candidates):
        remaining = count - index
        eta = (sum(walls) / len(walls)) * remaining if walls else None
        listener.candidate_started(index, count, candidate, eta)
        if candidate.batch_invariant and platform is not None and platform not in INVARIANCE_PLATFORMS + ("cpu",):
            result = CandidateResult(candidate, index, "unavailable",
                                     reason=f"unavailable on this platform ({platform}): batch-invariant kernels "
                                            "exist for CUDA, ROCm and XPU (vLLM's) and CPUs (evalgate's)")
        else:
            result = _measure(suite, candidate, index, count, schedule, url, listener, walls)
            if result.wall_seconds is not None and result.status == "measured":
                walls.append(result.wall_seconds)
            report.platform = report.platform or result.platform
        _store_result(url, report, result)
        report.results.append(result)
        listener.candidate_finished(index, count, result)
    return report


def _measure(suite: Suite, candidate: Candidate, index: int, count: int, schedule: Schedule, url: str,
             listener: Listener, walls: list[float]) -> CandidateResult:
    from .execution.request import RunRequest
    from .execution.worker import execute_in_worker
    from .judgement.judging import Judging, judge_run
    from .store import open_store

    started = time.perf_counter()
    rss = _PeakRss()
    others_left = count - index - 1

    def progress(done: int, total: int, label: str, *_pass) -> None:
        rss.sample()
        elapsed = time.perf_counter() - started
        this_total = elapsed * total / done if done else None
        per_candidate = (sum(walls) / len(walls)) if walls else this_total
        eta = None
        if this_total is not None and per_candidate is not None:
            eta = max(this_total - elapsed, 0.0) + per_candidate * others_left
        listener.candidate_progress(index, count, candidate, done, total, label, eta)

    try:
        request = RunRequest(candidate_suite(suite, candidate), url, RUN_KIND, schedule, env=candidate.env or None,
                             wave_timings=True)
        result = execute_in_worker(request, progress)
    except EvalgateError as exc:  # the engine failed to start or died: this candidate failed, not the command
        reason = exc.message + (f" (fix: {exc.fix})" if exc.fix else "")
        return CandidateResult(candidate, index, "failed", reason=reason, wall_seconds=time.perf_counter() - started,
                               error_exit_code=int(exc.exit_code))
    run_id, timings = result.run_id, result.timings
    store = open_store(url)
    try:
        record = store.load(run_id)
        judged = judge_run(record, None, Judging(RUN_KIND))
        differing = judged.counts["batch_variance"]
        engine = record.fingerprint.engine
        invariance = dict(engine.get("batch_invariance") or {})
        wave_tokens: dict[tuple[int, int], int] = defaultdict(int)
        wave_requests: dict[tuple[int, int], int] = defaultdict(int)
        for completions in record.outputs.values():
            for c in completions:
                wave_tokens[(c.pass_index, c.wave)] += len(c.output_ids)
                wave_requests[(c.pass_index, c.wave)] += 1
        levels = level_figures(list(timings.get("passes", [])), wave_tokens, wave_requests)
        status, reason = "measured", None
        if invariance.get("requested") and not invariance.get("in_force"):
            status = "unavailable"
            reason = invariance.get("reason") or "batch invariance was requested but is not in force"
        wall = time.perf_counter() - started
        store.finish_run(
            run_id, status="complete", verdict="invariant" if differing == 0 else "variant", exit_code=0,
            summary=judged.counts, verdicts=[to_json(v) for v in judged.verdicts if v.verdict != "stable"],
            schedule={**record.run.schedule, "timings": dict(timings),
                      "cost": {"candidate": candidate.name, "config": candidate.config()}},
        )
    except BaseException as exc:
        store.mark_incomplete(run_id, "failed", f"{type(exc).__name__}: {exc}")
        raise
    return CandidateResult(
        candidate, index, status, reason=reason, run_id=run_id,
        invariant=status == "measured" and differing == 0, differing_requests=differing,
        requests=len(record.requests), varying=varying_factors(judged.factors),
        batch_invariance=invariance, platform=engine.get("platform"), levels=levels,
        peak_rss_bytes=rss.result(),
        engine_load_seconds=timings.get("engine_load"), wall_seconds=wall,
    )


def _store_result(url: str, report: CostReport, result: CandidateResult) -> None:
    from .store import open_store

    top = report.highest_concurrency
    open_store(url).add_cost_result(
        session=report.session, suite_name=report.suite_name, candidate=result.candidate.name,
        position=result.position, status=result.status, reason=result.reason, run_id=result.run_id,
        config=result.candidate.config(), invariant=result.invariant if result.status != "failed" else None,
        differing_requests=result.differing_requests, requests=result.requests, highest_concurrency=top,
        tokens_per_second=result.tokens_per_second(top), peak_rss_bytes=result.peak_rss_bytes,
        engine_load_seconds=result.engine_load_seconds,
        figures={"levels": result.levels, "batch_invariance": result.batch_invariance} if result.levels else None,
    )


# --- outputs -------------------------------------------------------------------------------------------------


def write_json(report: CostReport, path: str | Path) -> None:
    """The JSON report (schema `evalgate.cost/1`, docs/cost.md), written atomically."""
    from .atomic import write_text_atomic

    write_text_atomic(path, json.dumps(report.to_dict(), indent=2, ensure_ascii=False) + "\n")


def require_matplotlib() -> None:
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise MissingDependency("matplotlib (for the --plot / --json-report plot)")


def write_plot(report: CostReport, path: str | Path) -> None:
    """Output tokens/s against concurrency, one line per measured candidate; invariant ones drawn solid
    with a star. Written atomically (a temporary file renamed into place)."""
    from .atomic import atomic_path

    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=110)
    try:
        levels = sorted({lv["concurrency"] for r in report.measured for lv in r.levels})
        for r in report.measured:
            xs = [lv["concurrency"] for lv in r.levels]
            ys = [lv["tokens_per_second"] for lv in r.levels]
            if r.invariant:
                ax.plot(xs, ys, "-*", markersize=12, linewidth=2, label=f"{r.candidate.name} (invariant)")
            else:
                ax.plot(xs, ys, "--o", markersize=6, fillstyle="none",
                        label=f"{r.candidate.name} ({r.differing_requests} of {r.requests} requests differ)")
        if len(levels) > 1 and levels[-1] / levels[0] >= 4:
            ax.set_xscale("log", base=2)
        if levels:
            ax.set_xticks(levels)
            ax.set_xticklabels([str(c) for c in levels])
        ax.set_xlabel("concurrency (requests submitted together)")
        ax.set_ylabel("output tokens/s (median over passes)")
        ratio = report.cost_ratio
        subtitle = (f"fastest invariant: {report.fastest_invariant.candidate.name}, {ratio:.2f}x the fastest"
                    if ratio is not None else "no invariant candidate")
        ax.set_title(f"evalgate cost: suite {report.suite_name!r}\n{subtitle}", fontsize=10)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        if report.measured:
            ax.legend(fontsize=8)
        fig.tight_layout()
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png")
    finally:
        plt.close(fig)


def failed_command_error(report: CostReport) -> EvalgateError | None:
    """The error to exit with when no candidate could run at all (reported after the table and files)."""
    code = report.exit_code
    if code == ExitCode.PASS:
        return None
    reasons = "; ".join(f"{r.candidate.name}: {r.reason}" for r in report.results if r.status == "failed")
    cls = ConfigError if code == ExitCode.USAGE else EngineError
    return cls(f"no candidate could be measured ({reasons})",
               fix="see each candidate's reason above; `evalgate check` on the suite shows engine errors in full")
