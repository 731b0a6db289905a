"""Across hardware on the fake engine (plumbing): a baseline recorded on this machine judges a check run under
an instruction-set cap (`ONEDNN_MAX_CPU_ISA`: another hardware class on any machine), with cross-hardware
outputs planted per request (engines/fake.py `fake_hardware_*`). What real vLLM does across classes is
tested against plain vLLM in tests/e2e/test_e2e_hardware.py."""

from __future__ import annotations

import json

import pytest
from helpers import database_url, db_query, read_json, write_suite

PROMPTS = [f"Question {i}: what is the colour of the river number {i}?" for i in range(6)]
OTHER_CLASS = ("ONEDNN_MAX_CPU_ISA", "SSE41")  # a kernel dispatch cap: another hardware class anywhere


def suite_with(tmp_path, fake_model, planted: str, gate: str = "", name: str = "ws", **kwargs):
    suite = write_suite(tmp_path / name, fake_model, PROMPTS, concurrency=(1, 3), shuffles=0, kind="fake",
                        max_tokens=8, extra_engine=planted, **kwargs)
    if gate:
        suite.write_text(suite.read_text(encoding="utf-8") + f"\n[gate]\n{gate}\n", encoding="utf-8")
    return suite


def test_drift_and_a_near_tie_pass_across_hardware_then_adoption_judges_like_with_like(
        inline_cli, tmp_path, fake_model, monkeypatch, store_url):
    suite = suite_with(tmp_path, fake_model, 'fake_hardware_drift = ["p000"]\nfake_hardware_near_tie = ["p001"]',
                       database=store_url)
    inline_cli("baseline", "create", suite, check=0)
    db = database_url(suite)
    # the baseline rescored its own tokens, stored with it (store/loaded.py OWN_RESCORING), every request once
    assert db_query(db, "select pass_index, count(distinct request_key), min(finish_reason) from outputs "
                        "where pass_index < 0 group by pass_index") == [(-1, len(PROMPTS), "scored")]

    monkeypatch.setenv(*OTHER_CLASS)
    proc = inline_cli("check", suite, "--json-report", tmp_path / "c.json", "--junit", tmp_path / "c.xml", check=0)
    # both rescorings are phases of the run's progress, after its three passes of 6: the run ends at 30/30
    told = [line.rsplit(": ", 1)[0] for line in proc.stderr.splitlines() if " requests" in line and "; run " in line]
    assert list(dict.fromkeys(told))[3:] == ["rescoring the baseline's tokens", "rescoring this run's tokens"]
    assert proc.stderr.count(": 6/6 requests") == 5 and proc.stderr.rstrip().count("; run 30/30") == 1
    report = read_json(tmp_path / "c.json")
    section = report["hardware"]
    assert section["counts"] == {"identical": 4, "drift": 1, "near_tie": 1, "confident": 0}
    assert section["compared"] == 6 and section["mode"] == "judge"
    assert section["envelope"]["max"] == pytest.approx(1e-6, rel=1e-3)  # p000's rescorings, 1e-6 apart
    assert section["envelope"]["requests"] == 6
    by_key = {r["key"]: r for r in report["requests"]}
    assert set(by_key) == {"p000", "p001"}
    assert (by_key["p000"]["verdict"], by_key["p000"]["across"], by_key["p000"]["components"]) == (
        "explained_change", "drift", ["hardware"])
    assert (by_key["p001"]["verdict"], by_key["p001"]["across"]) == ("explained_change", "near_tie")
    (flip,) = section["flips"]
    assert flip["key"] == "p001" and flip["class"] == "near_tie" and flip["gap"] == 0.0
    assert flip["baseline_token"]["id"] != flip["here_token"]["id"] and flip["position"] == 4
    assert "4 of 6 identical" in proc.stdout and "near tie at token 4" in proc.stdout
    assert 'name="across_near_tie" value="1"' in (tmp_path / "c.xml").read_text(encoding="utf-8")
    inline_cli("report", "2", "--suite", suite, "--html", tmp_path / "c.html", check=0)
    page = (tmp_path / "c.html").read_text(encoding="utf-8")
    assert "<h2>Across hardware</h2>" in page and "4 of 6 identical" in page
    assert "<td>near tie</td>" in page and "<td>drift</td>" in page  # the class column of Differing requests
    # the check rescored the baseline's tokens here (-2), and its own (-1): those that equal the baseline's
    # are the same rescoring (one payload), the flipped one is new
    rescored = db_query(db, "select pass_index, request_key, payload_hash from outputs where run_id = 2 and "
                            "pass_index < 0 order by pass_index, request_key")
    theirs = {key: h for p, key, h in rescored if p == -2}
    mine = {key: h for p, key, h in rescored if p == -1}
    assert set(theirs) == set(mine) == {f"p{i:03d}" for i in range(6)}
    assert [key for key in mine if mine[key] != theirs[key]] == ["p001"]

    proc = inline_cli("baseline", "adopt", "2", "--suite", suite, check=0)
    assert "adopted by proof against run 1" in proc.stdout
    listed = inline_cli("baseline", "list", "--suite", suite, check=0).stdout
    assert "adopted from run 1" in listed and "recorded on this class" in listed
    receipts = [json.loads(r) if isinstance(r, str) else r for (r,) in db_query(
        db, "select receipt from baselines order by run_id")]
    assert receipts[0] is None and receipts[1]["adopted_from"] == 1 and receipts[1]["rescored"] is True
    assert receipts[1]["counts"] == {"identical": 4, "drift": 1, "near_tie": 1, "confident": 0}
    # the adoption is recorded on the check's stored report, read back whole
    stored = json.loads(inline_cli("runs", "show", "2", "--suite", suite, "--json", check=0).stdout)["report"]
    assert stored["hardware"]["adopted"] is True and stored["promoted"] is True
    assert [u["action"] for u in stored["updates"]] == ["adopted"] and stored["counts"] == report["counts"]
    assert "adopted 20" in inline_cli("runs", "show", "2", "--suite", suite, check=0).stdout
    # now this class has its own baseline: judged like with like, bit for bit, no cross-hardware section
    inline_cli("check", suite, "--json-report", tmp_path / "again.json", check=0)
    again = read_json(tmp_path / "again.json")
    assert again["baseline_run_id"] == 2 and again["hardware"] is None and again["counts"]["stable"] == 6


def test_a_check_across_hardware_judged_a_window_at_a_time_is_judged_as_one_read_whole(
        inline_cli, tmp_path, fake_model, monkeypatch):
    """The cross-hardware section (counts, flips, the envelope over every request) adds up over windows of
    one request to the section of both runs and both rescorings read whole."""
    from evalgate.judgement import judging
    from evalgate.store import open_store

    suite = suite_with(tmp_path, fake_model, 'fake_hardware_drift = ["p000"]\nfake_hardware_near_tie = ["p001"]')
    inline_cli("baseline", "create", suite, check=0)
    monkeypatch.setenv(*OTHER_CLASS)
    inline_cli("check", suite, check=0)
    store = open_store(database_url(suite))
    whole = judging.judge_run(store.load(2), store.load(1), judging.Judging(), store)
    monkeypatch.setattr(judging, "WINDOW", 1)
    windowed = judging.judge_stored(store, 2, 1)
    assert windowed.to_dict() == whole.to_dict()
    assert windowed.hardware.counts == {"identical": 4, "drift": 1, "near_tie": 1, "confident": 0}
    assert windowed.hardware.envelope["requests"] == 6 and len(windowed.hardware.flips) == 1


def test_a_check_across_hardware_reads_the_baseline_by_windows_and_its_own_rescoring_reuses_the_baselines(
        inline_cli, tmp_path, fake_model, monkeypatch):
    """A check on another class rescores the baseline's first-pass tokens read a window of requests at a time
    (a leaderboard-sized baseline is never held whole), then its own: where it chose the baseline's tokens, that
    rescoring is reused, read back from the store (never held either). One engine call per request for the
    baseline's tokens, and one more for the one request whose tokens moved here (the near tie)."""
    from evalgate.engines.fake import FakeEngine
    from evalgate.execution import rescore

    suite = suite_with(tmp_path, fake_model, 'fake_hardware_drift = ["p000"]\nfake_hardware_near_tie = ["p001"]')
    inline_cli("baseline", "create", suite, check=0)
    monkeypatch.setenv(*OTHER_CLASS)
    monkeypatch.setattr(rescore, "WINDOW", 4)  # 6 requests: a window of 4, then one of 2
    scored, generate = [], FakeEngine.generate

    def counted(self, prompts, cache_salt=None):
        scored.extend(p.key for p in prompts if p.location == "rescoring")
        return generate(self, prompts, cache_salt)

    monkeypatch.setattr(FakeEngine, "generate", counted)
    inline_cli("check", suite, check=0)
    assert sorted(scored) == sorted([f"p{i:03d}" for i in range(6)] + ["p001"])
    rows = db_query(database_url(suite), "select request_key, pass_index, payload_hash from outputs "
                                         "where run_id = 2 and pass_index < 0")
    by_pass = {index: {key: payload for key, i, payload in rows if i == index} for index in (-1, -2)}
    assert set(by_pass[-1]) == set(by_pass[-2]) == {f"p{i:03d}" for i in range(6)}
    assert [key for key in sorted(by_pass[-1]) if by_pass[-1][key] != by_pass[-2][key]] == ["p001"]


def test_check_adopt_returns_and_stores_the_adopted_report(inline_cli, tmp_path, fake_model, monkeypatch):
    """`check --adopt` with no confident flip: the check becomes its class's baseline, and the report it writes
    is the stored one, adoption included (the same bytes `evalgate report` reads back)."""
    suite = suite_with(tmp_path, fake_model, 'fake_hardware_drift = ["p000"]')
    inline_cli("baseline", "create", suite, check=0)
    monkeypatch.setenv(*OTHER_CLASS)
    inline_cli("check", suite, "--adopt", "--json-report", tmp_path / "c.json", check=0)
    written = read_json(tmp_path / "c.json")
    assert written["hardware"]["adopted"] is True and [u["action"] for u in written["updates"]] == ["adopted"]
    stored = json.loads(inline_cli("runs", "show", str(written["run_id"]), "--suite", suite, "--json",
                                   check=0).stdout)["report"]
    assert stored == written
    assert db_query(database_url(suite), "select run_id from baselines order by run_id") == [(1,), (2,)]


def test_a_confident_flip_fails_and_is_never_adopted(inline_cli, tmp_path, fake_model, monkeypatch):
    suite = suite_with(tmp_path, fake_model, 'fake_hardware_confident = ["p002"]')
    inline_cli("baseline", "create", suite, check=0)
    monkeypatch.setenv(*OTHER_CLASS)
    proc = inline_cli("check", suite, "--adopt", "--json-report", tmp_path / "c.json", check=1)
    report = read_json(tmp_path / "c.json")
    (bad,) = report["requests"]
    assert (bad["key"], bad["verdict"], bad["across"], bad["components"]) == ("p002", "silent_regression", "confident", [])
    (flip,) = report["hardware"]["flips"]
    assert flip["gap"] == pytest.approx(3.0)  # the baseline's token, three places below this class's top
    assert "not rounding" in proc.stdout and report["hardware"]["adopted"] is False
    refused = inline_cli("baseline", "adopt", str(report["run_id"]), "--suite", suite, check=2)
    assert "confident flip" in refused.stderr
    assert db_query(database_url(suite), "select count(*) from baselines") == [(1,)]


def test_exact_fails_on_drift_and_refuse_keeps_exit_4(inline_cli, tmp_path, fake_model, monkeypatch):
    exact = suite_with(tmp_path, fake_model, 'fake_hardware_drift = ["p000"]', 'other_hardware = "exact"', "exact")
    refuse = suite_with(tmp_path, fake_model, 'fake_hardware_drift = ["p000"]', 'other_hardware = "refuse"', "refuse")
    for suite in (exact, refuse):
        inline_cli("baseline", "create", suite, check=0)
    monkeypatch.setenv(*OTHER_CLASS)
    inline_cli("check", exact, "--json-report", tmp_path / "e.json", check=1)
    (drift,) = read_json(tmp_path / "e.json")["requests"]
    assert (drift["verdict"], drift["across"]) == ("silent_regression", "drift")
    proc = inline_cli("check", refuse, check=4)
    assert "refuse" in proc.stderr and "1 other hardware class" in proc.stderr
    # --against names the other class's baseline all the same
    inline_cli("check", refuse, "--against", "1", check=0)


def test_against_names_a_baseline_and_bad_values_are_exit_2(inline_cli, tmp_path, fake_model):
    suite = suite_with(tmp_path, fake_model, "", 'tie_epsilon = 0.5\ndrift_cap = 1')
    inline_cli("baseline", "create", suite, check=0)
    assert "--against 99" in inline_cli("check", suite, "--against", "99", check=2).stderr
    inline_cli("check", suite, "--against", "1", "--json-report", tmp_path / "c.json", check=0)
    assert read_json(tmp_path / "c.json")["gate"]["tie_epsilon"] == 0.5
    for gate, field in (('other_hardware = "maybe"', "gate.other_hardware"), ("drift_cap = -1", "gate.drift_cap"),
                        ('tie_epsilon = "x"', "gate.tie_epsilon")):
        bad = suite_with(tmp_path, fake_model, "", gate, f"bad-{field}")
        assert field in inline_cli("check", bad, check=2).stderr


def test_shards_on_two_hardware_classes_merge_into_one_verdict_per_class(inline_cli, tmp_path, fake_model, monkeypatch):
    suite = suite_with(tmp_path, fake_model, 'fake_hardware_drift = ["p000", "p004"]\nfake_hardware_near_tie = ["p001"]')
    inline_cli("baseline", "create", suite, check=0)
    inline_cli("check", suite, "--shard", "1/2", "--group", "g", check=0)  # this class: its own baseline
    with monkeypatch.context() as patched:
        patched.setenv(*OTHER_CLASS)  # the other job's machine: judged against this class's baseline
        inline_cli("check", suite, "--shard", "2/2", "--group", "g", "--json-report", tmp_path / "s2.json", check=0)
    shard = read_json(tmp_path / "s2.json")
    assert shard["hardware"]["compared"] == shard["counts"]["stable"] + shard["counts"]["explained_change"] < 6
    proc = inline_cli("check", suite, "--merge", "--group", "g", "--json-report", tmp_path / "m.json", check=0)
    merged = read_json(tmp_path / "m.json")
    assert merged["counts"]["missing"] == 0 and sum(merged["counts"].values()) == 6
    assert merged["prompts"] == {"compared": 6, "equal": 6}  # every shard's requests, against the one baseline
    own, other = sorted(merged["classes"], key=lambda c: c["hardware"] is not None)
    assert own["hardware"] is None and own["baseline_run_id"] == 1 and own["status"] == "pass"
    assert other["hardware"]["counts"] == shard["hardware"]["counts"] and other["baseline_run_id"] == 1
    assert sum(own["counts"].values()) + sum(other["counts"].values()) == 6
    assert "across hardware against baseline run 1" in proc.stdout and "against its own class's baseline run 1" in proc.stdout
    # the other class's explained differences are exactly the planted ones in its shard
    planted = {"p000": "drift", "p001": "near_tie", "p004": "drift"}
    across = {r["key"]: r["across"] for r in merged["requests"]}
    assert across and all(planted[key] == cls for key, cls in across.items())


def test_a_request_under_an_adapter_of_the_output_head_is_judged_without_rescoring(inline_cli, tmp_path, fake_model,
                                                                                   monkeypatch):
    """vLLM leaves an adapter's lm_head (and embedding) delta out of prompt_logprobs (vllm#51594): a rescoring
    under such an adapter is the base model's. Across hardware its requests are judged on their decode logprobs
    alone (a flip is confident, the report says why), never on that rescoring; a request under an adapter of other
    modules is judged as before."""
    ws = tmp_path / "ws"
    for name, modules in (("head", ["q_proj", "lm_head"]), ("attn", ["q_proj", "v_proj"])):
        (ws / name).mkdir(parents=True)
        (ws / name / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8, "target_modules": modules}))
        (ws / name / "adapter_model.safetensors").write_bytes(name.encode())
    lines = [{"id": f"p{i:03d}", "prompt": p} for i, p in enumerate(PROMPTS)]
    lines[1]["adapter"], lines[2]["adapter"] = "head", "attn"
    suite = write_suite(ws, fake_model, lines, concurrency=(1, 3), shuffles=0, kind="fake", max_tokens=8,
                        extra_engine='fake_hardware_near_tie = ["p001", "p002"]')
    suite.write_text(suite.read_text(encoding="utf-8") + '\n[adapters]\nhead = "head"\nattn = "attn"\n', encoding="utf-8")
    inline_cli("baseline", "create", suite, check=0)

    monkeypatch.setenv(*OTHER_CLASS)
    proc = inline_cli("check", suite, "--json-report", tmp_path / "c.json", check=1)
    section = read_json(tmp_path / "c.json")["hardware"]
    assert {f["key"]: f["class"] for f in section["flips"]} == {"p001": "confident", "p002": "near_tie"}, proc.stdout
    assert any("adapter 'head'" in note and "lm_head" in note and "vllm#51594" in note for note in section["notes"])
    assert section["envelope"]["requests"] == len(PROMPTS) - 1  # its rescorings measure nothing of the hardware
