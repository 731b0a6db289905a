"""Across hardware on real vLLM: a baseline recorded on this machine's own numerics judges a check run with
another class's numerics, emulated on this machine by an instruction-set cap that torch or oneDNN honours.

Which cap gives another class depends on the CPU (ATEN_CPU_CAPABILITY=avx2 is another class only where the
CPU has AVX-512; a oneDNN cap may crash vLLM's bf16 path, as it does on an AMX Xeon; on an AVX2 EPYC no cap
changes a bf16 output). So a survey, like tests/variance.py, runs plain vLLM (tests/raw_vllm.py, no evalgate)
natively and under each cap that evalgate's fingerprint counts as another hardware class, and takes the first
whose outputs differ from the native ones. Where none differs, the test goes on with the first cap that ran:
another class by the fingerprint, the same numerics, so every request is "identical" across it.
The same plain-vLLM runs are the oracle: the native class rescores its own tokens, the emulated class
rescores the native tokens, and the test classifies every request from them with its own few lines and
the policy's ε and cap. The gate must report exactly those classes, pass (no confident flip here), adopt
the check, whose stored outputs are plain vLLM's on the emulated class bit for bit. (The drift, near-tie and
confident classes are planted on the fake engine in tests/plumbing/test_hardware.py.)
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import pytest
from helpers import CLI, cached_model, database_url, db_outputs, db_query, read_json, write_suite
from variance import RAW, long_prompts, outputs_equal

from evalgate.configuration.policy import GatePolicy
from evalgate.fingerprint import hardware_component
from evalgate.records import pack_floats

pytestmark = pytest.mark.e2e

# ATEN_CPU_CAPABILITY=default breaks vLLM's inductor kernels (a C++ compile error), even eager: not a candidate.
# torch's dispatch first (every op's kernels: it changed every output wherever it is another class), avx512 for
# where the tests already run capped (`make test-isa`: lifting the cap is another class); then oneDNN's caps,
# the lowest first (on an AVX2 EPYC only these are another class).
CANDIDATES = [("ATEN_CPU_CAPABILITY", "avx2"), ("ATEN_CPU_CAPABILITY", "avx512"), ("ONEDNN_MAX_CPU_ISA", "SSE41"),
              ("ONEDNN_MAX_CPU_ISA", "AVX"), ("ONEDNN_MAX_CPU_ISA", "AVX2")]
# 34-69 SmolLM2 tokens: each plain run and each gate run prefills every prompt three times (generation, its own tokens
# rescored, the other class's), and a SmolLM2 bf16 prefill is slow where the CPU has no bf16 instructions
PROMPTS = long_prompts(6, 30, 7, seed=7)
SAME_ENOUGH = 1  # caps that ran and changed no output, after which the survey goes on with the first of them
MAX_TOKENS = 8


def other_classes(env: dict) -> list[tuple[str, str]]:
    """The candidates that evalgate's fingerprint takes for another hardware class here (a cap at the CPU's own
    level is no other class: torch ignores ATEN_CPU_CAPABILITY=avx2 on an AVX2 CPU)."""
    native = hardware_component(env)["hash"]
    return [(name, value) for name, value in CANDIDATES if hardware_component({**env, name: value})["hash"] != native]


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


def survey(model, dtype: str, env: dict, work) -> tuple[tuple[str, str], dict, dict, list[str]]:
    native = plain(model, dtype, env, work / "native")
    assert isinstance(native, dict), f"plain vLLM failed natively: {native}"
    rows, ran, same = [], None, 0
    for name, value in other_classes(env):
        if same == SAME_ENOUGH:  # each plain run is an engine start: a cap that changes nothing is enough
            rows.append(f"{name}={value}: not tried")
            continue
        other = plain(model, dtype, {**env, name: value}, work / f"{name}-{value}", native)
        if isinstance(other, str):
            rows.append(f"{name}={value}: {other}")
            continue
        differ = sum(not outputs_equal(native["alone"][k], other["alone"][k]) for k in native["alone"])
        rows.append(f"{name}={value}: {differ}/{len(PROMPTS)} outputs differ")
        ran = ran or ((name, value), native, other)
        if differ:
            return (name, value), native, other, rows
        same += 1
    assert ran is not None, f"no instruction-set cap runs vLLM {dtype} as another class here:\n" + "\n".join(rows)
    return (*ran, rows)


def oracle(native: dict, other: dict, dtype: str) -> tuple[dict[str, str], float]:
    """Each request's class from plain vLLM (judgement/hardware.py's rules, written again), and the envelope."""
    tolerance = GatePolicy().tolerance(dtype)
    classes, envelope = {}, 0.0
    for key, mine in native["alone"].items():
        theirs, there, here = other["alone"][key], native["own"][key], other["native"][key]
        deltas = [abs(a - b) for a, b in zip(here["logprobs"], there["logprobs"])]
        envelope = max([envelope, *deltas])
        if outputs_equal(mine, theirs):
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
    (name, value), native, other, rows = survey(model, dtype, env, tmp_path / "survey")
    classes, envelope = oracle(native, other, dtype)
    print(f"\n{dtype}: emulated {name}={value}; survey: {'; '.join(rows)}; classes: {sorted(classes.values())}")

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
    # the adopted baseline is the emulated class's own numerics, bit for bit as plain vLLM gives them there: a later
    # check on that class is like with like (judged so, after adoption: tests/plumbing/test_hardware.py)
    stored = {o["key"]: (o["ids"], o["logprob_bits"]) for o in db_outputs(database_url(suite), "run_id = 2 and pass_index = 0")}
    assert stored == {key: (out["ids"], pack_floats([struct.unpack("<d", bytes.fromhex(h))[0] for h in out["logprob_bits"]]))
                      for key, out in other["alone"].items()}
    assert [b for (b,) in db_query(database_url(suite), "select run_id from baselines order by run_id")] == [1, 2]
