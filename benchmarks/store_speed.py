"""The store at GPU throughput: writing a run, a check's load + compare of two equal runs, bytes a token on
disk. Synthetic records shaped like vLLM's (ids below a 49,152-token vocabulary, float32 logprobs, top-5),
through the public `Store` and `judge()`. Prints measured figures; not a test.

    .venv/bin/python benchmarks/store_speed.py [--requests 5000] [--passes 3] [--tokens 64] [--top-k 5]

`equal passes`: every pass of a request produced the same output (what a passing check records);
`distinct passes`: every pass differs (the worst case for the store: nothing is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import struct
import tempfile
import time
from pathlib import Path


def float32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def synthetic(requests: int, passes: int, tokens: int, top_k: int, distinct: bool, seed: int = 0):
    from evalgate.records import Completion

    rng = random.Random(seed)
    per_pass = [[] for _ in range(passes)]
    for r in range(requests):
        base_ids = [rng.randrange(49_152) for _ in range(tokens)]
        base_lps = [float32(-rng.expovariate(2.0)) for _ in range(tokens)]
        for p in range(passes):
            lps = base_lps if not distinct or p == 0 else [float32(v * (1 + 1e-6 * p)) for v in base_lps]
            top_ids = [[t, *(rng.randrange(49_152) for _ in range(top_k - 1))] for t in base_ids]
            top_lps = [[lp, *(float32(lp - 0.5 - i) for i in range(top_k - 1))] for lp in lps]
            if not distinct:
                rng_state = random.Random(seed * 1_000_003 + r)  # the same top-k in every pass
                top_ids = [[t, *(rng_state.randrange(49_152) for _ in range(top_k - 1))] for t in base_ids]
            texts = [f" w{t % 997}" for t in base_ids]
            per_pass[p].append(Completion(
                key=f"r{r}", prompt_ids=[1, 2, 3], output_ids=list(base_ids), logprobs=list(lps), top_ids=top_ids,
                top_logprobs=top_lps, token_texts=texts, text="".join(texts), finish_reason="length",
                pass_index=p, concurrency=[1, 1, 8, 8][p % 4], wave=r // 8, position=r % 8))
    return per_pass


def suite_for(work: Path, requests: int):
    from evalgate.configuration.suite import load_suite

    (work / "model").mkdir()
    (work / "model" / "config.json").write_text("{}")
    (work / "prompts.jsonl").write_text("".join(json.dumps({"id": f"r{i}", "prompt": f"p{i}"}) + "\n"
                                                for i in range(requests)))
    (work / "evalgate.toml").write_text('[suite]\nname = "bench"\n[engine]\nmodel = "model"\n'
                                        '[sampling]\nmax_tokens = 64\n[prompts]\nfile = "prompts.jsonl"\n')
    return load_suite(work / "evalgate.toml")


def fingerprint() -> dict:
    from evalgate.fingerprint import COMPONENTS, component

    return {name: component({"hardware": "bench"} if name == "hardware" else {"n": name}) for name in COMPONENTS}


def measure(args, distinct: bool) -> dict:
    from evalgate.judgement.verdict import judge
    from evalgate.store import Store

    work = Path(tempfile.mkdtemp(prefix="evalgate-store-bench-"))
    suite = suite_for(work, args.requests)
    per_pass = synthetic(args.requests, args.passes, args.tokens, args.top_k, distinct)
    tokens = sum(len(c.output_ids) for outs in per_pass for c in outs)
    db = work / "e.sqlite"
    store = Store(f"sqlite:///{db}")
    schedule = {"passes": [{"index": p, "concurrency": 1, "repeat": 0, "order_seed": None, "cache": "cold",
                            "reference": None if p == 0 else 0, "factor": None if p == 0 else "repeat",
                            "salt_of": p} for p in range(args.passes)]}
    writes, run_ids = [], []
    for _ in range(2):  # a baseline and a check with the same outputs
        start = time.perf_counter()
        run_id = store.create_run(suite, "check", schedule, fingerprint(), {c.key: c.prompt_ids for c in per_pass[0]})
        for outs in per_pass:
            store.add_outputs(run_id, outs)
        writes.append(time.perf_counter() - start)
        run_ids.append(run_id)
    start = time.perf_counter()
    baseline, current = store.load(run_ids[0]), store.load(run_ids[1])
    loaded = time.perf_counter() - start
    report = judge(current, baseline)
    compared = time.perf_counter() - start
    store.database.dispose()
    size = sum(f.stat().st_size for f in work.glob("e.sqlite*"))
    expected = "batch_variance" if distinct else "stable"
    assert report.counts[expected] == args.requests, report.counts  # the comparison really ran
    return {"tokens": tokens, "first write s": writes[0], "second write s": writes[1], "load s": loaded,
            "load+compare s": compared, "bytes/token": size / (2 * tokens)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--top-k", type=int, default=5)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    print(f"store: {args.requests} requests x {args.passes} passes x {args.tokens} tokens, top-{args.top_k}; "
          f"two runs; load average {load:.2f}")
    print(f"{'outputs':16} {'tokens/run':>10} {'write tok/s':>12} {'2nd write tok/s':>16} {'load s':>7} "
          f"{'load+compare s':>15} {'bytes/token':>12}")
    for distinct in (False, True):
        m = measure(args, distinct)
        print(f"{'distinct passes' if distinct else 'equal passes':16} {m['tokens']:>10,} "
              f"{m['tokens'] / m['first write s']:>12,.0f} {m['tokens'] / m['second write s']:>16,.0f} "
              f"{m['load s']:>7.3f} {m['load+compare s']:>15.3f} {m['bytes/token']:>12.1f}")
    print("(write: storing one run, requests and every pass; 2nd write: the check, whose outputs equal the "
          "baseline's; load+compare: loading both runs and judge(); bytes/token: database files / tokens of "
          "both runs)")


if __name__ == "__main__":
    main()
