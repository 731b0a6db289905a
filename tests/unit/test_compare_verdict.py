"""Comparison and verdicts on recorded outputs (docs/design.md "Verdicts"), without any engine."""

from __future__ import annotations

import json
import random
import struct
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from evalgate.codec import from_json, to_json
from evalgate.configuration.schedule import Schedule, plan_passes
from evalgate.errors import ExitCode
from evalgate.fingerprint import COMPONENTS, component
from evalgate.judgement.compare import first_divergence, within_run
from evalgate.judgement.judging import Judging, judge_run
from evalgate.judgement.prompts import PromptCounts
from evalgate.judgement.report import REPORT_SCHEMA, Report
from evalgate.judgement.verdict import VERDICTS, CacheHits, RequestVerdict
from evalgate.records import Completion, pack_ids
from evalgate.store import RunRecord


def flip_last_bit(x: float) -> float:
    (n,) = struct.unpack("<Q", struct.pack("<d", x))
    return struct.unpack("<d", struct.pack("<Q", n ^ 1))[0]


def comp(ids, lps=None, *, key="r", pass_index=0, concurrency=1, top=None) -> Completion:
    lps = list(lps) if lps is not None else [-0.5 - i for i in range(len(ids))]
    if top is None:
        top = [[lp, lp - 1.0 - i] for i, lp in enumerate(lps)]  # margin at position i is 1 + i
    return Completion(key=key, prompt_ids=[1], output_ids=list(ids), logprobs=lps,
                      top_ids=[[t, t + 1000] for t in ids], top_logprobs=top,
                      token_texts=[f"<{t}>" for t in ids], text="".join(f"<{t}>" for t in ids),
                      finish_reason="length", pass_index=pass_index, concurrency=concurrency)


def fingerprint(**changed) -> dict:
    """A full fingerprint; keyword arguments replace a component's data."""
    return {name: component(changed.get(name, {"what": name})) for name in COMPONENTS}


def record(run_id: int, outputs: dict[str, list[Completion]], *, fp=None, request_hashes=None,
           suite_name="s", schedule: dict | None = None, rendered: dict[str, str] | None = None) -> RunRecord:
    """A run in memory; `rendered`: a request's prompt as the engine saw it (its ids: one per character)."""
    request_hashes, rendered = request_hashes or {}, rendered or {}
    requests = {key: SimpleNamespace(key=key, request_hash=request_hashes.get(key, f"h-{key}"),
                                     location=f"prompts.jsonl:{i + 1}", prompt=f"prompt {key}",
                                     rendered=rendered.get(key, f"prompt {key}"),
                                     prompt_ids=pack_ids([ord(c) for c in rendered.get(key, f"prompt {key}")]))
                for i, key in enumerate(outputs)}
    run = SimpleNamespace(id=run_id, suite_name=suite_name, schedule=schedule, hardware_class="cpu", engine_log=None)
    return RunRecord(run=run, fingerprint=fp or fingerprint(), requests=requests, outputs=outputs)


def passes(key: str, *completions: Completion) -> list[Completion]:
    """Stamp key and pass index (pass i at concurrency 1, 4, 16, ...) onto completions."""
    levels = [1, 4, 16, 16, 16]
    for i, c in enumerate(completions):
        c.key, c.pass_index, c.concurrency = key, i, levels[i]
    return list(completions)


def by_key(report: Report) -> dict[str, RequestVerdict]:
    """The report's verdicts by key: those not stable (a stable request is counted, not listed)."""
    return {v.key: v for v in report.verdicts}


IDS = [11, 12, 13, 14, 15]


# --- first_divergence ------------------------------------------------------------------------------------


def test_identical_completions_do_not_diverge():
    assert first_divergence(comp(IDS), comp(IDS)) is None


def test_token_divergence_position_tokens_and_margin():
    other = list(IDS)
    other[3] = 99
    div = first_divergence(comp(IDS), comp(other))
    assert (div.position, div.kind) == (3, "token")
    assert (div.reference_id, div.other_id) == (14, 99)
    assert (div.reference_text, div.other_text) == ("<14>", "<99>")
    assert div.margin == 4.0  # the reference's top-1 minus top-2 at position 3


def test_first_of_several_differences_is_reported():
    div = first_divergence(comp(IDS), comp([11, 0, 13, 0, 0]))
    assert div.position == 1


def test_logprob_only_divergence():
    lps = [-0.5, -1.5, -2.5, -3.5, -4.5]
    changed = list(lps)
    changed[2] = flip_last_bit(changed[2])
    div = first_divergence(comp(IDS, lps), comp(IDS, changed))
    assert (div.position, div.kind) == (2, "logprob")
    assert div.reference_id == div.other_id == 13
    assert div.reference_logprob == -2.5 and div.other_logprob == changed[2]


def test_signed_zero_logprob_is_a_divergence():
    div = first_divergence(comp([1, 2], [0.0, -1.0]), comp([1, 2], [-0.0, -1.0]))
    assert (div.position, div.kind) == (0, "logprob")


@pytest.mark.parametrize("ref, other, position, ref_id, other_id", [
    (IDS, IDS[:3], 3, 14, None),  # the other stopped early
    (IDS[:2], IDS, 2, None, 13),  # the other ran longer
    ([], IDS, 0, None, 11),
])
def test_length_divergence(ref, other, position, ref_id, other_id):
    div = first_divergence(comp(ref), comp(other))
    assert (div.position, div.kind, div.reference_id, div.other_id) == (position, "length", ref_id, other_id)


def test_margin_is_none_past_the_reference_end():
    div = first_divergence(comp(IDS[:2]), comp(IDS))
    assert div.margin is None


def test_divergence_to_dict_is_json():
    div = first_divergence(comp(IDS), comp([11, 12, 0, 14, 15]))
    d = to_json(div)
    assert set(d) == {"position", "kind", "reference_id", "reference_text", "other_id", "other_text", "margin",
                      "reference_logprob", "other_logprob"}
    json.dumps(d)


# --- within_run ------------------------------------------------------------------------------------------


def test_within_run_agreeing_passes():
    assert within_run(passes("r", comp(IDS), comp(IDS), comp(IDS))) is None
    assert within_run([]) is None
    assert within_run([comp(IDS)]) is None


def test_within_run_reports_first_disagreeing_pass_and_count():
    other = [11, 12, 77, 14, 15]
    d = within_run(passes("r", comp(IDS), comp(IDS), comp(other), comp(other)))
    assert (d.reference_pass, d.reference_concurrency) == (0, 1)
    assert (d.other_pass, d.other_concurrency) == (2, 16)
    assert d.differing_passes == 2
    assert (d.divergence.position, d.divergence.kind, d.divergence.other_id) == (2, "token", 77)


# --- judge -----------------------------------------------------------------------------------------------


def test_batch_variance_without_baseline():
    current = record(2, {
        "a": passes("a", comp(IDS), comp(IDS)),
        # The margin reported is the reference's (pass 0): a near-tie there.
        "b": passes("b", comp(IDS, top=[[-1.0, -1.0009765625]] * 5), comp([11, 12, 13, 50, 15])),
    })
    report = judge_run(current, None, Judging("baseline"))
    v = by_key(report)
    assert "a" not in v and report.counts["stable"] == 1
    assert v["b"].verdict == "batch_variance"
    assert v["b"].divergence.position == 3
    assert v["b"].divergence.margin == 0.0009765625
    assert v["b"].passes == {"reference_pass": 0, "reference_concurrency": 1, "other_pass": 1,
                             "other_concurrency": 4, "differing_passes": 1, "total_passes": 2,
                             "factors": [None]}  # no recorded plan: unattributed
    assert v["b"].factor is None
    assert v["b"].location == "prompts.jsonl:2"
    assert report.exit_code == ExitCode.REGRESSION and report.status == "regression"
    assert report.baseline_run_id is None and report.changed_components == []


def test_batch_variance_wins_over_baseline_comparison():
    baseline = record(1, {"a": passes("a", comp(IDS))})
    current = record(2, {"a": passes("a", comp(IDS), comp([11, 0, 13, 14, 15]))})
    assert by_key(judge_run(current, baseline))["a"].verdict == "batch_variance"


def test_equal_to_baseline_with_equal_fingerprint_is_stable():
    baseline = record(1, {"a": passes("a", comp(IDS), comp(IDS))})
    current = record(2, {"a": passes("a", comp(IDS), comp(IDS))})
    report = judge_run(current, baseline)
    assert report.verdicts == [] and report.counts["stable"] == 1
    assert report.exit_code == ExitCode.PASS == 0 and report.status == "pass"
    assert report.to_dict()["requests"] == []


def test_different_with_equal_fingerprint_is_silent_regression():
    baseline = record(1, {"a": passes("a", comp(IDS)), "b": passes("b", comp(IDS))})
    current = record(2, {"a": passes("a", comp(IDS)), "b": passes("b", comp([11, 12, 13, 14, 99]))})
    report = judge_run(current, baseline)
    v = by_key(report)
    assert "a" not in v and report.counts["stable"] == 1
    assert v["b"].verdict == "silent_regression"
    assert v["b"].components == []
    assert (v["b"].divergence.position, v["b"].divergence.reference_id, v["b"].divergence.other_id) == (4, 15, 99)
    assert report.exit_code == ExitCode.REGRESSION
    assert report.changed_components == []


def test_a_moved_rendered_prompt_explains_its_request_and_only_its_own():
    """Everything in the fingerprint equal, the suite's request equal: the prompt ids the engine was given
    moved (a template's date). That request is `prompt`, shown where; the other one stays a regression."""
    day1 = "<s>system\nToday Date: 01 Mar 2026\n\nBe brief.</s><s>user\nHi</s>"
    day2 = day1.replace("01 Mar", "02 Mar")
    baseline = record(1, {"a": passes("a", comp(IDS)), "b": passes("b", comp(IDS))}, rendered={"a": day1})
    current = record(2, {"a": passes("a", comp([11, 12, 13, 14, 77])), "b": passes("b", comp([11, 12, 13, 14, 99]))},
                     rendered={"a": day2})
    report = judge_run(current, baseline)
    v = by_key(report)
    assert (v["a"].verdict, v["a"].components) == ("explained_change", ["prompt"])
    assert v["a"].prompt.position == day1.index("01 Mar") + 1 and (v["a"].prompt.baseline_token, v["a"].prompt.token) == (
        ord("1"), ord("2"))
    assert "Today Date: 01 Mar 2026" in v["a"].prompt.baseline_text and "Today Date: 02 Mar 2026" in v["a"].prompt.text
    assert (v["b"].verdict, v["b"].components, v["b"].prompt) == ("silent_regression", [], None)
    assert report.prompts == PromptCounts(compared=2, equal=1)
    # a request whose own text changed: its prompt moving follows from that, and `suite` alone explains it
    edited = record(3, {"a": passes("a", comp([11, 12, 13, 14, 77])), "b": passes("b", comp(IDS))},
                    rendered={"a": day2}, request_hashes={"a": "h-edited"})
    a = by_key(judge_run(edited, baseline))["a"]
    assert (a.verdict, a.components, a.prompt) == ("explained_change", ["suite"], None)
    # the stored form reads back whole
    assert from_json(RequestVerdict, json.loads(json.dumps(to_json(v["a"])))).prompt == v["a"].prompt


def test_equal_rendered_prompts_are_said_beside_a_silent_regression():
    baseline = record(1, {"a": passes("a", comp(IDS)), "b": passes("b", comp(IDS))})
    current = record(2, {"a": passes("a", comp(IDS)), "b": passes("b", comp([11, 12, 13, 14, 99]))})
    report = judge_run(current, baseline)
    assert report.prompts == PromptCounts(compared=2, equal=2)
    assert Report.from_dict(json.loads(json.dumps(report.to_dict()))).prompts == report.prompts


def test_logprob_only_difference_against_baseline_is_a_silent_regression():
    lps = [-0.5, -1.5, -2.5, -3.5, -4.5]
    changed = list(lps)
    changed[4] = flip_last_bit(changed[4])
    baseline = record(1, {"a": passes("a", comp(IDS, lps))})
    current = record(2, {"a": passes("a", comp(IDS, changed))})
    v = by_key(judge_run(current, baseline))["a"]
    assert v.verdict == "silent_regression"
    assert (v.divergence.kind, v.divergence.position) == ("logprob", 4)


def test_length_difference_against_baseline():
    baseline = record(1, {"a": passes("a", comp(IDS))})
    current = record(2, {"a": passes("a", comp(IDS[:4]))})
    v = by_key(judge_run(current, baseline))["a"]
    assert (v.verdict, v.divergence.kind, v.divergence.position) == ("silent_regression", "length", 4)


def test_changed_model_explains_the_change():
    baseline = record(1, {"a": passes("a", comp(IDS)), "b": passes("b", comp(IDS))})
    current = record(2, {"a": passes("a", comp(IDS)), "b": passes("b", comp([0] + IDS[1:]))},
                     fp=fingerprint(model={"files": {"model.safetensors": "new"}}))
    report = judge_run(current, baseline)
    v = by_key(report)
    assert report.changed_components == ["model"]
    assert "a" not in v and report.counts["stable"] == 1  # equal outputs stay stable even when the model changed
    assert v["b"].verdict == "explained_change" and v["b"].components == ["model"]
    assert report.exit_code == ExitCode.PASS
    assert Report(**{**report.__dict__, "strict": True}).exit_code == ExitCode.REGRESSION


def test_changed_suite_hash_explains_only_that_request():
    baseline = record(1, {"a": passes("a", comp(IDS)), "b": passes("b", comp(IDS))})
    # The whole `suite` component differs (b's text changed), but only b's own request hash changed.
    current = record(2, {"a": passes("a", comp([1] + IDS[1:])), "b": passes("b", comp([2] + IDS[1:]))},
                     fp=fingerprint(suite={"requests": {"a": "h-a", "b": "h-b2"}}),
                     request_hashes={"b": "h-b2"})
    report = judge_run(current, baseline)
    v = by_key(report)
    assert report.changed_components == []  # `suite` is judged per request, never stack-wide
    assert v["a"].verdict == "silent_regression" and v["a"].components == []
    assert v["b"].verdict == "explained_change" and v["b"].components == ["suite"]
    assert report.exit_code == ExitCode.REGRESSION


def test_stack_change_and_own_suite_change_are_both_listed():
    baseline = record(1, {"a": passes("a", comp(IDS))})
    current = record(2, {"a": passes("a", comp(IDS[::-1]))}, fp=fingerprint(engine={"dtype": "bf16"}),
                     request_hashes={"a": "changed"})
    v = by_key(judge_run(current, baseline))["a"]
    assert v.verdict == "explained_change" and v.components == ["engine", "suite"]


def test_new_and_missing_requests():
    baseline = record(1, {"a": passes("a", comp(IDS)), "gone": passes("gone", comp(IDS))})
    current = record(2, {"a": passes("a", comp(IDS)), "added": passes("added", comp(IDS))})
    report = judge_run(current, baseline)
    v = by_key(report)
    assert v["added"].verdict == "new" and v["added"].components == ["suite"]
    assert v["gone"].verdict == "missing" and v["gone"].components == ["suite"]
    assert v["gone"].location == "prompts.jsonl:2"  # from the baseline's request
    assert report.counts == {"stable": 1, "batch_variance": 0, "silent_regression": 0, "explained_change": 0,
                             "new": 1, "missing": 1}
    assert report.exit_code == ExitCode.PASS
    strict = judge_run(current, baseline, Judging(strict=True))
    assert strict.exit_code == ExitCode.REGRESSION
    assert {x.key for x in strict.failing} == {"added", "gone"}


@pytest.mark.parametrize("verdict, normal, strict", [
    ("stable", 0, 0),
    ("batch_variance", 1, 1),
    ("silent_regression", 1, 1),
    ("explained_change", 0, 1),
    ("new", 0, 1),
    ("missing", 0, 1),
])
def test_exit_codes_per_verdict(verdict, normal, strict):
    def report(is_strict):
        return Report(kind="check", suite_name="s", run_id=2, baseline_run_id=1,
                      verdicts=[RequestVerdict("a", "stable"), RequestVerdict("b", verdict)],
                      changed_components=[], strict=is_strict)

    assert int(report(False).exit_code) == normal
    assert int(report(True).exit_code) == strict
    assert report(True).status == ("regression" if strict else "pass")


def test_report_to_dict_schema():
    baseline = record(1, {"a": passes("a", comp(IDS)), "b": passes("b", comp(IDS))})
    fp = fingerprint(engine={"batch_invariance": {"requested": True, "in_force": False, "reason": "cpu"}})
    current = record(7, {"a": passes("a", comp(IDS)), "b": passes("b", comp([0] + IDS[1:]))}, fp=fp,
                     suite_name="mysuite")
    d = judge_run(current, baseline, Judging(strict=True)).to_dict()
    assert d["schema"] == REPORT_SCHEMA == "evalgate.report/1"
    assert (d["kind"], d["suite"], d["run_id"], d["baseline_run_id"]) == ("check", "mysuite", 7, 1)
    assert (d["status"], d["exit_code"], d["strict"], d["promoted"]) == ("regression", 1, True, False)
    assert list(d["counts"]) == list(VERDICTS)
    assert d["changed_components"] == ["engine"]
    assert d["batch_invariance"] == {"requested": True, "in_force": False, "reason": "cpu"}
    assert [r["key"] for r in d["requests"]] == ["b"]  # stable requests are left out
    assert set(d["requests"][0]) == {"key", "verdict", "location", "divergence", "passes", "components", "factor",
                                     "bits_only", "kinds", "max_delta", "flip", "across", "prompt"}
    assert d["requests"][0]["across"] is None and d["hardware"] is None  # one hardware class
    assert d["requests"][0]["divergence"]["position"] == 0
    json.dumps(d, allow_nan=False)


# --- properties ------------------------------------------------------------------------------------------

finite_lp = st.floats(min_value=-30.0, max_value=0.0, allow_nan=False, allow_infinity=False)


@st.composite
def runs(draw):
    """Baseline outputs for a few requests, and a check run where some requests have one change."""
    n = draw(st.integers(1, 6))
    base: dict[str, tuple[list[int], list[float]]] = {}
    for i in range(n):
        length = draw(st.integers(1, 12))
        ids = draw(st.lists(st.integers(0, 50_000), min_size=length, max_size=length))
        lps = draw(st.lists(finite_lp, min_size=length, max_size=length))
        base[f"req-{i}"] = (ids, lps)
    changes = {}  # key -> (position, "token" | "logprob")
    for key, (ids, _) in base.items():
        if draw(st.booleans()):
            changes[key] = (draw(st.integers(0, len(ids) - 1)), draw(st.sampled_from(["token", "logprob"])))
    seed = draw(st.integers(0, 2**32 - 1))
    return base, changes, seed


def mutate(ids, lps, position, kind):
    ids, lps = list(ids), list(lps)
    if kind == "token":
        ids[position] = ids[position] + 1
    else:
        lps[position] = flip_last_bit(lps[position])
    return ids, lps


def build(base, changes, order, run_id, changed_pass=None):
    outputs = {}
    for key in order:
        ids, lps = base[key]
        if key in changes and changed_pass is None:
            ids, lps = mutate(ids, lps, *changes[key])
        cs = [comp(ids, lps), comp(ids, lps)]
        if key in changes and changed_pass is not None:
            cs[changed_pass] = comp(*mutate(ids, lps, *changes[key]))
        outputs[key] = passes(key, *cs)
    return record(run_id, outputs)


def summary(report):
    return {v.key: (v.verdict, to_json(v.divergence), v.passes, v.components)
            for v in report.verdicts}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs())
def test_property_order_independent_and_exact_position(data):
    base, changes, seed = data
    keys = list(base)
    shuffled = list(keys)
    random.Random(seed).shuffle(shuffled)

    baseline = build(base, {}, keys, 1)
    current = build(base, changes, keys, 2)
    report = judge_run(current, baseline)
    # The same requests arriving in another order (in both runs) get the same verdicts.
    reordered = judge_run(build(base, changes, shuffled, 2), build(base, {}, shuffled[::-1], 1))
    assert summary(report) == summary(reordered)
    assert report.counts == reordered.counts and report.exit_code == reordered.exit_code

    assert report.counts["stable"] == len(keys) - len(changes)
    for key in keys:
        if key not in changes:
            assert key not in summary(report)  # stable: counted, not listed
            continue
        v = summary(report)[key]
        position, kind = changes[key]
        assert v[0] == "silent_regression"
        assert (v[1]["position"], v[1]["kind"]) == (position, kind)
    assert report.exit_code == (ExitCode.REGRESSION if changes else ExitCode.PASS)

    # The same single change between two passes of one run is batch variance at the same position.
    variance = judge_run(build(base, changes, shuffled, 3, changed_pass=1), None)
    for key, (position, kind) in changes.items():
        v = by_key(variance)[key]
        assert v.verdict == "batch_variance"
        assert (v.divergence.position, v.divergence.kind) == (position, kind)
        assert v.passes["other_pass"] == 1


# --- many pairs at once -----------------------------------------------------------------------------------


def plain_comparison(a: Completion, b: Completion) -> tuple:
    """The comparison written position by position on Python lists: the reference for the array version."""
    ids_a, ids_b, lps_a, lps_b = (a.output_ids.tolist(), b.output_ids.tolist(), a.logprobs.tolist(), b.logprobs.tolist())
    found = None
    if a.digest != b.digest:
        n = min(len(ids_a), len(ids_b))
        m = min(len(lps_a), len(lps_b))
        token = next((i for i in range(n) if ids_a[i] != ids_b[i]), None)
        bit = next((i for i in range(m) if struct.pack("<d", lps_a[i]) != struct.pack("<d", lps_b[i])), None)
        if token is not None:
            found = (token, "token")
        elif len(ids_a) != len(ids_b):
            found = (n, "length")
        elif bit is not None:
            found = (bit, "logprob")
        elif len(lps_a) != len(lps_b):
            found = (m, "logprob")
    d = min(len(ids_a), len(ids_b), len(lps_a), len(lps_b))
    deltas = [abs(lps_a[i] - lps_b[i]) for i in range(d) if ids_a[i] == ids_b[i]]
    return found, max(deltas) if deltas else 0.0


few_ids = st.lists(st.integers(min_value=0, max_value=3), max_size=6)
odd_lps = st.sampled_from([-0.5, -1.0, -0.0, 0.0, float("-inf"), float("nan"), -1e-300, -0.5000000000000001])


@settings(max_examples=300, deadline=None)
@example(pairs=[([0, 0], [-0.5, -0.5], [0, 0], [float("nan"), -0.5])])  # a NaN first ranks first
@example(pairs=[([0, 0], [float("nan"), -0.5], [0, 0], [-0.5, -0.5]), ([1], [-1.0], [1, 2], [-1.0])])
@given(st.lists(st.tuples(few_ids, st.lists(odd_lps, max_size=6), few_ids, st.lists(odd_lps, max_size=6)),
                min_size=1, max_size=8))
def test_many_pairs_compared_at_once_as_each_alone(pairs):
    """`compare_outputs` works on all pairs' arrays together: each pair gets what a position-by-position
    comparison of it alone gives (lengths, uneven logprobs, NaN first or later, -0.0, infinities)."""
    from evalgate.judgement.compare import compare_outputs

    made = [(Completion("r", [1], ia, la, [], [], [], "", "length"), Completion("r", [1], ib, lb, [], [], [], "", "length"))
            for ia, la, ib, lb in pairs]
    for (a, b), got in zip(made, compare_outputs(made)):
        found, delta = plain_comparison(a, b)
        assert (None if got.position is None else (got.position, got.kind)) == found
        assert struct.pack("<d", got.max_delta) == struct.pack("<d", delta) or (got.max_delta != got.max_delta and delta != delta)


# --- conditions: each pass differs from its reference in one factor -------------------------------------

PLAN = {"passes": [p.to_dict() for p in plan_passes(Schedule(concurrency=(1, 8), shuffles=1))]}
# pass 0: c=1 cold (reference) · 1: c=1 hot (prefix_cache) · 2: c=8 cold (batch_size) · 3: c=8 shuffled (order)


def planned(key: str, *completions: Completion) -> list[Completion]:
    for p, c in zip(PLAN["passes"], completions):
        c.key, c.pass_index, c.concurrency = key, p["index"], p["concurrency"]
    return list(completions)


OTHER = [11, 12, 99, 14, 15]


def test_a_difference_is_attributed_to_the_one_factor_its_pass_changed():
    current = record(2, {
        "same": planned("same", comp(IDS), comp(IDS), comp(IDS), comp(IDS)),
        "cache": planned("cache", comp(IDS), comp(OTHER), comp(IDS), comp(IDS)),
        "batch": planned("batch", comp(IDS), comp(IDS), comp(OTHER), comp(OTHER)),  # the shuffle agrees with c=8
        "order": planned("order", comp(IDS), comp(IDS), comp(IDS), comp(OTHER)),
    }, schedule=PLAN)
    report = judge_run(current, None, Judging("baseline"))
    v = by_key(report)
    assert "same" not in v and report.counts["stable"] == 1
    assert (v["cache"].verdict, v["cache"].factor) == ("batch_variance", "prefix_cache")
    assert (v["batch"].factor, v["batch"].passes["factors"]) == ("batch_size", ["batch_size"])
    assert (v["order"].factor, v["order"].passes["other_pass"], v["order"].passes["reference_pass"]) == ("order", 3, 2)
    summary = {f.comparison: f.differing for f in report.factors}
    assert summary == {"prefix cache cold→hot": 1, "batch size 1→8": 1, "order (seed 0) at batch size 8": 1}
    assert report.to_dict()["requests"][0]["factor"] == "prefix_cache"
    assert report.cache_hits == [CacheHits(1, hit=0, missed=0, unknown=4)]  # comp() records no cache count


def test_a_request_varying_under_two_factors_names_both():
    current = record(2, {"k": planned("k", comp(IDS), comp(OTHER), comp([0] + IDS[1:]), comp([0] + IDS[1:]))},
                     schedule=PLAN)
    v = by_key(judge_run(current, None))["k"]
    assert v.factor == "prefix_cache" and v.passes["factors"] == ["prefix_cache", "batch_size"]
    assert v.passes["differing_passes"] == 2


def test_a_comparison_with_no_request_in_both_passes_is_never_invariant():
    from evalgate.reports.explain import factor_lines

    # pass 2 (batch size) ran nothing: its comparison is not evidence of invariance
    current = record(2, {"k": planned("k", comp(IDS), comp(IDS))}, schedule={"passes": PLAN["passes"][:3]})
    report = judge_run(current, None)
    assert [(f.pass_, f.compared, f.differing) for f in report.factors] == [(1, 1, 0), (2, 0, 0)]
    lines = factor_lines(report.factors)
    assert lines == ["invariant under: prefix cache cold→hot",
                     "not exercised: batch size 1→8 (no request ran in both passes)"]


def test_hot_pass_cache_hits_are_counted_from_the_engine():
    outs = {}
    for key, cached in (("hit", 128), ("miss", 0)):
        cs = planned(key, comp(IDS), comp(IDS), comp(IDS), comp(IDS))
        cs[1].cached_tokens = cached
        outs[key] = cs
    report = judge_run(record(2, outs, schedule=PLAN), None)
    assert report.cache_hits == [CacheHits(1, hit=1, missed=1, unknown=0)]
    from evalgate.reports.explain import factor_lines

    assert any("1 of 2 requests were served from the prefix cache; 1 was not" in line
               for line in factor_lines(report.factors, report.cache_hits))


def test_baseline_comparison_is_per_condition():
    """Like with like: the baseline's hot pass with this run's hot pass, cold with cold."""
    baseline = record(1, {"k": planned("k", comp(IDS), comp(OTHER), comp(IDS), comp(IDS))}, schedule=PLAN)
    # the check's hot pass equals the baseline's hot pass, its cold passes the baseline's cold ones
    current = record(2, {"k": planned("k", comp(IDS), comp(OTHER), comp(IDS), comp(IDS))}, schedule=PLAN)
    # judged alone, each run has prefix-cache variance; against each other, every condition agrees
    assert by_key(judge_run(current, None))["k"].factor == "prefix_cache"
    report = judge_run(current, baseline)
    assert [(p.baseline_pass, p.current_pass) for p in report.baseline_pairs] == [(0, 0), (1, 1), (2, 2), (3, 3)]
    # a check whose hot pass departs from the baseline's hot pass (and agrees with its own cold pass)
    hot_only = {"passes": [p for p in PLAN["passes"] if p["index"] in (0, 1)]}
    current = record(3, {"k": planned("k", comp(IDS), comp(IDS))}, schedule=hot_only)
    v = by_key(judge_run(current, baseline))["k"]
    assert v.verdict == "silent_regression"
    assert v.passes == {"baseline_pass": 1, "pass": 1, "condition": "concurrency 1, given order, cache hot"}


def test_a_check_with_no_condition_in_common_compares_first_passes_and_says_so():
    baseline = record(1, {"k": planned("k", comp(IDS))}, schedule={"passes": PLAN["passes"][:1]})
    other = {"passes": [dict(PLAN["passes"][2], index=0, reference=None, factor=None)]}  # c=8 only
    current = record(2, {"k": passes("k", comp(IDS))}, schedule=other)
    report = judge_run(current, baseline)
    assert to_json(report.baseline_pairs) == [{"baseline_pass": 0, "current_pass": 0, "same_condition": False,
                                      "condition": "baseline concurrency 1, given order, cache cold vs "
                                                   "concurrency 8, given order, cache cold"}]
    assert report.verdicts == [] and report.counts["stable"] == 1


def test_a_run_recorded_before_conditions_still_judges_unattributed():
    old = {"passes": [{"index": 0, "concurrency": 1, "repeat": 0, "order_seed": None},
                      {"index": 1, "concurrency": 4, "repeat": 0, "order_seed": None}]}
    current = record(2, {"k": passes("k", comp(IDS), comp(OTHER))}, schedule=old)
    v = by_key(judge_run(current, None))["k"]
    assert (v.verdict, v.factor) == ("batch_variance", None)
    # and a new check against that old baseline compares the old first pass (cold) with the new reference
    baseline = record(1, {"k": passes("k", comp(IDS), comp(OTHER))}, schedule=old)
    current = record(3, {"k": planned("k", comp(IDS), comp(IDS), comp(IDS), comp(IDS))}, schedule=PLAN)
    report = judge_run(current, baseline)
    assert [(p.baseline_pass, p.current_pass) for p in report.baseline_pairs] == [(0, 0)]
    assert report.verdicts == [] and report.counts["stable"] == 1


def test_golden_json_fields_of_conditions():
    """Pins the fields docs/json-report.md documents for conditions and factors."""
    current = record(2, {"k": planned("k", comp(IDS), comp(OTHER), comp(IDS), comp(IDS))}, schedule=PLAN)
    d = judge_run(current, None, Judging("baseline")).to_dict()
    assert set(d) == {"schema", "kind", "suite", "run_id", "baseline_run_id", "status", "exit_code", "strict",
                      "promoted", "counts", "changed_components", "batch_invariance", "requests", "metrics",
                      "task_changes", "factors", "cache_hits", "baseline_pairs", "not_run", "alone_coverage",
                      "gate", "differences", "hardware", "classes", "fingerprint_changes", "hardware_class",
                      "hardware_label", "prompts", "template_date", "engine_log", "updates"}
    assert d["alone_coverage"] is None  # the full schedule; the rotating preset's: tests/plumbing/test_rotation.py
    assert d["factors"][0] == {"factor": "prefix_cache", "comparison": "prefix cache cold→hot", "reference_pass": 0,
                               "pass": 1, "differing": 1, "compared": 1, "requests": 1, "keys": ["k"]}
    assert [f["factor"] for f in d["factors"]] == ["prefix_cache", "batch_size", "order"]
    assert d["requests"][0]["factor"] == "prefix_cache"
    assert d["requests"][0]["passes"] == {"reference_pass": 0, "reference_concurrency": 1, "other_pass": 1,
                                          "other_concurrency": 1, "differing_passes": 1, "total_passes": 4,
                                          "factors": ["prefix_cache"]}
    assert d["cache_hits"] == [{"pass": 1, "hit": 0, "missed": 0, "unknown": 1}]
    assert d["baseline_pairs"] == [] and d["not_run"] == []
    json.dumps(d, allow_nan=False)


@pytest.mark.parametrize("dtype, margin, expected", [
    ("torch.bfloat16", 0.25, "near_tie"),  # two bf16 logit steps: measured within a run on SmolLM2 bf16
    ("torch.bfloat16", 0.3125, "confident"),
    ("torch.float32", 0.25, "confident"),  # fp32 numerics move logits by ~1e-5: a flip at 0.25 is the model
    ("torch.float32", 0.0005, "near_tie"),
])
def test_the_near_tie_margin_follows_the_dtype_and_is_recorded_resolved(dtype, margin, expected):
    lps = [-0.1, -0.1, -0.1]
    top = [[-0.1, -0.1 - 1.0], [-0.1, -0.1 - margin], [-0.1, -1.1]]
    fp, gate = fingerprint(engine={"dtype": dtype}), {"gate": {"fail_on": "bits", "near_tie_margin": None}}
    baseline = record(1, {"a": passes("a", comp([1, 2, 3], lps=lps, top=top))}, fp=fp, schedule=gate)
    current = record(2, {"a": passes("a", comp([1, 9, 3], lps=lps, top=top))}, fp=fp, schedule=gate)
    report = judge_run(current, baseline)
    (v,) = report.verdicts
    assert (v.verdict, v.flip) == ("silent_regression", expected)
    tie = {"torch.bfloat16": 0.25, "torch.float32": 1e-3}[dtype]
    assert report.policy.near_tie_margin == tie == report.to_dict()["gate"]["near_tie_margin"]


def test_a_run_recorded_before_keeps_its_margin_and_a_suites_own_wins():
    from evalgate.configuration.policy import GatePolicy

    assert GatePolicy.recorded(None).near_tie_margin == 0.1  # judged before the margin followed the dtype
    assert GatePolicy.recorded({"fail_on": "bits", "near_tie_margin": 0.1}).for_dtype("bfloat16").near_tie_margin == 0.1
    assert GatePolicy.recorded({"fail_on": "bits", "near_tie_margin": None}).for_dtype("bfloat16").near_tie_margin == 0.25
    assert GatePolicy(near_tie_margin=0.5).for_dtype("float32").near_tie_margin == 0.5
