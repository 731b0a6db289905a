"""The gate end to end, through the real CLI and the real vLLM CPU engine on locally built models.

Each failure verdict is produced for real here: batch variance and a silent regression (every request
alone, then all together, each run cold) on the workload the session's survey found varying on this
machine, checked request by request against plain vLLM under the same conditions (tests/variance.py); an
explained change by swapping the weights at the same path. The real-engine tests mock nothing.

The real-engine tests store to SQLite. The same journey on each store backend, and the explained change
of a weight swap, run on the fake engine in the plumbing tier (tests/plumbing/test_gate.py).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import (
    GREEN_PROMPTS,
    SQLITE_IN_SUITE_DIR,
    assert_sqlite_beside_suite,
    database_url,
    db_baselines,
    db_exists,
    db_query,
    db_runs,
    gate_keys,
    green_path,
    read_json,
    variance_prompts,
    write_suite,
)
from sqlalchemy.exc import SQLAlchemyError

from evalgate.configuration.policy import HARDWARE_TOLERANCES
from evalgate.configuration.schedule import rotation_slot

pytestmark = pytest.mark.e2e

# The negative controls' workload (conftest.variance_prompts: what varies on these CPUs, measured).
VARIANCE_PROMPTS = variance_prompts()


runs, baselines = db_runs, db_baselines  # (id, kind, status, verdict) / (suite_name, run_id) rows, either backend


def test_green_path_create_then_check(cli, tmp_path, tiny_model):
    green_path(cli, tmp_path, tiny_model, SQLITE_IN_SUITE_DIR, "sqlite", "vllm")


def test_variance_is_attributed_to_its_factor_and_never_promoted(cli, tmp_path, variance_source):
    """The oracle test: the workload the session's survey found varying on this machine (tests/variance.py),
    under the conditions plain vLLM ran it (alone cold, alone hot, all together cold, all together shuffled).
    The gate must name exactly the requests plain vLLM shows differing under each factor, and say
    "invariant under" each comparison where plain vLLM shows none."""
    source, n = variance_source, variance_source.n
    suite = source.suite(tmp_path / "ws", concurrency=(1,), shuffles=0)
    proc = cli("baseline", "create", suite, "--concurrency", f"1,{n}", "--shuffles", "1", "--json-report",
               tmp_path / "r.json")
    assert proc.returncode == 1, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"  # the survey found batch_size
    report = read_json(tmp_path / "r.json")
    found = gate_keys(report)
    factors = {f["factor"]: f for f in report["factors"]}
    assert set(factors) == {"prefix_cache", "batch_size", "order"}
    assert factors["prefix_cache"]["comparison"] == "prefix cache cold→hot"
    assert factors["batch_size"]["comparison"] == f"batch size 1→{n}"
    assert factors["order"]["comparison"] == f"order (seed 0) at batch size {n}"
    for factor, expected in source.differing.items():
        assert found.get(factor, set()) == set(expected), (factor, source.table)
        assert factors[factor]["differing"] == len(expected) and factors[factor]["compared"] == n
        said = "varies under: " if expected else "invariant under: "
        line = next((line for line in proc.stdout.splitlines() if line.strip().startswith(said)), "")
        assert factors[factor]["comparison"] in line, (factor, said, proc.stdout[-3000:])
    for r in report["requests"]:
        if r["factor"] == "prefix_cache":  # both alone: the cache state is the one difference
            assert (r["passes"]["reference_pass"], r["passes"]["other_pass"]) == (0, 1)
            assert r["passes"]["reference_concurrency"] == r["passes"]["other_concurrency"] == 1
        elif r["factor"] == "batch_size":
            assert (r["passes"]["reference_concurrency"], r["passes"]["other_concurrency"]) == (1, n)
    # the hot pass is proven hot by vLLM's own count, as often as in plain vLLM; the cold passes are proven cold
    db = database_url(suite)
    cached = dict(db_query(db, "select pass_index, sum(cached_tokens > 0) from outputs group by pass_index"))
    assert cached[0] == 0 and cached[2] == 0 and cached[3] == 0 and cached[1] == source.cache_hits
    assert report["cache_hits"] == [{"pass": 1, "hit": cached[1], "missed": n - cached[1], "unknown": 0}]
    assert report["promoted"] is False
    assert "NOT promoted" in proc.stdout
    assert "max_num_seqs = 1" in proc.stdout  # the remedy for the batch-size effect is named
    assert_sqlite_beside_suite("sqlite", suite, db)
    assert baselines(db) == []
    # nothing to check against: exit 4, before any inference
    cli("check", suite, check=4)

    # The rotating preset on the same requests: one crowded pass, this turn's slot alone (cold, then hot).
    # It finds exactly what the full schedule found among the requests it ran alone.
    key = source.differing["batch_size"][0]
    rotation, turn = 3, rotation_slot(key, 3)
    rotating = source.suite(tmp_path / "rot", concurrency=(1, n), shuffles=0,
                            extra_schedule=f'preset = "rotating"\nrotation = {rotation}')
    cli.env["EVALGATE_ROTATION_TURN"] = str(turn)
    proc = cli("baseline", "create", rotating, "--json-report", tmp_path / "rot.json", check=1)
    rot = read_json(tmp_path / "rot.json")
    keys = [f"p{i:03d}" for i in range(n)]
    sample = {k for k in keys if rotation_slot(k, rotation) == turn}
    full = {(k, f) for f in ("batch_size", "prefix_cache") for k in found.get(f, set()) if k in sample}
    rotated = {(k, f) for f, ks in gate_keys(rot).items() for k in ks}
    assert (key, "batch_size") in rotated and rotated == full, (rotated, full)
    assert {r["key"] for r in rot["requests"]} == {k for k, _ in rotated}
    assert {f["factor"]: f["compared"] for f in rot["factors"]} == {"batch_size": len(sample),
                                                                   "prefix_cache": len(sample)}
    assert rot["alone_coverage"] == {"covered": len(sample), "requests": n, "runs": 1, "window": rotation}
    assert f"alone coverage: {100 * len(sample) / n:.0f}% over the last 1 run" in proc.stdout


def test_without_a_prefix_cache_there_is_no_prefix_cache_finding(cli, tmp_path, tiny_model):
    suite = write_suite(tmp_path / "ws", tiny_model, VARIANCE_PROMPTS[:8], max_tokens=4, concurrency=(1,), shuffles=0,
                        extra_engine="enable_prefix_caching = false")
    proc = cli("baseline", "create", suite, "--json-report", tmp_path / "r.json", check=0)
    report = read_json(tmp_path / "r.json")
    assert report["counts"]["batch_variance"] == 0 and report["factors"] == []
    assert report["not_run"] == [{"pass": "prefix cache hot", "reason": "the engine has prefix caching off "
                                  "(enable_prefix_caching = false): there is no cache to warm"}]
    assert "not run: prefix cache hot" in proc.stdout


def test_silent_regression_when_only_a_runtime_knob_changed(cli, tmp_path, variance_source):
    """Every request alone in the baseline, all together in the check, on the survey's workload: exactly the
    requests plain vLLM shows differing alone vs crowded are silent regressions, and nothing else."""
    source, n = variance_source, variance_source.n
    suite = source.suite(tmp_path / "ws", concurrency=(1,), shuffles=0, hot_pass=False)
    cli("baseline", "create", suite, "--concurrency", "1", check=0)  # every request alone
    proc = cli("check", suite, "--concurrency", str(n), "--json-report", tmp_path / "r.json")  # all crowded
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = read_json(tmp_path / "r.json")
    assert report["changed_components"] == []  # concurrency is not identity
    regressed = {r["key"] for r in report["requests"] if r["verdict"] == "silent_regression"}
    assert regressed == set(source.differing["batch_size"]), source.table
    assert report["counts"]["silent_regression"] == len(regressed) and report["counts"]["batch_variance"] == 0
    # no condition in common: the two reference passes were compared, and the report says so
    assert report["baseline_pairs"][0]["same_condition"] is False
    assert all(r["components"] == [] for r in report["requests"] if r["verdict"] == "silent_regression")
    assert "silent_regression" in proc.stdout and "no pass condition in common" in proc.stdout


def test_interrupted_run_is_incomplete_and_never_a_baseline(cli, tmp_path, tiny_model, store_url, store_backend):
    import signal
    import time

    prompts = [f"{p} ({i})" for i, p in enumerate(GREEN_PROMPTS * 4)]
    suite = write_suite(tmp_path / "ws", tiny_model, prompts, concurrency=(1,), shuffles=0, max_tokens=32,
                        database=store_url, kind="fake", extra_engine="fake_seconds_per_wave = 0.2")
    db = database_url(suite)
    proc = cli.popen("baseline", "create", suite)
    deadline = time.time() + 300
    while time.time() < deadline:  # wait until the run is recording
        if db_exists(db) and any(r[2] == "running" for r in _safe_runs(db)):
            break
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err[-3000:]
    assert "interrupted" in err
    assert_sqlite_beside_suite(store_backend, suite, db)
    assert runs(db) == [(1, "baseline", "interrupted", None)]
    assert baselines(db) == []
    refused = cli("baseline", "accept", "1", "--suite", suite, check=2)
    assert "not complete" in refused.stderr
    assert baselines(db) == []


def _safe_runs(db):
    try:
        return runs(db)
    except SQLAlchemyError:  # no tables yet (SQLite file being created, PostgreSQL schema not committed)
        return []


def test_import_stays_light():
    """The CLI must start without importing vLLM, torch or lm_eval."""
    code = ("import sys, evalgate.cli; "
            "print(sorted(m for m in ('vllm', 'torch', 'lm_eval', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_fail_on_tokens_lets_bit_drift_pass_and_reports_it(cli, tmp_path, variance_source):
    """`[gate] fail_on = "tokens"` on the survey's workload: the requests plain vLLM shows differing alone vs
    crowded in logprob bits only are drift (reported, passing); a token flip, where plain vLLM shows one, fails."""
    source, n = variance_source, variance_source.n
    suite = source.suite(tmp_path / "ws", concurrency=(1, n), shuffles=0, hot_pass=False)
    proc = cli("baseline", "create", suite, "--fail-on", "tokens", "--json-report", tmp_path / "r.json")
    report = read_json(tmp_path / "r.json")
    flips = set(source.token_flips["batch_size"])
    bits_only = set(source.differing["batch_size"]) - flips
    assert proc.returncode == (1 if flips else 0), proc.stdout[-3000:]
    # the near-tie margin follows the dtype (the tie ε of policy.HARDWARE_TOLERANCES), recorded resolved
    margin = HARDWARE_TOLERANCES[source.dtype][0]
    assert report["gate"] == {"fail_on": "tokens", "near_tie_margin": margin, "other_hardware": "judge",
                              "tie_epsilon": None, "drift_cap": None, "metric_alpha": 0.05, "fail_on_metric": None}
    d = report["differences"]
    assert d["bits_only"] == d["drift"] == len(bits_only)
    assert d["token_flips"]["near_tie"] + d["token_flips"]["confident"] == len(flips)
    assert {r["key"] for r in report["requests"] if r["bits_only"]} == bits_only
    # each flip's class, as plain vLLM's own margin at its first differing token says
    expected = {key: "near_tie" if at <= margin else "confident" for key, at in source.flip_margins["batch_size"].items()}
    assert {r["key"]: r["flip"] for r in report["requests"] if r["flip"]} == expected
    # the survey prefers a source that drifts in bits alone (every CPU measured has one): checked everywhere
    assert bits_only, f"the variance source drifts in no request's bits alone here:\n{source.table}"
    assert 0 < d["max_delta"] < 1 and d["min_margin"] is not None
    assert f"drift: {len(bits_only)} request(s) differ in logprob bits only" in proc.stdout
    assert "gate: fail on tokens" in proc.stdout
    assert report["promoted"] is (not flips)
