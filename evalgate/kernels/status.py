"""What the mode did in an engine process, and what that means for the report.

The engine process (an offline engine's core, a server's) fills `STATUS` while vLLM loads the model and builds
its attention metadata, and writes it as JSON to $EVALGATE_CPU_INVARIANT_STATUS after each step. evalgate reads
it back after the engine started (`judge_status`): the mode is in force only where every linear layer was
tiled, every attention configuration passed its check, and the model holds nothing the mode does not cover.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from evalgate.atomic import write_text_atomic

if TYPE_CHECKING:
    from evalgate.kernels.attention import AttentionCheck

STATUS_PATH_ENV = "EVALGATE_CPU_INVARIANT_STATUS"
KERNELS = "evalgate-cpu-kernels/3"


@dataclass
class KernelStatus:
    kernels: str = KERNELS
    linear: list[dict] = field(default_factory=list)        # {path, dtype, k, n, rows, tail_floor}
    attention: list[dict] = field(default_factory=list)     # {config, varies: reason or None, chunks_hold_to, window}
    uncovered: list[str] = field(default_factory=list)
    model_loaded: bool = False

    def linear_measured(self, key: tuple, geometry) -> None:
        path, dtype, k, n = key
        self.linear.append({"path": path, "dtype": str(dtype).removeprefix("torch."), "k": k, "n": n,
                            "rows": geometry.rows, "tail_floor": geometry.tail_floor})
        self.write()

    def attention_checked(self, config: str, check: AttentionCheck) -> None:
        self.attention.append({"config": config, **asdict(check)})
        self.write()

    def add_uncovered(self, op: str) -> None:
        if op not in self.uncovered:
            self.uncovered.append(op)
        self.write()

    def model_loaded_now(self) -> None:
        self.model_loaded = True
        self.write()

    def write(self) -> None:
        path = os.environ.get(STATUS_PATH_ENV)
        if path:
            write_text_atomic(path, json.dumps(asdict(self), indent=1))


STATUS = KernelStatus()


def read_status(path: str | Path) -> KernelStatus | None:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return KernelStatus(**{k: v for k, v in data.items() if k in KernelStatus.__dataclass_fields__})


def judge_status(status: KernelStatus | None) -> tuple[bool, str]:
    """(in force, what the report says): the reason it is not, or what is in force."""
    if status is None or not status.model_loaded:
        return False, ("evalgate's CPU kernels did not report from the engine process: install evalgate where "
                       "vLLM runs (it is a vLLM plugin) and keep vLLM's plugins enabled (VLLM_PLUGINS)")
    if status.uncovered:
        return False, "not covered by evalgate's CPU kernels: " + "; ".join(status.uncovered)
    varies = [a["varies"] for a in status.attention if a["varies"]]
    if varies:
        return False, varies[0]
    if not status.attention:
        return False, "the attention kernel was never checked (no CPU attention backend was built)"
    rows = sorted({g["rows"] for g in status.linear})
    padded = [f"{g['path']} {g['dtype']} {g['k']}x{g['n']} pads below {g['tail_floor']} rows"
              for g in status.linear if g["tail_floor"] > 1]
    # the queries cut at fixed positions where the check found a window that keeps a chunk's bits; the report says
    # how far chunked prefill, prefix-cache hits and decodes were checked to keep them (docs/conditions.md)
    windows = sorted({a.get("window", 0) for a in status.attention})
    chunks = min(a.get("chunks_hold_to", 0) for a in status.attention)
    cut = ("queries cut every " + "/".join(map(str, windows)) + " positions" if 0 not in windows else
           "queries not cut" if windows == [0] else "queries of some configurations cut")
    return True, (f"{status.kernels}: linear layers in fixed {'/'.join(map(str, rows))}-row tiles"
                  + (f" ({'; '.join(padded)})" if padded else "")
                  + f"; attention on one thread, {cut}, split-KV off, checked invariant ({len(status.attention)} "
                  + "configuration" + ("s" if len(status.attention) != 1 else "") + ")"
                  + f"; chunked prefill and prefix-cache hits checked to keep its bits up to {chunks} tokens")
