"""What removes a factor's variance where batch-invariant kernels are not in force, as data: the words people
read (`text`) and the `[engine]` settings that do it (`settings`; none: no setting removes it, e.g. an engine
bug to report). A schedule factor declares its remedy in judgement/factors.py, a probe on its class
(probes/base.py); `evalgate survey`, `init` and `demo` write the settings into a suite and `evalgate cost`
prices them, all from this one declaration."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Remedy:
    text: str
    settings: dict[str, Any] = field(default_factory=dict, hash=False)

    @classmethod
    def of(cls, value: Remedy | str | None) -> Remedy | None:
        """A declared remedy; a plug-in probe may still give its words alone (no settings)."""
        return cls(value) if isinstance(value, str) else value


# One sequence at a time: nobody shares the batch. What every batch factor's remedy is on a CPU.
ONE_SEQUENCE = Remedy("batch invariance (batch_invariant = true: vLLM's kernels on CUDA/ROCm/XPU, evalgate's on CPU) "
                      "or engine.max_num_seqs = 1",
                      {"max_num_seqs": 1})
