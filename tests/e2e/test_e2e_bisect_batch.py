"""`evalgate bisect batch` and `evalgate repro` end to end: the real CLI, the real vLLM CPU engine, and the
workload the session's survey found varying alone vs crowded on this machine (tests/variance.py).

One baseline run of that workload (alone and all together, prefix cache off) is shared by the module. A request whose
token ids differ alone vs crowded is bisected down to a minimal set of neighbours, and that minimal batch
is run again in a fresh process (the repro pack's plain-vLLM script) to show the flip reproduces. The
default repro pack of the recorded divergence reproduces it too, with no evalgate import.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import CLI, database_url, db_output_ids, db_query, read_json

pytestmark = pytest.mark.e2e

@pytest.fixture(scope="module")
def source_env(cli_env, variance_source) -> dict[str, str]:
    """The CLI's environment on the variance source (the planted one's plugin, where no real source varies)."""
    return {**cli_env, **variance_source.env}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, source_env, variance_source):
    """(cli, suite, db url, run id, verdict details by key, the variance source) of one baseline run with
    batch variance."""
    root = tmp_path_factory.mktemp("bisect-batch")
    suite = variance_source.suite(root / "ws", concurrency=(1, variance_source.n), shuffles=0, name="bisect-batch",
                                  extra_engine="enable_prefix_caching = false")
    cli = CLI(source_env, root)
    # exit 1 (batch variance: the negative control), stored and promoted all the same with --allow-variance
    cli("baseline", "create", suite, "--allow-variance", check=1)
    db = database_url(suite)
    ((run_id,),) = db_query(db, "select id from runs where kind = 'baseline'")
    verdicts = {}
    for key, detail in db_query(db, "select request_key, detail from verdicts where run_id = :r", r=run_id):
        verdicts[key] = json.loads(detail) if isinstance(detail, str) else detail
    return cli, suite, db, run_id, verdicts, variance_source


def _flip(verdicts: dict) -> str:
    """A request whose output changed alone vs crowded: a token id where the CPU flips one, else its
    logprob bits (all that the CPUs of this project's machines have shown)."""
    keys = sorted(k for k, v in verdicts.items()
                  if v["verdict"] == "batch_variance" and v["passes"]["reference_concurrency"] == 1)
    assert keys, ("the gate found no request changing alone vs crowded, although plain vLLM did on this machine "
                  "(tests/variance.py)\n" + json.dumps(verdicts, indent=1)[:4000])
    tokens = [k for k in keys if verdicts[k]["divergence"]["kind"] in ("token", "length")]
    return (tokens or keys)[0]


def _run_script(script: Path, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    """The pack's script in a fresh Python process, outside the repository (no evalgate on its path)."""
    return subprocess.run([sys.executable, str(script)], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _plain_batches(pack: Path, batches: dict[str, list[str]], env: dict, work: Path) -> dict:
    """Plain vLLM (tests/raw_vllm.py) with the pack's model, engine arguments and requests: each named batch
    submitted as one wave, cold."""
    from variance import run_plain_vllm

    engine = read_json(pack / "engine.json")
    args = dict(engine["engine_args"])  # as the pack's own script starts its engine
    dtype = args.pop("dtype", None) or engine.get("recorded", {}).get("dtype") or "auto"
    requests = read_json(pack / "requests.json")["requests"]
    plan = {"model": engine["model"], "dtype": dtype, "engine": args, "sampling": dict(requests[0]["sampling"]),
            "prompts": [{"key": r["id"], "prompt_token_ids": r["prompt_token_ids"]} for r in requests],
            "conditions": [{"name": name, "batch": keys, "concurrency": len(keys), "salt": name}
                           for name, keys in batches.items()]}
    return run_plain_vllm(plan, work / "plain", {k: v for k, v in env.items() if k != "COLUMNS"})


def _imports(script: Path) -> set[str]:
    tree = ast.parse(script.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_bisect_batch_finds_a_minimal_neighbour_set_that_reproduces(recorded, source_env, tmp_path):
    cli, suite, db, run_id, verdicts, source = recorded
    key = _flip(verdicts)
    crowded = {k for k, v in verdicts.items() if v["verdict"] == "batch_variance"}
    assert crowded == set(source.differing["batch_size"])  # exactly what plain vLLM shows alone vs crowded
    report, pack = tmp_path / "out" / "bisect.json", tmp_path / "pack"
    proc = cli("bisect", "batch", run_id, key, "--suite", suite, "--json-report", report, "--repro", pack, check=0)
    doc = read_json(report)
    assert doc["kind"] == "batch" and doc["status"] == "found" and doc["reproduced"] is True, proc.stdout
    on_tokens = verdicts[key]["divergence"]["kind"] in ("token", "length")
    assert doc["on"] == ("tokens" if on_tokens else "bits")  # auto: what the recorded variance changed
    neighbours = doc["neighbours"]
    assert len(neighbours) == source.n - 1 and key not in neighbours
    minimal = doc["minimal"]
    assert minimal and set(minimal) <= set(neighbours) and len(minimal) <= len(neighbours)
    assert doc["proven_minimal"] is True
    c = doc["concurrency"]
    assert 2 <= c <= source.n and len(minimal) <= c - 1
    # alone -> A, with {x, y} -> B, and the first divergent token
    div = doc["divergence"]
    if on_tokens:
        assert doc["alone"]["token_ids"] != doc["flipped"]["token_ids"] and div["kind"] in ("token", "length")
    else:
        assert div["kind"] == "logprob"
    assert doc["alone"]["token_ids"][: div["position"]] == doc["flipped"]["token_ids"][: div["position"]]
    assert "alone -> [" in proc.stdout and f"with {{{', '.join(minimal)}}} -> [" in proc.stdout
    assert f"first divergent token: position {div['position']}" in proc.stdout
    assert f"smallest flipping concurrency: {c}" in proc.stdout
    # the alone trial reproduces the run's own alone output (same configuration, same env)
    assert any("equals run" in line and "bit for bit" in line for line in doc["evidence"]), doc["evidence"]
    # progress on stderr, every trial in the database, and fewer engine runs than a naive search
    assert "[trial 1/~" in proc.stderr and "-> reference" in proc.stderr
    trials = db_query(db, "select step, label, outcome, config from bisect_trials where session_id = :s order by step",
                      s=doc["bisect"])
    assert [t[0] for t in trials] == list(range(1, len(trials) + 1)) and len(trials) == doc["engine_runs"]
    assert trials[0][1:3] == ("alone", "reference") and trials[1][2] == "bad"  # the recorded batch flips
    assert trials[-1][1].startswith("verify in a fresh engine: with {") and trials[-1][2] == "bad"
    config = json.loads(trials[-1][3]) if isinstance(trials[-1][3], str) else trials[-1][3]
    assert sorted(config["batch"]) == sorted([key, *minimal])
    assert doc["engine_runs"] <= doc["naive_engine_runs"]  # fewer once there are more than a few neighbours
    ((status,),) = db_query(db, "select status from bisect_sessions where id = :s", s=doc["bisect"])
    assert status == "complete"
    shown = cli("bisect", "show", doc["bisect"], "--suite", suite, check=0)
    assert "verify in a fresh engine" in shown.stdout

    # re-running the minimal batch independently (plain vLLM, fresh process) reproduces the flip
    batches = read_json(pack / "batches.json")
    assert [sorted(requests) for requests in (b["requests"] for b in batches["batches"])] == [[key], sorted([key, *minimal])]
    run = _run_script(pack / "repro.py", source_env, tmp_path)
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr[-4000:]}"
    assert "VERDICT: REPRODUCED" in run.stdout
    assert f"first difference at output token {div['position']}" in run.stdout
    # and plain vLLM agrees that the set is minimal: with any one of its neighbours left out, the target
    # gives its output alone again (one engine, every batch as one wave, on the criterion the bisect used)
    order = next(b["requests"] for b in batches["batches"] if len(b["requests"]) > 1)
    plain = _plain_batches(pack, {"alone": [key], "minimal": order,
                                  **{f"without {m}": [k for k in order if k != m] for m in minimal}}, source_env, tmp_path)
    fields = ("ids",) if doc["on"] == "tokens" else ("ids", "logprob_bits")
    target = {name: tuple(tuple(out[key][f]) for f in fields) for name, out in plain.items()}
    assert target["minimal"] != target["alone"]
    assert all(target[f"without {m}"] == target["alone"] for m in minimal), {n: t[0] for n, t in target.items()}


def test_repro_pack_reproduces_the_recorded_divergence(recorded, source_env, tmp_path):
    cli, suite, db, run_id, verdicts, source = recorded
    key = _flip(verdicts)
    out = tmp_path / "repro"
    proc = cli("repro", run_id, key, "--suite", suite, "-o", out, check=0)
    assert str(out / "repro.py") in proc.stdout
    for name in ("requests.json", "batches.json", "engine.json", "env.json", "fingerprint.json", "expected.json",
                 "repro.py", "README.md"):
        assert (out / name).is_file(), name
    script = out / "repro.py"
    assert "evalgate" not in _imports(script) and _imports(script) >= {"vllm"}
    # expected vs observed are the stored outputs of the two passes, and the divergence the verdict named
    expected = read_json(out / "expected.json")
    stored = {p: ids for _, p, ids in db_output_ids(db, "run_id = :r and request_key = :k", r=run_id, k=key)}
    assert expected["expected"]["token_ids"] == stored[0] and expected["observed"]["token_ids"] == stored[1]
    assert expected["first_divergence"]["position"] == verdicts[key]["divergence"]["position"]
    on_tokens = verdicts[key]["divergence"]["kind"] in ("token", "length")
    assert expected["criterion"] == ("tokens" if on_tokens else "bits") and expected["kind"] == "batch_variance"
    batches = read_json(out / "batches.json")["batches"]
    assert [len(b["requests"]) for b in batches] == [1, source.n]
    requests = read_json(out / "requests.json")["requests"]
    assert {r["key"] for r in requests} == {f"p{i:03d}" for i in range(source.n)}
    assert all(r["prompt_token_ids"] and r["sampling"]["max_tokens"] == source.max_tokens for r in requests)
    assert read_json(out / "env.json")["variables"]["OMP_NUM_THREADS"] == "1"
    assert read_json(out / "engine.json")["engine_args"]["seed"] == 0
    assert "python repro.py" in (out / "README.md").read_text(encoding="utf-8")

    run = _run_script(script, source_env, tmp_path)
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr[-4000:]}"
    assert "VERDICT: REPRODUCED: the divergence reproduced" in run.stdout


def test_bisect_batch_and_repro_refuse_bad_arguments(recorded, tmp_path):
    cli, suite, db, run_id, verdicts, source = recorded
    key = _flip(verdicts)
    proc = cli("repro", run_id, "no-such-key", "--suite", suite, "-o", tmp_path / "a", check=2)
    assert "no request 'no-such-key'" in proc.stderr + proc.stdout
    assert not (tmp_path / "a").exists()
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine", encoding="utf-8")
    proc = cli("repro", run_id, key, "--suite", suite, "-o", full, check=2)
    assert "not an empty directory" in proc.stderr + proc.stdout
    assert sorted(p.name for p in full.iterdir()) == ["keep.txt"]
    cli("bisect", "batch", run_id, "no-such-key", "--suite", suite, check=2)
    # a stable request's refusal: tests/plumbing/test_bisect_refusals.py (a stable request exists on every machine)
