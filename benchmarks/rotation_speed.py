"""Detection per engine-second: the rotating preset against the full schedule, on the CPU negative controls
(the tiny fp32 model with long prompts varies under a warm prefix cache and under batch size). One engine
runs the full schedule once (concurrency [1, N], the hot pass) and then `--rotation` turns of the rotating
preset over the same requests. Prints what each finds and what each costs, as ratios to one crowded pass
(every request at concurrency N); not a test.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/rotation_speed.py [--prompts 48] [--rotation 8 16]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

WORDS = "harbour signal meadow copper lantern orbit thistle granite ember willow cipher delta summit".split()


def long_prompts(n: int) -> list[str]:
    """117-439 tokens: longer than vLLM's 128-token CPU cache block, so a warm cache serves part of them."""
    rng = random.Random(7)
    return [f"Entry {i}: " + " ".join(rng.choice(WORDS) for _ in range(30 + (i * 37) % 90)) for i in range(n)]


def write_suite(work: Path, name: str, model: Path, prompts: list[str], max_tokens: int, schedule: str) -> Path:
    work.mkdir(parents=True, exist_ok=True)
    (work / "prompts.jsonl").write_text("".join(json.dumps({"id": f"p{i:03d}", "prompt": p}) + "\n"
                                                for i, p in enumerate(prompts)))
    (work / "evalgate.toml").write_text(f"""
[suite]
name = "{name}"
database = "sqlite:///../bench.sqlite"
[engine]
model = "{model}"
dtype = "float32"
max_model_len = 512
enforce_eager = true
[sampling]
max_tokens = {max_tokens}
[prompts]
file = "prompts.jsonl"
[schedule]
{schedule}
""")
    return work / "evalgate.toml"


def findings(store, run_id: int) -> set[tuple[str, str]]:
    """(request, factor) of every comparison in the run whose outputs differ."""
    from evalgate.configuration.schedule import passes_of
    from evalgate.judgement.compare import pass_differences

    record = store.load(run_id)
    passes = passes_of(record.run.schedule)
    return {(key, d.factor) for key, outputs in record.outputs.items() for d in pass_differences(outputs, passes)}


def engine_seconds(timings) -> tuple[float, float]:
    """(all passes, the crowded pass: the first at the highest concurrency) of one run."""
    passes = timings["passes"]
    top = max(p["concurrency"] for p in passes)
    return sum(p["seconds"] for p in passes), next(p["seconds"] for p in passes if p["concurrency"] == top)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--rotation", type=int, nargs="+", default=[8, 16])
    args = parser.parse_args()

    from evalgate.configuration.suite import load_suite
    from evalgate.engines import start_engine
    from evalgate.execution.request import RunRequest
    from evalgate.execution.runner import TURN_ENV, record_run
    from evalgate.models.tinymodel import cached_model
    from evalgate.store import open_store
    from evalgate.timings import Timings

    load = os.getloadavg()[0]
    model = cached_model("tiny")
    work = Path(tempfile.mkdtemp(prefix="evalgate-rotation-bench-"))
    prompts, n = long_prompts(args.prompts), args.prompts
    full = load_suite(write_suite(work / "full", "rot-bench", model, prompts, args.max_tokens,
                                  f"concurrency = [1, {n}]\nshuffles = 0"))
    engine = start_engine(full)
    url = full.database
    store = open_store(url)
    timings = Timings()
    found_full = findings(store, record_run(RunRequest(full, url, "check", full.schedule), engine, timings))
    full_seconds, crowded = engine_seconds(timings)

    rows = []
    for rotation in args.rotation:
        rotating = load_suite(write_suite(work / f"rot{rotation}", "rot-bench", model, prompts, args.max_tokens,
                                          f'concurrency = [1, {n}]\npreset = "rotating"\nrotation = {rotation}'))
        found, costs, crowds = set(), [], []
        for turn in range(rotation):
            os.environ[TURN_ENV] = str(turn)
            timings = Timings()
            found |= findings(store, record_run(RunRequest(rotating, url, "check", rotating.schedule), engine,
                                                timings))
            seconds, crowd = engine_seconds(timings)
            costs.append(seconds)
            crowds.append(crowd)
        rows.append((rotation, found, statistics.mean(costs), max(costs), statistics.mean(crowds)))
    engine.close()

    def per_factor(found: set) -> str:
        return ", ".join(f"{factor} {sum(1 for _, f in found if f == factor)}"
                         for factor in sorted({f for _, f in found_full}))

    print(f"rotation: {n} long prompts x {args.max_tokens} tokens, tiny fp32 model; load average {load:.2f}")
    print(f"one crowded pass (all {n} at concurrency {n}): {crowded:.2f} s of engine time")
    print(f"{'schedule':28} {'engine s/run':>12} {'x crowded':>10} {'findings':>9} {'found %':>8}  by factor")
    print(f"{'full (alone, hot, crowded)':28} {full_seconds:12.2f} {full_seconds / crowded:10.2f} "
          f"{len(found_full):9d} {100.0:8.1f}  {per_factor(found_full)}")
    for rotation, found, mean_cost, worst, crowd in rows:
        share = 100 * len(found & found_full) / len(found_full) if found_full else float("nan")
        print(f"{f'rotating, rotation {rotation}':28} {mean_cost:12.2f} {mean_cost / crowd:10.2f} "
              f"{len(found):9d} {share:8.1f}  {per_factor(found)} (over {rotation} runs; worst run "
              f"{worst / crowd:.2f}x; found beyond the full schedule: {len(found - found_full)})")
    print("(engine s/run: inference of every pass of one run; x crowded: that over the run's own crowded pass; "
          "findings: (request, factor) comparisons whose outputs differ, the rotating preset's over all its turns)")


if __name__ == "__main__":
    main()
