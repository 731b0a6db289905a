"""The gate's own plumbing through the CLI, on the fake engine in this process: the green journey on each
store backend (SQLite and PostgreSQL: the store is what differs, not the engine), an explained change
when the weights at the same path change, and shards merged into one verdict. Each failure verdict is
produced on real vLLM in tests/e2e/test_e2e_gate.py."""

from __future__ import annotations

import json
import shutil

from helpers import GREEN_PROMPTS, bare_model, database_url, db_baselines, db_query, green_path, read_json, write_suite


def test_green_path_on_each_store_backend(inline_cli, tmp_path, fake_model, store_url, store_backend):
    green_path(inline_cli, tmp_path, fake_model, store_url, store_backend, "fake")


def test_explained_change_after_weight_swap(inline_cli, tmp_path, fake_model):
    """The weights' content hash is evalgate's (vLLM's own fingerprint would not notice the swap), so the
    fake test engine, whose outputs follow the weights, shows it as well as vLLM and in a fraction of the time."""
    model = tmp_path / "model"
    shutil.copytree(fake_model, model)
    suite = write_suite(tmp_path / "ws", model, GREEN_PROMPTS[:8], concurrency=(1, 8), shuffles=0, kind="fake")
    inline_cli("baseline", "create", suite, check=0)
    # same path, other weights: vLLM's own fingerprint would not notice; evalgate's content hash does
    bare_model(model, seed=1)
    out = inline_cli("check", suite, "--json-report", tmp_path / "check.json", check=0)
    report = read_json(tmp_path / "check.json")
    assert report["counts"]["silent_regression"] == 0
    assert report["counts"]["explained_change"] >= 1
    assert report["changed_components"] == ["model"]
    changed = [r for r in report["requests"] if r["verdict"] == "explained_change"]
    assert all(r["components"] == ["model"] for r in changed)
    first = changed[0]["divergence"]
    assert first["reference_id"] != first["other_id"] and first["margin"] is not None
    assert "model.safetensors" in report["fingerprint_changes"]["model"]
    assert "explained_change" in out.stdout
    inline_cli("check", suite, "--strict", check=1)


def test_a_change_in_the_suite_itself_is_said_beside_the_unchanged_stack(inline_cli, tmp_path, fake_model):
    """[sampling] or a prompt's text changed and nothing else: the stack's identity line says unchanged, and the
    next line says which differing requests the suite itself explains, in the terminal, the job summary and the
    HTML report alike (the identity line alone read as if nothing had changed)."""
    suite = write_suite(tmp_path / "ws", fake_model, GREEN_PROMPTS[:4], concurrency=(1,), shuffles=0, kind="fake",
                        max_tokens=4)
    inline_cli("baseline", "create", suite, check=0)
    suite.write_text(suite.read_text().replace("max_tokens = 4", "max_tokens = 5"))
    summary = tmp_path / "summary.md"
    inline_cli.env.update({"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)})
    checked = inline_cli("check", suite, check=0)
    line = "changed in the suite itself: 4 differing requests (the request's own text, sampling or lm-eval task"
    assert "identity unchanged since baseline run 1" in checked.stdout and line in checked.stdout
    assert line in summary.read_text()
    inline_cli("report", "--latest", "--html", tmp_path / "r.html", "--suite", suite, check=0)
    assert line.replace("'", "&#39;") in (tmp_path / "r.html").read_text()


def test_a_one_pass_schedule_says_it_judged_no_batch_variance(inline_cli, tmp_path, fake_model):
    """One pass compares nothing: its `stable` says nothing of batch variance, and the report says so (it read
    as a clean bill); with a second pass the line is gone."""
    suite = write_suite(tmp_path / "ws", fake_model, GREEN_PROMPTS[:2], concurrency=(1,), shuffles=0, kind="fake",
                        hot_pass=False)
    created = inline_cli("baseline", "create", suite, check=0)
    assert "passes compared: none (the schedule ran one pass): batch variance was not judged" in created.stdout
    inline_cli("report", "1", "--html", tmp_path / "r.html", "--suite", suite, check=0)
    html = (tmp_path / "r.html").read_text()
    assert "passes compared: none" in html and '<table class="factors">' not in html  # no empty table of factors
    two = write_suite(tmp_path / "two", fake_model, GREEN_PROMPTS[:2], concurrency=(1, 2), shuffles=0, kind="fake",
                      hot_pass=False)
    assert "passes compared: none" not in inline_cli("baseline", "create", two, check=0).stdout


def test_two_shards_merge_to_the_unsharded_verdict(inline_cli, tmp_path, fake_model, store_url):
    model = tmp_path / "model"
    shutil.copytree(fake_model, model)
    prompts = GREEN_PROMPTS[:12]
    suite = write_suite(tmp_path / "ws", model, prompts, concurrency=(1, 4), shuffles=0, database=store_url,
                        kind="fake")
    db = database_url(suite)

    # a sharded baseline: neither shard alone is promoted; the merge is
    inline_cli("baseline", "create", suite, "--shard", "1/2", "--group", "b1", check=0)
    inline_cli("baseline", "create", suite, "--shard", "2/2", "--group", "b1", check=0)
    assert db_baselines(db) == []
    inline_cli("baseline", "create", suite, "--merge", "--group", "b1", "--json-report", tmp_path / "b.json", check=0)
    merged_baseline = read_json(tmp_path / "b.json")
    assert merged_baseline["promoted"] is True and merged_baseline["counts"]["stable"] == len(prompts)
    assert db_baselines(db) == [("test", merged_baseline["run_id"])]

    # new weights, then the same check sharded and unsharded
    bare_model(model, seed=1)
    whole = inline_cli("check", suite, "--json-report", tmp_path / "whole.json")
    parts = [inline_cli("check", suite, "--shard", f"{i}/2", "--group", "c1", "--json-report", tmp_path / f"s{i}.json")
             for i in (1, 2)]
    shard_reports = [read_json(tmp_path / f"s{i}.json") for i in (1, 2)]
    assert sum(r["counts"]["explained_change"] + r["counts"]["stable"] for r in shard_reports) == len(prompts)
    assert all(r["counts"]["missing"] == 0 for r in shard_reports)  # other shards' keys are not "missing"
    merged = inline_cli("check", suite, "--merge", "--group", "c1", "--json-report", tmp_path / "merged.json")
    whole_report, merged_report = read_json(tmp_path / "whole.json"), read_json(tmp_path / "merged.json")
    assert merged.returncode == whole.returncode == 0 and all(p.returncode == 0 for p in parts)
    assert merged_report["counts"] == whole_report["counts"]
    assert merged_report["changed_components"] == whole_report["changed_components"] == ["model"]
    def strip(report):
        return sorted((r["key"], r["verdict"], r["divergence"]["position"]) for r in report["requests"])
    assert strip(merged_report) == strip(whole_report)
    merged_run = merged_report["run_id"]
    passes = len(read_json(tmp_path / "whole.json")["factors"]) + 1  # every pass but pass 0 is a comparison
    assert db_query(db, f"select count(*) from outputs where run_id = {merged_run}") == [(len(prompts) * passes,)]

    # an incomplete group cannot be merged
    inline_cli("check", suite, "--shard", "1/3", "--group", "c2", check=0)
    refused = inline_cli("check", suite, "--merge", "--group", "c2", check=3)
    assert "missing shards 2/3, 3/3" in refused.stderr
    inline_cli("check", suite, "--shard", "1/2", check=2)  # --shard without --group


def test_a_merge_is_judged_under_its_own_fail_on(inline_cli, tmp_path, fake_model):
    """--fail-on on the merge command is the merged run's policy, recorded with it; never the first shard's."""
    suite = write_suite(tmp_path / "ws", fake_model, GREEN_PROMPTS[:4], concurrency=(1, 2), shuffles=0, kind="fake")
    for i in (1, 2):
        inline_cli("baseline", "create", suite, "--shard", f"{i}/2", "--group", "g", check=0)  # recorded on bits
    inline_cli("baseline", "create", suite, "--merge", "--group", "g", "--fail-on", "tokens",
               "--json-report", tmp_path / "m.json", check=0)
    merged = read_json(tmp_path / "m.json")
    assert merged["gate"]["fail_on"] == "tokens" and merged["differences"]["fail_on"] == "tokens"
    ((schedule, report),) = db_query(database_url(suite), "select schedule, report from runs where id = :r",
                                     r=merged["run_id"])
    stored, report = (json.loads(v) if isinstance(v, str) else v for v in (schedule, report))
    assert stored["gate"]["fail_on"] == "tokens" and report["gate"]["fail_on"] == "tokens"  # the report's own column


def test_off_a_terminal_each_pass_says_its_progress_in_plain_lines(cli, tmp_path, fake_model):
    """A CI log gets plain lines (no bar): each pass by its label with its requests done, then the baseline's
    rescoring (a phase as long as a pass: one prefill per request), and the run's, ending at each one's full
    count, once. A real process: the engine's child relays its progress over the queue."""
    suite = write_suite(tmp_path / "ws", fake_model, GREEN_PROMPTS[:8], concurrency=(1, 8), shuffles=0, kind="fake")
    err = cli("baseline", "create", suite, check=0).stderr
    # first the engine starting (minutes, for a real model), with where its output goes meanwhile
    log = tmp_path / "ws" / ".evalgate" / "logs"
    assert err.splitlines()[0].startswith(f"starting the fake engine (its output: {log}/baseline-")
    lines = [line for line in err.splitlines() if " requests" in line and "; run " in line]
    assert lines and all("\x1b" not in line and "━" not in line for line in lines)  # plain: no bar, no colour
    labels = list(dict.fromkeys(line.rsplit(": ", 1)[0] for line in lines))
    assert len(labels) == 4 and all(label.startswith(f"pass {i}: ") for i, label in enumerate(labels[:3]))
    assert labels[3] == "rescoring this run's tokens"
    assert all(sum(line.startswith(f"{label}: 8/8 requests") for line in lines) == 1 for label in labels)
    assert lines[-1].endswith("run 32/32")
    # a check rescores nothing on the baseline's hardware: its run ends with its last pass
    err = cli("check", suite, check=0).stderr
    lines = [line for line in err.splitlines() if " requests" in line and "; run " in line]
    assert "rescoring" not in err and lines[-1].startswith("pass 2: ") and lines[-1].endswith("run 24/24")


def test_a_pass_is_stored_as_it_runs_in_bounded_chunks_and_judged_as_if_whole(inline_cli, tmp_path, fake_model,
                                                                               monkeypatch):
    """No pass (nor the rescoring) is held whole: its outputs go to the store every STORE_EVERY; the run stores
    every output once and is judged as a pass stored at once is (the same payloads, deduplicated across chunks
    and passes)."""
    from evalgate.store import runs
    from evalgate.store.runs import RunStore

    sizes, add_outputs = [], RunStore.add_outputs
    monkeypatch.setattr(RunStore, "add_outputs", lambda self, run_id, outputs: (sizes.append(len(outputs)),
                                                                                add_outputs(self, run_id, outputs))[1])
    whole = write_suite(tmp_path / "whole", fake_model, GREEN_PROMPTS[:8], concurrency=(1, 8), shuffles=1, kind="fake")
    inline_cli("baseline", "create", whole, "--json-report", tmp_path / "whole.json", check=0)
    assert max(sizes) == 8  # at the default, a pass of 8 is one write
    sizes.clear()
    monkeypatch.setattr(runs, "STORE_EVERY", 3)
    chunked = write_suite(tmp_path / "chunked", fake_model, GREEN_PROMPTS[:8], concurrency=(1, 8), shuffles=1,
                          kind="fake")
    inline_cli("baseline", "create", chunked, "--json-report", tmp_path / "chunked.json", check=0)
    # the concurrency-1 passes (cold, hot): chunks of 3; a wave of 8 is one; then the rescoring, 3 at a time
    assert sizes[:6] == [3, 3, 2, 3, 3, 2] and set(sizes[6:-3]) == {8} and sizes[-3:] == [3, 3, 2]
    counts = read_json(tmp_path / "chunked.json")["counts"]
    assert counts == read_json(tmp_path / "whole.json")["counts"] and counts["stable"] == 8
    stored = db_query(database_url(chunked), "select count(*), count(distinct payload_hash) from outputs")[0]
    assert stored == db_query(database_url(whole), "select count(*), count(distinct payload_hash) from outputs")[0]
