"""`evalgate bisect config RUN_A RUN_B`: which setting difference changed the outputs.

The settings are what the two runs' fingerprints recorded and one engine process can toggle: the
pass-through [engine] arguments (dtype, enforce_eager, max_num_seqs, ...), batch invariance requested or
not, and the allow-listed environment (OMP_NUM_THREADS, VLLM_*, ...). Everything else that differs (model
weights, tokenizer, code, hardware, vLLM/torch version, a secret-looking variable whose value was never
stored) cannot be toggled: it is listed, and if the toggles cannot reproduce the change it is named as
where the cause must lie.

Trials start from run A's configuration with some of B's settings applied, on only the requests whose
outputs differ, each in a fresh engine process (nothing stale: the environment is set before vLLM is
imported). The first trial, with no setting applied, is the reference every other trial is compared with;
delta debugging (ddmin.py) then finds a 1-minimal set of settings whose trial differs from it, and a last
trial applies every other setting to show they change nothing on their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError, EngineError
from ..fingerprint import REDACTED
from ..judgement.compare import first_divergence
from ..store import RunRecord, Store
from .ddmin import BudgetExhausted, ddmin, naive_trials
from .session import Bisection, Bounds, TrialCallback, TrialOutcome
from .trials import RunConfig, differing_keys, run_trial, suite_of

# Engine identity fields that follow from the settings (or are the settings' own record); a difference in
# any other field (vllm or torch version, platform) is an installation change, not a toggle.
_DERIVED_ENGINE_FIELDS = {"args", "dtype", "max_model_len", "enforce_eager", "compilation_mode", "prefix_caching",
                          "chunked_prefill", "max_num_seqs", "max_num_batched_tokens", "tensor_parallel_size",
                          "pipeline_parallel_size", "data_parallel_size", "seed", "torch_threads", "batch_invariance"}


@dataclass(frozen=True)
class Setting:
    """One toggleable difference: `kind` env | engine | batch_invariant; None means absent in that run."""

    kind: str
    name: str
    a: Any
    b: Any

    @property
    def label(self) -> str:
        return f"{self.kind} {self.name}: {_show(self.a)} -> {_show(self.b)}"


def _show(value: Any) -> str:
    return "(unset)" if value is None else repr(value)


def setting_differences(a: RunRecord, b: RunRecord) -> tuple[list[Setting], list[str]]:
    """(toggleable settings that differ, descriptions of the differences that cannot be toggled)."""
    config_a, config_b = RunConfig.of(a), RunConfig.of(b)
    settings: list[Setting] = []
    fixed: list[str] = []
    for name in sorted(set(config_a.engine_args) | set(config_b.engine_args)):
        if config_a.engine_args.get(name) != config_b.engine_args.get(name):
            settings.append(Setting("engine", name, config_a.engine_args.get(name), config_b.engine_args.get(name)))
    if config_a.batch_invariant != config_b.batch_invariant:
        settings.append(Setting("batch_invariant", "batch_invariant", config_a.batch_invariant, config_b.batch_invariant))
    for name in sorted(set(config_a.env) | set(config_b.env)):
        value_a, value_b = config_a.env.get(name), config_b.env.get(name)
        if value_a == value_b:
            continue
        if REDACTED in (value_a, value_b):
            fixed.append(f"env {name}: a secret-looking variable whose value is never stored")
        else:
            settings.append(Setting("env", name, value_a, value_b))
    engine_a, engine_b = a.fingerprint.engine, b.fingerprint.engine
    for name in sorted(set(engine_a) | set(engine_b)):
        if name not in _DERIVED_ENGINE_FIELDS and engine_a.get(name) != engine_b.get(name):
            fixed.append(f"engine {name}: {engine_a.get(name)!r} -> {engine_b.get(name)!r} (installation)")
    for component in ("model", "tokenizer", "code", "hardware"):
        if a.fingerprint.component_hash(component) != b.fingerprint.component_hash(component):
            fixed.append(f"{component} component")
    return settings, fixed


def trial_config(a: RunConfig, applied: list[Setting]) -> RunConfig:
    """Run A's configuration with the `applied` settings set to run B's values."""
    engine_args, env, batch_invariant = dict(a.engine_args), dict(a.env), a.batch_invariant
    for s in applied:
        if s.kind == "engine":
            engine_args.pop(s.name, None) if s.b is None else engine_args.__setitem__(s.name, s.b)
        elif s.kind == "env":
            env.pop(s.name, None) if s.b is None else env.__setitem__(s.name, s.b)
        else:
            batch_invariant = bool(s.b)
    return RunConfig(engine_args=engine_args, batch_invariant=batch_invariant, env=env)


@dataclass
class ConfigResult:
    session_id: int
    run_a: int
    run_b: int
    status: str  # found | inconclusive
    settings: list[Setting]
    not_toggleable: list[str]
    keys: list[str]  # the requests the trials ran
    culprits: list[Setting] = field(default_factory=list)
    proven_minimal: bool = False
    evidence: list[str] = field(default_factory=list)
    reason: str = ""
    trials: int = 0
    naive: int = 0

    @property
    def exit_code(self) -> int:
        return 0 if self.status == "found" else 1

    def to_dict(self) -> dict:
        return {"bisect": self.session_id, "kind": "config", "run_a": self.run_a, "run_b": self.run_b,
                "status": self.status, "culprits": [vars(s) for s in self.culprits],
                "proven_minimal": self.proven_minimal, "settings": [vars(s) for s in self.settings],
                "not_toggleable": self.not_toggleable, "keys": self.keys, "evidence": self.evidence,
                "reason": self.reason, "engine_runs": self.trials, "naive_engine_runs": self.naive}

    def lines(self) -> list[str]:
        out = [f"bisect {self.session_id}: run {self.run_a} -> run {self.run_b}, {len(self.settings)} toggleable "
               f"setting difference(s), {len(self.keys)} differing request(s)"]
        out += [f"  {s.label}" for s in self.settings]
        if self.not_toggleable:
            out.append("not toggleable: " + "; ".join(self.not_toggleable))
        if self.status == "found":
            minimal = "a minimal set" if self.proven_minimal else "a set (not proven minimal: bounds reached)"
            out.append(f"culprit ({minimal}):")
            out += [f"  {s.label}" for s in self.culprits]
        else:
            out.append(f"inconclusive: {self.reason}")
        out += [f"evidence: {line}" for line in self.evidence]
        out.append(f"engine runs: {self.trials} (a naive search over subsets would need {self.naive})")
        out.append(f"trials: evalgate bisect show {self.session_id}")
        return out


def bisect_config(store: Store, run_a: int, run_b: int, *, bounds: Bounds | None = None,
                  on_trial: TrialCallback | None = None, keys: list[str] | None = None) -> ConfigResult:
    a, b = store.load(run_a), store.load(run_b)
    for record in (a, b):
        if not record.outputs:
            raise ConfigError(f"run {record.id} has no outputs", fix="pick complete runs (see `evalgate runs list`)")
    settings, fixed = setting_differences(a, b)
    changed = _changed_keys(a, b) if keys is None else list(keys)
    if not settings:
        raise ConfigError(f"runs {run_a} and {run_b} differ in no setting that can be toggled"
                          + (f" (they differ in: {'; '.join(fixed)})" if fixed else ""),
                          fix="use `evalgate bisect commits` for code changes, or `evalgate diff` to see the change")
    if not changed:
        raise ConfigError(f"runs {run_a} and {run_b} give the same outputs on every request they share with the same "
                          "text and sampling: there is no output change to bisect",
                          fix="pick two runs whose outputs differ (`evalgate diff A B`)")
    concurrency = a.outputs[changed[0]][0].concurrency  # the first pass's level, as the outputs compared
    subject = {"run_a": run_a, "run_b": run_b, "keys": changed, "settings": [s.label for s in settings],
               "concurrency": concurrency}
    bisection = Bisection(store, "config", b.run.suite_name, subject, bounds=bounds, on_trial=on_trial)
    result = ConfigResult(bisection.session_id, run_a, run_b, "inconclusive", settings, fixed, changed)
    # Reference, every setting, ddmin (about 2 log2(n) trials for one culprit), the confirmation.
    bisection.estimate = 3 + 2 * max(1, len(settings).bit_length())
    trials = ConfigTrials(bisection, store.url, b, RunConfig.of(a), changed, concurrency)
    trial = trials.run
    with bisection.guard():
        try:
            outcome, reference = trial([], "A (no setting of B)")
            trials.reference = reference
            if outcome.outcome == "error":
                raise EngineError(f"run {run_a}'s configuration no longer starts an engine: {outcome.detail['error']}")
            stored_a = {k: a.outputs[k][0] for k in changed}
            if concurrency == 1:  # alone, a request's output does not depend on the others: A must reproduce
                drift = differing_keys(stored_a, reference)
                result.evidence.append(f"A's configuration reproduces run {run_a}'s outputs on "
                                       f"{len(changed) - len(drift)}/{len(changed)} requests")
            everything, outputs_all = trial(list(settings), "A + every setting of B")
            if everything.outcome != "bad":
                result.reason = ("applying every toggleable setting of B does not change the outputs: the cause is "
                                 "outside them" + (f" ({'; '.join(fixed)})" if fixed else " (not recorded in the fingerprint)"))
                return _done(bisection, result)
            stored_b = {k: b.outputs[k][0] for k in changed}
            matches_b = len(changed) - len(differing_keys(stored_b, outputs_all))
            result.evidence.append(f"A + every setting of B changes {len(everything.detail['differing'])}/"
                                   f"{len(changed)} requests (equal to run {run_b}'s outputs on {matches_b})")

            tried: dict[frozenset, tuple] = {}

            def fails(subset: list[Setting]) -> bool:
                tried[_signature(subset)] = trial(subset, "A + " + ", ".join(s.label for s in subset))
                return tried[_signature(subset)][0].outcome == "bad"

            culprits, proven = ddmin(settings, fails)
            result.culprits, result.proven_minimal, result.status = culprits, proven, "found"
            # ddmin has already run the culprits on their own, unless they are every setting
            culprit_outcome, culprit_outputs = tried.get(_signature(culprits)) or (everything, outputs_all)
            result.evidence.append(f"A + culprit changes {len(culprit_outcome.detail['differing'])}/{len(changed)} "
                                   f"requests (trial run {culprit_outcome.run_id})")
            key = culprit_outcome.detail["differing"][0]
            result.evidence.append(f"{key}: {_describe(first_divergence(reference[key], culprit_outputs[key]))}")
            others = [s for s in settings if s not in culprits]
            if others:
                rest, _ = trial(others, "A + every other setting (confirm)")
                result.evidence.append(
                    "every other setting together changes nothing" if rest.outcome == "good" else
                    f"the other settings change outputs too ({rest.outcome}): there is more than one cause; "
                    "bisect again between the culprit's trial run and run B")
        except BudgetExhausted as exc:
            result.reason = str(exc)
            if result.culprits:
                result.status = "found"
        result.naive = 1 + naive_trials(len(settings), max(1, len(result.culprits)))
        return _done(bisection, result)


class ConfigTrials:
    """The trials of one config bisection: each a fresh engine on the changed requests, with some of B's
    settings applied over A's configuration, judged against the first trial (A's own, the reference)."""

    def __init__(self, bisection: Bisection, url: str, run_b, base: RunConfig, changed: list[str], concurrency: int):
        self.bisection, self.url, self.run_b, self.base = bisection, url, run_b, base
        self.changed, self.concurrency = changed, concurrency
        self.reference: dict | None = None  # the first trial's outputs, once it has run

    def run(self, applied: list[Setting], label: str) -> tuple[TrialOutcome, dict]:
        """One trial, stored with the bisection: (its outcome, its outputs by request key)."""
        config = trial_config(self.base, applied)
        suite = suite_of(self.run_b, config, database=self.url)
        outputs: dict = {}

        def judged() -> TrialOutcome:
            try:
                run_id, got = run_trial(suite, self.url, self.changed, concurrency=self.concurrency,
                                        env=config.worker_env())
            except EngineError as exc:  # a setting the engine refuses: this subset cannot be judged
                return TrialOutcome("error", detail={"error": exc.message})
            outputs.update(got)
            if self.reference is None:
                return TrialOutcome("reference", run_id)
            differ = differing_keys(self.reference, got)
            return TrialOutcome("bad" if differ else "good", run_id, {"differing": differ})

        return self.bisection.trial(label, {"applied": [s.label for s in applied]}, judged), outputs


def _done(bisection: Bisection, result: ConfigResult) -> ConfigResult:
    result.trials = bisection.steps
    status = "complete" if result.status == "found" and result.proven_minimal else "inconclusive"
    bisection.finish(status, result.to_dict())
    return result


def _signature(settings: list[Setting]) -> frozenset:
    return frozenset(s.label for s in settings)


def _describe(div) -> str:
    if div.kind == "logprob":
        return (f"same tokens, the logprob of token {div.position} ({div.reference_id} {div.reference_text!r}) "
                f"differs: {div.reference_logprob!r} -> {div.other_logprob!r}")
    where = "output ends" if div.kind == "length" else "first differs"
    margin = f" (margin {div.margin:.3g})" if div.margin is not None else ""
    return (f"{where} at token {div.position}: {div.reference_id} {div.reference_text!r} -> "
            f"{div.other_id} {div.other_text!r}{margin}")


def _changed_keys(a: RunRecord, b: RunRecord) -> list[str]:
    """Requests in both runs, with the same text and sampling, whose first-pass outputs differ."""
    same_request = [k for k in a.outputs if k in b.outputs and k in a.requests and k in b.requests
                    and a.requests[k].request_hash == b.requests[k].request_hash]
    return differing_keys({k: a.outputs[k][0] for k in same_request}, {k: b.outputs[k][0] for k in same_request})
