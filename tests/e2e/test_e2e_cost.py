"""`evalgate cost` end to end: the real CLI, the real vLLM CPU engine, locally built models.

On the workload the session's survey found varying alone vs crowded on this machine (tests/variance.py),
the batched default must come out not invariant, with exactly the requests plain vLLM shows differing,
`max_num_seqs=1` invariant, and the cost ratio must be the ratio of the stored figures.
On CPU the batch-invariant candidate runs evalgate's kernels: in force, and invariant where the variance is
the CPU's own (a planted one sits after the kernels, in the sampler's logits, and stays). Also: per-candidate env reaches
that candidate's engine only, unknown engine arguments are exit 2, and the GPU validation script's CPU
dry run passes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import database_url, db_baselines, db_query, db_runs, read_json, write_suite

from evalgate.kernels.status import KERNELS

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


def test_cost_of_determinism(cli, tmp_path, variance_source):
    # the prefix cache off: with it on, a hot pass could show the cache's effect under every candidate,
    # one sequence at a time included
    n = variance_source.n
    suite = variance_source.suite(tmp_path / "ws", concurrency=(1, n), shuffles=0, name="cost",
                                  extra_engine="enable_prefix_caching = false")
    proc = cli("cost", suite, "--json-report", tmp_path / "out" / "cost.json", check=0)
    doc = read_json(tmp_path / "out" / "cost.json")
    assert doc["schema"] == "evalgate.cost/1" and doc["platform"] == "cpu"
    by_name = {c["name"]: c for c in doc["candidates"]}
    # no-prefix-cache is left out: the suite already has the prefix cache off, so `batched` is that candidate
    assert list(by_name) == ["batch-invariant", "batched", "max-num-seqs-1"]
    assert by_name["batched"]["varying"] == {"batch_size": by_name["batched"]["differing_requests"]}

    batched, seq1, requested = by_name["batched"], by_name["max-num-seqs-1"], by_name["batch-invariant"]
    assert requested["status"] == "measured" and requested["batch_invariance"]["in_force"] is True
    assert requested["batch_invariance"]["kernels"] == KERNELS
    if variance_source.candidate.planted:  # planted in the logits, after every kernel: the mode cannot remove it
        assert requested["differing_requests"] == len(variance_source.differing["batch_size"])
    else:  # this CPU's own kernels varied: the mode removes it
        assert requested["invariant"] is True and requested["differing_requests"] == 0
    assert batched["status"] == "measured" and batched["invariant"] is False, json.dumps(batched, indent=1)
    assert batched["differing_requests"] == len(variance_source.differing["batch_size"])  # plain vLLM's count
    assert seq1["status"] == "measured" and seq1["invariant"] is True and seq1["differing_requests"] == 0
    assert batched["batch_invariance"] == {"requested": False, "in_force": False, "reason": "not requested"}

    # the ratio is computed from the stored figures...
    db = database_url(suite)
    stored = {name: (tps, rss, run) for name, tps, rss, run in db_query(
        db, "select candidate, tokens_per_second, peak_rss_bytes, run_id from cost_results where session = :s",
        s=doc["session"])}
    assert set(stored) == set(by_name)
    fastest = max(by_name, key=lambda n: stored[n][0])
    fastest_invariant = max((n for n in by_name if by_name[n]["invariant"]), key=lambda n: stored[n][0])
    assert doc["fastest"]["name"] == fastest and doc["fastest_invariant"]["name"] == fastest_invariant
    assert doc["cost_ratio"] == pytest.approx(stored[fastest_invariant][0] / stored[fastest][0], rel=1e-12)
    assert 0 < doc["cost_ratio"] <= 1
    # ... and a stored figure is the runner's own record: the crowded pass (one wave, not the warm-up) is
    # its output tokens over its seconds
    for name in by_name:
        (schedule,) = db_query(db, "select schedule from runs where id = :i", i=stored[name][2])[0]
        schedule = json.loads(schedule) if isinstance(schedule, str) else schedule
        (crowded,) = [p for p in schedule["timings"]["passes"] if p["concurrency"] == n]
        assert stored[name][0] == pytest.approx(crowded["output_tokens"] / crowded["seconds"], rel=1e-9)
        assert stored[name][1] > 100 << 20  # peak RSS of an engine process: hundreds of MiB at least
    assert f"cost ratio {doc['cost_ratio']:.3f}" in proc.stdout

    # cost runs are stored as such, never as baselines or checks
    assert [(kind, status) for _, kind, status, _ in db_runs(db)] == [("cost", "complete")] * 3
    assert db_baselines(db) == []
    listed = cli("runs", "list", "--suite", suite, check=0)
    assert "cost" in listed.stdout
    cli("check", suite, check=4)  # still no baseline: a cost run is not one

    png = tmp_path / "out" / "cost.png"
    assert doc["plot"] and Path(doc["plot"]) == png
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from PIL import Image

    with Image.open(png) as img:
        img.verify()


def test_candidate_env_reaches_only_its_engine_and_bad_args_are_exit_2(cli, tmp_path, tiny_model):
    suite = write_suite(tmp_path / "ws", tiny_model, ["one", "two", "three", "four"], max_tokens=4, concurrency=(1, 4),
                        shuffles=0)
    # both bad candidates named in one error (each correction would cost another vLLM import)
    bad = cli("cost", suite, "--no-defaults", "--candidate", "x:max_num_seq=2", "--candidate", "y:max_num_seqs=two",
              check=2)  # vLLM on y: "'<' not supported"
    assert "candidate 'x' (--candidate): unknown vLLM engine argument `max_num_seq`" in bad.stderr
    assert "did you mean `max_num_seqs`?" in bad.stderr
    assert "candidate 'y' (--candidate): `max_num_seqs` must be an integer, got str 'two'" in bad.stderr
    assert not (tmp_path / "ws" / "evalgate.sqlite").exists()

    out = tmp_path / "c.json"
    cli("cost", suite, "--no-defaults", "--candidate", "probe:env.VLLM_EVALGATE_COST_PROBE=yes",
        "--candidate", "two:max_num_seqs=2", "--json-report", out, "--plot", tmp_path / "plot.png", check=0)
    doc = read_json(out)
    by_name = {c["name"]: c for c in doc["candidates"]}
    assert by_name["probe"]["config"]["env"] == {"VLLM_EVALGATE_COST_PROBE": "yes"}
    assert by_name["two"]["config"]["engine_args"] == {"max_num_seqs": 2}
    db = database_url(suite)
    envs = {}
    for name in ("probe", "two"):
        rows = db_query(db, "select f.components from runs r join fingerprints f on f.hash = r.fingerprint_hash "
                            "where r.id = :i", i=by_name[name]["run_id"])
        components = rows[0][0] if not isinstance(rows[0][0], str) else json.loads(rows[0][0])
        envs[name] = components["env"]["data"]
        if name == "two":
            assert components["engine"]["data"]["max_num_seqs"] == 2
    assert envs["probe"].get("VLLM_EVALGATE_COST_PROBE") == "yes"
    assert "VLLM_EVALGATE_COST_PROBE" not in envs["two"]  # applied in that candidate's engine process only
    assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_gpu_validation_script_dry_run(tmp_path, tiny_model, cli_env):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_validate.py"), "--dry-run", "--out",
                           str(out), "--model", str(tiny_model)], env=cli_env, capture_output=True, text=True,
                          timeout=600)
    summary = json.loads((out / "summary.json").read_text())
    assert proc.returncode == 0, proc.stdout + (out / "commands.log").read_text()[-4000:]
    assert summary["exit"] == 0 and summary["problems"] == []
    assert summary["invariant"]["batch_invariance"]["requested"] is True
    assert summary["invariant"]["batch_invariance"]["in_force"] is True  # evalgate's CPU kernels
    assert summary["cost"]["candidates"]["batch-invariant"]["status"] == "measured"
    assert summary["cost"]["candidates"]["batch-invariant"]["invariant"] is True
    assert summary["cost"]["candidates"]["max-num-seqs-1"]["invariant"] is True
    for name in ("invariant.json", "control.json", "cost.json", "cost.png", "summary.md", "commands.log"):
        assert (out / name).is_file(), name
    # one table: every comparison of the default schedule and of every probe, with the flag on and off
    table = {row["factor"]: row for row in summary["table"]}
    assert {"prefix_cache", "batch_size", "order", "neighbours", "prefill_decode"} <= set(table)
    assert all(isinstance(row["differing_on"], int) and isinstance(row["differing_off"], int)
               for row in summary["table"] if not row["comparison"].startswith("not run"))
    assert table["batch_size"]["tokens_per_second_off"] > 0
    assert "chunked_prefill" in table
    # the dry run's 4 concurrent prompts (under 128 tokens with their outputs: one CPU cache block each) fit
    # the probe's KV cache of max_model_len / 128 + 1 = 5 blocks: vLLM never preempts, so the probe is
    # reported as not run, with vLLM's count as the reason, never as a comparison that passed
    assert "preemption" not in table
    assert "no preemption" in table["probe preemption"]["comparison"]
    assert any("vllm" in line for line in summary["machine"]["packages"])
    assert "| factor | comparison |" in (out / "summary.md").read_text()


def test_gpu_validation_script_reports_a_machine_without_vllm(tmp_path):
    """Where vLLM (or evalgate) is missing, the script still says what the machine has, and exits 3."""
    out = tmp_path / "out"
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_validate.py"), "--out", str(out),
                           "--python", str(bare / "bin" / "python")], capture_output=True, text=True, timeout=300)
    summary = json.loads((out / "summary.json").read_text())
    assert proc.returncode == 3 and summary["exit"] == 3
    assert "gpus" in summary["machine"] and "packages" in summary["machine"]
    assert any("not importable" in p for p in summary["problems"])
    assert "GPUs:" in (out / "summary.md").read_text()
