"""Across hardware on real vLLM: a baseline recorded on this machine's own numerics judges a check run with
another class's numerics, emulated on this machine by an instruction-set cap that torch or oneDNN honours.

Which cap gives another class depends on the CPU (ATEN_CPU_CAPABILITY=avx2 is another class only where the
CPU has AVX-512; a oneDNN cap may crash vLLM's bf16 path, as it does on an AMX Xeon). So a survey, like
tests/variance.py, runs plain vLLM (tests/raw_vllm.py, no evalgate) natively and under each candidate, and
takes the first whose outputs differ from the native ones; none differing fails with the survey's table.
The same plain-vLLM runs are the oracle: the native class rescores its own tokens, the emulated class
rescores the native tokens, and the test classifies every request from them with its own few lines and
the policy's ε and cap. The gate must report exactly those classes, pass (no confident flip here), adopt
the check, and then judge the emulated class like with like, bit for bit.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import pytest
from helpers import CLI, cached_model, database_url, db_query, read_json, write_suite
from variance import RAW, long_prompts

from evalgate.configuration.policy import GatePolicy

pytestmark = pytest.mark.e2e

# ATEN_CPU_CAPABILITY=default breaks vLLM's inductor kernels (a C++ compile error), even eager: not a candidate
CANDIDATES = [("ATEN_CPU_CAPABILITY", "avx2"), ("ONEDNN_MAX_CPU_ISA", "AVX2"), ("ONEDNN_MAX_CPU_ISA", "AVX"),
              ("ONEDNN_MAX_CPU_ISA", "SSE41")]
PROMPTS = long_prompts(6, 60, 7, seed=7)
MAX_TOKENS = 8


def plain(model, dtype: str, env: dict, work, native: dict | None = None) -> dict | str:
    """Plain vLLM: every prompt alone, and its own tokens rescored (and `native`'s, when given); or why not."""
    conditions = [{"name": "alone", "concurrency": 1, "salt": "alone"}, {"name": "own", "rescore": "alone"}]
    if native is not None:
        conditions.append({"name": "native", "rescore": {k: v["ids"] for k, v in native["alone"].items()}})
    plan = {"model": str(model), "dtype": dtype, "engine": {"max_model_len": 512, "enforce_eager": True, "seed": 0},
            "sampling": {"temperature": 0.0, "max_tokens": MAX_TOKENS, "logprobs": 5},
            "prompts": [{"key": f"p{i:03d}", "prompt": p} for i, p in enumerate(PROMPTS)], "conditions": conditions}
    work.mkdir(parents=True, exist_ok=True)
    (work / "plan.json").write_text(json.dumps(plan), encoding="utf-8")
    proc = subprocess.run([sys.executable, str(RAW), str(work / "plan.json"), str(work / "out.json")], env=env,
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:  # e.g. SIGILL: vLLM's bf16 path under a oneDNN cap on an AMX Xeon
        return f"exit {proc.returncode}: {(proc.stderr.strip().splitlines() or [''])[-1][:120]}"
    return json.loads((work / "out.json").read_text(encoding="utf-8"))["conditions"]


def survey(model, dtype: str, env: dict, work) -> tuple[tuple[str, str], dict, dict]:
    native = plain(model, dtype, env, work / "native")
    assert isinstance(native, dict), f"plain vLLM failed natively: {native}"
    rows = []
    for name, value in CANDIDATES:
        other = plain(model, dtype, {**env, name: value}, work / f"{name}-{value}", native)
        if isinstance(other, str):
            rows.append(f"{name}={value}: {other}")
            continue
        differ = sum(native["alone"][k] != other["alone"][k] for k in native["alone"])
        rows.append(f"{name}={value}: {differ}/{len(PROMPTS)} outputs differ")
        if differ:
            return (name, value), native, other
    pytest.fail(f"no emulated hardware class on this machine for {dtype}:\n" + "\n".join(rows))


def oracle(native: dict, other: dict, dtype: str) -> tuple[dict[str, str], float]:
    """Each request's class from plain vLLM (judgement/hardware.py's rules, written again), and the envelope."""
    tolerance = GatePolicy().tolerance(dtype)
    classes, envelope = {}, 0.0
    for key, mine in native["alone"].items():
        theirs, there, here = other["alone"][key], native["own"][key], other["native"][key]
        deltas = [abs(a - b) for a, b in zip(here["logprobs"], there["logprobs"])]
        envelope = max([envelope, *deltas])
        if mine == theirs:
            classes[key] = "identical"
        elif mine["ids"] == theirs["ids"]:
            bits = [struct.unpack("<d", bytes.fromhex(h))[0] for h in mine["logprob_bits"]]
            moved = [struct.unpack("<d", bytes.fromhex(h))[0] for h in theirs["logprob_bits"]]
            decode = max(abs(a - b) for a, b in zip(bits, moved))
            classes[key] = "drift" if decode <= tolerance.cap and max(deltas) <= tolerance.cap else "confident"
        else:
            p = next(i for i, (a, b) in enumerate(zip(mine["ids"], theirs["ids"])) if a != b)
            gap = max(here["top"][p][1], here["logprobs"][p]) - here["logprobs"][p]
            near = gap <= tolerance.epsilon and max(deltas[:p], default=0.0) <= tolerance.cap
            classes[key] = "near_tie" if near else "confident"
    return classes, envelope


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_baseline_judges_another_class_as_plain_vllm_does_then_is_adopted(cli, cli_env, models_dir, tmp_path, dtype):
    model = cached_model(models_dir, "smollm2")
    env = {k: v for k, v in cli_env.items() if k != "COLUMNS"}
    (name, value), native, other = survey(model, dtype, env, tmp_path / "survey")
    classes, envelope = oracle(native, other, dtype)

    suite = write_suite(tmp_path / "ws", model, list(PROMPTS), dtype=dtype, max_tokens=MAX_TOKENS, concurrency=(1,),
                        shuffles=0, hot_pass=False)
    cli("baseline", "create", suite, check=0)
    emulated = CLI({**cli_env, name: value}, tmp_path)
    confident = "confident" in classes.values()
    proc = emulated("check", suite, "--json-report", tmp_path / "c.json", check=1 if confident else 0)
    report = read_json(tmp_path / "c.json")
    section = report["hardware"]
    assert section is not None, proc.stdout  # judged against the native class's baseline: not exit 4
    got = {key: "identical" for key in classes}
    got.update({r["key"]: r["across"] for r in report["requests"]})
    assert got == classes, (name, value, proc.stdout)
    counts = {c: list(classes.values()).count(c) for c in ("identical", "drift", "near_tie", "confident")}
    assert section["counts"] == counts and section["compared"] == len(PROMPTS)
    assert section["envelope"]["max"] == pytest.approx(envelope, rel=1e-6, abs=1e-12)
    assert section["tolerance"]["dtype"] == dtype
    # the kernels the check ran with, as torch itself reports them in the engine process
    info = [json.loads(c) if isinstance(c, str) else c for (c,) in db_query(database_url(suite),
            "select f.components from fingerprints f join runs r on r.fingerprint_hash = f.hash where r.id = 2")]
    kernels = info[0]["hardware"]["info"]["kernels"]
    assert kernels["torch_reported"] == kernels["torch"]
    if confident:  # never on the emulations seen so far; a confident flip is never adopted
        assert cli("baseline", "adopt", "2", "--suite", suite, check=2)
        return
    cli("baseline", "adopt", "2", "--suite", suite, check=0)
    emulated("check", suite, "--json-report", tmp_path / "again.json", check=0)
    again = read_json(tmp_path / "again.json")
    assert again["baseline_run_id"] == 2 and again["hardware"] is None
    assert again["counts"]["stable"] == len(PROMPTS)  # like with like: bit for bit
