"""lm-eval scores a run from its pass 0 as stored, read back a window at a time (`Store.pass_outputs`), never the
pass held whole: the metrics are the same whatever the window. The example tasks on the fake engine, whose
logprobs follow each request's context, so a perplexity moves if any document gets another's answer."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

from helpers import database_url

from evalgate.store import loaded, open_store

EXAMPLE_TASKS = Path(__file__).resolve().parents[2] / "examples" / "lm_eval" / "tasks"

SUITE = """[suite]
name = "scoring"
database = "sqlite:///scoring.sqlite"
[engine]
kind = "fake"
model = "{model}"
[sampling]
max_tokens = 4
[lm_eval]
include_path = ["tasks"]
tasks = ["evalgate_sentences", "evalgate_capitals"]
[schedule]
concurrency = [1]
shuffles = 0
"""


def scored(inline_cli, ws: Path, model: Path) -> tuple[dict, list[tuple]]:
    """A baseline of the example tasks: (task metric -> value, every per-document value)."""
    shutil.copytree(EXAMPLE_TASKS, ws / "tasks")
    suite = ws / "evalgate.toml"
    suite.write_text(SUITE.format(model=model), encoding="utf-8")
    inline_cli("baseline", "create", suite, check=0)
    scores, samples = open_store(database_url(suite)).load_scores(1)
    return ({(s.task, s.metric): s.value for s in scores},
            sorted((s.task, s.doc_id, s.metric, s.value) for s in samples))


def test_lm_eval_scores_pass_zero_read_a_window_at_a_time_as_if_read_whole(inline_cli, tmp_path, tokenized_model,
                                                                           monkeypatch):
    whole = scored(inline_cli, tmp_path / "whole", tokenized_model)  # the example tasks fit one window
    reads = []
    read = loaded.read_completions

    def counted(store, run_id, pass_index, keys, *args, **kwargs):
        reads.append(math.inf if keys is None else len(keys))  # None: the whole pass
        return read(store, run_id, pass_index, keys, *args, **kwargs)

    monkeypatch.setattr(loaded, "CHUNK", 2)  # every lookup past the last window reads two requests anew
    monkeypatch.setattr(loaded, "read_completions", counted)
    windowed = scored(inline_cli, tmp_path / "windowed", tokenized_model)
    metrics, samples = whole
    assert windowed == whole
    assert {"word_perplexity,none", "bits_per_byte,none", "acc,none"} <= {metric for _, metric in metrics}
    assert len({value for (task, _), value in metrics.items() if task == "evalgate_sentences"}) > 1 and samples
    assert reads and max(reads) <= 2  # what scoring read of pass 0: two requests at a time


ARITH = """[suite]
name = "gen"
database = "sqlite:///gen.sqlite"
[engine]
kind = "fake"
model = "{model}"
[sampling]
{sampling}
[lm_eval]
include_path = ["tasks"]
tasks = ["evalgate_arith"]
limit = 3
[schedule]
concurrency = [1]
shuffles = 0
"""


def test_task_generation_kwargs_vllm_would_refuse_or_that_sample_unseeded_are_usage_errors(inline_cli, tmp_path,
                                                                                          tokenized_model):
    """A task's generation_kwargs as tasks in the wild write them: a Hugging Face key (`num_beams`) vLLM refuses on
    every request, or sampling without a seed (random outputs, no gate). Exit 2 naming the task, nothing stored;
    a seed in [sampling] makes the sampling gateable."""
    cases = [("  num_beams: 1\n", "", "generation_kwargs `num_beams` is not a vLLM sampling parameter"),
             ("  top_p: 0\n", "", "generation_kwargs `top_p` is 0; vLLM takes in (0, 1]"),
             ("  do_sample: false\n  max_gen_toks: 0\n", "", "generation_kwargs `max_gen_toks` is 0; vLLM takes 1 or more"),
             ("  temperature: 0.7\n", "", "sample (temperature 0.7) without a seed"),
             ("  temperature: 0.7\n", "seed = 5", None)]
    for i, (kwargs, sampling, said) in enumerate(cases):
        ws = tmp_path / f"ws{i}"
        shutil.copytree(EXAMPLE_TASKS, ws / "tasks")
        task = ws / "tasks" / "arith.yaml"
        text = task.read_text().replace("  do_sample: false\n", kwargs)
        if "max_gen_toks: 0" in kwargs:
            text = text.replace("  max_gen_toks: 6\n", "")
        task.write_text(text, encoding="utf-8")
        suite = ws / "evalgate.toml"
        suite.write_text(ARITH.format(model=tokenized_model, sampling=sampling), encoding="utf-8")
        proc = inline_cli("baseline", "create", suite, check=0 if said is None else 2)
        if said is not None:
            out = " ".join((proc.stdout + proc.stderr).split())
            assert "lm-eval task 'evalgate_arith' (evalgate_arith doc 0)" in out and said in out, out[-600:]
            assert not (ws / "gen.sqlite").exists()


def test_a_prompt_id_that_is_also_an_lm_eval_request_key_is_a_usage_error(inline_cli, tmp_path, tokenized_model):
    """Plain prompts beside tasks: an id shaped like lm-eval's keys (task/doc/index/repeat) that one of its requests
    has would give two requests one key. Exit 2 naming the line, nothing stored (it was a database error, exit 3)."""
    ws = tmp_path / "ws"
    shutil.copytree(EXAMPLE_TASKS, ws / "tasks")
    (ws / "prompts.jsonl").write_text('{"id": "mine", "prompt": "a"}\n{"id": "evalgate_arith/1/0/0", "prompt": "b"}\n')
    suite = ws / "evalgate.toml"
    suite.write_text(ARITH.format(model=tokenized_model, sampling="").replace("[lm_eval]", '[prompts]\nfile = "prompts.jsonl"\n[lm_eval]'))
    out = " ".join(inline_cli("baseline", "create", suite, check=2).stderr.split())
    assert f"{ws / 'prompts.jsonl'}:2: prompt id 'evalgate_arith/1/0/0' is also the key of a request lm-eval built" in out
    assert not (ws / "gen.sqlite").exists()


def test_a_task_data_file_that_is_a_git_lfs_pointer_is_a_usage_error_naming_it(inline_cli, tmp_path, tokenized_model):
    ws = tmp_path / "ws"
    shutil.copytree(EXAMPLE_TASKS, ws / "tasks")
    (ws / "tasks" / "arith.jsonl").write_bytes(b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"1" * 64
                                               + b"\nsize 4242\n")
    suite = ws / "evalgate.toml"
    suite.write_text(ARITH.format(model=tokenized_model, sampling=""), encoding="utf-8")
    out = " ".join(inline_cli("baseline", "create", suite, check=2).stderr.split())
    assert f"{ws / 'tasks' / 'arith.yaml'}: `dataset_kwargs.data_files` names 'arith.jsonl', a Git LFS pointer" in out
    assert "git lfs pull" in out and not (ws / "gen.sqlite").exists()
