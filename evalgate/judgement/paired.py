"""Did the metric move? A paired test of one lm-eval metric over the documents both runs scored.

A change of 0.04 in a task's accuracy over 50 documents may be two documents that flipped, or noise; only
the documents tell. evalgate knows each document's value on both sides, so it tests the pairs:

- a **binary** metric (every document 0 or 1: `acc`, `exact_match`): McNemar's exact test. Only the
  documents that flipped count, `up` (0 → 1) and `down` (1 → 0); with no real change each flip is a fair
  coin, so the p-value is the two-sided binomial test of `up` in `up + down` (`scipy.stats.binomtest`);
- any other metric (a perplexity, a score): a paired sign-flip permutation test of the mean per-document
  difference (`scipy.stats.permutation_test`: exact for up to 13 documents, 9,999 seeded resamples beyond),
  `up` and `down` counting the documents whose value rose and fell.

"significant" is p < `[gate] metric_alpha` (default 0.05). Whether a move is a **drop** (worse) follows
lm-eval's `higher_is_better` for the metric (its registry; unknown: no direction, never a drop).
scipy comes with lm-eval (scikit-learn's dependency); it is imported only when there are metrics to test.
"""

from __future__ import annotations

from dataclasses import dataclass

RESAMPLES = 9_999
SEED = 0  # permutation tests are seeded: a run's report is the same every time it is judged


@dataclass(frozen=True)
class PairedTest:
    """A metric's paired test (a report row's `paired`): which test, over how many documents, how many moved
    up and down, its p-value, whether that is significant at `alpha`, which way, and whether it is worse."""

    test: str  # mcnemar_exact | sign_flip_permutation
    documents: int
    up: int
    down: int
    p_value: float
    alpha: float
    significant: bool
    direction: str | None  # up | down | None (not significant)
    drop: bool


def paired_test(pairs: list[tuple[float, float]], alpha: float, higher_is_better: bool | None) -> PairedTest | None:
    """The test of a metric's per-document (baseline, current) values. None without documents on both sides."""
    pairs = [(float(a), float(b)) for a, b in pairs if a is not None and b is not None]
    if not pairs:
        return None
    up = sum(b > a for a, b in pairs)
    down = sum(b < a for a, b in pairs)
    binary = all(v in (0.0, 1.0) for pair in pairs for v in pair)
    if up + down == 0:
        p_value = 1.0
    elif binary:
        from scipy.stats import binomtest

        p_value = float(binomtest(up, up + down, 0.5).pvalue)
    else:
        p_value = _sign_flip_p(pairs)
    significant = p_value < alpha
    direction = _direction(pairs, up, down, binary) if significant else None
    drop = bool(direction and higher_is_better is not None and (direction == "down") == higher_is_better)
    return PairedTest("mcnemar_exact" if binary else "sign_flip_permutation", len(pairs), up, down, p_value, alpha,
                      significant, direction, drop)


def _sign_flip_p(pairs: list[tuple[float, float]]) -> float:
    import numpy as np
    from scipy.stats import permutation_test

    before = np.array([a for a, _ in pairs])
    after = np.array([b for _, b in pairs])
    result = permutation_test((after, before), lambda x, y, axis: np.mean(x - y, axis=axis), vectorized=True,
                              permutation_type="samples", n_resamples=RESAMPLES, random_state=SEED)
    return float(result.pvalue)


def _direction(pairs, up: int, down: int, binary: bool) -> str | None:
    if binary:
        return "up" if up > down else "down"
    mean = sum(b - a for a, b in pairs) / len(pairs)
    return "up" if mean > 0 else "down" if mean < 0 else None


def higher_is_better(metric: str) -> bool | None:
    """lm-eval's direction for a metric (`acc,none` → `acc`): True, False, or None when lm-eval does not know it."""
    try:
        import lm_eval.api.metrics  # noqa: F401  (fills the registry)
        from lm_eval.api.registry import higher_is_better_registry
    except ImportError:  # lm-eval suites run with lm-eval installed; a report read elsewhere has no direction
        return None
    try:
        return bool(higher_is_better_registry.get(metric.split(",", 1)[0]))
    except KeyError:  # a task's own metric: lm-eval's registry does not know which way is better
        return None
