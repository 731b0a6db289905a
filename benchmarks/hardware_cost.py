"""What a baseline that travels costs (docs/conditions.md "Across hardware"), side by side in one run.

    python benchmarks/hardware_cost.py [--model DIR] [--prompts 32] [--tokens 32] [--dtype float32]

One suite (SmolLM2 by default) on the default schedule (alone, alone with the cache warm, 8 at a time, 8 at a
time shuffled), three runs in one database:
1. `baseline create`: its passes, then the rescoring of its own tokens (one prefill per request);
2. a same-class `check`: its passes only;
3. a cross-hardware `check` under another instruction set (ATEN_CPU_CAPABILITY=avx2 where the CPU has
   AVX-512, else ONEDNN_MAX_CPU_ISA=SSE41): its passes, then the rescorings of the baseline's tokens and its own.
Printed: each run's engine seconds by phase (from the run's own timings), the baseline's rescoring overhead
(goal: at most 1.10x the same run without it) and the cross-hardware check against the same-class check
(goal: at most 1.15x), in engine time (inference + rescoring) and in wall time of the whole command.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

WORDS = "the river city number answer model colour quick brown fox lazy dog over under capital country".split()


def write_suite(directory: Path, model: str, n: int, tokens: int, dtype: str) -> Path:
    lines = []
    for i in range(n):
        rng = random.Random(i)
        text = f"Note {i}: " + " ".join(rng.choice(WORDS) for _ in range(30 + 5 * i))
        lines.append('{"id": "p%03d", "prompt": "%s"}' % (i, text))
    (directory / "prompts.jsonl").write_text("\n".join(lines) + "\n")
    suite = directory / "evalgate.toml"
    suite.write_text(f"""[suite]
name = "hardware-cost"
[engine]
model = "{model}"
dtype = "{dtype}"
max_model_len = 1024
enforce_eager = true
[sampling]
max_tokens = {tokens}
logprobs = 5
[prompts]
file = "prompts.jsonl"
[schedule]
concurrency = [1, 8]
[gate]
fail_on = "tokens"
""")
    return suite


def emulation() -> tuple[str, str]:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return ("ATEN_CPU_CAPABILITY", "avx2") if " avx512f" in flags else ("ONEDNN_MAX_CPU_ISA", "SSE41")


def timed(label: str, call) -> tuple[float, dict]:
    from evalgate.timings import Timings

    timings = Timings()
    t0 = time.perf_counter()
    report = call(timings)
    wall = time.perf_counter() - t0
    phases = timings.phases()
    engine = phases.get("inference", 0.0) + phases.get("rescore", 0.0)
    print(f"{label:<28} exit {int(report.exit_code)}  wall {wall:6.1f} s  engine {engine:6.2f} s  "
          + "  ".join(f"{k} {v:.2f}" for k, v in sorted(phases.items())))
    return wall, phases


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None, help="a model directory (default: SmolLM2 built here)")
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import evalgate
    from evalgate.configuration.suite import load_suite

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from evalgate.models.smollm2 import build_smollm2

            model = str(Path(tmp) / "smollm2")
            build_smollm2(Path(model))
        suite_path = write_suite(Path(tmp), model, args.prompts, args.tokens, args.dtype)
        suite = load_suite(suite_path)
        name, value = emulation()
        print(f"# {cpu}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; {args.prompts} prompts x "
              f"{args.tokens} tokens, {args.dtype}, the default schedule; the other class: {name}={value}")
        base_wall, base = timed("baseline create", lambda t: evalgate.create_baseline(suite, timings=t))
        same_wall, same = timed("check, same class", lambda t: evalgate.check(suite, timings=t))
        os.environ[name] = value
        try:
            cross_wall, cross = timed("check, another class", lambda t: evalgate.check(suite, timings=t))
        finally:
            del os.environ[name]
    rescore = base.get("rescore", 0.0)
    print(f"baseline: rescoring {rescore:.2f} s on {base['inference']:.2f} s of passes: "
          f"{(base['inference'] + rescore) / base['inference']:.3f}x the baseline without it (goal <= 1.10)")
    engine_same = same["inference"]
    engine_cross = cross["inference"] + cross.get("rescore", 0.0)
    print(f"cross-hardware check: engine {engine_cross / engine_same:.3f}x a same-class check "
          f"(goal <= 1.15); whole command {cross_wall / same_wall:.3f}x")


if __name__ == "__main__":
    sys.exit(main())
