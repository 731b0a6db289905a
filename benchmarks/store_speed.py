"""The store at GPU throughput: writing a run, a check's load + judgement of two runs, bytes a token on disk.

Synthetic records shaped like vLLM's (ids below a 49,152-token vocabulary, float32 logprobs, top-5), handed
to the public `Store` the way this evalgate's engines hand them over (arrays; lists for an evalgate from
before arrays), and judged with `judgement.judging.judge_stored` (`gate.judge_runs` before it), what
`evalgate check` runs. Prints measured figures; not a test. `benchmarks/before_after.py` runs it on two
checkouts side by side (`make bench`).

    .venv/bin/python benchmarks/store_speed.py [--requests 5000] [--passes 3] [--tokens 64] [--top-k 5] [--trials 3] [--json]

Each figure is the median of `--trials` measurements, each in a fresh database.

`equal passes`: every pass of a request produced the same output (what a passing check records);
`distinct passes`: every pass differs (the worst case: nothing is shared, every request is compared on
its tokens).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def synthetic(requests: int, passes: int, tokens: int, top_k: int, distinct: bool, as_lists: bool):
    """Per pass, the completions of every request; `distinct`: each pass's logprobs a little different."""
    from evalgate.records import Completion

    rng = np.random.default_rng(0)
    per_pass = [[] for _ in range(passes)]
    for r in range(requests):
        ids = rng.integers(0, 49_152, tokens)
        lps = (-rng.exponential(0.5, tokens)).astype(np.float32)
        top_ids = rng.integers(0, 49_152, (tokens, top_k))
        top_ids[:, 0] = ids
        top_lps = np.sort((-rng.exponential(1.0, (tokens, top_k))).astype(np.float32), axis=1)[:, ::-1]
        top_lps[:, 0] = lps
        texts = [f" w{t % 997}" for t in ids.tolist()]
        for p in range(passes):
            mine_lps, mine_top = lps, top_lps
            if distinct and p:
                mine_lps = np.nextafter(lps, np.float32(0)) if p % 2 else np.nextafter(lps, np.float32(-1))
                mine_top = top_lps.copy()
                mine_top[:, 0] = mine_lps
            fields = dict(output_ids=ids, logprobs=mine_lps, top_ids=top_ids, top_logprobs=mine_top)
            if as_lists:  # what the engines handed over before arrays: Python ints and floats
                fields = {name: value.tolist() for name, value in fields.items()}
            per_pass[p].append(Completion(key=f"r{r}", prompt_ids=[1, 2, 3], token_texts=texts, text="".join(texts),
                                          finish_reason="length", pass_index=p, concurrency=[1, 1, 8, 8][p % 4],
                                          wave=r // 8, position=r % 8, **fields))
    return per_pass


def suite_for(work: Path, requests: int, tokens: int):
    from evalgate.configuration.suite import load_suite

    (work / "model").mkdir()
    (work / "model" / "config.json").write_text("{}")
    (work / "prompts.jsonl").write_text("".join(json.dumps({"id": f"r{i}", "prompt": f"p{i}"}) + "\n"
                                                for i in range(requests)))
    (work / "evalgate.toml").write_text(f'[suite]\nname = "bench"\n[engine]\nmodel = "model"\n'
                                        f'[sampling]\nmax_tokens = {tokens}\n[prompts]\nfile = "prompts.jsonl"\n')
    return load_suite(work / "evalgate.toml")


def fingerprint(suite) -> dict:
    """As the runner makes it, before the run is written: the suite component holds every request's hash."""
    from evalgate.fingerprint import COMPONENTS, component

    data = {"hardware": {"hardware": "bench"}, "suite": suite.identity()}
    return {name: component(data.get(name, {"n": name})) for name in COMPONENTS}


def measure(args, distinct: bool) -> dict:
    import evalgate.records
    from evalgate.store import Store

    try:  # this tree: the one judging pipeline
        from evalgate.judgement.judging import Judging, judge_stored

        def judge_runs(store, run_id, baseline_id):
            return judge_stored(store, run_id, baseline_id, Judging("check"))
    except ImportError:  # an evalgate from before it
        from evalgate import gate

        def judge_runs(store, run_id, baseline_id):
            return gate.judge_runs(store, run_id, baseline_id, kind="check")

    work = Path(tempfile.mkdtemp(prefix="evalgate-store-bench-"))
    suite = suite_for(work, args.requests, args.tokens)
    as_lists = not hasattr(evalgate.records, "encode_pass")  # an evalgate from before arrays
    per_pass = synthetic(args.requests, args.passes, args.tokens, args.top_k, distinct, as_lists)
    tokens = sum(len(c.output_ids) for outs in per_pass for c in outs)
    db = work / "e.sqlite"
    store = Store(f"sqlite:///{db}")
    schedule = {"passes": [{"index": p, "concurrency": 1, "repeat": 0, "order_seed": None, "cache": "cold",
                            "reference": None if p == 0 else 0, "factor": None if p == 0 else "repeat",
                            "salt_of": p} for p in range(args.passes)]}
    fp = fingerprint(suite)
    prompt_ids = {c.key: c.prompt_ids for c in per_pass[0]}
    writes, run_ids = [], []
    for _ in range(2):  # a baseline and a check with the same outputs
        for outs in per_pass:
            for c in outs:
                c._digest = None  # each run computes its digests, as a run of fresh outputs does
        start = time.perf_counter()
        run_id = store.create_run(suite, "check", schedule, fp, prompt_ids)
        for outs in per_pass:
            store.add_outputs(run_id, outs)
        writes.append(time.perf_counter() - start)
        run_ids.append(run_id)
    del per_pass
    gc.collect()  # judging happens in evalgate's own process, which never held the engine's outputs
    judged = []
    for _ in range(3):
        fresh = Store(f"sqlite:///{db}")  # nothing cached from the writes
        start = time.perf_counter()
        report = judge_runs(fresh, run_ids[1], run_ids[0])
        judged.append(time.perf_counter() - start)
        fresh.database.dispose()
    store.database.dispose()
    size = sum(f.stat().st_size for f in work.glob("e.sqlite*"))
    expected = "batch_variance" if distinct else "stable"
    assert report.counts[expected] == args.requests, report.counts  # the comparison really ran
    return {"tokens": tokens, "write tok/s": tokens / writes[0], "2nd write tok/s": tokens / writes[1],
            "load+judge s": min(judged), "bytes/token": size / (2 * tokens)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--top-k", type=int, default=5)
    parser.add_argument("--trials", type=int, default=3, help="measurements per figure, each in a fresh database")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON line (before_after.py)")
    args = parser.parse_args()
    figures = {}
    for distinct in (False, True):
        label = "distinct passes" if distinct else "equal passes"
        trials = [measure(args, distinct) for _ in range(args.trials)]
        for name in trials[0]:
            if name != "tokens":
                figures[f"store, {label}: {name}"] = statistics.median(trial[name] for trial in trials)
    if args.json:
        print(json.dumps(figures))
        return
    print(f"store: {args.requests} requests x {args.passes} passes x {args.tokens} tokens, top-{args.top_k}; "
          f"two runs; median of {args.trials}; load average {os.getloadavg()[0]:.2f}")
    for name, value in figures.items():
        print(f"  {name:45} {value:>14,.3f}")
    print("(write: storing one run, requests and every pass; 2nd write: the check, whose outputs equal the "
          "baseline's; load+judge: judge_stored of the check against the baseline, best of 3, in a fresh store; "
          "bytes/token: database files / tokens of both runs)")


if __name__ == "__main__":
    main()
