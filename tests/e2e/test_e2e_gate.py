"""The gate end to end, through the real CLI and the real vLLM CPU engine on locally built models.

Each failure verdict is produced for real here: batch variance and a silent regression (every request
alone, then all together, each run cold) on the workload the session's survey found varying on this
machine, checked request by request against plain vLLM under the same conditions (tests/variance.py); an
explained change by swapping the weights at the same path. The real-engine tests mock nothing.

The real-engine tests store to SQLite. Where the backend is what is tested, the same journey runs on
PostgreSQL too (`store_url`, `store_backend`: conftest.py; EVALGATE_TEST_POSTGRES=1, tests/pg.py) with the
fake test engine (evalgate/engines/fake.py), whose outputs are deterministic: the store is what differs,
not the engine. The stored rows are read back through SQLAlchemy on either backend; assertions about
SQLite's own files run on SQLite only.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from helpers import (
    SQLITE_IN_SUITE_DIR,
    database_url,
    db_baselines,
    db_exists,
    db_query,
    db_runs,
    read_json,
    sqlite_file,
    variance_prompts,
    write_suite,
)
from sqlalchemy.exc import SQLAlchemyError

from evalgate.configuration.schedule import rotation_slot

pytestmark = pytest.mark.e2e

GREEN_PROMPTS = [f"Prompt number {i}: the quick brown fox and the {w}" for i, w in
                 enumerate(["dog", "cat", "river", "city", "answer", "model", "colour", "number"] * 3)]
# The negative controls' workload (conftest.variance_prompts: what varies on these CPUs, measured).
VARIANCE_PROMPTS = variance_prompts()


runs, baselines = db_runs, db_baselines  # (id, kind, status, verdict) / (suite_name, run_id) rows, either backend


def assert_sqlite_beside_suite(store_backend: str, suite, db: str) -> None:
    """On SQLite, the relative `sqlite:///evalgate.sqlite` is the file next to the suite file."""
    if store_backend == "sqlite":
        assert sqlite_file(db) == suite.parent / "evalgate.sqlite" and sqlite_file(db).is_file()


def test_green_path_create_then_check(cli, tmp_path, tiny_model):
    green_path(cli, tmp_path, tiny_model, SQLITE_IN_SUITE_DIR, "sqlite", "vllm")


def test_green_path_on_each_store_backend(cli, tmp_path, tiny_model, store_url, store_backend):
    green_path(cli, tmp_path, tiny_model, store_url, store_backend, "fake")


def green_path(cli, tmp_path, tiny_model, store_url, store_backend, kind):
    suite = write_suite(tmp_path / "ws", tiny_model, GREEN_PROMPTS, concurrency=(1, 4, 16), shuffles=1,
                        database=store_url, kind=kind, max_tokens=8)
    created = cli("baseline", "create", suite, "--json-report", tmp_path / "create.json", check=0)
    report = read_json(tmp_path / "create.json")
    assert report["counts"]["stable"] == len(GREEN_PROMPTS)
    assert report["promoted"] is True
    assert "NOT in force" in created.stdout  # batch invariance requested, unavailable on CPU: said so

    checked = cli("check", suite, "--json-report", tmp_path / "check.json", check=0)
    report = read_json(tmp_path / "check.json")
    assert report["schema"] == "evalgate.report/1"
    assert report["status"] == "pass" and report["exit_code"] == 0
    assert report["counts"]["stable"] == len(GREEN_PROMPTS)
    assert report["changed_components"] == []
    assert report["requests"] == []
    assert report["batch_invariance"] == {
        "requested": True, "in_force": False,
        "reason": "not available on this platform (cpu): vLLM's batch-invariant kernels need CUDA, ROCm or XPU"
        if kind == "vllm" else "the fake test engine has no batch-invariant kernels",
    }
    assert "PASS" in checked.stdout
    if kind == "vllm":  # prompts shorter than one 128-token CPU cache block: the hot pass can hit nothing
        assert report["cache_hits"] == [{"pass": 1, "hit": 0, "missed": len(GREEN_PROMPTS), "unknown": 0}]
        out = " ".join(checked.stdout.split())
        assert "hot pass 1: 0 of 24 requests were served from the prefix cache" in out
        assert "not exercised: prefix cache cold→hot" in out and "invariant under: batch size 1→4" in out

    db = database_url(suite)
    assert_sqlite_beside_suite(store_backend, suite, db)
    assert runs(db) == [(1, "baseline", "complete", "pass"), (2, "check", "complete", "pass")]
    # every request at every pass: 3 concurrency levels, the hot pass (1) and a shuffled pass
    per_pass = db_query(db, "select pass_index, concurrency, count(*), max(position) from outputs "
                            "where run_id = 2 group by pass_index, concurrency order by pass_index")
    assert per_pass == [(0, 1, 24, 0), (1, 1, 24, 0), (2, 4, 24, 3), (3, 16, 24, 15), (4, 16, 24, 15)]

    listed = cli("runs", "list", "--suite", suite, check=0)
    assert "baseline" in listed.stdout and "check" in listed.stdout
    shown = cli("runs", "show", "2", "--suite", suite, "--json", check=0)
    assert '"status": "complete"' in shown.stdout
    diffed = cli("diff", "1", "2", "--suite", suite, "--json-report", tmp_path / "diff.json", check=0)
    assert read_json(tmp_path / "diff.json")["counts"]["stable"] == len(GREEN_PROMPTS)
    assert "identity unchanged" in diffed.stdout
    cli("baseline", "accept", "2", "--suite", suite, check=0)
    assert baselines(db) == [("test", 2)]


def test_explained_change_after_weight_swap(cli, tmp_path, tiny_model):
    """The weights' content hash is evalgate's (vLLM's own fingerprint would not notice the swap), so the
    fake test engine, whose outputs follow the weights, shows it as well as vLLM and in a fraction of the time."""
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    suite = write_suite(tmp_path / "ws", model, GREEN_PROMPTS[:8], concurrency=(1, 8), shuffles=0, kind="fake")
    cli("baseline", "create", suite, check=0)
    # same path, other weights: vLLM's own fingerprint would not notice; evalgate's content hash does
    cli("build-model", model, "--seed", "1", check=0)
    out = cli("check", suite, "--json-report", tmp_path / "check.json", check=0)
    report = read_json(tmp_path / "check.json")
    assert report["counts"]["silent_regression"] == 0
    assert report["counts"]["explained_change"] >= 1
    assert report["changed_components"] == ["model"]
    changed = [r for r in report["requests"] if r["verdict"] == "explained_change"]
    assert all(r["components"] == ["model"] for r in changed)
    first = changed[0]["divergence"]
    assert first["reference_id"] != first["other_id"] and first["margin"] is not None
    assert "model.safetensors" in report["fingerprint_changes"]["model"]
    assert "explained_change" in out.stdout
    cli("check", suite, "--strict", check=1)


def gate_keys(report: dict, verdict: str = "batch_variance") -> dict[str, set[str]]:
    """Factor -> the requests a report finds varying under it (every factor a request varies under)."""
    found: dict[str, set[str]] = {}
    for r in report["requests"]:
        if r["verdict"] == verdict:
            for factor in r["passes"]["factors"]:
                found.setdefault(factor, set()).add(r["key"])
    return found


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
    assert report["gate"] == {"fail_on": "tokens", "near_tie_margin": 0.1}
    d = report["differences"]
    assert d["bits_only"] == d["drift"] == len(bits_only)
    assert d["token_flips"]["near_tie"] + d["token_flips"]["confident"] == len(flips)
    assert {r["key"] for r in report["requests"] if r["bits_only"]} == bits_only
    if bits_only:
        assert 0 < d["max_delta"] < 1 and d["min_margin"] is not None
        assert f"drift: {len(bits_only)} request(s) differ in logprob bits only" in proc.stdout
    assert "gate: fail on tokens" in proc.stdout
    assert report["promoted"] is (not flips)
