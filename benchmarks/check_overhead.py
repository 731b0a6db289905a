"""Where the time of `evalgate check` goes: engine load, inference, and evalgate's own work (tokenize,
fingerprint, storing, comparing, judging). Prints measured figures; not a test.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/check_overhead.py [--presets tiny,small] [--prompts 32]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--presets", default="tiny,small")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--concurrency", default="1,8,32")
    args = parser.parse_args()

    from evalgate import gate
    from evalgate.configuration.suite import load_suite
    from evalgate.models.tinymodel import cached_model
    from evalgate.timings import Timings

    concurrency = [int(c) for c in args.concurrency.split(",")]
    rows = []
    for preset in args.presets.split(","):
        model = cached_model(preset)
        work = Path(tempfile.mkdtemp(prefix=f"evalgate-bench-{preset}-"))
        (work / "prompts.jsonl").write_text("".join(
            json.dumps({"id": f"b{i}", "prompt": f"Benchmark prompt {i}: tell me about topic number {i}"}) + "\n"
            for i in range(args.prompts)))
        (work / "suite.toml").write_text(f"""
[suite]
name = "bench-{preset}"
database = "sqlite:///bench.sqlite"
[engine]
model = "{model}"
dtype = "{'float32' if preset == 'tiny' else 'bfloat16'}"
max_model_len = 512
enforce_eager = true
[sampling]
max_tokens = {args.max_tokens}
[prompts]
file = "prompts.jsonl"
[schedule]
concurrency = {concurrency}
shuffles = 0
""")
        suite = load_suite(work / "suite.toml")
        gate.create_baseline(suite, allow_variance=True)
        timings = Timings()
        start = time.perf_counter()
        report = gate.check(suite, timings=timings)
        total = time.perf_counter() - start
        other = total - sum(timings.phases().values())
        rows.append((preset, total, timings, other, report.counts))

    print(f"{'model':6} {'total s':>8} {'engine load':>12} {'inference':>10} {'evalgate':>9} {'worker+other':>13} "
          f"{'evalgate %':>10}")
    for preset, total, t, other, counts in rows:
        own = t.get("evalgate", 0.0)
        print(f"{preset:6} {total:8.2f} {t.get('engine_load', 0):12.2f} {t.get('inference', 0):10.2f} "
              f"{own:9.3f} {other:13.3f} {100 * own / total:9.2f}%")
    print(f"({args.prompts} prompts x {args.max_tokens} tokens, concurrency {concurrency}. engine load = importing "
          "vLLM and starting it; evalgate = tokenize, fingerprint, store, load, compare, judge; worker+other = "
          "starting/ending the engine's child process, the baseline lookup, anything outside the timed phases)")


if __name__ == "__main__":
    main()
