"""`evalgate bisect config` end to end: real vLLM CPU engines, real runs that differ in several settings of
which exactly one changes outputs (dtype float32 -> bfloat16 on the tiny model; the others: seed, max_num_seqs
and three harmless VLLM_* variables). Six settings, the fewest for which ddmin always needs fewer engine
runs than trying each setting alone (at most 5 trials + the reference, against 1 + 6): each trial is an
engine start."""

from __future__ import annotations

import pytest
from helpers import CLI, database_url, db_query, read_json, write_suite

pytestmark = pytest.mark.e2e

PROMPTS = ["The quick brown fox", "Once upon a time", "Numbers are", "The capital of", "Write about the sea"]
HARMLESS_ENV = {"VLLM_EVALGATE_TEST_A": "1", "VLLM_EVALGATE_TEST_B": "1", "VLLM_EVALGATE_TEST_C": "1"}


def test_config_bisect_names_the_one_setting_that_changes_outputs(cli_env, tmp_path, tiny_model):
    suite = write_suite(tmp_path / "ws", tiny_model, PROMPTS, dtype="float32", max_tokens=8, concurrency=(1,),
                        shuffles=0, name="cfg")
    db = database_url(suite)
    CLI(cli_env, tmp_path)("baseline", "create", suite, check=0)
    text = suite.read_text().replace('dtype = "float32"', 'dtype = "bfloat16"').replace("seed = 0", "seed = 1\nmax_num_seqs = 64")
    suite.write_text(text)
    changed_env = dict(cli_env, **HARMLESS_ENV)
    CLI(changed_env, tmp_path)("check", suite, check=0)  # an explained change: engine and env differ
    (run_a, _), (run_b, _) = db_query(db, "select id, kind from runs order by id")

    cli = CLI(cli_env, tmp_path)
    proc = cli("bisect", "config", run_a, run_b, "--db", db, "--json-report", tmp_path / "cfg.json", check=0)
    doc = read_json(tmp_path / "cfg.json")
    assert doc["status"] == "found" and doc["proven_minimal"] is True
    assert [(c["kind"], c["name"], c["a"], c["b"]) for c in doc["culprits"]] == [("engine", "dtype", "float32", "bfloat16")]
    assert len(doc["settings"]) == 6 and doc["keys"] == [f"p{i:03d}" for i in range(len(PROMPTS))]
    assert "culprit (a minimal set):\n  engine dtype: 'float32' -> 'bfloat16'" in proc.stdout
    assert "every other setting together changes nothing" in proc.stdout
    assert f"A's configuration reproduces run {run_a}'s outputs on 5/5 requests" in proc.stdout
    assert "[trial 1/~" in proc.stderr  # progress, one line per trial
    assert doc["engine_runs"] < doc["naive_engine_runs"], doc

    # every trial is stored with its run (kind `bisect`, complete, never a baseline), readable afterwards
    trials = db_query(db, "select t.outcome, r.kind, r.status from bisect_trials t join runs r on r.id = t.run_id "
                          "where t.session_id = :s order by t.step", s=doc["bisect"])
    assert len(trials) == doc["engine_runs"] and trials[0][0] == "reference"
    assert {kind for _, kind, _ in trials} == {"bisect"} and {status for _, _, status in trials} == {"complete"}
    assert db_query(db, "select status from bisect_sessions where id = :s", s=doc["bisect"]) == [("complete",)]
    shown = cli("bisect", "show", doc["bisect"], "--db", db, "--json", check=0)
    assert '"culprits"' in shown.stdout and shown.stdout.count('"outcome"') == len(trials)
    assert db_query(db, "select count(*) from baselines") == [(1,)]  # trials never move the baseline


def test_config_bisect_refuses_runs_without_a_setting_difference(cli, tmp_path, tiny_model):
    # a refusal before any trial: evalgate's own checks, on the fake test engine
    suite = write_suite(tmp_path / "ws", tiny_model, PROMPTS[:2], max_tokens=4, concurrency=(1,), shuffles=0,
                        kind="fake")
    cli("baseline", "create", suite, check=0)
    proc = cli("bisect", "config", "1", "1", "--db", database_url(suite), check=2)
    assert "differ in no setting that can be toggled" in proc.stderr
    assert cli("bisect", "config", "1", "7", "--db", database_url(suite), check=2).stderr.count("run 7 does not exist") == 1
