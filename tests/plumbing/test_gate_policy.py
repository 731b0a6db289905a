"""`[gate]`: the judging policy on the fake test engine (plumbing). A token flip fails at either level, the
level is recorded with the run and shown in every report, it changes no fingerprint, and bad values are
exit 2 naming the field. Bits-only drift passing under `fail_on = "tokens"` is shown on real vLLM
(test_e2e_gate.py), since only a real engine drifts in bits alone."""

from __future__ import annotations

import json

from helpers import database_url, db_query, read_json, write_suite

PROMPTS = [f"Question {i}: what is the colour of the river number {i}?" for i in range(6)]


def fake_suite(tmp_path, fake_model, gate: str = ""):
    suite = write_suite(tmp_path / "ws", fake_model, PROMPTS, concurrency=(1, 6), shuffles=0, kind="fake", max_tokens=8,
                        extra_engine='fake_vary_with_batch = ["p001"]')
    if gate:
        suite.write_text(suite.read_text(encoding="utf-8") + f"\n[gate]\n{gate}\n", encoding="utf-8")
    return suite


def test_a_token_flip_fails_at_the_tokens_level_and_the_level_is_no_identity(inline_cli, tmp_path, fake_model):
    suite = fake_suite(tmp_path, fake_model, 'fail_on = "tokens"\nnear_tie_margin = 0.5')
    proc = inline_cli("baseline", "create", suite, "--json-report", tmp_path / "t.json", "--junit", tmp_path / "j.xml", check=1)
    report = read_json(tmp_path / "t.json")
    assert report["gate"] == {"fail_on": "tokens", "near_tie_margin": 0.5, "other_hardware": "judge",
                              "tie_epsilon": None, "drift_cap": None, "metric_alpha": 0.05, "fail_on_metric": None}
    (flip,) = report["requests"]
    # the fake engine's top-1 and top-2 lie 1.0 nats apart: over the 0.5 margin, a confident flip
    assert flip["key"] == "p001" and flip["bits_only"] is False and flip["flip"] == "confident"
    assert flip["divergence"]["margin"] == 1.0
    assert report["differences"]["token_flips"][flip["flip"]] == 1 and report["differences"]["drift"] == 0
    assert "gate: fail on tokens" in proc.stdout and "confident flip" in proc.stdout
    junit = (tmp_path / "j.xml").read_text(encoding="utf-8")
    assert 'name="fail_on" value="tokens"' in junit
    # the same run judged on bits: the same fingerprint, the level recorded with each run
    inline_cli("baseline", "create", suite, "--fail-on", "bits", "--json-report", tmp_path / "b.json", check=1)
    assert read_json(tmp_path / "b.json")["gate"]["fail_on"] == "bits"
    db = database_url(suite)
    rows = db_query(db, "select fingerprint_hash, schedule from runs order by id")
    assert rows[0][0] == rows[1][0]
    gates = [(json.loads(s) if isinstance(s, str) else s)["gate"]["fail_on"] for _, s in rows]
    assert gates == ["tokens", "bits"]


def test_bad_gate_values_are_exit_2_naming_the_field(inline_cli, tmp_path, fake_model):
    suite = fake_suite(tmp_path, fake_model, 'fail_on = "words"')
    proc = inline_cli("baseline", "create", suite, check=2)
    assert "gate.fail_on" in proc.stderr and "tokens" in proc.stderr
    assert not (tmp_path / "ws" / "evalgate.sqlite").exists()
    suite = fake_suite(tmp_path, fake_model, "near_tie_margin = -1")
    assert "gate.near_tie_margin" in inline_cli("baseline", "create", suite, check=2).stderr
    suite = fake_suite(tmp_path, fake_model)
    assert "--fail-on" in inline_cli("baseline", "create", suite, "--fail-on", "maybe", check=2).stderr
    assert not (tmp_path / "ws" / "evalgate.sqlite").exists()
