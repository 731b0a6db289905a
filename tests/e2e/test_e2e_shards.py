"""Sharding end to end: n shard jobs write to one store (SQLite and PostgreSQL), `--merge` joins them,
and the merged verdict equals the verdict of one unsharded run. Sharding is evalgate's own plumbing
(selection, store, merge, verdicts): it runs on the fake test engine (evalgate/engines/fake.py)."""

from __future__ import annotations

import shutil

import pytest
from helpers import database_url, db_baselines, db_query, read_json, write_suite
from test_e2e_gate import GREEN_PROMPTS

pytestmark = pytest.mark.e2e


def test_two_shards_merge_to_the_unsharded_verdict(cli, tmp_path, tiny_model, store_url):
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    prompts = GREEN_PROMPTS[:12]
    suite = write_suite(tmp_path / "ws", model, prompts, concurrency=(1, 4), shuffles=0, database=store_url,
                        kind="fake")
    db = database_url(suite)

    # a sharded baseline: neither shard alone is promoted; the merge is
    cli("baseline", "create", suite, "--shard", "1/2", "--group", "b1", check=0)
    cli("baseline", "create", suite, "--shard", "2/2", "--group", "b1", check=0)
    assert db_baselines(db) == []
    cli("baseline", "create", suite, "--merge", "--group", "b1", "--json-report", tmp_path / "b.json", check=0)
    merged_baseline = read_json(tmp_path / "b.json")
    assert merged_baseline["promoted"] is True and merged_baseline["counts"]["stable"] == len(prompts)
    assert db_baselines(db) == [("test", merged_baseline["run_id"])]

    # new weights, then the same check sharded and unsharded
    cli("build-model", model, "--seed", "1", check=0)
    whole = cli("check", suite, "--json-report", tmp_path / "whole.json")
    parts = [cli("check", suite, "--shard", f"{i}/2", "--group", "c1", "--json-report", tmp_path / f"s{i}.json")
             for i in (1, 2)]
    shard_reports = [read_json(tmp_path / f"s{i}.json") for i in (1, 2)]
    assert sum(r["counts"]["explained_change"] + r["counts"]["stable"] for r in shard_reports) == len(prompts)
    assert all(r["counts"]["missing"] == 0 for r in shard_reports)  # other shards' keys are not "missing"
    merged = cli("check", suite, "--merge", "--group", "c1", "--json-report", tmp_path / "merged.json")
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
    cli("check", suite, "--shard", "1/3", "--group", "c2", check=0)
    refused = cli("check", suite, "--merge", "--group", "c2", check=3)
    assert "missing shards 2/3, 3/3" in refused.stderr
    cli("check", suite, "--shard", "1/2", check=2)  # --shard without --group
