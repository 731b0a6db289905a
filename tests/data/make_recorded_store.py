"""Write tests/data/recorded-0009.sqlite: runs recorded and judged by evalgate as it was at schema 0009
(commit e7708aa, before outputs were arrays), so that tests/unit/test_recorded_store.py can show today's
evalgate loads them and judges them to the same verdicts and divergences.

Run against that evalgate, from a checkout of it:

    git worktree add /tmp/old-evalgate e7708aa
    PYTHONPATH=/tmp/old-evalgate OMP_NUM_THREADS=1 .venv/bin/python tests/data/make_recorded_store.py

It stores synthetic runs with every kind of difference (batch variance, silent regressions by token,
length and logprob bit, explained changes, new and missing requests) and awkward records (ids over
65,535, float64 logprobs, ragged top-k, -0.0, infinities, NUL and lone surrogates in texts), then a
baseline and a check of the tiny model on real vLLM (its float32 logprobs and real top-k).
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
TARGET = HERE / "recorded-0009.sqlite"


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def suite_at(work: Path, keys: list[str]):
    from evalgate.configuration.suite import load_suite

    (work / "model").mkdir(parents=True, exist_ok=True)
    (work / "model" / "config.json").write_text("{}")
    (work / "prompts.jsonl").write_text("".join(json.dumps({"id": k, "prompt": f"prompt {k}"}) + "\n" for k in keys))
    (work / "evalgate.toml").write_text('[suite]\nname = "recorded"\n[engine]\nmodel = "model"\n'
                                        '[sampling]\nmax_tokens = 6\n[prompts]\nfile = "prompts.jsonl"\n')
    return load_suite(work / "evalgate.toml")


def output(rng: random.Random, key: str, style: str) -> dict:
    """One request's output, as lists (what the engines handed over then)."""
    n = 6
    big = style == "big-ids"
    ids = [rng.randrange(70_000, 150_000) if big else rng.randrange(0, 49_152) for _ in range(n)]
    if style == "float64":
        lps = [-rng.random() for _ in range(n)]
    else:
        lps = [f32(-rng.expovariate(2.0)) for _ in range(n)]
    if style == "odd-floats":
        lps[1], lps[2], lps[3] = -0.0, float("-inf"), -5e-324
    k = 1 + rng.randrange(4) if style == "ragged" else 3
    top_ids = [[t] + [rng.randrange(0, 49_152) for _ in range(k - 1 if style != "ragged" else rng.randrange(k))]
               for t in ids]
    top_lps = [[lp] + sorted((f32(lp - 0.25 - rng.random()) for _ in row[1:]), reverse=True) for lp, row in zip(lps, top_ids)]
    if style == "tie":  # a near tie at position 2
        top_lps[2] = [top_lps[2][0], f32(top_lps[2][0] - 0.01), *top_lps[2][2:]]
    texts = [f" w{t % 97}" for t in ids]
    if style == "odd-text":
        texts[0], texts[1] = "a\x00", "\ud800"
    return {"output_ids": ids, "logprobs": lps, "top_ids": top_ids, "top_logprobs": top_lps, "token_texts": texts,
            "text": "".join(texts) if style != "odd-text" else "other text"}


def changed(o: dict, how: str) -> dict:
    o = json.loads(json.dumps(o))  # a copy
    if how == "token":
        o["output_ids"][2] += 1
        o["top_ids"][2][0] = o["output_ids"][2]
    elif how == "length":
        for name in ("output_ids", "logprobs", "top_ids", "top_logprobs", "token_texts"):
            o[name] = o[name][:-1]
        o["text"] = "".join(o["token_texts"])
    elif how == "bit":
        bits = struct.unpack("<Q", struct.pack("<d", o["logprobs"][3]))[0] ^ (1 << 29)
        o["logprobs"][3] = struct.unpack("<d", struct.pack("<Q", bits))[0]
    return o


def synthetic_runs(store_url: str) -> None:
    from evalgate import gate
    from evalgate.configuration.schedule import Schedule, plan_passes
    from evalgate.fingerprint import COMPONENTS, component
    from evalgate.records import Completion
    from evalgate.store import open_store

    styles = ["plain", "big-ids", "float64", "odd-floats", "ragged", "tie", "odd-text", "plain", "plain", "plain",
              "plain", "plain"]
    keys = [f"k{i:02d}" for i in range(len(styles))]
    rng = random.Random(20261202)
    base = {k: output(rng, k, style) for k, style in zip(keys, styles)}
    plan = plan_passes(Schedule(concurrency=(1, 4), shuffles=1))
    schedule = {"passes": [p.to_dict() for p in plan]}
    store = open_store(store_url)
    work = Path(tempfile.mkdtemp(prefix="recorded-"))

    def fingerprint(suite, model="m1") -> dict:
        data = {"hardware": {"hardware": "recorded"}, "model": {"weights": model}, "suite": suite.identity()}
        return {name: component(data.get(name, {"n": name})) for name in COMPONENTS}

    def record(kind: str, variant: dict[str, list[dict]], *, model="m1", keys_=keys, baseline=None, **judge) -> int:
        suite = suite_at(work / f"s{len(list(work.iterdir()))}", keys_)
        run_id = store.create_run(suite, kind, schedule, fingerprint(suite, model), {k: [1, 2, 3] for k in keys_})
        for p in plan:
            completions = []
            for position, key in enumerate(keys_):
                o = variant[key][p.index] if isinstance(variant[key], list) else variant[key]
                completions.append(Completion(key=key, prompt_ids=[1, 2, 3], finish_reason="length",
                                              pass_index=p.index, concurrency=p.concurrency, wave=position // p.concurrency,
                                              position=position % p.concurrency, cached_tokens=3 if p.cache == "hot" else 0,
                                              **o))
            store.add_outputs(run_id, completions)
        gate.judge_and_finish(store, run_id, gate.Judging(kind, baseline, **judge))
        return run_id

    # a baseline whose k02 varies with the batch (a token) and k05 in one bit in its hot pass
    first = {k: [base[k]] * len(plan) for k in keys}
    first["k02"] = [base["k02"] if p.concurrency == 1 else changed(base["k02"], "token") for p in plan]
    first["k05"] = [changed(base["k05"], "bit") if p.cache == "hot" else base["k05"] for p in plan]
    baseline = record("baseline", first, allow_variance=True)
    # a check: equal, but silent regressions by token, length and bit, and the same variance
    second = dict(first)
    second["k07"], second["k08"], second["k09"] = (changed(base["k07"], "token"), changed(base["k08"], "length"),
                                                   changed(base["k09"], "bit"))
    record("check", second, baseline=baseline)
    # explained: other weights change k10; k11 is dropped and k12 is new (the suite changed too)
    third = {**{k: first[k] for k in keys[:-1]}, "k10": changed(base["k10"], "token"),
             "k12": output(rng, "k12", "plain")}
    record("check", third, model="m2", keys_=[*keys[:-1], "k12"], baseline=baseline)
    # an equal check, judged strict
    record("check", first, baseline=baseline, strict=True)


def real_runs(store_url: str) -> None:
    """A baseline and a check of the tiny model on vLLM, through the CLI of that evalgate."""
    from evalgate.models.tinymodel import build_model

    work = Path(tempfile.mkdtemp(prefix="recorded-vllm-"))
    build_model(work / "tiny", "tiny", 0, None)
    prompts = [f"Recorded prompt {i}: the river and the city number {i}" for i in range(10)]
    (work / "prompts.jsonl").write_text("".join(json.dumps({"id": f"v{i}", "prompt": p}) + "\n" for i, p in enumerate(prompts)))
    (work / "evalgate.toml").write_text(f"""[suite]
name = "recorded-vllm"
database = "{store_url}"
[engine]
model = "{work / 'tiny'}"
dtype = "float32"
max_model_len = 256
enforce_eager = true
seed = 0
[sampling]
max_tokens = 8
logprobs = 5
[prompts]
file = "prompts.jsonl"
[schedule]
concurrency = [1, 10]
""")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for command in (["baseline", "create", "--allow-variance"], ["check"]):
        done = subprocess.run([sys.executable, "-c", "from evalgate.cli import main; main()", *command,
                               str(work / "evalgate.toml")], env=env, capture_output=True, text=True,
                              cwd=work)  # not this checkout: `-c` puts the working directory first on sys.path
        print(done.stdout[-800:], done.stderr[-800:])


if __name__ == "__main__":
    import evalgate.store.db

    assert not hasattr(evalgate.store.db, "SCHEMA_HEAD"), "run this with the evalgate of schema 0009 (see the docstring)"
    TARGET.unlink(missing_ok=True)
    url = f"sqlite:///{TARGET}"
    synthetic_runs(url)
    real_runs(url)
    from evalgate.store import open_store

    open_store(url).database.dispose()
    with sqlite3.connect(TARGET) as conn:  # one self-contained file
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("PRAGMA journal_mode=DELETE")
        assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [("0009",)]
    print(f"wrote {TARGET} ({TARGET.stat().st_size} bytes)")
