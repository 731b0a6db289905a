"""Bad input through the real CLI: a clear message naming the file and field, exit 2 (or 4), and nothing
written. The engine-argument and prompt-length checks use the real vLLM."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from helpers import CLI, write_suite

pytestmark = pytest.mark.e2e


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_unknown_engine_argument(cli, tmp_path, tiny_model):
    # a misspelt name, and a quoted number (vLLM's own error, "'<' not supported between instances of 'int' and
    # 'str'", names no field): both named in one error, so one correction and one engine start fix both
    suite = write_suite(tmp_path, tiny_model, ["hello"], extra_engine='max_num_seq = 4\nmax_num_seqs = "4"')
    proc = cli("baseline", "create", suite, check=2)
    assert "unknown vLLM engine argument `engine.max_num_seq`" in proc.stderr
    assert "did you mean `max_num_seqs`?" in proc.stderr
    assert "`engine.max_num_seqs` must be an integer, got str '4'" in proc.stderr and "set `max_num_seqs` to an integer" in proc.stderr
    assert not (tmp_path / "evalgate.sqlite").exists()


def test_prompt_longer_than_context_stores_no_run(cli, tmp_path, tiny_model):
    suite = write_suite(tmp_path, tiny_model, ["short", "word " * 600])
    proc = cli("baseline", "create", suite, check=2)
    assert "prompts.jsonl:2" in proc.stderr and "max_model_len" in proc.stderr
    assert not (tmp_path / "evalgate.sqlite").exists()  # checked before the database is opened


def test_no_suite_file_found(cli, tmp_path):
    proc = cli("check", check=2)
    assert "no suite file" in proc.stderr


def test_accept_unknown_run(cli, tmp_path, tiny_model):
    from evalgate.store import open_store

    suite = write_suite(tmp_path, tiny_model, ["hello"])
    open_store(f"sqlite:///{tmp_path / 'evalgate.sqlite'}").database.dispose()
    proc = cli("baseline", "accept", "42", "--suite", suite, check=2)
    assert "run 42 does not exist" in proc.stderr


def test_history_commands_do_not_create_a_database(cli, tmp_path):
    missing = tmp_path / "typo.sqlite"
    proc = cli("runs", "list", "--db", missing, check=2)
    assert "no evalgate database" in proc.stderr and str(missing) in proc.stderr
    assert not missing.exists()


def test_engine_argument_value_vllm_refuses_is_a_configuration_error(cli, tmp_path, tiny_model):
    """vLLM itself refuses the value (the tiny model has 512 positions): exit 2 naming the suite file, the
    field and vLLM's reason, nothing written; not exit 3 "vLLM failed to start"."""
    suite = write_suite(tmp_path, tiny_model, ["hello"])
    suite.write_text(suite.read_text().replace("max_model_len = 512", "max_model_len = 2048"))
    proc = cli("baseline", "create", suite, check=2)
    assert str(suite) in proc.stderr and "`engine.max_model_len`" in proc.stderr
    assert "max_position_embeddings" in proc.stderr and "fix:" in proc.stderr  # vLLM's reason, kept
    assert "failed to start" not in proc.stderr
    assert not (tmp_path / "evalgate.sqlite").exists()
    assert not list((tmp_path / ".evalgate" / "logs").glob("*.log"))  # no log left behind for bad input


def test_a_model_of_an_architecture_vllm_does_not_know_names_its_config(cli, tmp_path, tiny_model):
    """A model whose config.json names an unknown model type: exit 2 naming that file and the fields to check,
    not a value of [engine] (the suite wrote none of it); nothing written."""
    model = tmp_path / "odd-model"
    shutil.copytree(tiny_model, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "model_type": "foo", "architectures": ["FooForCausalLM"]}))
    suite = write_suite(tmp_path, model, ["hello"])
    proc = cli("baseline", "create", suite, check=2)
    assert f"{model / 'config.json'}: vLLM cannot load this model" in proc.stderr and "`foo`" in proc.stderr
    assert "`model_type` and `architectures`" in proc.stderr and "[engine]" not in proc.stderr.split("fix:")[0]
    assert not (tmp_path / "evalgate.sqlite").exists()


def _without_weights(model: Path) -> str:
    (model / "model.safetensors").unlink()
    return "has no weights (no *.safetensors, *.bin or *.pt file)"


def _missing_shard(model: Path) -> str:
    (model / "model.safetensors").rename(model / "model-00001-of-00002.safetensors")
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "lm_head.weight": "model-00002-of-00002.safetensors", "model.norm.weight": "model-00001-of-00002.safetensors"}}))
    return "model.safetensors.index.json names weight files the directory lacks (model-00002-of-00002.safetensors)"


@pytest.mark.parametrize("damage", [_without_weights, _missing_shard], ids=["no-weights", "missing-shard"])
@pytest.mark.parametrize("kind", ["vllm", "vllm-server"])
def test_a_model_directory_without_its_weights_is_refused_before_vllm_starts(cli, tmp_path, tiny_model, damage, kind):
    """An interrupted copy or download: exit 2 naming the directory (or its index) and what is missing, before
    vLLM is imported or a server started (vLLM's own error came after its start, as exit 3); nothing written."""
    model = tmp_path / "copied-model"
    shutil.copytree(tiny_model, model)
    expected = damage(model)
    suite = write_suite(tmp_path, model, ["hello"], kind=kind)
    stderr = " ".join(cli("baseline", "create", suite, check=2).stderr.split())  # as wrapped to the terminal
    assert f"{suite}: `engine.model`: " in stderr and expected in stderr, stderr
    assert "evalgate fetch" in stderr.split("fix:")[1]
    assert not (tmp_path / "evalgate.sqlite").exists()


@pytest.mark.parametrize("module, suite_extra", [
    ("vllm", ""),
    ("lm_eval", "\n[lm_eval]\ntasks = [\"arith\"]\ninclude_path = [\"tasks\"]\n"),
])
def test_dependency_missing_in_the_engine_process_is_exit_2_with_the_install_fix(cli, tmp_path, tiny_model, module,
                                                                               suite_extra):
    """The package is importable nowhere on this path (a stand-in that raises ImportError, first on
    PYTHONPATH): the error crosses from the engine process and is still exit 2 with the pip command."""
    shim = tmp_path / "shim" / module
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text(f"raise ImportError('No module named {module}')\n")
    (tmp_path / "tasks").mkdir()
    suite = write_suite(tmp_path, tiny_model, ["hello"], kind="fake" if module == "lm_eval" else "vllm")
    suite.write_text(suite.read_text() + suite_extra)
    env = dict(cli.env, PYTHONPATH=f"{tmp_path / 'shim'}{os.pathsep}{cli.env.get('PYTHONPATH', '')}")
    proc = CLI(env, tmp_path)("baseline", "create", suite, check=2)
    assert "is not installed" in proc.stderr and "pip install" in proc.stderr, proc.stderr
    assert "TypeError" not in proc.stderr
    assert not (tmp_path / "evalgate.sqlite").exists()
