"""Outputs in content-addressed payloads (records.encode_payload, migration 0009): exact round trips, one
payload per distinct output, digest-first comparison that decodes nothing for equal runs, the same
verdicts as in-memory records, and databases written before payloads still load."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import sqlalchemy as sa
from alembic import command
from helpers import migration
from hypothesis import given, settings
from hypothesis import strategies as st

from evalgate.codec import to_json
from evalgate.configuration.schedule import Schedule, plan_passes
from evalgate.configuration.suite import load_suite
from evalgate.fingerprint import COMPONENTS, component, fingerprint_hash
from evalgate.judgement.judging import judge_run
from evalgate.records import Completion, StoredCompletion, decode_payload, encode_payload, pack_floats, pack_ids
from evalgate.store import Store
from evalgate.store.db import _alembic_config

OLD_ENCODING = migration("0009")  # the 0001 top-k encoding, which only that migration reads and writes


def bits(values) -> list[bytes]:
    return [struct.pack("<d", v) for v in values]


def make(ids, lps, *, top_ids=None, top_lps=None, text=None, texts=None, key="k", pass_index=0) -> Completion:
    top_ids = top_ids if top_ids is not None else [[t, t + 1] for t in ids]
    top_lps = top_lps if top_lps is not None else [[lp, lp - 1.0] for lp in lps]
    texts = texts if texts is not None else [f"<{t}>" for t in ids]
    return Completion(key=key, prompt_ids=[1, 2], output_ids=list(ids), logprobs=list(lps), top_ids=top_ids,
                      top_logprobs=top_lps, token_texts=texts, text="".join(texts) if text is None else text,
                      finish_reason="length", pass_index=pass_index)


def same(a: Completion, b: Completion) -> bool:
    (a_ids, a_lps), (b_ids, b_lps) = a.top_rows(), b.top_rows()
    return (a.output_ids.tolist() == b.output_ids.tolist() and bits(a.logprobs) == bits(b.logprobs) and a_ids == b_ids
            and [bits(r) for r in a_lps] == [bits(r) for r in b_lps]
            and a.token_texts == b.token_texts and a.text == b.text)


def round_trip(c: Completion) -> Completion:
    _, blob = encode_payload(c)
    ids, lps, top_ids, top_lps, texts, text = decode_payload(blob)
    return make(ids, lps, top_ids=top_ids, top_lps=top_lps, texts=texts, text=text)


# --- the encoding ----------------------------------------------------------------------------------------

NAN_WITH_PAYLOAD = struct.unpack("<d", bytes.fromhex("010000000000f87f"))[0]
ODD_FLOATS = [0.0, -0.0, -1e-7, float("-inf"), float("inf"), 5e-324, -5e-324, 1.7976931348623157e308,
              -0.6931471805599453, float.fromhex("-0x1.fffffep-1"), NAN_WITH_PAYLOAD]


def test_every_logprob_bit_survives_including_values_float32_cannot_hold():
    c = make(range(len(ODD_FLOATS)), ODD_FLOATS)
    assert same(round_trip(c), c)


def test_float32_logprobs_and_small_ids_take_half_the_space():
    f32 = [float.fromhex("-0x1.fffffep-1") * (i + 1) / 64 for i in range(64)]
    f32 = [struct.unpack("<f", struct.pack("<f", v))[0] for v in f32]  # exactly float32, as vLLM's
    top = [[v, f32[(i + 1) % 64]] for i, v in enumerate(f32)]
    lean = make(range(100, 164), f32, top_lps=top, text="", texts=[])
    wide = make(range(70_000, 70_064), [v + 1e-12 for v in f32], top_lps=top, text="", texts=[])
    for c in (lean, wide):
        assert same(round_trip(c), c)
    # 2-byte ids and 4-byte floats vs 4 and 8
    assert len(_body(lean)) < 0.55 * len(_body(wide))


def _body(c: Completion) -> bytes:
    return encode_payload(c)[1]


def test_ragged_top_k_rows_large_and_negative_ids_and_odd_text():
    c = make([3, 70_000, -5], [-1.0, -2.0, -3.0], top_ids=[[3, 9, 8], [70_000], []],
             top_lps=[[-1.0, -2.5, -9.0], [-2.0], []], texts=["a\x00", "\ud800", "é"], text="a\x00\ud800é")
    assert same(round_trip(c), c)
    no_top = make([1, 2], [-1.0, -2.0], top_ids=[[], []], top_lps=[[], []])
    assert same(round_trip(no_top), no_top)
    uneven = make([1, 2, 3], [-1.0], top_ids=[], top_lps=[])  # lengths recorded separately
    assert same(round_trip(uneven), uneven)
    assert same(round_trip(make([], [])), make([], []))


ids_strategy = st.integers(min_value=-(2**31), max_value=2**31 - 1) | st.integers(min_value=0, max_value=70_000)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(ids_strategy, st.floats(allow_nan=True, width=64),
                          st.lists(st.tuples(ids_strategy, st.floats(width=64)), max_size=4)), max_size=12),
       st.text(max_size=8))
def test_any_completion_round_trips_exactly(rows, text):
    c = make([r[0] for r in rows], [r[1] for r in rows], top_ids=[[t for t, _ in r[2]] for r in rows],
             top_lps=[[v for _, v in r[2]] for r in rows], texts=[text] * len(rows), text=text)
    assert same(round_trip(c), c)


def test_the_payload_hash_names_the_content():
    a = make([1, 2], [-0.5, -1.5])
    assert encode_payload(a)[0] == encode_payload(make([1, 2], [-0.5, -1.5]))[0]
    flipped = struct.unpack("<d", struct.pack("<Q", struct.unpack("<Q", struct.pack("<d", -1.5))[0] ^ 1))[0]
    changed = [make([1, 3], [-0.5, -1.5]), make([1, 2], [-0.5, flipped]), make([1, 2], [-0.5, -1.5], text="x"),
               make([1, 2], [-0.5, -1.5], top_ids=[[1, 7], [2, 3]])]
    hashes = {encode_payload(c)[0] for c in changed} | {encode_payload(a)[0]}
    assert len(hashes) == 5


# --- the store -------------------------------------------------------------------------------------------


def fingerprint() -> dict:
    return {name: component({"hardware": "cpu"} if name == "hardware" else {"n": name}) for name in COMPONENTS}


def write_suite(tmp_path, keys):
    (tmp_path / "model").mkdir(parents=True, exist_ok=True)
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"id": k, "prompt": f"p {k}"}) + "\n" for k in keys))
    (tmp_path / "evalgate.toml").write_text('[suite]\nname = "unit"\n[engine]\nmodel = "model"\n'
                                            '[sampling]\nmax_tokens = 4\n[prompts]\nfile = "prompts.jsonl"\n')
    return load_suite(tmp_path / "evalgate.toml")


PLAN = plan_passes(Schedule(concurrency=(1, 8), shuffles=0))  # pass 0 cold, 1 hot, 2 batch 8


def schedule_record() -> dict:
    return {"passes": [p.to_dict() for p in PLAN]}


def outputs_of(variant: dict[str, list[Completion]]) -> list[list[Completion]]:
    """Per pass, the completions of every key, stamped with key, pass and concurrency."""
    per_pass = []
    for p in PLAN:
        per_pass.append([])
        for key, passes in variant.items():
            c = passes[p.index]
            c.key, c.pass_index, c.concurrency = key, p.index, p.concurrency
            per_pass[-1].append(c)
    return per_pass


def store_run(store, suite, variant, kind="check") -> int:
    run_id = store.create_run(suite, kind, schedule_record(), fingerprint(), {k: [1, 2] for k in variant})
    for completions in outputs_of(variant):
        store.add_outputs(run_id, completions)
    return run_id


def steady(seed: int) -> list[Completion]:
    return [make([seed, seed + 1, seed + 2], [-0.25, -0.5, -0.75]) for _ in PLAN]


def test_equal_outputs_are_stored_once_and_compared_without_decoding(tmp_path):
    keys = [f"r{i}" for i in range(20)]
    suite = write_suite(tmp_path, keys)
    store = Store(f"sqlite:///{tmp_path / 'e.sqlite'}")
    baseline = store_run(store, suite, {k: steady(i) for i, k in enumerate(keys)}, "baseline")
    check = store_run(store, suite, {k: steady(i) for i, k in enumerate(keys)})
    with store.database.connect() as conn:
        assert conn.execute(sa.text("select count(*) from outputs")).scalar() == 2 * 3 * 20
        assert conn.execute(sa.text("select count(*) from payloads")).scalar() == 20  # 120 outputs, 20 distinct
    current, base = store.load(check), store.load(baseline)
    report = judge_run(current, base)
    assert report.counts["stable"] == 20 and not report.failing
    loaded = [c for record in (current, base) for outs in record.outputs.values() for c in outs]
    assert len(loaded) == 120 and all(isinstance(c, StoredCompletion) for c in loaded)
    assert not any("view" in vars(c) for c in loaded)  # digests decided every comparison: no payload read


def differing_variants():
    """A baseline and a check with every kind of difference, within a run and against the baseline."""
    flip = struct.unpack("<d", struct.pack("<Q", struct.unpack("<Q", struct.pack("<d", -0.5))[0] ^ 1))[0]
    base = {"same": steady(1), "logprob": steady(2), "longer": steady(3), "token": steady(4), "varies": steady(5)}
    check = {"same": steady(1), "logprob": steady(2), "longer": steady(3), "token": steady(4), "varies": steady(5)}
    check["logprob"] = [make([2, 3, 4], [-0.25, flip, -0.75]) for _ in PLAN]  # same ids, one bit
    check["longer"] = [make([3, 4, 5, 6], [-0.25, -0.5, -0.75, -1.0]) for _ in PLAN]
    check["token"] = [make([4, 9, 6], [-0.25, -0.5, -0.75]) for _ in PLAN]
    check["varies"][2] = make([5, 6, 8], [-0.25, -0.5, -0.75])  # batch 8 departs at position 2
    return base, check


def test_stored_runs_get_the_verdicts_and_divergences_of_in_memory_ones(tmp_path):
    from types import SimpleNamespace

    from evalgate.store import RunRecord

    base, check = differing_variants()
    suite = write_suite(tmp_path, list(base))
    store = Store(f"sqlite:///{tmp_path / 'e.sqlite'}")
    stored = judge_run(store.load(store_run(store, suite, check)), store.load(store_run(store, suite, base, "baseline")))

    def in_memory(run_id, variant):
        loaded = store.load(run_id)  # the same request rows and fingerprint, outputs straight from memory
        outputs = {key: [c for per_pass in outputs_of(variant) for c in per_pass if c.key == key] for key in variant}
        return RunRecord(run=SimpleNamespace(**{**loaded.run.__dict__, "id": run_id}), fingerprint=loaded.fingerprint,
                         requests=loaded.requests, outputs=outputs)

    base2, check2 = differing_variants()
    memory = judge_run(in_memory(2, check2), in_memory(1, base2))
    got = {v.key: to_json(v) for v in stored.verdicts}
    want = {v.key: to_json(v) for v in memory.verdicts}
    assert got == want
    assert {k: v["verdict"] for k, v in got.items()} == {  # "same" is stable: counted, not listed
        "logprob": "silent_regression", "longer": "silent_regression", "token": "silent_regression",
        "varies": "batch_variance"}
    assert stored.counts == memory.counts and stored.counts["stable"] == 1
    assert got["logprob"]["divergence"]["kind"] == "logprob" and got["logprob"]["divergence"]["position"] == 1
    assert got["longer"]["divergence"]["kind"] == "length" and got["longer"]["divergence"]["position"] == 3
    assert got["varies"]["divergence"]["position"] == 2 and got["varies"]["factor"] == "batch_size"


def test_a_stored_run_judged_a_window_at_a_time_gets_the_report_of_one_read_whole(tmp_path, monkeypatch):
    """`judge_stored` reads WINDOW requests at a time (here 2), the baseline's requests the run lacks last: the
    report equals the one judged over both runs read whole, and no read holds more than a window."""
    from evalgate.judgement import judging

    base, check = differing_variants()
    base["gone"], check["added"] = steady(6), steady(7)  # missing from the check, new in it
    store = Store(f"sqlite:///{tmp_path / 'e.sqlite'}")
    base_id = store_run(store, write_suite(tmp_path / "b", list(base)), base, "baseline")
    check_id = store_run(store, write_suite(tmp_path / "c", list(check)), check)
    whole = judge_run(store.load(check_id), store.load(base_id), judging.Judging(), store)
    read, load = [], store.load

    def counted(run_id, only_pass=None, keys=None, fingerprint=None):
        record = load(run_id, only_pass, keys, fingerprint)
        read.append(len(record.requests) if keys is not None else None)
        return record

    monkeypatch.setattr(judging, "WINDOW", 2)
    monkeypatch.setattr(store, "load", counted)
    windowed = judging.judge_stored(store, check_id, base_id)
    assert windowed.to_dict() == whole.to_dict()
    assert {v.key: v.verdict for v in windowed.verdicts} == {
        "logprob": "silent_regression", "longer": "silent_regression", "token": "silent_regression",
        "varies": "batch_variance", "added": "new", "gone": "missing"}
    assert windowed.counts["stable"] == 1 and windowed.factors[0].compared == 6
    # the two runs' identities, then each window of the check's 6 requests and the baseline's one left: <= 2 each
    assert read[:2] == [0, 0] and None not in read and max(read) == 2 and sum(read[2:]) == 6 + 5 + 1


# --- databases written before payloads (schema 0008) -----------------------------------------------------


def test_a_database_written_before_payloads_upgrades_and_compares_with_new_runs(tmp_path, db_url):
    """On both backends: a database at 0008, written with the old columns, is migrated on open."""
    base, _ = differing_variants()
    suite = write_suite(tmp_path, list(base))
    engine = sa.create_engine(db_url)
    with engine.begin() as conn:
        command.upgrade(_alembic_config(conn), "0008")
        fp = fingerprint()
        conn.execute(sa.text("insert into fingerprints (hash, components, created_at) values "
                             "(:h, :c, '2026-01-01 00:00:00')"), {"h": fingerprint_hash(fp), "c": json.dumps(fp)})
        conn.execute(sa.text("insert into runs (suite_name, suite_path, kind, status, schedule, started_at, "
                             "fingerprint_hash, hardware_class) values ('unit', :path, 'baseline', 'complete', "
                             ":schedule, '2026-01-01 00:00:00', :fp, 'cpu')"),
                     {"path": str(suite.path), "schedule": json.dumps(schedule_record()), "fp": fingerprint_hash(fp)})
        run_id = conn.execute(sa.text("select max(id) from runs")).scalar()
        for key in base:
            conn.execute(sa.text("insert into requests (run_id, key, request_hash, prompt, prompt_ids, sampling, "
                                 "location, request_type) values (:run, :key, :h, 'p', :ids, '{}', null, 'generate')"),
                         {"run": run_id, "key": key, "h": suite.request_hash(next(p for p in suite.prompts if p.key == key)),
                          "ids": pack_ids([1, 2])})
        for completions in outputs_of(base):  # the 0001 encoding: int32 ids, float64 logprobs, padded top-k
            for c in completions:
                k, top_ids, top_lps = OLD_ENCODING.pack_top(c)
                conn.execute(sa.text(
                    "insert into outputs (run_id, request_key, pass_index, concurrency, wave, position, output_ids,"
                    " logprobs, top_k, top_ids, top_logprobs, token_texts, text, finish_reason, digest) values "
                    "(:run, :key, :p, :c, 0, 0, :ids, :lps, :k, :tids, :tlps, :texts, :text, 'length', :digest)"),
                    {"run": run_id, "key": c.key, "p": c.pass_index, "c": c.concurrency, "ids": pack_ids(c.output_ids),
                     "lps": pack_floats(c.logprobs), "k": k, "tids": top_ids, "tlps": top_lps,
                     "texts": json.dumps(c.token_texts), "text": c.text, "digest": c.digest})
    engine.dispose()

    store = Store(db_url)  # migrates to head
    old = store.load(run_id)
    for key, completions in zip(base, zip(*outputs_of(base))):
        assert [c.pass_index for c in old.outputs[key]] == [0, 1, 2]
        for got, want in zip(old.outputs[key], completions):
            assert same(got, want) and got.digest == want.digest and got.prompt_ids == [1, 2]
    base2, check = differing_variants()
    report = judge_run(store.load(store_run(store, suite, base2)), old)  # a new run against the migrated one
    assert report.counts["stable"] == len(base) and not report.failing
    report = judge_run(store.load(store_run(store, suite, check)), old)
    assert {v.key: v.verdict for v in report.verdicts if v.verdict != "stable"} == {
        "logprob": "silent_regression", "longer": "silent_regression", "token": "silent_regression",
        "varies": "batch_variance"}
    with store.database.connect() as conn:
        # the equal run's outputs point at the payloads the migration wrote: 5 distinct, +4 from the check
        assert conn.execute(sa.text("select count(*) from payloads")).scalar() == 5 + 4


# --- arrays as the engines hand them over (records.encode_pass) ------------------------------------------

def as_arrays(c: Completion, id_type, float_type) -> Completion:
    """The same completion with its ids and logprobs as arrays of these types (top-k as 2-D arrays and lengths)."""
    return Completion(key=c.key, prompt_ids=c.prompt_ids, output_ids=c.output_ids.astype(id_type),
                      logprobs=c.logprobs.astype(float_type), top_ids=c.top_ids.astype(id_type),
                      top_logprobs=c.top_logprobs.astype(float_type), top_lengths=c.top_lengths,
                      token_texts=c.token_texts, text=c.text, finish_reason=c.finish_reason, pass_index=c.pass_index)


F32_VALUES = [-0.5, -1.25, -0.375, -7.75, -0.0]  # exactly float32, and so are v - 1 and v - 2


@pytest.mark.parametrize("id_type", ["int64", "int32", "uint16", "uint32"])
@pytest.mark.parametrize("float_type", ["float32", "float64"])
def test_arrays_of_every_type_an_engine_hands_over_round_trip_as_their_lists(id_type, float_type):
    lists = make([3, 900, 65_535, 0, 7], F32_VALUES, top_ids=[[3, 1, 2], [900], [65_535, 4], [0, 9, 8], [7, 6, 5]],
                 top_lps=[[v, v - 1, v - 2][: n] for v, n in zip(F32_VALUES, (3, 1, 2, 3, 3))])
    arrays = as_arrays(lists, id_type, float_type)
    assert encode_payload(arrays) == encode_payload(lists) and arrays.digest == lists.digest
    assert same(round_trip(arrays), lists)


def test_tensors_and_lists_from_vllm_give_the_same_record():
    torch = pytest.importorskip("torch")
    lists = make([5, 6, 7], F32_VALUES[:3], top_ids=[[5, 1], [6, 2], [7, 3]], top_lps=[[v, v - 1] for v in F32_VALUES[:3]])
    tensors = Completion(key="k", prompt_ids=[1, 2], output_ids=torch.tensor([5, 6, 7]),
                         logprobs=torch.tensor(F32_VALUES[:3], dtype=torch.float32),
                         top_ids=np.asarray(torch.tensor([[5, 1], [6, 2], [7, 3]])),
                         top_logprobs=np.asarray(torch.tensor([[v, v - 1] for v in F32_VALUES[:3]], dtype=torch.float32)),
                         token_texts=lists.token_texts, text=lists.text, finish_reason="length")
    assert encode_payload(tensors) == encode_payload(lists) and tensors.digest == lists.digest


def mixed_pass() -> list[Completion]:
    """Completions a pass can mix: 16- and 32-bit ids, float32 and float64 logprobs, ragged rows, NaN, empty."""
    rng = np.random.default_rng(7)
    out = []
    for i in range(40):
        n = int(rng.integers(0, 9))
        ids = rng.integers(0, 70_000 if i % 3 == 0 else 60_000, n)
        lps = (-rng.exponential(1.0, n)).astype(np.float32 if i % 2 else np.float64)
        if i % 7 == 0 and n:
            lps[0] = np.nan
        top = rng.integers(0, 60_000, (n, 4))
        top_lps = np.sort(-rng.exponential(1.0, (n, 4)), axis=1)[:, ::-1]
        lengths = rng.integers(1, 5, n) if i % 5 == 0 else None
        texts = [f"t{t}" for t in ids.tolist()]
        out.append(Completion(key=f"r{i}", prompt_ids=[1], output_ids=ids, logprobs=lps, top_ids=top,
                              top_logprobs=top_lps, top_lengths=lengths, token_texts=texts,
                              text="".join(texts) if i % 4 else "other", finish_reason="length"))
    return out


def test_a_pass_encoded_at_once_equals_each_output_encoded_alone():
    from evalgate.records import encode_pass

    completions = mixed_pass()
    encoded = encode_pass(completions)
    alone = [encode_payload(c) for c in mixed_pass()]
    assert encoded.payload_hashes == [h for h, _ in alone]
    assert encoded.payloads == dict(alone)
    assert encoded.digests == [c.digest for c in mixed_pass()] and encoded.repeats == 0
    for c, (_, blob) in zip(completions, alone):
        assert same(round_trip(c), c)


def test_a_repeat_of_the_previous_pass_is_recognized_on_the_arrays_and_a_changed_bit_is_not():
    from evalgate.records import encode_pass

    first = encode_pass(mixed_pass())
    again = mixed_pass()
    again.reverse()  # another order: a shuffled pass
    flipped = again[3]
    flipped.logprobs = flipped.logprobs.copy()
    flipped.logprobs[-1] = np.nextafter(flipped.logprobs[-1], 0)  # one bit
    top_changed = again[8]
    top_changed.top_ids = top_changed.top_ids.copy()
    top_changed.top_ids[0, -1] += 1
    encoded = encode_pass(again, first.seen)
    fresh = encode_pass([c for c in mixed_pass()[::-1]])
    changed_keys = {flipped.key, top_changed.key} - {c.key for c in again if not c.output_ids.size}
    assert encoded.repeats == len(again) - len(changed_keys)
    for c, digest, payload_hash in zip(again, encoded.digests, encoded.payload_hashes):
        if c.key in changed_keys:
            assert payload_hash not in set(first.payload_hashes) and payload_hash in encoded.payloads
            assert (digest != first.digests[first_index(c.key)]) == (c is flipped)
        else:
            assert (digest, payload_hash) == (first.digests[first_index(c.key)], first.payload_hashes[first_index(c.key)])
    assert set(encoded.payloads) == {h for c, h in zip(again, encoded.payload_hashes) if c.key in changed_keys}
    assert len(fresh.payload_hashes) == len(again)


def test_a_request_left_out_of_a_pass_is_still_a_repeat_in_the_next():
    """A rotating or probe pass covers some requests: the next pass compares each with its latest output."""
    from evalgate.records import encode_pass

    first = encode_pass(mixed_pass())
    seen = dict(first.seen)
    subset = encode_pass(mixed_pass()[:10], seen)
    assert set(subset.seen) == {c.key for c in mixed_pass()[:10]}  # this chunk's only: the writer adds them
    seen.update(subset.seen)
    last = encode_pass(mixed_pass(), seen)
    assert subset.repeats == 10 and last.repeats == len(mixed_pass())
    assert (last.digests, last.payload_hashes, last.payloads) == (first.digests, first.payload_hashes, {})
    changed = mixed_pass()
    changed[20].logprobs = changed[20].logprobs.copy()
    changed[20].logprobs[0] = np.nextafter(changed[20].logprobs[0], 0)
    assert encode_pass(changed, seen).repeats == len(changed) - 1


def first_index(key: str) -> int:
    return [c.key for c in mixed_pass()].index(key)


GOLDEN_LEAN = make([1, 2], [-0.5, -1.5], top_ids=[[1, 3], [2]], top_lps=[[-0.5, -2.0], [-1.5]], texts=["a", "b"])
GOLDEN_WIDE = make([70_000], [-0.1], top_ids=[[70_000, 5]], top_lps=[[-0.1, -0.2]], texts=["\u00e9"], text="x")
# version 1, written by every evalgate from 0009 until payload version 2: still read, bit for bit
V1_LEAN = ("014866010102000000020000000200000002000000010002000100030002000000000000bf0000c0bf000000bf000000c00000c0"
           "bf00000000020001005b2261222c202262225d")
V1_WIDE = ("0169640000010000000100000001000000020000007011010070110100050000009a9999999999b9bf9a9999999999b9bf9a99999999"
           "99c9bf5b2278222c205b225c7530306539225d5d")


def test_the_payload_encoding_is_pinned():
    """Version 2, byte for byte (docs/storage.md): header, ids, floats, ragged row lengths, each token
    text's UTF-8 length, the texts, and the text only when it is not the token texts joined."""
    assert encode_payload(GOLDEN_LEAN)[1].hex() == (
        "02" "4866" "03" "01" "02000000" "02000000" "02000000" "02000000" "02000000"  # H f, ragged+joined, 1-byte lengths
        "01000200" "0100030002000000"  # ids, top-k ids (row 2 padded with 0)
        "000000bf0000c0bf" "000000bf000000c00000c0bf00000000"  # logprobs, top-k logprobs (float32)
        "02000100" "0101" "6162")  # row lengths, text lengths, "ab"
    assert encode_payload(GOLDEN_WIDE)[1].hex() == (
        "02" "6964" "00" "01" "01000000" "01000000" "01000000" "02000000" "01000000"  # i d, text not joined
        "70110100" "7011010005000000"
        "9a9999999999b9bf" "9a9999999999b9bf9a9999999999c9bf"  # float64: -0.1 is not a float32
        "02" "c3a9" "78")  # é is 2 bytes, then the text "x"


def test_version_1_payloads_read_back_as_they_were_written():
    for blob, c in ((V1_LEAN, GOLDEN_LEAN), (V1_WIDE, GOLDEN_WIDE)):
        ids, lps, top_ids, top_lps, texts, text = decode_payload(bytes.fromhex(blob))
        assert same(make(ids, lps, top_ids=top_ids, top_lps=top_lps, texts=texts, text=text), c)


def test_an_unknown_payload_version_is_an_error_not_a_guess():
    blob = bytearray(encode_payload(GOLDEN_LEAN)[1])
    blob[0] = 3
    with pytest.raises(ValueError, match="version 3 is unknown"):
        decode_payload(bytes(blob))


def test_one_token_text_is_read_alone_and_long_texts_take_wider_lengths():
    from evalgate.records import payload_view

    texts = ["a", "é" * 200, "\ud800", "", "z" * 70_000]
    c = make(range(5), [-1.0] * 5, texts=texts)
    view = payload_view(encode_payload(c)[1])
    assert [view.token_text(i) for i in range(6)] == [*texts, None] and "token_texts" not in vars(view)
    assert view.token_texts == texts and view.text == "".join(texts)
    assert view._width == 4 and payload_view(encode_payload(make([1], [-1.0], texts=["é" * 200]))[1])._width == 2


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(min_value=0, max_value=30), st.sampled_from([-0.5, -1.0, -1.5, -2.0, -0.0])),
                         min_size=1, max_size=6), min_size=1, max_size=6), st.integers(min_value=0, max_value=6))
def test_top_k_rows_ranked_at_once_as_position_by_position(positions, k):
    """vLLM's flat logprobs (the token, then its top-k) ranked by `rank_top_rows` as `rank_top` ranks each."""
    from evalgate.records import rank_top, rank_top_rows

    width = max(len(p) for p in positions)
    rows = [p + [p[-1]] * (width - len(p)) for p in positions]  # a repeated entry, as vLLM's sampled token
    ids = np.array([[t for t, _ in row] for row in rows])
    lps = np.array([[v for _, v in row] for row in rows])
    top_ids, top_lps, lengths = rank_top_rows(ids, lps, k)
    got = Completion(key="k", prompt_ids=[], output_ids=ids[:, 0], logprobs=lps[:, 0], top_ids=top_ids,
                     top_logprobs=top_lps, top_lengths=lengths, token_texts=[], text="", finish_reason="length")
    want = [rank_top(row, k) for row in rows]
    assert got.top_rows() == ([w[0] for w in want], [w[1] for w in want])
    assert [bits(r) for r in got.top_rows()[1]] == [bits(w[1]) for w in want]  # -0.0 keeps its sign
