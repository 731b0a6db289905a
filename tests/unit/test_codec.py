"""The one codec of typed rows (evalgate/codec.py): what the Report and every row in it are stored and read by."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from evalgate.codec import from_json, omitted, stored_as, to_json
from evalgate.configuration.policy import GatePolicy, Tolerance
from evalgate.judgement.hardware import AcrossHardware, Flip
from evalgate.judgement.report import BatchInvariance, ClassRow
from evalgate.judgement.verdict import RequestVerdict


@dataclass(frozen=True)
class Inner:
    pass_: int = stored_as("pass")
    kinds: frozenset = frozenset()


@dataclass(frozen=True)
class Outer:
    name: str
    rows: list[Inner] = field(default_factory=list)
    by_name: dict[str, Inner] = field(default_factory=dict)
    one: Inner | None = None
    note: str | None = omitted()


def test_rows_round_trip_through_json_with_renamed_keys_nested_rows_and_sets():
    value = Outer("a", [Inner(1, frozenset({"token", "logprob"}))], {"x": Inner(2)}, Inner(3))
    stored = json.loads(json.dumps(to_json(value)))
    assert stored == {"name": "a", "rows": [{"pass": 1, "kinds": ["logprob", "token"]}],
                      "by_name": {"x": {"pass": 2, "kinds": []}}, "one": {"pass": 3, "kinds": []}}
    assert from_json(Outer, stored) == value


def test_an_omitted_field_is_left_out_while_none_and_older_or_newer_keys_read_back():
    assert "note" not in to_json(Outer("a")) and to_json(Outer("a", note="n"))["note"] == "n"
    assert from_json(Outer, {"name": "a", "a key of a newer evalgate": 1}) == Outer("a")  # unknown: ignored
    with pytest.raises(ValueError, match="Outer lacks name"):
        from_json(Outer, {"rows": []})


def test_the_report_rows_keep_the_json_contract():
    verdict = RequestVerdict("k", "batch_variance", kinds=frozenset({"logprob"}))
    stored = to_json(verdict)
    assert stored["bits_only"] is True and "adapter" not in stored  # derived for readers; only under an adapter
    assert from_json(RequestVerdict, stored) == verdict
    # a verdict stored before `kinds`: read from `bits_only`
    assert from_json(RequestVerdict, {"key": "k", "verdict": "batch_variance", "bits_only": True}).kinds == {"logprob"}
    flip = Flip("k", "near_tie", 3, "token", {"id": 1}, {"id": 2}, 0.1, 0.2, 0.05)
    assert to_json(flip)["class"] == "near_tie" and from_json(Flip, to_json(flip)) == flip
    assert to_json(BatchInvariance()) == {} and not BatchInvariance().known  # `{}`: the engine did not say
    assert to_json(BatchInvariance(True, True, "", "evalgate-cpu-kernels/2"))["kernels"] == "evalgate-cpu-kernels/2"
    assert "kernels" not in to_json(BatchInvariance(False, False, "not requested"))
    # the oldest runs recorded no [gate]: judged on bits at a near-tie margin of 0.1
    assert GatePolicy.recorded(None) == GatePolicy(near_tie_margin=0.1)
    row = ClassRow("c1", "cpu", 5, 4, "pass", {"stable": 2}, None)
    assert from_json(ClassRow, json.loads(json.dumps(to_json(row)))) == row
    across = AcrossHardware("b", "avx2", "h", "amx", "judge", Tolerance(1e-3, 1e-3, "float32"),
                            {"identical": 1, "near_tie": 1}, 2, None, [flip])
    again = from_json(AcrossHardware, json.loads(json.dumps(to_json(across))))
    assert again == across and isinstance(again.tolerance, Tolerance) and isinstance(again.flips[0], Flip)
