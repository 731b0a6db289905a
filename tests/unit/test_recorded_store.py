"""Runs recorded and judged by evalgate at schema 0009, before outputs were arrays
(tests/data/recorded-0009.sqlite, written by tests/data/make_recorded_store.py): today's evalgate migrates
the file, reads every output back bit for bit, and judges every run to the verdicts, divergences and
factor tables that were stored with it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from evalgate import gate
from evalgate.records import output_digest
from evalgate.store import Store

RECORDED = Path(__file__).resolve().parent.parent / "data" / "recorded-0009.sqlite"


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Store:
    path = tmp_path_factory.mktemp("recorded") / "recorded.sqlite"
    shutil.copy(RECORDED, path)
    return Store(f"sqlite:///{path}")  # migrates 0009 -> head


def canonical(value) -> str:
    return json.dumps(value, sort_keys=True)  # NaN and infinities compare as the same text


def test_the_recording_has_every_kind_of_verdict(store):
    counts = {}
    for run in store.runs():
        for name, n in run.summary.items():
            counts[name] = counts.get(name, 0) + n
    assert all(counts[name] for name in ("stable", "batch_variance", "silent_regression", "explained_change", "new",
                                         "missing")), counts
    assert {run.suite_name for run in store.runs()} == {"recorded", "recorded-vllm"}


def test_every_recorded_run_is_judged_as_it_was(store):
    for run in store.runs():
        report = gate.judge_runs(store, run.id, run.baseline_run_id, kind=run.kind)
        assert report.counts == run.summary, run.id
        stored_verdicts = store.verdicts(run.id)
        # fields added since the recording (`across`: a cross-hardware class) are new, and None on a run of one class
        added = {"across"}
        got = [v.to_dict() for v in report.verdicts if v.verdict != "stable"]
        assert all(d.pop(name) is None for d in got for name in added), run.id
        assert canonical(got) == canonical(stored_verdicts), run.id
        stored = run.schedule["judged"]
        for name in ("factors", "cache_hits", "baseline_pairs", "differences"):
            assert canonical(report.judged()[name]) == canonical(stored[name]), (run.id, name)


def test_every_recorded_output_reads_back_to_its_digest(store):
    for run in store.runs():
        record = store.load(run.id)
        for key, completions in record.outputs.items():
            for c in completions:
                ids, lps = c.output_ids.astype("<i4").tobytes(), c.logprobs.astype("<f8").tobytes()
                assert output_digest(ids, lps) == c.digest, (run.id, key, c.pass_index)
                assert len(c.top_ids) == len(c.output_ids) and len(c.token_texts) == len(c.output_ids)
