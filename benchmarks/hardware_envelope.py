"""Another machine's numerics on this one: what a changed kernel instruction set does to outputs and to a
rescoring, in plain vLLM (tests/raw_vllm.py, no evalgate). The figures behind the cross-hardware defaults
(`[gate] tie_epsilon`, `drift_cap`: docs/conditions.md "Across hardware").

    python benchmarks/hardware_envelope.py --model DIR [--dtype float32 bfloat16] [--prompts 24] [--tokens 16]

For each dtype: the native class generates every prompt alone and rescores its own tokens (one prefill
each); each emulated class (an instruction-set cap torch or oneDNN honours) does the same and also rescores
the native tokens. Printed per setting: outputs whose bits differ from native, token flips, the envelope
(|Δ logprob| per position between the two rescorings of the native tokens: max and p99), and at each flip
the gap on the emulated class (its top-1 logprob minus the native token's: what `tie_epsilon` bounds).
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
SETTINGS = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
WORDS = "the river city number answer model colour quick brown fox lazy dog over under capital country".split()


def prompts(n: int) -> list[str]:
    out = []
    for i in range(n):
        rng = random.Random(1000 + i)
        out.append(f"Note {i}: " + " ".join(rng.choice(WORDS) for _ in range(40 + 6 * i)) + ". In short,")
    return out


def plain(model: str, dtype: str, texts: list[str], tokens: int, env: dict, native: dict | None, work: Path) -> dict:
    plan = {"model": model, "dtype": dtype, "engine": {"max_model_len": 1024, "enforce_eager": True, "seed": 0},
            "sampling": {"temperature": 0.0, "max_tokens": tokens, "logprobs": 5},
            "prompts": [{"key": f"p{i:03d}", "prompt": t} for i, t in enumerate(texts)],
            "conditions": [{"name": "alone", "concurrency": 1, "salt": "alone"},
                           {"name": "own", "rescore": "alone"}]}
    if native is not None:
        plan["conditions"].append({"name": "native", "rescore": {k: v["ids"] for k, v in native["alone"].items()}})
    work.mkdir(parents=True, exist_ok=True)
    (work / "plan.json").write_text(json.dumps(plan))
    proc = subprocess.run([sys.executable, str(RAW), str(work / "plan.json"), str(work / "out.json")],
                          env=env, capture_output=True, text=True)
    if proc.returncode:  # e.g. SIGILL: vLLM's bf16 path under an oneDNN cap on an AMX Xeon (measured)
        code = proc.returncode
        return {"error": f"killed by signal {-code if code < 0 else code - 128}" if code < 0 or code > 128
                else (proc.stderr.strip().splitlines() or [f"exit {code}"])[-1]}
    return json.loads((work / "out.json").read_text())["conditions"]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--tokens", type=int, default=16)
    args = parser.parse_args()
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    print(f"# {cpu}, {os.cpu_count()} cores; {args.prompts} prompts alone, {args.tokens} tokens, model {args.model}")
    texts = prompts(args.prompts)
    base_env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
                "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_LOGGING_LEVEL": "ERROR"}
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in args.dtype:
            native = plain(args.model, dtype, texts, args.tokens, base_env, None, Path(tmp) / dtype / "native")
            if "error" in native:
                print(f"{dtype}: native failed: {native['error']}")
                continue
            margins = [row[1] - lp for out in native["own"].values() for row, lp in zip(out["top"], out["logprobs"])]
            print(f"\n{dtype}")
            print("| setting | outputs that differ | token flips | envelope max / p99 | gaps at the flips |")
            print("|---|---|---|---|---|")
            for name, value in SETTINGS.items():
                got = plain(args.model, dtype, texts, args.tokens, {**base_env, name: value}, native,
                            Path(tmp) / dtype / name)
                if "error" in got:
                    print(f"| {name}={value} | failed: {got['error'][:80]} | | | |")
                    continue
                differ = sum(native["alone"][k] != got["alone"][k] for k in native["alone"])
                flips, gaps, deltas = 0, [], []
                for key, mine in native["alone"].items():
                    theirs = got["alone"][key]
                    here, there = got["native"][key], native["own"][key]
                    deltas += [abs(a - b) for a, b in zip(here["logprobs"], there["logprobs"])]
                    first = next((i for i, (a, b) in enumerate(zip(mine["ids"], theirs["ids"])) if a != b), None)
                    if first is not None:
                        flips += 1
                        gaps.append(here["top"][first][1] - here["logprobs"][first])
                gap_text = ", ".join(f"{g:.3g}" for g in sorted(gaps)) or "-"
                print(f"| {name}={value} | {differ}/{len(texts)} | {flips} | {max(deltas, default=0):.3g} / "
                      f"{percentile(deltas, 0.99):.3g} | {gap_text} |")
            nonzero = sorted(m for m in margins if m > 0)
            print(f"native rescoring of its own tokens: {len(margins)} positions, {len(nonzero)} where the token is "
                  f"not the rescoring's top-1; the smallest such gap: {nonzero[0] if nonzero else 0:.3g} "
                  "(a bf16 logit's step)")


if __name__ == "__main__":
    main()
