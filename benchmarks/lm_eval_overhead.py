"""What an lm-eval suite costs on top of inference: lm-eval's own work (finding and loading the tasks,
building their requests, scoring the first pass) next to engine load, inference and evalgate's own work.
Runs the shipped example (examples/lm_eval: 24 generation, 48 loglikelihood and 6 rolling-loglikelihood
requests plus 2 plain prompts) on the trained tiny model. Prints measured figures; not a test.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/lm_eval_overhead.py [--concurrency 1,8] [--limit 24]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "lm_eval"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--limit", type=int, default=None, help="documents per task (default: all)")
    args = parser.parse_args()

    from evalgate import gate
    from evalgate.configuration.suite import load_suite
    from evalgate.models.tinymodel import cached_model
    from evalgate.timings import Timings

    work = Path(tempfile.mkdtemp(prefix="evalgate-bench-lm-eval-"))
    shutil.copytree(EXAMPLE / "tasks", work / "tasks")
    shutil.copy(EXAMPLE / "prompts.jsonl", work / "prompts.jsonl")
    text = (EXAMPLE / "evalgate.toml").read_text().replace('model = "model"', f'model = "{cached_model("arith")}"')
    text = text.replace("concurrency = [1, 8]", f"concurrency = [{args.concurrency}]")
    if args.limit:
        text = text.replace("[lm_eval]\n", f"[lm_eval]\nlimit = {args.limit}\n")
    (work / "evalgate.toml").write_text(text)
    suite = load_suite(work / "evalgate.toml")
    gate.create_baseline(suite)
    timings = Timings()
    start = time.perf_counter()
    report = gate.check(suite, timings=timings)
    total = time.perf_counter() - start
    phases = timings.phases()
    print(f"{'phase':12} {'seconds':>8} {'share':>7}")
    for name in ("engine_load", "lm_eval", "inference", "evalgate"):
        print(f"{name:12} {phases.get(name, 0.0):8.2f} {100 * phases.get(name, 0.0) / total:6.1f}%")
    other = total - sum(phases.values())
    print(f"{'other':12} {other:8.2f} {100 * other / total:6.1f}%   (worker start/exit, baseline lookup)")
    print(f"{'total':12} {total:8.2f}")
    passes = timings.get("passes", [])
    for p in passes:
        print(f"pass {p['index']}: concurrency {p['concurrency']:3}, {p['requests']} requests, "
              f"{p['seconds']:.2f} s, {p['requests'] / p['seconds']:.1f} requests/s")
    print(f"verdicts: {report.counts}; lm_eval = finding/loading tasks, building requests (twice: once to record, "
          "once to score), lm-eval's metrics; evalgate = tokenize, fingerprint, store, compare, judge")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
