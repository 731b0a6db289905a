"""Unit tests of the bisect machinery: ddmin, the trial store and bounds, setting differences."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from evalgate.bisect.config import Setting, setting_differences, trial_config
from evalgate.bisect.ddmin import BudgetExhausted, ddmin, naive_trials
from evalgate.bisect.session import Bisection, Bounds, TrialOutcome
from evalgate.bisect.trials import RunConfig
from evalgate.fingerprint import REDACTED, RunFingerprint
from evalgate.store import open_store


def _counting(culprits: set):
    calls = []

    def fails(subset):
        calls.append(list(subset))
        return culprits <= set(subset)

    return fails, calls


@pytest.mark.parametrize("n", [1, 2, 5, 8, 16, 33])
def test_ddmin_finds_a_single_culprit_in_logarithmic_trials(n):
    for culprit in range(n):
        fails, calls = _counting({culprit})
        found, proven = ddmin(list(range(n)), fails)
        assert found == [culprit] and proven
        assert len(calls) <= 2 * max(1, n.bit_length()), (n, culprit, calls)


def test_ddmin_finds_an_interacting_pair_and_is_one_minimal():
    for pair in itertools.combinations(range(7), 2):
        fails, calls = _counting(set(pair))
        found, proven = ddmin(list(range(7)), fails)
        assert sorted(found) == list(pair) and proven
        for drop in found:  # 1-minimal: removing any element passes
            assert not fails([x for x in found if x != drop])
        assert len(calls) < naive_trials(7, 2)


def test_ddmin_never_repeats_a_trial():
    seen = []

    def fails(subset):
        key = frozenset(subset)
        assert key not in seen, f"subset {sorted(subset)} tried twice"
        seen.append(key)
        return {3, 9} <= set(subset)

    assert sorted(ddmin(list(range(12)), fails)[0]) == [3, 9]


def test_ddmin_out_of_budget_returns_a_failing_set_not_proven_minimal():
    calls = []

    def fails(subset):
        if len(calls) == 2:
            raise BudgetExhausted("--max-steps 2 reached")
        calls.append(list(subset))
        return 5 in subset

    found, proven = ddmin(list(range(16)), fails)
    assert 5 in found and not proven and len(found) < 16


def test_naive_trials_counts_subsets_up_to_the_size_found():
    assert naive_trials(5, 1) == 5
    assert naive_trials(5, 2) == 5 + 10
    assert naive_trials(16, 2) == 16 + 120


def test_trials_are_stored_as_they_happen_and_bounds_stop_the_session(db_url):
    store = open_store(db_url)
    lines = []
    bisection = Bisection(store, "config", "s", {"run_a": 1}, bounds=Bounds(max_steps=2),
                          on_trial=lambda step, est, label, outcome, sec: lines.append((step, label, outcome.outcome)))
    bisection.trial("first", {"x": 1}, lambda: TrialOutcome("good", detail={"k": [1]}))
    _, trials = store.bisect(bisection.session_id)
    assert [(t.step, t.label, t.outcome, t.config, t.detail) for t in trials] == [(1, "first", "good", {"x": 1}, {"k": [1]})]
    bisection.trial("second", {}, lambda: TrialOutcome("bad"))
    with pytest.raises(BudgetExhausted, match="max-steps 2"):
        bisection.trial("third", {}, lambda: TrialOutcome("bad"))
    assert lines == [(1, "first", "good"), (2, "second", "bad")]
    with pytest.raises(KeyboardInterrupt):
        with bisection.guard():
            raise KeyboardInterrupt
    session, trials = store.bisect(bisection.session_id)
    assert session.status == "interrupted" and len(trials) == 2
    assert store.bisects()[0].id == bisection.session_id


def _record(engine_args, env, *, requested=False, hashes=None, vllm="0.32.0"):
    fingerprint = {
        "engine": {"hash": "e", "data": {"args": engine_args, "vllm": vllm, "torch_threads": 1,
                                         "batch_invariance": {"requested": requested}}},
        "env": {"hash": "v", "data": env},
    }
    for name, value in (hashes or {}).items():
        fingerprint[name] = {"hash": value, "data": {}}
    return SimpleNamespace(fingerprint=RunFingerprint(fingerprint))


def test_setting_differences_split_toggleable_from_fixed():
    a = _record({"dtype": "float32", "seed": 0}, {"OMP_NUM_THREADS": "1", "VLLM_API_KEY": REDACTED, "VLLM_X": "1"},
                hashes={"model": "m1", "code": "c"})
    b = _record({"dtype": "bfloat16", "seed": 0, "max_num_seqs": 8}, {"OMP_NUM_THREADS": "2", "VLLM_API_KEY": "other"},
                requested=True, hashes={"model": "m2", "code": "c"}, vllm="0.33.0")
    settings, fixed = setting_differences(a, b)
    assert [s.label for s in settings] == [
        "engine dtype: 'float32' -> 'bfloat16'", "engine max_num_seqs: (unset) -> 8",
        "batch_invariant batch_invariant: False -> True",
        "env OMP_NUM_THREADS: '1' -> '2'", "env VLLM_X: '1' -> (unset)"]
    assert any("VLLM_API_KEY" in f for f in fixed) and "model component" in fixed
    assert any(f.startswith("engine vllm") for f in fixed) and "code component" not in fixed


def test_trial_config_applies_b_values_and_unsets_absent_ones():
    base = RunConfig({"dtype": "float32", "seed": 0}, False, {"OMP_NUM_THREADS": "1", "VLLM_X": "1"})
    config = trial_config(base, [Setting("engine", "dtype", "float32", "bfloat16"), Setting("env", "VLLM_X", "1", None),
                                 Setting("engine", "seed", 0, None), Setting("batch_invariant", "batch_invariant", False, True)])
    assert config.engine_args == {"dtype": "bfloat16"}
    assert config.env == {"OMP_NUM_THREADS": "1"} and config.batch_invariant is True
    assert base.engine_args == {"dtype": "float32", "seed": 0}  # the run's own config is untouched


def test_worker_env_restores_the_run_env_and_unsets_extra_allow_listed_names(monkeypatch):
    monkeypatch.setenv("VLLM_SOMETHING_NEW", "1")
    monkeypatch.setenv("HOME_UNRELATED", "x")
    env = RunConfig({}, False, {"OMP_NUM_THREADS": "3", "VLLM_API_KEY": REDACTED}).worker_env()
    assert env["OMP_NUM_THREADS"] == "3" and env["VLLM_SOMETHING_NEW"] is None
    assert "VLLM_API_KEY" not in env and "HOME_UNRELATED" not in env
