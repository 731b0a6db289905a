"""`evalgate demo`: the whole journey on a tiny locally built model, no network, no GPU.

1. build (or reuse) the tiny model; 2. write a suite, prompts and the example lm-eval tasks
(examples/lm_eval/tasks) into a workspace; 3. create a baseline; 4. check against it (pass); 5. swap the
weights at the same path for a checkpoint trained for fewer steps and check again (explained `model`
change; the arithmetic task's exact match visibly drops, naming the documents that moved).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from .tinymodel import build_model

DEMO_PROMPTS = [
    "The capital of France is",
    "Once upon a time there was",
    "Question: what is two plus two? Answer:",
    "def add(a, b):",
    "List three colors:",
    "Translate to French: good morning",
    "Water boils at",
    "The quick brown fox",
    "Summarize the following text in one sentence.",
    "Numbers: 1 2 3",
    "A journey of a thousand miles",
    "Bonjour, merci,",
]

SUITE_TEMPLATE = """\
# evalgate suite written by `evalgate demo` (format: docs/suite.md)
[suite]
name = "demo"
database = "sqlite:///evalgate.sqlite"   # relative to this file
code_paths = ["prompts.jsonl"]

[engine]
model = "model"              # a local model directory; built by `evalgate build-model model`
dtype = "float32"
max_model_len = 256
enforce_eager = true
seed = 0
batch_invariant = true       # requested; only in force where vLLM supports it (CUDA/ROCm/XPU)

[sampling]
temperature = 0.0
max_tokens = 16
logprobs = 5

[prompts]
file = "prompts.jsonl"

[lm_eval]                    # lm-eval tasks run as requests too (tasks/: exact match, multiple choice, perplexity)
include_path = ["tasks"]
tasks = ["evalgate_arith", "evalgate_capitals", "evalgate_sentences"]
num_fewshot = 2

[schedule]
concurrency = [1, 4, 12]
shuffles = 1
repeats = 1
"""


def write_workspace(directory: Path, seed: int = 0) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    model = directory / "model"
    if not (model / "config.json").is_file():
        build_model(model, "arith", seed)  # the tiny model, trained for a minute on the example task's sums
    (directory / "prompts.jsonl").write_text(
        "".join(json.dumps({"id": f"demo-{i:02d}", "prompt": p}) + "\n" for i, p in enumerate(DEMO_PROMPTS)),
        encoding="utf-8",
    )
    shutil.copytree(example_tasks_dir(), directory / "tasks", dirs_exist_ok=True)
    suite = directory / "evalgate.toml"
    suite.write_text(SUITE_TEMPLATE, encoding="utf-8")
    return suite


def example_tasks_dir() -> Path:
    """examples/lm_eval/tasks ships inside the wheel as evalgate/example_tasks; a checkout has it at the top."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "example_tasks", here.parent / "examples" / "lm_eval" / "tasks"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("evalgate's example lm-eval tasks are missing from this installation; reinstall evalgate")
