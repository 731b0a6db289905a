"""The hunt for holes in "nothing changed": settings outside the suite file that move output bits in plain vLLM
on this machine, and which identity component evalgate records each one in (docs/fingerprint.md "What moves
outputs with the suite file unchanged").

    python benchmarks/identity_holes.py --model DIR [--dtype float32] [--prompts 8] [--tokens 12]

For each setting: plain vLLM (tests/raw_vllm.py, no evalgate) generates every prompt alone with the setting in
its environment, compared with the same run without it (outputs whose ids or logprob bits differ, token
flips); then what evalgate records of the setting: the `env` component (env_snapshot), the `hardware` class
(the kernel dispatch), or the vLLM engine's `libraries` (the runtime libraries its process maps, read in a
process started with the setting). A setting that moves bits and is recorded nowhere is a hole: the table
prints it as NONE.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
from pathlib import Path

RAW = Path(__file__).resolve().parent.parent / "tests" / "raw_vllm.py"
WORDS = "the river city number answer model colour quick brown fox lazy dog over under capital country".split()
SYSTEM_GOMP = "/usr/lib/x86_64-linux-gnu/libgomp.so.1"
# name -> value: what a CI runner's environment, a deployment guide or a shell profile may set
SETTINGS = {
    "OMP_NUM_THREADS": "2",
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "ONEDNN_DEFAULT_FPMATH_MODE": "BF16",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "VLLM_CPU_KVCACHE_SPACE": "2",
    "VLLM_CPU_OMP_THREADS_BIND": "0",
    "LD_PRELOAD": SYSTEM_GOMP,
    "LD_LIBRARY_PATH": "__torch_lib_copy__",  # a folder holding another copy of torch's libgomp, found first
    "TZ": "Pacific/Kiritimati",  # the wall clock's date: a chat template's input (pinned: template_date)
}
LIBRARIES = ("import json, torch, vllm; from evalgate.fingerprint import runtime_libraries; "
             "print(json.dumps(runtime_libraries()))")


def prompts(n: int) -> list[str]:
    return [f"Note {i}: " + " ".join(random.Random(2000 + i).choice(WORDS) for _ in range(30 + 5 * i)) + ". In short,"
            for i in range(n)]


def plain(model: str, dtype: str, texts: list[str], tokens: int, env: dict, work: Path) -> dict:
    plan = {"model": model, "dtype": dtype, "engine": {"max_model_len": 1024, "enforce_eager": True, "seed": 0},
            "sampling": {"temperature": 0.0, "max_tokens": tokens, "logprobs": 5},
            "prompts": [{"key": f"p{i:03d}", "prompt": t} for i, t in enumerate(texts)],
            "conditions": [{"name": "alone", "concurrency": 1, "salt": "alone"}]}
    work.mkdir(parents=True, exist_ok=True)
    (work / "plan.json").write_text(json.dumps(plan))
    proc = subprocess.run([sys.executable, str(RAW), str(work / "plan.json"), str(work / "out.json")],
                          env=env, capture_output=True, text=True)
    if proc.returncode:
        code = proc.returncode
        return {"error": f"killed by signal {-code}" if code < 0 else (proc.stderr.strip().splitlines() or [f"exit {code}"])[-1]}
    return json.loads((work / "out.json").read_text())["conditions"]["alone"]


def recorded(name: str, env: dict, base_env: dict) -> str:
    """Which component of evalgate's fingerprint records the setting (NONE: a hole)."""
    from evalgate.fingerprint import env_snapshot, hardware_component

    where = []
    if env_snapshot(env) != env_snapshot(base_env):
        changed = sorted(k for k in set(env_snapshot(env)) | set(env_snapshot(base_env))
                         if env_snapshot(env).get(k) != env_snapshot(base_env).get(k))
        where.append(f"env ({', '.join(changed)})")
    if hardware_component(env)["hash"] != hardware_component(base_env)["hash"]:
        where.append("hardware (kernel dispatch)")
    libs = [json.loads(subprocess.run([sys.executable, "-c", LIBRARIES], env=e, capture_output=True, text=True,
                                      check=True).stdout.splitlines()[-1]) for e in (env, base_env)]
    if libs[0] != libs[1]:
        moved = sorted(k for k in set(libs[0]) | set(libs[1]) if libs[0].get(k) != libs[1].get(k))
        where.append(f"engine libraries ({', '.join(moved)})")
    return "; ".join(where) or "NONE"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=12)
    args = parser.parse_args()
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    print(f"# {cpu}, {os.cpu_count()} cores; {args.prompts} prompts alone, {args.tokens} tokens, {args.dtype}, "
          f"model {args.model}")
    texts = prompts(args.prompts)
    base_env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
                "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_LOGGING_LEVEL": "ERROR"}
    for name in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "LD_PRELOAD", "LD_LIBRARY_PATH", "TZ"):
        base_env.pop(name, None)
    with tempfile.TemporaryDirectory() as tmp:
        native = plain(args.model, args.dtype, texts, args.tokens, base_env, Path(tmp) / "native")
        print("| setting | outputs whose bits differ | token flips | recorded as |")
        print("|---|---|---|---|")
        for name, value in SETTINGS.items():
            if value == "__torch_lib_copy__":  # another libgomp.so.1, ahead of torch's on the search path
                copy = Path(tmp) / "libs"
                copy.mkdir()
                (copy / "libgomp.so.1").write_bytes(Path(SYSTEM_GOMP).read_bytes())
                value = str(copy)
            if name == "LD_PRELOAD" and not Path(value).exists():
                print(f"| {name}={value} | not here | | |")
                continue
            env = {**base_env, name: value}
            got = plain(args.model, args.dtype, texts, args.tokens, env, Path(tmp) / name)
            shown = value if len(value) < 40 else "…" + value[-30:]
            if "error" in got:
                print(f"| {name}={shown} | failed: {got['error'][:80]} | | {recorded(name, env, base_env)} |")
                continue
            differ = sum((native[k]["ids"], native[k]["logprob_bits"]) != (got[k]["ids"], got[k]["logprob_bits"])
                         for k in native)
            flips = sum(native[k]["ids"] != got[k]["ids"] for k in native)
            print(f"| {name}={shown} | {differ}/{len(texts)} | {flips} | {recorded(name, env, base_env)} |", flush=True)


if __name__ == "__main__":
    main()
