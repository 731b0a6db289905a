"""Across hardware: a check judged against the baseline of another hardware class (docs/conditions.md
"Across hardware").

Two classes do not promise equal bits, so a difference is classified instead of failed outright, on the
rescorings (evalgate/execution/rescore.py) of the *baseline's* tokens: one made on the baseline's class when
it was recorded, one made here by the check. Prefill is compared with prefill only.

- `identical`: the bits are equal.
- `drift`: the same tokens, the logprobs within the cap (decode vs decode, and the two rescorings).
- `near_tie`: at the first divergence, this machine's rescoring puts the baseline's token within ε of its
  own top token, and the two rescorings agree within the cap before it: a tie the hardware breaks either way.
- `confident`: anything else. The baseline's token is clearly not preferred here, or the rescorings disagree
  beyond the cap: that is not rounding.

The envelope is |Δ logprob| per position between the two rescorings, over every request: its maximum and
p99 for this pair of classes, measured, not assumed. ε and the cap are the policy's (`GatePolicy.tolerance`,
by the engine's dtype). Under `other_hardware = "judge"` the hardware explains drift and near ties (an
`explained_change`) and not a confident flip (a `silent_regression`); under `"exact"` it explains nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ..codec import stored_as
from ..configuration.policy import GatePolicy, Tolerance
from ..configuration.prompts import SCORING_TYPES
from ..fingerprint import hardware_label
from ..records import Completion
from ..store import RunRecord
from .verdict import RequestVerdict

CLASSES = ("identical", "drift", "near_tie", "confident")
# Keys of the `engine` component that follow the machine rather than the setup: another class of machine
# runs another platform (cpu, cuda) with its own core count. Across hardware they count as the hardware.
MACHINE_KEYS = frozenset({"platform", "torch_threads"})
BASELINE_DIFFERENCES = ("explained_change", "silent_regression")  # the verdicts of a difference from the baseline


@dataclass(frozen=True)
class Flip:
    """A near tie or confident difference from the other class's baseline: where, the two tokens ({id, text}),
    each side's margin and the gap to this machine's top token that decided its class."""

    key: str
    cls: str = stored_as("class")  # near_tie | confident
    position: int
    kind: str
    baseline_token: dict[str, Any]
    here_token: dict[str, Any]
    baseline_margin: float | None
    here_margin: float | None
    gap: float | None


@dataclass(frozen=True)
class AcrossHardware:
    """The report's cross-hardware section: the two classes, the envelope, the counts and every flip."""

    baseline_class: str
    baseline_label: str
    here_class: str
    here_label: str
    mode: str  # judge | exact
    tolerance: Tolerance
    counts: dict[str, int]
    compared: int
    envelope: dict[str, Any] | None  # {"max", "p99", "positions", "requests"}; None: not measured
    flips: list[Flip] = field(default_factory=list)  # each near tie and confident difference
    notes: list[str] = field(default_factory=list)
    adopted: bool = False  # this check became its class's baseline (`adopt`)

    @property
    def identical(self) -> str:
        """The device-independence property, measured: "N of M identical"."""
        return f"{self.counts['identical']} of {self.compared} identical"

    @property
    def adoptable(self) -> bool:
        return self.counts["confident"] == 0



def rescoring_of(key: str, record: RunRecord | None) -> Completion | None:
    outputs = record.outputs.get(key) if record is not None else None
    return outputs[0] if outputs else None


def position_deltas(here: Completion | None, there: Completion | None):
    """|Δ logprob| per position between two rescorings of the same tokens (None: not both, or not the same)."""
    import numpy as np

    if here is None or there is None or not np.array_equal(here.output_ids, there.output_ids):
        return None
    with np.errstate(invalid="ignore"):
        return np.abs(here.logprobs.astype(np.float64) - there.logprobs.astype(np.float64))


def gap_to_top(rescoring: Completion, position: int) -> float | None:
    """How far below this machine's own top token the rescored (baseline's) token lies at a position: 0 when
    it is the top token."""
    if position >= rescoring.output_ids.size:
        return None
    chosen = float(rescoring.logprobs[position])
    _, top = rescoring.top(position)
    return max(top[0], chosen) - chosen if top else None


def classify(divergence, decode_delta: float | None, here: Completion | None, deltas, tolerance: Tolerance) -> tuple[str, float | None]:
    """A difference's class (module docstring) and, for a flip, the gap that decided it."""
    if divergence.kind == "logprob":
        within = (decode_delta is not None and decode_delta <= tolerance.cap
                  and (deltas is None or float(deltas.max(initial=0.0)) <= tolerance.cap))
        return ("drift" if within else "confident"), None
    position = divergence.position
    gap = gap_to_top(here, position) if here is not None else None
    agreed_before = deltas is None or float(deltas[:position].max(initial=0.0)) <= tolerance.cap
    near = gap is not None and gap <= tolerance.epsilon and agreed_before
    return ("near_tie" if near else "confident"), gap


def envelope_deltas(here: RunRecord | None, there: RunRecord | None,
                    skip: frozenset[str] | set[str] = frozenset()) -> tuple[Any, int]:
    """|Δ logprob| per position between the two rescorings of every request in both (but `skip`: requests whose
    rescorings are not their own), as one array, and how many requests it covers; (None, 0) without both. One
    array for a window of requests, not one a request: a leaderboard-sized run has millions of positions, and
    an array costs 112 bytes before its first value."""
    import numpy as np

    if here is None or there is None:
        return None, 0
    keys = [key for key in here.digests if key in there.digests and key not in skip]
    here.prefetch(keys)
    there.prefetch(keys)
    deltas = [d for d in (position_deltas(rescoring_of(k, here), rescoring_of(k, there)) for k in keys) if d is not None]
    return (np.concatenate(deltas) if deltas else None), len(deltas)


def envelope(deltas: list, requests: int) -> dict[str, Any]:
    """Max and p99 of the per-position deltas of every window (`envelope_deltas`), over `requests` requests."""
    import numpy as np

    values = np.concatenate(deltas) if deltas else np.zeros(0)
    if not values.size:
        return {"max": None, "p99": None, "positions": 0, "requests": 0}
    top = float(values.max())  # before the quantile reorders the values in place (no copy of millions)
    return {"max": top, "p99": float(np.quantile(values, 0.99, method="higher", overwrite_input=True)),
            "positions": int(values.size), "requests": requests}


def across_hardware(verdicts: list[RequestVerdict], current: RunRecord, baseline: RunRecord, here: RunRecord | None,
                    there: RunRecord | None, policy: GatePolicy) -> tuple[list[RequestVerdict], AcrossHardware]:
    """Every difference from the other class's baseline classified (module docstring): the verdicts as the
    classes decide them, and the section that says how, its envelope left to the caller (`envelope`: the
    deltas of every window of the run). `here`: this check's rescoring of the baseline's tokens; `there`: the
    baseline's own, on its class."""
    engine = current.fingerprint.engine
    tolerance = policy.tolerance(engine.get("dtype"))
    counts = dict.fromkeys(CLASSES, 0)
    flips, notes, decided = [], [], []
    machine = {"hardware"} | ({"engine"} if machine_bound(baseline, current) else set())
    compared = 0
    keys = [v.key for v in verdicts if v.verdict in BASELINE_DIFFERENCES]
    unscored = unscored_requests(current)  # key -> adapter: a rescoring under it is the base model's (vllm#51594)
    for record in (here, there):
        if record is not None:
            record.prefetch(keys)
    for v in verdicts:
        if v.verdict == "stable" and v.key in baseline.requests:
            counts["identical"] += 1
            compared += 1
        if v.verdict not in BASELINE_DIFFERENCES or v.divergence is None:
            decided.append(v)
            continue
        compared += 1
        scoring = current.requests[v.key].request_type in SCORING_TYPES  # already rescorings, on both classes
        base_out, cur_out = _pair(v, baseline, current)
        mine, theirs = ((cur_out, base_out) if scoring else (rescoring_of(v.key, here), rescoring_of(v.key, there)))
        if mine is not None and base_out is not None and not _rescores(mine, base_out):
            mine = theirs = None  # a rescoring of other tokens (a baseline promoted with variance) decides nothing
        if v.key in unscored:
            mine = theirs = None  # not the adapter's own scores: the decode logprobs alone decide, a flip is confident
        across, gap = classify(v.divergence, v.max_delta, mine, position_deltas(mine, theirs), tolerance)
        counts[across] += 1
        unexplained = set(v.components) <= machine and (policy.other_hardware == "exact" or across == "confident")
        # the hardware does not explain it: a silent regression
        decided.append(replace(v, across=across, **({"verdict": "silent_regression", "components": []}
                                                     if unexplained else {})))
        if across != "drift":
            d = v.divergence
            flips.append(Flip(v.key, across, d.position, d.kind, {"id": d.reference_id, "text": d.reference_text},
                              {"id": d.other_id, "text": d.other_text}, d.margin,
                              cur_out.margin(d.position) if cur_out is not None else None, gap))
    if there is None:
        notes.append("the baseline has no rescoring of its own (recorded before rescorings, or accepted from a "
                     "check): the envelope is not measured, and only ε and the decode logprobs decide")
    if here is None:
        notes.append("this check has no rescoring of the baseline's tokens: every flip is confident")
    for adapter, modules in sorted(current.fingerprint.unscored.items()):
        if adapter in unscored.values():
            notes.append(f"requests under adapter {adapter!r} ({', '.join(modules)}: vLLM leaves that LoRA delta out of "
                         "prompt_logprobs, vllm#51594) are judged without rescoring: their decode logprobs decide a "
                         "drift, and every token flip is confident")
    return decided, AcrossHardware(
        baseline_class=baseline.run.hardware_class, baseline_label=hardware_label(baseline.fingerprint.hardware),
        here_class=current.run.hardware_class, here_label=hardware_label(current.fingerprint.hardware),
        mode=policy.other_hardware, tolerance=tolerance, counts=counts, compared=compared,
        envelope=None, flips=flips, notes=notes)



def unscored_requests(record: RunRecord) -> dict[str, str]:
    """The run's requests under such an adapter: key -> adapter (the suite component's adapters section)."""
    unscored = record.fingerprint.unscored
    return {key: adapter for key, adapter in record.fingerprint.request_adapters.items() if adapter in unscored}

def machine_bound(baseline: RunRecord, current: RunRecord) -> bool:
    """Whether the engine components differ only where the machine decides (MACHINE_KEYS)."""
    theirs, mine = baseline.fingerprint.engine, current.fingerprint.engine
    return {key for key in set(theirs) | set(mine) if theirs.get(key) != mine.get(key)} <= MACHINE_KEYS


def _pair(v, baseline: RunRecord, current: RunRecord) -> tuple[Completion | None, Completion | None]:
    passes = v.passes or {}
    base = {c.pass_index: c for c in baseline.outputs.get(v.key, [])}.get(passes.get("baseline_pass"))
    cur = {c.pass_index: c for c in current.outputs.get(v.key, [])}.get(passes.get("pass"))
    return base, cur


def _rescores(rescoring: Completion, output: Completion) -> bool:
    """Whether a rescoring scores this output's tokens (all of them, or the part that fit the context)."""
    import numpy as np

    n = rescoring.output_ids.size
    return n <= output.output_ids.size and np.array_equal(rescoring.output_ids, output.output_ids[:n])
