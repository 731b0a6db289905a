"""`evalgate check` wall time against raw vLLM doing the same passes in one process, on the tiny model.

Both are fresh processes timed from the outside, alternating: the raw script imports vLLM, starts
`vllm.LLM` with the suite's engine settings and generates the check's passes (the same waves, cache
salts, sampling and top-k); `evalgate check` does that plus everything it adds (CLI, the engine's
supervised process, tokenizing, fingerprinting, storing, loading the baseline, judging, reporting).
Prints the medians and the ratio; not a test. The default workload is the one the store issue was
measured on from outside: 54 prompts x 16 tokens, passes at concurrency 1, 4, 16 and 16 shuffled, no hot
pass; `--prompts 540` is the suite 10x larger.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/check_vs_raw.py [--prompts 54] [--max-tokens 16] [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAW = r"""
import json, sys
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
plan = json.load(open(sys.argv[1]))
llm = LLM(model=plan["model"], dtype="float32", max_model_len=512, enforce_eager=True, seed=0)
tokenizer = llm.get_tokenizer()
ids = [tokenizer.encode(p) for p in plan["prompts"]]
params = SamplingParams(max_tokens=plan["max_tokens"], temperature=0.0, logprobs=5)
tokens = 0
for number, waves in enumerate(plan["passes"]):
    for wave in waves:
        prompts = [TokensPrompt(prompt_token_ids=ids[i], cache_salt=f"raw-{number}") for i in wave]
        for out in llm.generate(prompts, params, use_tqdm=False):
            tokens += len(out.outputs[0].token_ids)
print(tokens)
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=54)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON line (before_after.py)")
    args = parser.parse_args()

    from evalgate.configuration.schedule import plan_passes, waves
    from evalgate.configuration.suite import load_suite
    from evalgate.models.tinymodel import cached_model

    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TQDM_DISABLE": "1",
           "VLLM_CPU_KVCACHE_SPACE": "1"}  # as evalgate sets it on CPU (a 1 GiB KV cache)
    model = cached_model("tiny")
    work = Path(tempfile.mkdtemp(prefix="evalgate-vs-raw-"))
    prompts = [f"Benchmark prompt {i}: tell me about topic number {i} and the river" for i in range(args.prompts)]
    (work / "prompts.jsonl").write_text("".join(json.dumps({"id": f"b{i:03d}", "prompt": p}) + "\n"
                                                for i, p in enumerate(prompts)))
    suite_file = work / "evalgate.toml"
    suite_file.write_text(f"""
[suite]
name = "vs-raw"
[engine]
model = "{model}"
dtype = "float32"
max_model_len = 512
enforce_eager = true
seed = 0
[sampling]
max_tokens = {args.max_tokens}
logprobs = 5
[prompts]
file = "prompts.jsonl"
[schedule]
concurrency = [1, 4, 16]
shuffles = 1
hot_pass = false
""")
    suite = load_suite(suite_file)
    keys = [p.key for p in suite.prompts]
    index = {k: i for i, k in enumerate(keys)}
    plan = {"model": str(model), "prompts": prompts, "max_tokens": args.max_tokens,
            "passes": [[[index[k] for k in wave] for wave in waves(keys, p)] for p in plan_passes(suite.schedule)]}
    (work / "plan.json").write_text(json.dumps(plan))
    (work / "raw.py").write_text(RAW)
    evalgate = [str(Path(sys.executable).with_name("evalgate"))]
    subprocess.run([*evalgate, "baseline", "create", str(suite_file)], env=env, check=True, capture_output=True)

    def timed(cmd: list[str]) -> float:
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
        return time.perf_counter() - t0

    raw, check = [], []
    for _ in range(args.repeats):
        raw.append(timed([sys.executable, str(work / "raw.py"), str(work / "plan.json")]))
        check.append(timed([*evalgate, "check", str(suite_file)]))
    r, c = statistics.median(raw), statistics.median(check)
    if args.json:
        label = f"check vs raw vLLM, {args.prompts} prompts"
        print(json.dumps({f"{label}: raw s": r, f"{label}: check s": c, f"{label}: ratio": c / r}))
        return
    print(f"check vs raw vLLM: {args.prompts} prompts x {args.max_tokens} tokens, {len(plan['passes'])} passes, "
          f"tiny fp32; load average {os.getloadavg()[0]:.2f}")
    print(f"raw vLLM in one process  {r:6.1f} s  (runs: {', '.join(f'{x:.1f}' for x in raw)})")
    print(f"evalgate check           {c:6.1f} s  (runs: {', '.join(f'{x:.1f}' for x in check)})")
    print(f"ratio                    {c / r:6.2f}x  (evalgate's cost over raw vLLM: {c - r:+.1f} s)")


if __name__ == "__main__":
    main()
