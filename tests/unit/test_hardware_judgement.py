"""judgement/hardware.py's rules on hand-made records: the classes at their edges, and what counts as the
machine. The gate end to end: tests/plumbing/test_hardware.py (fake engine), tests/e2e/test_e2e_hardware.py
(vLLM against plain vLLM's rescorings)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from evalgate.configuration.policy import GatePolicy, Tolerance, dtype_name
from evalgate.judgement.compare import first_divergence
from evalgate.judgement.hardware import classify, gap_to_top, machine_bound, position_deltas
from evalgate.records import Completion
from evalgate.store import RunRecord

TOL = Tolerance(epsilon=0.25, cap=0.5, dtype="bfloat16")


def comp(ids, lps, tops) -> Completion:
    """A completion whose row at each position is `tops[i]` (id, logprob pairs, best first)."""
    return Completion("k", [1, 2], np.array(ids), np.array(lps, dtype=np.float64),
                      np.array([[t for t, _ in row] for row in tops]), np.array([[lp for _, lp in row] for row in tops]),
                      [str(t) for t in ids], "", "length")


def test_a_flip_is_a_near_tie_within_epsilon_of_the_top_and_confident_beyond():
    baseline = comp([5, 6, 7], [-0.1, -0.2, -0.3], [[(5, -0.1), (9, -2)], [(6, -0.2), (9, -2)], [(7, -0.3), (8, -0.4)]])
    here = comp([5, 6, 8], [-0.1, -0.2, -0.3], [[(5, -0.1), (9, -2)], [(6, -0.2), (9, -2)], [(8, -0.3), (7, -0.4)]])
    d = first_divergence(baseline, here)
    # this class's rescoring of the baseline's tokens: token 7 at 0.25 below its top (8) -> a near tie at ε
    rescored = comp([5, 6, 7], [-0.1, -0.2, -0.5], [[(5, -0.1), (9, -2)], [(6, -0.2), (9, -2)], [(8, -0.25), (7, -0.5)]])
    assert gap_to_top(rescored, 2) == 0.25
    assert classify(d, None, rescored, None, TOL) == ("near_tie", 0.25)
    assert classify(d, None, rescored, None, Tolerance(0.2, 0.5, "bfloat16"))[0] == "confident"
    # the rescorings disagree beyond the cap before the flip: not rounding
    there = comp([5, 6, 7], [-0.1, -0.9, -0.5], [[(5, -0.1), (9, -2)], [(6, -0.9), (9, -2)], [(7, -0.5), (8, -0.6)]])
    assert classify(d, None, rescored, position_deltas(rescored, there), TOL)[0] == "confident"
    assert classify(d, None, None, None, TOL) == ("confident", None)  # no rescoring: nothing says it is a tie


def test_drift_is_within_the_cap_on_both_the_decode_and_the_rescorings():
    a = comp([5], [-0.1], [[(5, -0.1), (9, -2)]])
    b = comp([5], [-0.3], [[(5, -0.3), (9, -2)]])
    d = first_divergence(a, b)
    assert classify(d, 0.2, a, None, TOL)[0] == "drift"
    assert classify(d, 0.6, a, None, TOL)[0] == "confident"
    far = comp([5], [-0.7], [[(5, -0.7), (9, -2)]])
    assert classify(d, 0.2, a, position_deltas(a, far), TOL)[0] == "confident"


def test_tolerances_follow_the_dtype_unless_the_suite_sets_them():
    assert dtype_name("torch.bfloat16") == "bfloat16" and dtype_name("half") == "float16"
    assert dtype_name(None) == "bfloat16"  # a server that does not say: the widest
    assert GatePolicy().tolerance("torch.float32") == Tolerance(1e-3, 1e-3, "float32")
    assert GatePolicy(tie_epsilon=0.01).tolerance("bfloat16") == Tolerance(0.01, 0.5, "bfloat16")


def record(engine: dict) -> RunRecord:
    return RunRecord(run=SimpleNamespace(id=1), fingerprint={"engine": {"data": engine}}, requests={})


def test_the_machine_decides_the_platform_and_thread_count_nothing_else():
    cpu = {"kind": "vllm", "dtype": "torch.bfloat16", "platform": "cpu", "torch_threads": 2}
    assert machine_bound(record(cpu), record({**cpu, "torch_threads": 16, "platform": "cuda"}))
    assert not machine_bound(record(cpu), record({**cpu, "dtype": "torch.float32"}))
