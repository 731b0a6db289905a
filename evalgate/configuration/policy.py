"""The gate's judging policy (`[gate]`): what fails a run. A policy, never identity: it is recorded with
each run and shown in every report, and changing it changes no fingerprint.

- `fail_on = "bits"` (the default, the contract): any difference fails, down to one logprob bit.
- `fail_on = "tokens"`: a request whose token ids are all equal and only logprob bits differ is **drift**:
  reported (how many, the largest |Δ logprob|, the smallest margin) and not a failure. A token flip fails.
  For machines and endpoints without batch-invariant kernels (CPUs, GPUs without VLLM_BATCH_INVARIANT),
  where bits move with the batch on every request but what users see does not.

Every token flip is classed by the reference's top-1 minus top-2 logprob margin at the flip: a
`near_tie` (margin at most `near_tie_margin`: numerics tipped two almost equal candidates) or `confident`
(the model's preference really changed). Reports keep the two apart. By default the margin follows the
engine's dtype, as the cross-hardware ε does (the same figures, `HARDWARE_TOLERANCES`): bf16 margins come in
logit steps of 0.0625-0.125, and within one run flips were measured at 0, 0.125 and 0.25 (two steps), which a
fixed 0.1 called confident. It is resolved when a run is judged and recorded with it: a run keeps its labels.

Across hardware (a check judged against another hardware class's baseline, evalgate/judgement/hardware.py):
- `other_hardware = "judge"` (default): drift and near ties pass and are reported, confident flips fail;
  `"exact"` fails on any difference (stacks that claim device-independent kernels); `"refuse"` keeps exit 4.
- `tie_epsilon`: a flip is a near tie when this machine's rescoring puts the baseline's token within it of
  its own top token; `drift_cap`: the largest |Δ logprob| between the two classes that is still rounding.
  Both in nats, by default by the dtype (`HARDWARE_TOLERANCES`): a bf16 logit moves in steps of 0.0625-0.125
  at a small model's magnitudes, an fp32 one in steps a thousand times smaller.

lm-eval metrics (evalgate/judgement/paired.py): each metric row carries a paired test over the documents
both runs scored, "significant" at `metric_alpha` (default 0.05). `fail_on_metric = "significant_drop"`
fails a run whose metric got significantly worse, even where every token-level difference is explained
(a new model that is worse); by default metrics inform and never fail.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..codec import from_json
from .config import check_keys, fail

FAIL_ON = ("bits", "tokens")
FAIL_ON_METRIC = ("significant_drop",)
DEFAULT_METRIC_ALPHA = 0.05
OTHER_HARDWARE = ("judge", "exact", "refuse")
# (tie_epsilon, drift_cap) in nats per dtype, from the emulated classes (docs/conditions.md "Across hardware"):
# SmolLM2 fp32 rescorings of the same tokens differ by at most 2.7e-5 between instruction sets, bf16 by 0.23
# (AVX-512 BF16 matmuls vs AVX2), its flips at gaps of at most 0.125 (one bf16 step of a logit). So fp32: 40x
# its largest; bf16: two logit steps for ε, twice the largest for the cap; fp16 (3 more mantissa bits) 1/8 of bf16.
HARDWARE_TOLERANCES = {"float32": (1e-3, 1e-3), "float16": (0.03, 0.06), "bfloat16": (0.25, 0.5)}
UNKNOWN_DTYPE = "bfloat16"  # a server that does not say: the widest (what GPU serving mostly runs)
# nats: the margin runs were judged under before it followed the dtype (their recorded policy may not name it)
LEGACY_NEAR_TIE_MARGIN = 0.1
BITS_ONLY = "logprob"  # the divergence kind of a difference in logprob bits alone (compare.Divergence)


def dtype_name(dtype: str | None) -> str:
    """"torch.bfloat16", "bf16", "half" -> a key of HARDWARE_TOLERANCES."""
    text = (dtype or "").lower().replace("torch.", "")
    aliases = {"bf16": "bfloat16", "half": "float16", "fp16": "float16", "float": "float32", "fp32": "float32"}
    text = aliases.get(text, text)
    return text if text in HARDWARE_TOLERANCES else UNKNOWN_DTYPE


@dataclass(frozen=True)
class Tolerance:
    """What rounding across two hardware classes may do, in nats (policy.py docstring)."""

    epsilon: float
    cap: float
    dtype: str


@dataclass(frozen=True)
class GatePolicy:
    fail_on: str = "bits"
    near_tie_margin: float | None = None  # None: by the engine's dtype (its tie ε, HARDWARE_TOLERANCES)
    other_hardware: str = "judge"
    tie_epsilon: float | None = None  # None: by the engine's dtype (HARDWARE_TOLERANCES)
    drift_cap: float | None = None
    metric_alpha: float = DEFAULT_METRIC_ALPHA  # a metric's paired test is significant below it
    fail_on_metric: str | None = None  # "significant_drop": a metric significantly worse fails the run

    def tolerance(self, dtype: str | None) -> Tolerance:
        """ε and the cap for an engine of this dtype: the suite's where it sets them, else the dtype's."""
        name = dtype_name(dtype)
        epsilon, cap = HARDWARE_TOLERANCES[name]
        return Tolerance(epsilon if self.tie_epsilon is None else self.tie_epsilon,
                         cap if self.drift_cap is None else self.drift_cap, name)

    def fails(self, kinds: set[str]) -> bool:
        """Whether differences of these divergence kinds fail the gate under this policy."""
        return bool(kinds) and (self.fail_on == "bits" or bool(kinds - {BITS_ONLY}))

    def for_dtype(self, dtype: str | None) -> GatePolicy:
        """The policy with `near_tie_margin` resolved for an engine of this dtype (the suite's, else the tie ε
        of the dtype): what a run is judged under and recorded with."""
        if self.near_tie_margin is not None:
            return self
        return replace(self, near_tie_margin=self.tolerance(dtype).epsilon)

    def flip_class(self, kind: str | None, margin: float | None) -> str | None:
        """`near_tie` or `confident` for a token flip; None for anything else (or an unknown margin)."""
        if kind != "token" or margin is None:
            return None
        limit = self.near_tie_margin if self.near_tie_margin is not None else self.tolerance(None).epsilon
        return "near_tie" if margin <= limit else "confident"

    @classmethod
    def from_older(cls, data: dict) -> dict:
        """A recorded policy (the codec, evalgate/codec.py): runs recorded before `[gate]` were judged on bits,
        and before the margin followed the dtype, at a near-tie margin of 0.1."""
        return {"near_tie_margin": LEGACY_NEAR_TIE_MARGIN, **data}

    @classmethod
    def recorded(cls, data: dict | None) -> GatePolicy:
        """The policy a run was judged under, as its schedule or report recorded it (none: the oldest runs')."""
        return from_json(cls, data or {})


GATE_KEYS = ("fail_on", "near_tie_margin", "other_hardware", "tie_epsilon", "drift_cap", "metric_alpha", "fail_on_metric")


def _nats(table: dict, key: str, default, where: str, prefix: str, example: str):
    value = table.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise fail(where, f"`{prefix}gate.{key}` must be a number >= 0 (nats), got {value!r}", f"e.g. {key} = {example}")
    return float(value)


def parse_gate_table(table: dict, where: str, prefix: str = "") -> GatePolicy:
    check_keys(table, set(GATE_KEYS), where, f"{prefix}gate.")
    fail_on = table.get("fail_on", "bits")
    if fail_on not in FAIL_ON:
        raise fail(where, f"`{prefix}gate.fail_on` must be \"bits\" or \"tokens\", got {fail_on!r}",
                   'fail_on = "tokens" lets logprob-bit drift pass and fails token flips (docs/suite.md)')
    margin = _nats(table, "near_tie_margin", None, where, prefix, "0.25")
    other = table.get("other_hardware", "judge")
    if other not in OTHER_HARDWARE:
        raise fail(where, f"`{prefix}gate.other_hardware` must be \"judge\", \"exact\" or \"refuse\", got {other!r}",
                   'other_hardware = "judge" judges a check against another hardware class\'s baseline (docs/suite.md)')
    alpha = table.get("metric_alpha", DEFAULT_METRIC_ALPHA)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        raise fail(where, f"`{prefix}gate.metric_alpha` must be a number between 0 and 1, got {alpha!r}",
                   "metric_alpha = 0.05: a metric moved significantly when its paired test's p-value is below it")
    on_metric = table.get("fail_on_metric")
    if on_metric is not None and on_metric not in FAIL_ON_METRIC:
        raise fail(where, f"`{prefix}gate.fail_on_metric` must be \"significant_drop\", got {on_metric!r}",
                   'fail_on_metric = "significant_drop" fails a run whose lm-eval metric got significantly worse; '
                   "leave it out and metrics never fail a run")
    return GatePolicy(fail_on, margin, other, _nats(table, "tie_epsilon", None, where, prefix, "0.25"),
                      _nats(table, "drift_cap", None, where, prefix, "0.5"), float(alpha), on_metric)
