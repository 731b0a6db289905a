"""Did the metric move? (evalgate/judgement/paired.py): McNemar's exact test on a binary metric's flipped
documents, a paired permutation test otherwise, the direction from lm-eval's registry, and the gate's
`fail_on_metric` on a planted significant drop."""

from __future__ import annotations

import math
import random

import pytest
from scipy.stats import binomtest, permutation_test

from evalgate.configuration.policy import GatePolicy, parse_gate_table
from evalgate.errors import ConfigError
from evalgate.judgement.paired import PairedTest, higher_is_better, paired_test
from evalgate.judgement.report import Report
from evalgate.judgement.scores import MetricRow


def binary(up: int, down: int, same: int) -> list[tuple[float, float]]:
    return [(0.0, 1.0)] * up + [(1.0, 0.0)] * down + [(1.0, 1.0)] * same


def test_mcnemar_exact_on_planted_flips_equals_the_binomial_test():
    # 1 document up, 8 down, 41 unchanged: p = 2 * (C(9,0) + C(9,1)) / 2^9, by hand and by scipy
    result = paired_test(binary(1, 8, 41), 0.05, True)
    by_hand = 2 * (math.comb(9, 0) + math.comb(9, 1)) / 2 ** 9
    assert result.p_value == pytest.approx(by_hand) == pytest.approx(binomtest(1, 9, 0.5).pvalue)
    assert (result.test, result.documents, result.up, result.down) == ("mcnemar_exact", 50, 1, 8)
    assert result.significant and result.direction == "down" and result.drop
    # two flips of fifty: a change of 0.04 that is no signal
    small = paired_test(binary(0, 2, 48), 0.05, True)
    assert small.p_value == pytest.approx(0.5) and not small.significant and not small.drop
    assert paired_test(binary(0, 0, 10), 0.05, True).p_value == 1.0
    assert paired_test([], 0.05, True) is None


def test_a_continuous_metric_is_tested_by_paired_permutation():
    rng = random.Random(3)
    shifted = [(a, a + 0.5 + rng.gauss(0, 0.1)) for a in (rng.uniform(5, 9) for _ in range(20))]
    result = paired_test(shifted, 0.05, False)  # a perplexity: lower is better, it rose
    assert result.test == "sign_flip_permutation" and result.up == 20 and result.drop
    assert result.p_value < 0.001
    same = [(a, a + rng.choice([-1, 1]) * 0.01) for a in (rng.uniform(5, 9) for _ in range(12))]
    result = paired_test(same, 0.05, False)
    import numpy as np

    expected = permutation_test((np.array([b for _, b in same]), np.array([a for a, _ in same])),
                                lambda x, y, axis: np.mean(x - y, axis=axis), vectorized=True,
                                permutation_type="samples", n_resamples=9_999, random_state=0).pvalue
    assert result.p_value == pytest.approx(expected) and not result.drop


def test_the_direction_of_better_comes_from_lm_eval():
    assert higher_is_better("acc,none") is True and higher_is_better("exact_match,strip") is True
    assert higher_is_better("word_perplexity,none") is False and higher_is_better("no_such_metric,none") is None
    up = paired_test(binary(9, 0, 1), 0.05, True)
    assert up.direction == "up" and not up.drop  # better
    assert not paired_test(binary(0, 9, 1), 0.05, None).drop  # no known direction: never a drop


def report_with(paired: PairedTest, policy: GatePolicy) -> Report:
    row = MetricRow("t", "acc,none", 0.9, 0.5, -0.4, moved=[], paired=paired)
    return Report(kind="check", suite_name="s", run_id=2, baseline_run_id=1, verdicts=[], changed_components=["model"],
                  batch_invariance={}, metrics=[row], policy=policy)


def test_a_planted_significant_drop_fails_only_under_fail_on_metric():
    drop = paired_test(binary(0, 20, 30), 0.05, True)
    assert report_with(drop, GatePolicy()).exit_code == 0  # metrics inform by default
    failing = report_with(drop, GatePolicy(fail_on_metric="significant_drop"))
    assert int(failing.exit_code) == 1 and failing.status == "regression" and len(failing.failing_metrics) == 1
    noise = paired_test(binary(1, 2, 47), 0.05, True)
    assert report_with(noise, GatePolicy(fail_on_metric="significant_drop")).exit_code == 0
    # alpha decides what is significant
    assert not paired_test(binary(1, 8, 41), 0.01, True).significant


def test_bad_metric_policy_is_refused_naming_the_field():
    assert parse_gate_table({"metric_alpha": 0.01, "fail_on_metric": "significant_drop"}, "s.toml") == \
        GatePolicy(metric_alpha=0.01, fail_on_metric="significant_drop")
    for table, field in (({"metric_alpha": 1.5}, "gate.metric_alpha"), ({"metric_alpha": True}, "gate.metric_alpha"),
                         ({"fail_on_metric": "any_drop"}, "gate.fail_on_metric")):
        with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
            parse_gate_table(table, "s.toml")
