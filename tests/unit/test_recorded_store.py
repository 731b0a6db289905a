"""Runs recorded and judged by evalgate at schema 0009, before outputs were arrays
(tests/data/recorded-0009.sqlite, written by tests/data/make_recorded_store.py): today's evalgate migrates
the file, reads every output back bit for bit, and judges every run to the verdicts, divergences and
factor tables that were stored with it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from evalgate.codec import to_json
from evalgate.judgement.judging import Judging, judge_stored, stored_report
from evalgate.judgement.report import Report
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
        report = judge_stored(store, run.id, run.baseline_run_id, Judging(run.kind))
        assert report.counts == run.summary, run.id
        stored_verdicts = store.verdicts(run.id)
        # fields added since the recording (`across`: a cross-hardware class; `prompt`: a moved rendered prompt)
        # are new, and None on a run of one class whose prompts did not move
        added = {"across", "prompt"}
        got = [to_json(v) for v in report.verdicts if v.verdict != "stable"]
        assert all(d.pop(name) is None for d in got for name in added), run.id
        # `kinds`, new too, agrees with the recorded `bits_only`: logprob alone is drift, none for new/missing
        for d in got:
            kinds = d.pop("kinds")
            assert (kinds == ["logprob"]) is (d["bits_only"] is True) and (kinds == []) is (d["bits_only"] is None), d
        assert canonical(got) == canonical(stored_verdicts), run.id
        stored = run.schedule["judged"]
        for name in ("factors", "cache_hits", "baseline_pairs", "differences"):
            assert canonical(report.to_dict()[name]) == canonical(stored[name]), (run.id, name)


def test_every_recorded_output_reads_back_to_its_digest(store):
    for run in store.runs():
        record = store.load(run.id)
        for key, completions in record.outputs.items():
            for c in completions:
                ids, lps = c.output_ids.astype("<i4").tobytes(), c.logprobs.astype("<f8").tobytes()
                assert output_digest(ids, lps) == c.digest, (run.id, key, c.pass_index)
                assert len(c.top_ids) == len(c.output_ids) and len(c.token_texts) == len(c.output_ids)


def copy_with_version_2(store: Store, run_id: int, baseline_id: int | None) -> int:
    """A copy of a recorded run whose outputs are stored again today, in version 2 payloads beside the
    recording's version 1 ones (its digests recomputed from the arrays)."""
    import sqlalchemy as sa

    from evalgate.records import Completion
    from evalgate.store.models import Request, Run

    record = store.load(run_id)
    with store.database.begin() as conn:
        row = dict(conn.execute(sa.select(Run.__table__).where(Run.__table__.c.id == run_id)).mappings().one())
        row.pop("id")
        row["baseline_run_id"] = baseline_id
        new_id = conn.execute(sa.insert(Run.__table__).values(**row)).inserted_primary_key[0]
        requests = conn.execute(sa.select(Request.__table__).where(Request.__table__.c.run_id == run_id)).mappings().all()
        conn.execute(sa.insert(Request.__table__), [{**{k: v for k, v in r.items() if k != "id"}, "run_id": new_id}
                                                    for r in requests])
    by_pass: dict[int, list[Completion]] = {}
    for outputs in record.outputs.values():
        for c in outputs:
            by_pass.setdefault(c.pass_index, []).append(Completion(
                key=c.key, prompt_ids=c.prompt_ids, output_ids=c.output_ids.copy(), logprobs=c.logprobs.copy(),
                top_ids=c.top_ids.copy(), top_logprobs=c.top_logprobs.copy(), top_lengths=c.top_lengths,
                token_texts=list(c.token_texts), text=c.text, finish_reason=c.finish_reason, pass_index=c.pass_index,
                concurrency=c.concurrency, wave=c.wave, position=c.position, cached_tokens=c.cached_tokens))
    for index in sorted(by_pass):
        store.add_outputs(new_id, by_pass[index])
    return new_id


def test_version_1_and_version_2_payloads_side_by_side_judge_identically(store):
    """Every recorded run stored again in version 2 payloads, judged against its recorded baseline (version
    1) and against a version 2 copy of it: the verdicts, divergences, deltas and factor tables of the
    recording, and the digests unchanged."""
    import sqlalchemy as sa

    runs = [run for run in store.runs() if run.baseline_run_id is not None]
    assert runs
    copies: dict[int, int] = {}
    for run in sorted(store.runs(), key=lambda r: r.id):
        copies[run.id] = copy_with_version_2(store, run.id, None)
    with store.database.connect() as conn:
        versions = dict(conn.execute(sa.text("SELECT substr(data, 1, 1), COUNT(*) FROM payloads GROUP BY 1")).all())
    assert set(versions) == {b"\x01", b"\x02"}, versions  # both encodings in one database
    for run in runs:
        recorded = judge_stored(store, run.id, run.baseline_run_id, Judging(run.kind))
        for current, baseline in ((copies[run.id], run.baseline_run_id), (copies[run.id], copies[run.baseline_run_id]),
                                  (run.id, copies[run.baseline_run_id])):
            report = judge_stored(store, current, baseline, Judging(run.kind))
            assert report.counts == recorded.counts == run.summary, run.id
            assert canonical([to_json(v) for v in report.verdicts]) == canonical([to_json(v) for v in recorded.verdicts])
            for name in ("factors", "cache_hits", "baseline_pairs", "differences"):
                assert canonical(report.to_dict()[name]) == canonical(recorded.to_dict()[name]), (run.id, name)
        digests = {(k, c.pass_index): c.digest for k, cs in store.load(run.id).outputs.items() for c in cs}
        copied = {(k, c.pass_index): c.digest for k, cs in store.load(copies[run.id]).outputs.items() for c in cs}
        assert copied == digests


def test_a_run_recorded_before_reports_were_stored_gets_its_report_once(tmp_path):
    """Runs finished before reports were stored (they kept `judged` only) are judged once on read, as they
    were judged then, and the report is stored: the next read is the stored object, not a new judgement."""
    path = tmp_path / "recorded.sqlite"
    shutil.copy(RECORDED, path)
    store = Store(f"sqlite:///{path}")
    for run in store.runs():
        assert "report" not in run.schedule and run.report is None
        report = stored_report(store, run.id)
        assert report.counts == run.summary and report.run_id == run.id, run.id
        stored = {"report": store.get_run(run.id).report}  # in its own column (migration 0013)
        assert "report" not in store.get_run(run.id).schedule
        # read back with the run's verdict rows, whose fields added since the recording are new
        again = Report.from_dict({**stored["report"], "requests": store.verdicts(run.id)}).to_dict()
        added = ("across", "bits_only", "kinds")
        assert [{k: v for k, v in r.items() if k not in added} for r in again.pop("requests")] == \
            [{k: v for k, v in r.items() if k not in added} for r in report.to_dict()["requests"]]
        assert again == {k: v for k, v in report.to_dict().items() if k != "requests"}
        assert "requests" not in stored["report"]  # the verdict rows hold them, once
        for name in ("factors", "cache_hits", "baseline_pairs", "differences"):
            assert canonical(stored["report"][name]) == canonical(run.schedule["judged"][name]), (run.id, name)
    first = store.runs()[0]
    store.set_report(first.id, {**store.get_run(first.id).report, "fingerprint_changes": {"model": "as stored"}})
    assert stored_report(store, first.id).fingerprint_changes == {"model": "as stored"}  # read, not rebuilt
