"""lm-eval suites without an engine: the [lm_eval] table, task discovery and data-path anchoring, request
identity, and the answer format handed back to lm-eval. (End to end: tests/e2e/test_e2e_lm_eval.py.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from evalgate.configuration.prompts import Prompt
from evalgate.configuration.suite import load_suite
from evalgate.errors import ConfigError
from evalgate.lmeval.harness import loglikelihood_result
from evalgate.lmeval.tasks import _anchor_data_paths, _data_hashes, _portable_config, prepare
from evalgate.records import Completion

EXAMPLE_TASKS = Path(__file__).resolve().parents[2] / "examples" / "lm_eval" / "tasks"


def suite_file(tmp_path: Path, lm_eval: str, prompts: bool = False) -> Path:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    shutil.copytree(EXAMPLE_TASKS, tmp_path / "tasks", dirs_exist_ok=True)
    text = '[engine]\nmodel = "model"\n'
    if prompts:
        (tmp_path / "p.jsonl").write_text('{"id": "a", "prompt": "hi"}\n')
        text += '[prompts]\nfile = "p.jsonl"\n'
    path = tmp_path / "evalgate.toml"
    path.write_text(text + "[lm_eval]\n" + lm_eval)
    return path


def test_a_suite_of_tasks_needs_no_prompts_file(tmp_path):
    suite = load_suite(suite_file(tmp_path, 'include_path = ["tasks"]\ntasks = ["evalgate_arith"]\nlimit = 5\n'))
    assert suite.prompts == [] and suite.prompts_file is None
    assert suite.lm_eval.tasks == ("evalgate_arith",) and suite.lm_eval.limit == 5
    assert suite.lm_eval.include_path == ((tmp_path / "tasks").resolve(),)
    mixed = load_suite(suite_file(tmp_path, 'include_path = "tasks"\ntasks = ["evalgate_arith"]\n', prompts=True))
    assert [p.key for p in mixed.prompts] == ["a"]


@pytest.mark.parametrize("table, message", [
    ('tasks = []\n', "`lm_eval.tasks` must be a non-empty list"),
    ('tasks = ["a", "a"]\n', "names a task twice"),
    ('tasks = ["a"]\ninclude_path = ["nowhere"]\n', "`lm_eval.include_path`"),
    ('tasks = ["a"]\nlimt = 3\n', "did you mean `limit`?"),
    ('tasks = ["a"]\nlimit = 0\n', "`lm_eval.limit` is 0"),
    ('tasks = ["a"]\nnum_fewshot = -1\n', "`lm_eval.num_fewshot` must be >= 0"),
    ('tasks = ["a"]\nadd_bos_token = "yes"\n', "`lm_eval.add_bos_token` must be true or false"),
])
def test_lm_eval_table_errors_name_the_field(tmp_path, table, message):
    with pytest.raises(ConfigError) as err:
        load_suite(suite_file(tmp_path, table))
    assert message in str(err.value) and str(tmp_path / "evalgate.toml") in str(err.value)


def test_request_identity_covers_type_and_continuation(tmp_path):
    suite = load_suite(suite_file(tmp_path, 'include_path = ["tasks"]\ntasks = ["evalgate_arith"]\n', prompts=True))
    plain = Prompt(key="k", text="The capital of France is", max_tokens=None, line=1)
    choice_a = Prompt(key="k", text="The capital of France is", max_tokens=None, line=0, request_type="loglikelihood",
                      continuation=" Paris", segments=(((1, 2), (3,)),))
    choice_b = Prompt(key="k", text="The capital of France is", max_tokens=None, line=0, request_type="loglikelihood",
                      continuation=" Rome", segments=(((1, 2), (4,)),))
    hashes = {suite.request_hash(p) for p in (plain, choice_a, choice_b)}
    assert len(hashes) == 3
    assert suite.sampling_for(choice_a) == {"max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 5}
    generation = Prompt(key="g", text="Q:", max_tokens=None, line=0, request_type="generate_until",
                        sampling={"max_tokens": 6, "stop": ["\n"]})
    assert suite.sampling_for(generation)["stop"] == ["\n"] and suite.sampling_for(generation)["max_tokens"] == 6


def test_data_paths_resolve_against_the_task_file(tmp_path):
    yaml_path = tmp_path / "sub" / "t.yaml"
    yaml_path.parent.mkdir()
    (yaml_path.parent / "d.jsonl").write_text("{}\n")
    cfg = _anchor_data_paths({"task": "t", "dataset_kwargs": {"data_files": {"test": "d.jsonl"}}}, yaml_path)
    assert cfg["dataset_kwargs"]["data_files"] == {"test": str((yaml_path.parent / "d.jsonl").resolve())}
    assert cfg["dataset_kwargs"]["download_mode"] == "force_redownload"  # datasets' cache keys local files by mtime
    # Identity holds the file's content hash, not its absolute path (which differs between checkouts).
    portable = _portable_config(cfg)
    assert str(tmp_path) not in repr(portable) and portable["dataset_kwargs"]["data_files"] == {"test": "d.jsonl"}
    import hashlib
    assert _data_hashes(cfg) == {"data_files": {"test": hashlib.sha256(b"{}\n").hexdigest()}}
    with pytest.raises(ConfigError) as err:
        _anchor_data_paths({"task": "t", "dataset_kwargs": {"data_files": ["missing.jsonl"]}}, yaml_path)
    assert str(yaml_path) in str(err.value) and "dataset_kwargs.data_files" in str(err.value)


def test_prepare_finds_the_include_path_tasks_and_names_unknown_ones(tmp_path):
    suite = load_suite(suite_file(tmp_path, 'include_path = ["tasks"]\ntasks = ["evalgate_arith", "evalgate_capitals"]\n'))
    prepared = prepare(suite.lm_eval, suite.path)
    assert [spec["task"] for spec in prepared.specs] == ["evalgate_arith", "evalgate_capitals"]
    assert Path(prepared.specs[0]["dataset_kwargs"]["data_files"]["test"]).is_absolute()
    assert prepared.sources["evalgate_arith"] == str((tmp_path / "tasks" / "arith.yaml").resolve())

    broken = tmp_path / "tasks" / "broken.yaml"
    broken.write_text("task: [unclosed\n")
    with pytest.raises(ConfigError) as err:
        prepare(suite.lm_eval, suite.path)
    assert str(broken) in str(err.value)


def test_loglikelihood_answer_is_sum_and_greedy_flag():
    top1 = Completion(key="k", prompt_ids=[], output_ids=[5, 6], logprobs=[-0.5, -1.25],
                      top_ids=[[5, 9], [6, 2]], top_logprobs=[[-0.5, -2.0], [-1.25, -1.5]], token_texts=[], text="",
                      finish_reason="scored")
    assert loglikelihood_result(top1) == (-1.75, True)
    not_top = Completion(key="k", prompt_ids=[], output_ids=[5, 6], logprobs=[-0.5, -3.0],
                         top_ids=[[5, 9], [2, 6]], top_logprobs=[[-0.5, -2.0], [-1.0, -3.0]], token_texts=[], text="",
                         finish_reason="scored")
    assert loglikelihood_result(not_top) == (-3.5, False)


def test_unloadable_data_and_unavailable_builtin_tasks_are_named_before_the_engine(tmp_path):
    suite = load_suite(suite_file(tmp_path, 'include_path = ["tasks"]\ntasks = ["evalgate_arith"]\n'))
    (tmp_path / "tasks" / "arith.jsonl").write_text('{"question": "1 + 1", "answer": "2"}\nnot json at all\n')
    with pytest.raises(ConfigError) as err:
        prepare(suite.lm_eval, suite.path)
    assert str((tmp_path / "tasks" / "arith.yaml").resolve()) in str(err.value) and "evalgate_arith" in str(err.value)

    builtin = load_suite(suite_file(tmp_path, 'tasks = ["arc_easy"]\n'))  # lm-eval's own; its data is not here
    with pytest.raises(ConfigError) as err:
        prepare(builtin.lm_eval, builtin.path)
    assert "'arc_easy'" in str(err.value) and "'allenai/ai2_arc'" in str(err.value) and "does not pin" in str(err.value)
    assert "evalgate fetch" in err.value.fix


def test_a_group_reads_its_tasks_data_relative_to_each_task_file(tmp_path, monkeypatch):
    """A group (or tag) of the include paths' tasks: each member's data paths resolve against its own task
    file, as a task named by itself does, from whatever working directory (lm-eval's rule would be the working
    directory: a group in `tasks/` failed from the suite's directory). A missing file names its task file."""
    suite = suite_file(tmp_path, 'include_path = ["tasks"]\ntasks = ["examples"]\n')
    (tmp_path / "tasks" / "nested").mkdir()
    (tmp_path / "tasks" / "nested" / "examples.yaml").write_text("group: examples\ntask:\n  - evalgate_arith\n"
                                                                 "  - evalgate_capitals\n")
    monkeypatch.chdir(tmp_path / "model")  # neither the suite's directory nor the task files'
    loaded = load_suite(suite)
    prepared = prepare(loaded.lm_eval, loaded.path)
    tasks = prepared.manager.load(prepared.specs)["tasks"]  # every leaf task, through its groups
    assert {"evalgate_arith", "evalgate_capitals"} <= set(tasks)
    files = tasks["evalgate_arith"].config.dataset_kwargs["data_files"]
    assert files == {"test": str((tmp_path / "tasks" / "arith.jsonl").resolve())}

    (tmp_path / "tasks" / "arith.jsonl").unlink()
    with pytest.raises(ConfigError) as err:
        prepare(loaded.lm_eval, loaded.path)
    assert str((tmp_path / "tasks" / "arith.yaml").resolve()) in str(err.value) and "does not exist" in str(err.value)

