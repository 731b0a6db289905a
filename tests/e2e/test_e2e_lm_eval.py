"""lm-eval suites end to end: the shipped example (examples/lm_eval: a generation task scored by exact match,
a multiple-choice task scored by loglikelihood, a perplexity task scored by rolling loglikelihood, plus
plain prompts) through the real CLI, real lm-eval and the real vLLM CPU engine on a locally built model.

One workspace and one baseline are shared by the module; each test that changes the workspace restores it.
The commands run from a directory other than the suite's, so task data paths must resolve against the
task files, never the working directory.
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest
from helpers import CLI, db_query, read_json

pytestmark = pytest.mark.e2e

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lm_eval"
TASKS = {"evalgate_arith": "generate_until", "evalgate_capitals": "loglikelihood",
         "evalgate_sentences": "loglikelihood_rolling"}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, arith_model, cli_env):
    """The example copied beside a private copy of the demo's model (the tiny architecture trained on the
    example's sums; a copy, so its weights can be swapped), with a baseline."""
    root = tmp_path_factory.mktemp("lm-eval")
    ws = root / "example"
    shutil.copytree(EXAMPLE / "tasks", ws / "tasks")
    shutil.copy(EXAMPLE / "prompts.jsonl", ws / "prompts.jsonl")
    shutil.copytree(arith_model, ws / "model")
    # the example as shipped, less its shuffled pass (a pass over every request of three tasks, per run)
    example = (EXAMPLE / "evalgate.toml").read_text(encoding="utf-8")
    assert "shuffles = 1" in example
    (ws / "evalgate.toml").write_text(example.replace("shuffles = 1", "shuffles = 0"), encoding="utf-8")
    elsewhere = root / "cwd"
    elsewhere.mkdir()
    cli = CLI(cli_env, elsewhere)
    cli("baseline", "create", ws / "evalgate.toml", "--json-report", root / "create.json", check=0)
    return ws, cli, root


def db(ws: Path) -> str:
    return f"sqlite:///{ws / 'evalgate.sqlite'}"


def metric(report: dict, task: str, name: str) -> dict:
    return next(r for r in report["metrics"] if r["task"] == task and r["metric"] == name)


def test_example_tasks_create_then_check_with_metrics_side_by_side(workspace):
    ws, cli, root = workspace
    created = read_json(root / "create.json")
    assert created["status"] == "pass" and created["promoted"] is True

    checked = cli("check", ws / "evalgate.toml", "--json-report", root / "check.json", check=0)
    report = read_json(root / "check.json")
    # a CI log names each step that counts no requests as it starts, in order, the engine's log with it
    steps = [line for line in checked.stderr.splitlines() if line.endswith(" ...")]
    assert steps[0] == "reading the lm-eval tasks ..." and steps[1].startswith("starting the vllm engine (its output: ")
    assert str(ws / ".evalgate" / "logs") in steps[1]
    assert steps[2:] == ["building the lm-eval tasks' requests ...", "scoring with lm-eval ..."]
    # Every request of every task, in every pass, bit-identical to the baseline: all stable.
    types = dict(db_query(db(ws), "SELECT request_type, count(*) FROM requests WHERE run_id = :r GROUP BY request_type",
                          r=report["run_id"]))
    assert set(types) == {"generate", *TASKS.values()}
    assert report["counts"]["stable"] == sum(types.values()) and report["requests"] == []
    keys = [k for (k,) in db_query(db(ws), "SELECT key FROM requests WHERE run_id = :r", r=report["run_id"])]
    assert "evalgate_capitals/0/3/0" in keys and "evalgate_arith/23/0/0" in keys  # task/doc/idx/repeat

    # Metrics from lm-eval, stored for both runs and shown side by side.
    for run_id in (created["run_id"], report["run_id"]):
        stored = {(t, m) for t, m in db_query(db(ws), "SELECT task, metric FROM scores WHERE run_id = :r", r=run_id)}
        assert {("evalgate_arith", "exact_match,strip"), ("evalgate_capitals", "acc,none"),
                ("evalgate_sentences", "word_perplexity,none")} <= stored
    acc = metric(report, "evalgate_capitals", "acc,none")
    assert acc["baseline"] == acc["current"] and acc["delta"] == 0 and acc["moved"] == []
    # (their values against lm-eval's own run of the same tasks: test_loglikelihoods_agree_with_lm_eval_hf_backend)
    exact = metric(report, "evalgate_arith", "exact_match,strip")
    assert exact["current"] >= 0.5, "the trained model should answer most one-digit sums"
    assert "task metrics" in checked.stdout and "evalgate_capitals" in checked.stdout

    # The capitals task asks for each of 4 choices: 12 documents x 4 loglikelihood requests.
    per_task = Counter(k.split("/")[0] for k in keys if "/" in k)
    assert per_task == {"evalgate_arith": 24, "evalgate_capitals": 48, "evalgate_sentences": 6}


def test_changed_data_file_is_an_explained_suite_change(workspace):
    ws, cli, root = workspace
    data = ws / "tasks" / "capitals.jsonl"
    original = data.read_text(encoding="utf-8")
    data.write_text(original.replace('"Peru"', '"Ecuador"'), encoding="utf-8")
    try:
        cli("check", ws / "evalgate.toml", "--json-report", root / "data.json", check=0)
    finally:
        data.write_text(original, encoding="utf-8")
    report = read_json(root / "data.json")
    assert report["changed_components"] == []  # nothing in the serving stack changed...
    assert report["counts"]["silent_regression"] == 0 and report["counts"]["batch_variance"] == 0
    changed = {r["key"] for r in report["requests"]}
    # ...and every request that moved is explained by its own change of the suite (its text).
    assert changed and all(r["verdict"] == "explained_change" and r["components"] == ["suite"]
                           for r in report["requests"])
    assert all(k.startswith("evalgate_capitals/") for k in changed)  # the other tasks did not move
    assert report["task_changes"] == {"evalgate_capitals": "data files, documents"}  # named even where no request moved
    peru_doc = next(i for i, line in enumerate(original.splitlines()) if '"Peru"' in line)
    assert {f"evalgate_capitals/{peru_doc}/{i}/0" for i in range(4)} <= changed


def test_changed_model_moves_metrics_and_is_explained(workspace, cli_env):
    """New weights at the same path: a checkpoint trained for fewer steps. The arithmetic task's exact match
    drops, and the report names the documents that moved and their (explained) requests."""
    ws, cli, root = workspace
    saved = root / "model-trained"
    shutil.copytree(ws / "model", saved)
    builder = CLI(cli_env, root)
    builder("build-model", ws / "model", "--preset", "arith", "--steps", "40", check=0)
    try:
        cli("check", ws / "evalgate.toml", "--json-report", root / "model.json", check=0)
    finally:
        shutil.rmtree(ws / "model")
        shutil.copytree(saved, ws / "model")
    report = read_json(root / "model.json")
    assert report["changed_components"] == ["model"]
    assert report["counts"]["silent_regression"] == 0 and report["counts"]["explained_change"] > 0
    ppl = metric(report, "evalgate_sentences", "word_perplexity,none")
    assert ppl["delta"] != 0 and ppl["baseline"] != ppl["current"]
    exact = metric(report, "evalgate_arith", "exact_match,strip")
    assert exact["current"] < exact["baseline"] and exact["delta"] == exact["current"] - exact["baseline"]
    assert len(exact["moved"]) >= 3 and all(doc["baseline"] == 1.0 and doc["current"] == 0.0 or
                                            doc["baseline"] == 0.0 and doc["current"] == 1.0 for doc in exact["moved"])
    assert [r["key"] for r in exact["moved"][0]["requests"]] == [f"evalgate_arith/{exact['moved'][0]['doc_id']}/0/0"]
    # did it move? McNemar's exact test over the documents that flipped, as scipy computes it on those counts
    from scipy.stats import binomtest

    up = sum(d["current"] > d["baseline"] for d in exact["moved"])
    down = sum(d["current"] < d["baseline"] for d in exact["moved"])
    paired = exact["paired"]
    assert (paired["test"], paired["documents"], paired["up"], paired["down"]) == ("mcnemar_exact", 24, up, down)
    assert paired["p_value"] == pytest.approx(binomtest(up, up + down, 0.5).pvalue)
    assert paired["significant"] is (paired["p_value"] < 0.05) and paired["drop"] is paired["significant"]
    assert ppl["paired"] is None  # a corpus-level metric: lm-eval keeps no value per document to pair
    checked = cli("runs", "show", str(report["run_id"]), "--suite", ws / "evalgate.toml", check=0)
    assert f"{up} up, {down} down of 24 documents" in " ".join(checked.stdout.split())
    cli("report", str(report["run_id"]), "--suite", ws / "evalgate.toml", "--html", root / "model.html", check=0)
    html = (root / "model.html").read_text(encoding="utf-8")
    assert "Task metrics (lm-eval)" in html and "exact_match,strip" in html
    moved = [doc for row in report["metrics"] for doc in row["moved"]]
    for doc in moved:  # every document that moved names its requests, and they changed explicably
        assert doc["requests"] and all(r["verdict"] == "explained_change" for r in doc["requests"])


def test_loglikelihoods_agree_with_lm_eval_hf_backend(workspace):
    """lm-eval's own `hf` backend on the same model: the same requests (tokenized the same way) and the
    same loglikelihoods within float tolerance (vLLM's and PyTorch's CPU kernels round differently)."""
    pytest.importorskip("accelerate")
    import torch
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    from evalgate.configuration.suite import load_suite
    from evalgate.lmeval.harness import loglikelihood_result
    from evalgate.lmeval.tasks import prepare
    from evalgate.store import open_store

    ws, cli, root = workspace
    suite = load_suite(ws / "evalgate.toml")
    torch.set_num_threads(1)
    hf = HFLM(pretrained=str(ws / "model"), dtype="float32", device="cpu", batch_size=1)
    prepared = prepare(suite.lm_eval, suite.path)
    tasks = [spec for spec in prepared.specs if isinstance(spec, dict) and spec["task"] != "evalgate_arith"]
    results = simple_evaluate(model=hf, tasks=tasks, task_manager=prepared.manager, num_fewshot=suite.lm_eval.num_fewshot,
                              fewshot_random_seed=suite.lm_eval.fewshot_seed, bootstrap_iters=0, log_samples=True)

    store = open_store(suite.database)
    baseline = store.load(read_json(root / "create.json")["run_id"])
    compared = 0
    for row in results["samples"]["evalgate_capitals"]:
        for idx, resp in enumerate(row["resps"]):
            hf_ll, hf_greedy = resp[0]
            ours = baseline.outputs[f"evalgate_capitals/{row['doc_id']}/{idx}/0"][0]
            ll, greedy = loglikelihood_result(ours)
            assert ll == pytest.approx(float(hf_ll), rel=1e-4, abs=1e-4)
            assert greedy == bool(hf_greedy)
            compared += 1
    for row in results["samples"]["evalgate_sentences"]:
        ours = baseline.outputs[f"evalgate_sentences/{row['doc_id']}/0/0"][0]
        assert sum(ours.logprobs) == pytest.approx(float(row["resps"][0][0]), rel=1e-4, abs=1e-3)
        compared += 1
    assert compared == 48 + 6
    # and the metrics evalgate stored are lm-eval's, as its own run computes them on these loglikelihoods
    created = read_json(root / "create.json")
    for task, name in (("evalgate_capitals", "acc,none"), ("evalgate_sentences", "word_perplexity,none")):
        assert metric(created, task, name)["current"] == pytest.approx(results["results"][task][name], rel=1e-3), task


@pytest.mark.parametrize("breakage", ["yaml", "data_file", "task_name"])
def test_broken_task_is_exit_2_naming_the_file(tmp_path, tiny_model, cli, breakage):
    ws = tmp_path / "ws"
    shutil.copytree(EXAMPLE / "tasks", ws / "tasks")
    shutil.copy(EXAMPLE / "prompts.jsonl", ws / "prompts.jsonl")
    suite = (EXAMPLE / "evalgate.toml").read_text(encoding="utf-8").replace('model = "model"', f'model = "{tiny_model}"')
    if breakage == "yaml":
        (ws / "tasks" / "arith.yaml").write_text("task: evalgate_arith\noutput_type: [unclosed\n", encoding="utf-8")
        expected = [str(ws / "tasks" / "arith.yaml"), "does not load"]
    elif breakage == "data_file":
        (ws / "tasks" / "capitals.jsonl").unlink()
        expected = [str(ws / "tasks" / "capitals.yaml"), "dataset_kwargs.data_files", "capitals.jsonl"]
    else:
        suite = suite.replace('"evalgate_capitals"', '"evalgate_capitls"')
        expected = ["evalgate_capitls", "did you mean 'evalgate_capitals'"]
    (ws / "evalgate.toml").write_text(suite, encoding="utf-8")
    proc = cli("baseline", "create", ws / "evalgate.toml", check=2)
    for text in expected:
        assert text in proc.stderr, proc.stderr
    assert not (ws / "evalgate.sqlite").exists()  # nothing written, not even an empty database


def test_pytest_plugin_has_one_item_per_task(workspace):
    """`pytest --evalgate`: plain prompts are one item each, an lm-eval task is one item `lm_eval:TASK`
    that fails with the diffs of its failing requests (here: a changed data file under --evalgate-strict)."""
    import subprocess
    import sys
    import xml.etree.ElementTree as ET

    ws, cli, root = workspace

    def run_pytest(junit, *args):
        proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--evalgate",
                               str(ws / "evalgate.toml"), "--junitxml", str(junit), *args],
                              cwd=cli.cwd, env=cli.env, capture_output=True, text=True, timeout=900)
        cases = {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")}
        return proc, cases

    proc, cases = run_pytest(root / "plugin-pass.xml")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(cases) == ["hello", *(f"lm_eval:{t}" for t in sorted(TASKS)), "story"]

    data = ws / "tasks" / "capitals.jsonl"
    original = data.read_text(encoding="utf-8")
    data.write_text(original.replace('"Peru"', '"Ecuador"'), encoding="utf-8")
    try:
        proc, cases = run_pytest(root / "plugin-strict.xml", "--evalgate-strict")
    finally:
        data.write_text(original, encoding="utf-8")
    assert proc.returncode == 1
    failed = {name for name, case in cases.items() if case.find("failure") is not None}
    assert failed == {"lm_eval:evalgate_capitals"}
    text = cases["lm_eval:evalgate_capitals"].find("failure").text
    assert "of lm-eval task evalgate_capitals failed" in text and "explained_change" in text


def test_an_mmlu_shaped_task_runs_end_to_end_on_the_fake_engine(cli_env, tmp_path):
    """benchmarks/mmlu_shaped.py as a user runs it, at 150 questions (MMLU's shape: four lettered choices, each
    scored by loglikelihood): create, new weights, check with lm-eval's metric and its paired test over the
    questions. At MMLU's 14,042 questions it is the leaderboard-sized benchmark (docs/storage.md)."""
    import json
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "mmlu_shaped.py"
    proc = subprocess.run([sys.executable, str(script), "--questions", "150", "--json"], cwd=tmp_path, env=cli_env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(proc.stdout)
    assert figures["requests"] == 600 and figures["create"]["exit"] == 0  # 150 questions x 4 choices
    assert figures["counts"]["explained_change"] == 600 and figures["changed_components"] == ["model"]
    acc, = [m for m in figures["metrics"] if m["metric"].startswith("acc")]
    assert acc["task"] == "mmlu_shaped" and 0 <= acc["baseline"] <= 1 and acc["paired"]["documents"] == 150
