"""Soak: many checks in a row against one database, through the library API in one process.

Two engines. On the fake engine, in this process ($EVALGATE_INLINE_ENGINE), it runs in every full test run
(CI): 200 checks in about ten seconds, so evalgate's own store, judging and memory are soaked on every landing. On
the real vLLM engine it is off by default: each check starts a fresh engine process (measured 16-24 s per
check on 2 busy cores with the tiny model, so 200 checks take about an hour there). Run it with

    EVALGATE_SOAK=1 OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/e2e/test_soak.py -s -m soak

EVALGATE_SOAK_CHECKS changes the number of checks (default 200). After the loop: every run is complete and
passed, `PRAGMA integrity_check` is ok, the database grows linearly (the bytes added per check stay the
same from the first checks to the last ones), and this process's memory stays flat (the first check
imports torch for the hardware fingerprint: about +200 MB, once). The measured numbers
are printed (use -s) and attached to the test report as properties.
"""

from __future__ import annotations

import json
import os
import resource
import sqlite3
import statistics
import time
from pathlib import Path

import pytest
from helpers import TEST_ENV, write_suite

pytestmark = pytest.mark.soak
VLLM_SOAK = pytest.mark.skipif(os.environ.get("EVALGATE_SOAK") != "1",
                               reason="vLLM soak: set EVALGATE_SOAK=1 (EVALGATE_SOAK_CHECKS=200 by default, ~1 h on 2 cores)")

PROMPTS = [f"Soak prompt {i}: the quick brown fox and the {w}" for i, w in
           enumerate(["dog", "cat", "river", "city", "answer", "model", "colour", "number"])]
SIZE_TOLERANCE = 0.25  # mean bytes per check of the last window vs the first, after the warm-up
RSS_GROWTH_LIMIT = 150 << 20  # bytes, over the last 100 checks (the second half, for shorter soaks)


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # not Linux: peak, not current


def logical_db_bytes(db: Path) -> int:
    """page_count * page_size through a fresh read-only connection: the database as readers see it,
    including pages still in the -wal file (whose own size is reused, not grown, after checkpoints)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        (pages,) = conn.execute("pragma page_count").fetchone()
        (page_size,) = conn.execute("pragma page_size").fetchone()
    finally:
        conn.close()
    return pages * page_size


@pytest.mark.parametrize("kind, default_checks", [("fake", 200), pytest.param("vllm", 200, marks=VLLM_SOAK)])
def test_soak_many_checks_one_database(kind, default_checks, tmp_path, request, evalgate_home, monkeypatch,
                                       record_property):
    from evalgate import gate
    from evalgate.configuration.suite import load_suite
    from evalgate.store import open_store

    n_checks = int(os.environ.get("EVALGATE_SOAK_CHECKS", default_checks))
    assert n_checks >= 10, "EVALGATE_SOAK_CHECKS: at least 10 checks"
    for name in [k for k in os.environ if k.startswith("VLLM_")]:
        monkeypatch.delenv(name)
    for name, value in {**TEST_ENV, "EVALGATE_HOME": str(evalgate_home),
                        "VLLM_CACHE_ROOT": str(evalgate_home / "vllm-cache")}.items():
        monkeypatch.setenv(name, value)
    if kind == "fake":
        monkeypatch.setenv("EVALGATE_INLINE_ENGINE", "1")  # the engine in this process: its memory is measured too
    model = request.getfixturevalue("fake_model" if kind == "fake" else "tiny_model")
    suite = load_suite(write_suite(tmp_path / "ws", model, PROMPTS, concurrency=(1, 4), shuffles=1,
                                   max_tokens=16, name="soak", kind=kind))
    db = tmp_path / "ws" / "evalgate.sqlite"
    store = open_store(suite.database)

    t0 = time.perf_counter()
    created = gate.create_baseline(suite, store)
    baseline_seconds = time.perf_counter() - t0
    assert created.exit_code == 0 and created.promoted

    sizes, rss, seconds = [logical_db_bytes(db)], [rss_bytes()], []
    for i in range(n_checks):
        t0 = time.perf_counter()
        report = gate.check(suite, store)
        seconds.append(time.perf_counter() - t0)
        assert report.exit_code == 0 and report.counts["stable"] == len(PROMPTS), (i, report.counts)
        sizes.append(logical_db_bytes(db))
        rss.append(rss_bytes())
        if (i + 1) % 10 == 0 or i + 1 == n_checks:
            print(f"soak: check {i + 1}/{n_checks}: {seconds[-1]:.1f} s, db {sizes[-1] / 1e6:.2f} MB, "
                  f"rss {rss[-1] / 1e6:.0f} MB", flush=True)

    with sqlite3.connect(db) as conn:
        assert conn.execute("pragma integrity_check").fetchall() == [("ok",)]
        assert conn.execute("select kind, status, verdict, count(*) from runs group by kind, status, verdict "
                            "order by kind").fetchall() == [("baseline", "complete", "pass", 1),
                                                            ("check", "complete", "pass", n_checks)]

    # database growth: linear in the number of checks
    increments = [b - a for a, b in zip(sizes, sizes[1:])]
    warmup = max(2, n_checks // 40)
    window = min(50, (n_checks - warmup) // 3)
    first, last = statistics.mean(increments[warmup:warmup + window]), statistics.mean(increments[-window:])
    xs = list(range(len(sizes)))
    slope, intercept = statistics.linear_regression(xs, sizes)
    ss_res = sum((y - (slope * x + intercept)) ** 2 for x, y in zip(xs, sizes))
    ss_tot = sum((y - statistics.mean(sizes)) ** 2 for y in sizes)
    r2 = 1 - ss_res / ss_tot if ss_tot else 1.0

    # memory: flat after the warm-up
    span = min(100, n_checks // 2)
    rss_growth = rss[-1] - rss[-1 - span]
    children_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # engine processes, if any

    numbers = {
        "checks": n_checks, "baseline_seconds": round(baseline_seconds, 2),
        "seconds_per_check_mean": round(statistics.mean(seconds), 2),
        "seconds_per_check_min_max": [round(min(seconds), 2), round(max(seconds), 2)],
        "bytes_per_check_fit": round(slope), "bytes_per_check_first_window": round(first),
        "bytes_per_check_last_window": round(last), "size_fit_r2": round(r2, 5),
        "db_logical_bytes_start_end": [sizes[0], sizes[-1]],
        "db_file_bytes": db.stat().st_size,
        "wal_file_bytes": (db.with_name(db.name + "-wal").stat().st_size
                           if db.with_name(db.name + "-wal").exists() else 0),
        "rss_bytes_start_end": [rss[0], rss[-1]], "rss_growth_last_span": rss_growth, "rss_span_checks": span,
        "children_peak_rss_bytes": children_peak,
    }
    print("soak results: " + json.dumps(numbers), flush=True)
    for key, value in numbers.items():
        record_property(key, value)

    assert first > 0 and abs(last - first) <= SIZE_TOLERANCE * first, (
        f"database growth per check changed: {first:.0f} B/check at first, {last:.0f} B/check at the end")
    assert r2 >= 0.98, f"database size is not linear in the number of checks (R^2 = {r2:.4f})"
    assert rss_growth < RSS_GROWTH_LIMIT, f"RSS grew {rss_growth / 1e6:.0f} MB over the last {span} checks"
