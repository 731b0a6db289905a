"""Traffic as evidence on the fake test engine (plumbing): a trace replayed as the load, the converter,
bad traces, the cancel probe, and `evalgate fuzz` finding and shrinking a planted cancel-path fault.
What vLLM itself does under a replay is tested in tests/e2e/test_e2e_traffic.py."""

from __future__ import annotations

import json

import pytest
from helpers import database_url, db_query, read_json, write_suite

PROMPTS = [f"Question {i}: what follows the number {i}?" for i in range(4)]


def traced_suite(tmp_path, fake_model, trace_lines, *, engine="", concurrency=(1, 2), load=""):
    ws = tmp_path / "ws"
    suite = write_suite(ws, fake_model, PROMPTS, max_tokens=6, kind="fake", extra_engine=engine, concurrency=concurrency,
                        shuffles=0, hot_pass=False)
    (ws / "traffic.jsonl").write_text("".join(json.dumps(e) + "\n" for e in trace_lines))
    suite.write_text(suite.read_text() + f'\n[load]\ntrace = "traffic.jsonl"\n{load}')
    return suite


TRACE = [
    {"step": 0, "tokens": 40, "max_tokens": 8},
    {"step": 1, "tokens": 30, "prefix": {"of": "e1", "tokens": 20}, "max_tokens": 6, "cancel_after": {"tokens": 3}},
    {"step": 2, "gated": True},
    {"step": 3, "prompt": "a text prompt", "max_tokens": 4, "cancel_after": {"steps": 2}},
]


def test_a_trace_is_replayed_around_each_wave_and_what_it_did_is_recorded(inline_cli, tmp_path, fake_model):
    suite = traced_suite(tmp_path, fake_model, TRACE)
    inline_cli("baseline", "create", suite, check=0)
    [(schedule,)] = db_query(database_url(suite), "select schedule from runs")
    schedule = json.loads(schedule)
    assert schedule["load"]["trace"] == str(tmp_path / "ws" / "traffic.jsonl")
    loaded = [p for p in schedule["timings"]["passes"] if "load" in p]
    assert [p["concurrency"] for p in loaded] == [2]  # [load] applies to levels > 1, as the filler does
    load = loaded[0]["load"]
    # two waves of two requests, each inside its own replay: 3 events sent, 2 cancelled, 1 completed each
    assert (load["placement"], load["sent"], load["cancelled"], load["completed"]) == ("step", 6, 4, 2)
    assert load["trace"] == {"events": 3, "cancels": 2, "gated_markers": 1, "unit": "step"}
    arrivals = [a for wave in load["waves"] for a in wave["gated_arrivals"]]
    assert [(a["key"], a["step"]) for a in arrivals] == [("p000", 2), ("p001", 2), ("p002", 2), ("p003", 2)]
    assert [a["running"] for a in arrivals] == [2, 3, 2, 3]  # e1, e2 (and the first gated request) run at step 2
    # the trace's own requests are never stored; no prompt text of the trace is either
    assert db_query(database_url(suite), "select count(*) from outputs where pass_index = 1") == [(4,)]
    assert "a text prompt" not in json.dumps(schedule)


def test_a_replay_ends_when_the_gated_requests_finish(inline_cli, tmp_path, fake_model):
    trace = [{"step": 0, "tokens": 10, "max_tokens": 40}, {"step": 1, "gated": True}, {"step": 30, "tokens": 10, "max_tokens": 2}]
    suite = traced_suite(tmp_path, fake_model, trace)
    inline_cli("baseline", "create", suite, check=0)
    [(schedule,)] = db_query(database_url(suite), "select schedule from runs")
    [load] = [p["load"] for p in json.loads(schedule)["timings"]["passes"] if "load" in p]
    # the gated requests decode 6 tokens from step 1: at step 7 nothing later can change them
    assert (load["sent"], load["completed"], load["stopped"], load["unsent"]) == (2, 0, 2, 2)
    assert [w["steps"] for w in load["waves"]] == [7, 7]


def test_a_planted_cancel_fault_shows_only_where_the_trace_cancels_a_neighbour_mid_decode(inline_cli, tmp_path,
                                                                                          fake_model):
    no_cancel = [{k: v for k, v in e.items() if k != "cancel_after"} for e in TRACE]
    clean = traced_suite(tmp_path / "clean", fake_model, no_cancel, engine='fake_vary_with_cancel = ["p001"]')
    inline_cli("baseline", "create", clean, check=0)
    faulty = traced_suite(tmp_path / "faulty", fake_model, TRACE, engine='fake_vary_with_cancel = ["p001"]')
    report = tmp_path / "r.json"
    inline_cli("baseline", "create", faulty, "--json-report", report, check=1)
    assert [(r["key"], r["verdict"]) for r in read_json(report)["requests"] if r["verdict"] != "stable"] == [
        ("p001", "batch_variance")]


@pytest.mark.parametrize("line, field, fix", [
    ({"step": 5, "tokens": 10, "max_tokens": 4}, "is before line 2", "sort the trace"),
    ({"step": 9, "tokens": -3, "max_tokens": 4}, "`tokens` must be an integer >= 1, got -3", "whole number"),
    ({"step": 9, "tokens": 8, "max_tokens": 4, "cancel_after": {"tokens": 4}}, "`cancel_after.tokens` = 4 is after the end",
     "fewer than 4 tokens"),
    ({"step": 9, "tokens": 8, "max_tokens": 4, "arrival": 3}, "unknown key `arrival`", "allowed keys"),
    ({"step": 9, "tokens": 8}, "`max_tokens` is missing", "max_tokens"),
    ({"at": 9.0, "tokens": 8, "max_tokens": 4}, "`at` in a trace whose first event uses `step`", "seconds and steps"),
    ({"step": 9, "tokens": 8, "max_tokens": 4, "prefix": {"of": "nope", "tokens": 2}}, "`prefix.of` 'nope'", "earlier line"),
])
def test_a_bad_trace_is_refused_naming_its_line_and_field_and_nothing_is_stored(inline_cli, tmp_path, fake_model,
                                                                               line, field, fix):
    trace = [{"step": 0, "tokens": 10, "max_tokens": 4}, {"step": 6, "tokens": 10, "max_tokens": 4}, line]
    suite = traced_suite(tmp_path, fake_model, trace)
    for args in (("baseline", "create", suite), ("trace", "check", tmp_path / "ws" / "traffic.jsonl"),
                 ("fuzz", suite, "--max-trials", "3")):
        proc = inline_cli(*args, check=2)
        message = " ".join(proc.stderr.split())
        assert "traffic.jsonl:3:" in message and field in message and fix in message, message
    assert not (tmp_path / "ws" / "evalgate.sqlite").exists()


def test_a_trace_needs_an_engine_that_places_events_and_fuzz_needs_exact_placement(inline_cli, tmp_path, fake_model):
    ws = tmp_path / "ws"
    suite = write_suite(ws, fake_model, PROMPTS, kind="openai", concurrency=(1, 2))
    engine_lines = ("dtype", "max_model_len", "enforce_eager", "seed")  # vLLM's, not a server client's
    text = "\n".join(line for line in suite.read_text().splitlines() if not line.startswith(engine_lines))
    suite.write_text(text.replace('model = "', 'base_url = "http://127.0.0.1:9"\nserved_model = "m"\nmodel = "', 1))
    proc = inline_cli("fuzz", suite, check=2)
    assert "fuzz needs exact placement" in " ".join(proc.stderr.split()) and 'engine.kind = "vllm"' in proc.stderr
    suite = traced_suite(tmp_path / "f", fake_model, TRACE, load="filler = 4\n")
    proc = inline_cli("baseline", "create", suite, check=2)
    assert "`load.filler` is a filler setting, and `load.trace` replaces the filler" in " ".join(proc.stderr.split())


def test_a_log_of_your_traffic_becomes_a_trace_of_lengths_without_text(inline_cli, tmp_path):
    log = tmp_path / "traffic.csv"
    log.write_text("timestamp,prompt_tokens,output_tokens,prompt\n"
                   "2026-12-03T09:00:01.500Z,120,16,secret words\n"
                   "2026-12-03T09:00:00.250Z,80,8,other secret\n"
                   "2026-12-03T09:00:03Z,300,32,third\n")
    out = tmp_path / "trace.jsonl"
    proc = inline_cli("trace", "convert", log, "-o", out, check=0)
    assert "3 events over 2.75 s" in proc.stdout
    events = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(e["at"], e["tokens"], e["max_tokens"]) for e in events] == [(0.0, 80, 8), (1.25, 120, 16), (2.75, 300, 32)]
    assert "secret" not in out.read_text()
    inline_cli("trace", "check", out, check=0)
    jsonl = tmp_path / "log.jsonl"
    jsonl.write_text(json.dumps({"time": 10, "input_tokens": 5, "completion_tokens": 0}) + "\n")
    proc = inline_cli("trace", "convert", jsonl, "-o", tmp_path / "t2.jsonl", check=2)
    assert "log.jsonl:1: `output_tokens` must be a positive integer, got 0" in " ".join(proc.stderr.split())
    missing = inline_cli("trace", "convert", tmp_path / "nope.csv", "-o", tmp_path / "t3.jsonl", check=2)
    assert "nope.csv: log not found" in missing.stderr and not (tmp_path / "t3.jsonl").exists()
    # a spreadsheet's export where the comma is the decimal mark: `;` between the columns (read as one column before)
    semicolons = tmp_path / "export.csv"
    semicolons.write_text('ts;prompt_tokens;output_tokens;prompt\n1.5;120;16;"a; b"\n')
    proc = inline_cli("trace", "convert", semicolons, "-o", tmp_path / "t4.jsonl", check=0)
    assert "1 event over 0 s" in proc.stdout
    assert [json.loads(line)["tokens"] for line in (tmp_path / "t4.jsonl").read_text().splitlines()] == [120]


@pytest.mark.parametrize(("planted", "expected"), [
    ('fake_vary_with_cancel = ["p002"]', {"p002": ["cancel"]}),  # a cancel-path fault: only the abort differs
    ('fake_vary_with_batch = ["p002"]', {"p002": ["neighbours"]}),  # batch sharing alone: never the abort path
    ('fake_vary_with_cancel = ["p002"]\nfake_vary_with_batch = ["p002", "p003"]',
     {"p002": ["neighbours", "cancel"], "p003": ["neighbours"]}),  # both: both named
])
def test_the_cancel_probe_names_the_abort_path_only_against_its_control(inline_cli, tmp_path, fake_model, planted,
                                                                        expected):
    """The control runs the same neighbours finishing on the same steps; the treatment aborts them there. So
    the abort path is named only by treatment vs control, batch sharing only by control vs alone."""
    suite = write_suite(tmp_path / "ws", fake_model, PROMPTS, max_tokens=6, kind="fake", concurrency=(1,), shuffles=0,
                        hot_pass=False, extra_engine=planted, extra_schedule='probes = ["cancel"]')
    report = tmp_path / "r.json"
    proc = inline_cli("baseline", "create", suite, "--json-report", report, check=1)
    doc = read_json(report)
    found = {r["key"]: r["passes"]["factors"] for r in doc["requests"] if r["verdict"] == "batch_variance"}
    assert found == expected
    factors = {f["factor"]: f for f in doc["factors"]}
    assert factors["cancel"]["reference_pass"] == factors["neighbours"]["pass"]  # treatment against its control
    assert factors["neighbours"]["reference_pass"] == 0
    assert "aborted on the same steps" in factors["cancel"]["comparison"]
    assert "finish mid-decode (cancel probe's control)" in factors["neighbours"]["comparison"]
    out = " ".join(proc.stdout.split())
    assert ("abort path" in out) == any("cancel" in f for f in expected.values())  # the engine-bug remedy
    [(schedule,)] = db_query(database_url(suite), "select schedule from runs")
    control, treatment = [p for p in json.loads(schedule)["timings"]["passes"] if p["probe"] == "cancel"]
    assert (treatment["load"]["cancelled"], treatment["load"]["completed"]) == (4 * len(PROMPTS), 0)
    assert (control["load"]["cancelled"], control["load"]["completed"]) == (0, 4 * len(PROMPTS))
    # each neighbour was running on the same steps in both: the arrivals saw the same batch
    assert [w["gated_arrivals"] for w in control["load"]["waves"]] == [w["gated_arrivals"] for w in
                                                                       treatment["load"]["waves"]]


def test_fuzz_finds_a_planted_cancel_fault_shrinks_it_to_the_cancelled_neighbour_and_packs_a_repro(inline_cli, tmp_path,
                                                                                                   fake_model):
    suite = write_suite(tmp_path / "ws", fake_model, PROMPTS, max_tokens=8, kind="fake", concurrency=(1, 2),
                        extra_engine='fake_vary_with_cancel = ["p001"]')
    report = tmp_path / "f.json"
    proc = inline_cli("fuzz", suite, "--budget", "2m", "--max-trials", "50", "--json-report", report, check=1)
    doc = read_json(report)
    assert doc["status"] == "found" and doc["key"] == "p001" and doc["reproduced"] is True
    assert doc["search_trials"] <= 50 and "cancel" in doc["mutations"]
    assert doc["shrunk_events"] <= 2 and doc["proven_minimal"] is True
    shrunk = [json.loads(line) for line in doc["shrunk"].splitlines()]
    traffic = [e for e in shrunk if not e.get("gated")]
    assert any("cancel_after" in e for e in traffic)  # the planted fault needs a cancelled neighbour
    # tried once more with the neighbours finishing on the same steps: unchanged, so the abort path is named
    assert doc["cause"] == "cancel" and "the cancel is needed" in " ".join(proc.stdout.split())
    pack = tmp_path / "ws" / ".evalgate" / "fuzz" / str(doc["fuzz"])
    assert sorted(p.name for p in pack.iterdir()) == ["README.md", "engine.json", "outputs.json", "repro.py",
                                                      "request.json", "trace.jsonl"]
    assert (pack / "trace.jsonl").read_text() == doc["shrunk"]
    outputs = read_json(pack / "outputs.json")
    assert outputs["alone"] != outputs["in_trace"] and outputs["divergence"]["position"] == 4  # from the middle on
    assert "FOUND: request 'p001'" in proc.stdout and f"repro pack: {pack}" in " ".join(proc.stdout.split())
    # every trial is stored as it is decided: the search, the shrink and the fresh engine's verification
    trials = db_query(database_url(suite), "select label, outcome from bisect_trials order by step")
    assert len(trials) == doc["trials"] and trials[-1] == (trials[-1][0], "bad")
    assert trials[doc["search_trials"] - 1][1] == "bad" and all(o == "good" for _, o in trials[: doc["search_trials"] - 1])
    assert "verify in a fresh engine" in trials[-1][0]
    shown = inline_cli("bisect", "show", str(doc["fuzz"]), "--suite", suite, check=0)
    assert "fuzz" in shown.stdout


def test_fuzz_does_not_blame_a_cancel_that_batch_sharing_explains(inline_cli, tmp_path, fake_model):
    """A batch-size effect found in a trace whose one neighbour is cancelled: the same neighbour finishing on
    the same step changes the output too, so the report names sharing the batch, not the abort path."""
    suite = write_suite(tmp_path / "ws", fake_model, PROMPTS, max_tokens=8, kind="fake", concurrency=(1, 2),
                        extra_engine='fake_vary_with_batch = ["p001"]')
    seed = tmp_path / "seed.jsonl"
    seed.write_text(json.dumps({"step": 0, "tokens": 16, "max_tokens": 12, "cancel_after": {"steps": 3}}) + "\n"
                    + json.dumps({"step": 0, "gated": True}) + "\n")
    report = tmp_path / "f.json"
    proc = inline_cli("fuzz", suite, "--key", "p001", "--trace", seed, "--max-trials", "5", "--json-report", report,
                      check=1)
    doc = read_json(report)
    assert doc["status"] == "found" and doc["search_trials"] == 1 and doc["shrunk_events"] == 1
    assert doc["cause"] == "neighbours"
    out = " ".join(proc.stdout.split())
    assert "the cancel is not needed" in out and "abort path: report it" not in out


def test_fuzz_without_a_fault_reports_not_found_with_the_trial_count(inline_cli, tmp_path, fake_model):
    suite = write_suite(tmp_path / "ws", fake_model, PROMPTS, max_tokens=8, kind="fake", concurrency=(1, 2))
    report = tmp_path / "f.json"
    proc = inline_cli("fuzz", suite, "--max-trials", "20", "--json-report", report, check=0)  # as `check`: nothing found
    doc = read_json(report)
    assert (doc["status"], doc["search_trials"], doc["trials"]) == ("not_found", 20, 20)
    assert "NOT FOUND" in proc.stdout and "20 search trials" in proc.stdout and "--max-trials 20 reached" in proc.stdout
    assert db_query(database_url(suite), "select count(*), min(outcome), max(outcome) from bisect_trials") == [
        (20, "good", "good")]
    assert not (tmp_path / "ws" / ".evalgate" / "fuzz").exists()
    bad = inline_cli("fuzz", suite, "--budget", "soon", check=2)
    assert "--budget 'soon': not a duration" in bad.stderr


def test_fuzz_at_the_tokens_level_passes_over_drift_and_finds_a_planted_token_flip(inline_cli, tmp_path, fake_model):
    """`fuzz --fail-on tokens` (or `[gate] fail_on = "tokens"`): p000 drifts in logprob bits whenever it shares
    a step with anything (as every request does on a CPU without batch invariance), p001 flips tokens only when
    a neighbour is aborted. On bits the search stops at the first trial, on the drift; on tokens it passes
    over the drift, finds the cancel fault, says how much drift it passed, and its pack judges on tokens."""
    engine = 'fake_drift_with_batch = ["p000"]\nfake_vary_with_cancel = ["p001"]'
    suite = write_suite(tmp_path / "ws", fake_model, PROMPTS, max_tokens=8, kind="fake", concurrency=(1, 2),
                        extra_engine=engine)
    inline_cli("fuzz", suite, "--budget", "2m", "--max-trials", "50", "--json-report", tmp_path / "bits.json", check=1)
    bits = read_json(tmp_path / "bits.json")
    assert (bits["on"], bits["key"], bits["search_trials"]) == ("bits", "p000", 1)  # the drift, at once

    proc = inline_cli("fuzz", suite, "--fail-on", "tokens", "--budget", "2m", "--max-trials", "50",
                      "--json-report", tmp_path / "tokens.json", "--repro", tmp_path / "pack", check=1)
    doc = read_json(tmp_path / "tokens.json")
    assert (doc["on"], doc["status"], doc["key"], doc["reproduced"]) == ("tokens", "found", "p001", True)
    assert doc["search_trials"] > 1 and "cancel" in doc["mutations"]
    assert doc["drift_trials"] >= doc["search_trials"] - 1 and doc["drift_keys"] == ["p000"]
    out = " ".join(proc.stdout.split())
    assert "changes its tokens" in out and f"passed over: {doc['drift_trials']} trial(s) drifted" in out
    assert read_json(tmp_path / "pack" / "outputs.json")["on"] == "tokens"
    assert "A change is one in **tokens**" in (tmp_path / "pack" / "README.md").read_text()

    # the suite's own [gate] fail_on is honoured without the flag
    suite.write_text(suite.read_text(encoding="utf-8") + '\n[gate]\nfail_on = "tokens"\n', encoding="utf-8")
    inline_cli("fuzz", suite, "--budget", "2m", "--max-trials", "50", "--json-report", tmp_path / "gate.json", check=1)
    assert read_json(tmp_path / "gate.json")["key"] == "p001"
    inline_cli("fuzz", suite, "--fail-on", "words", check=2)
