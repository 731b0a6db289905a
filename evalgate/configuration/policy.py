"""The gate's judging policy (`[gate]`): what fails a run. A policy, never identity: it is recorded with
each run and shown in every report, and changing it changes no fingerprint.

- `fail_on = "bits"` (the default, the contract): any difference fails, down to one logprob bit.
- `fail_on = "tokens"`: a request whose token ids are all equal and only logprob bits differ is **drift**:
  reported (how many, the largest |Δ logprob|, the smallest margin) and not a failure. A token flip fails.
  For machines and endpoints without batch-invariant kernels (CPUs, GPUs without VLLM_BATCH_INVARIANT),
  where bits move with the batch on every request but what users see does not.

Every token flip is classed by the reference's top-1 minus top-2 logprob margin at the flip: a
`near_tie` (margin under `near_tie_margin`: numerics tipped two almost equal candidates) or `confident`
(the model's preference really changed). Reports keep the two apart.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from .config import check_keys, fail

FAIL_ON = ("bits", "tokens")
DEFAULT_NEAR_TIE_MARGIN = 0.1  # nats: below it a flip is a numerics coin toss rather than a changed preference
BITS_ONLY = "logprob"  # the divergence kind of a difference in logprob bits alone (compare.Divergence)


@dataclass(frozen=True)
class GatePolicy:
    fail_on: str = "bits"
    near_tie_margin: float = DEFAULT_NEAR_TIE_MARGIN

    def fails(self, kinds: set[str]) -> bool:
        """Whether differences of these divergence kinds fail the gate under this policy."""
        return bool(kinds) and (self.fail_on == "bits" or bool(kinds - {BITS_ONLY}))

    def flip_class(self, kind: str | None, margin: float | None) -> str | None:
        """`near_tie` or `confident` for a token flip; None for anything else (or an unknown margin)."""
        if kind != "token" or margin is None:
            return None
        return "near_tie" if margin < self.near_tie_margin else "confident"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict | None) -> GatePolicy:
        """A run's recorded policy; runs recorded before `[gate]` were judged on bits."""
        return cls(**{k: v for k, v in (data or {}).items() if k in ("fail_on", "near_tie_margin")})


def parse_gate_table(table: dict, where: str, prefix: str = "") -> GatePolicy:
    check_keys(table, {"fail_on", "near_tie_margin"}, where, f"{prefix}gate.")
    fail_on = table.get("fail_on", "bits")
    if fail_on not in FAIL_ON:
        raise fail(where, f"`{prefix}gate.fail_on` must be \"bits\" or \"tokens\", got {fail_on!r}",
                   'fail_on = "tokens" lets logprob-bit drift pass and fails token flips (docs/suite.md)')
    margin = table.get("near_tie_margin", DEFAULT_NEAR_TIE_MARGIN)
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not math.isfinite(margin) or margin < 0:
        raise fail(where, f"`{prefix}gate.near_tie_margin` must be a number >= 0 (nats), got {margin!r}",
                   f"e.g. near_tie_margin = {DEFAULT_NEAR_TIE_MARGIN}")
    return GatePolicy(fail_on, float(margin))
