"""An MMLU-shaped lm-eval task through evalgate, as a user's own local task (issue: leaderboard-sized suites).

MMLU's test split is 14,042 questions of four choices, 56,168 loglikelihood requests. This writes a task of that
shape (a task YAML and its JSONL: arithmetic questions, one right answer and three near misses, the choices
scored as the letters A-D after an MMLU prompt) and runs it as a user would: `baseline create`, then, on the fake
engine, new weights at the model's path and `check --json-report`: every request an explained change (`model`),
lm-eval's accuracy of both runs side by side and the paired test over the questions. Prints each command's time,
peak RSS (CLI and engine child) and the database's size, then the metric rows. Measured figures; not a test
(tests/e2e/test_e2e_lm_eval.py runs it with 150 questions on the fake engine). The fake engine scores the four
letters of a question alike (a scored token's logprob follows its context, not the token), so its accuracy is
the share of questions whose answer is A whatever the weights, and the paired test finds nothing moved; on
vLLM (`--vllm`) the letters are scored by the model.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/mmlu_shaped.py [--questions 14042] [--json]
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/mmlu_shaped.py --questions 40 --vllm MODEL_DIR  # a sample on vLLM
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from suite_scale import measured  # noqa: E402  (a sibling script)

MMLU_TEST_QUESTIONS = 14_042

TASK = """# MMLU's shape: a question, four lettered choices, the letter scored by loglikelihood
task: mmlu_shaped
dataset_path: json
dataset_kwargs:
  data_files:
    test: mmlu_shaped.jsonl
test_split: test
output_type: multiple_choice
doc_to_text: "{{question.strip()}}\\nA. {{choices[0]}}\\nB. {{choices[1]}}\\nC. {{choices[2]}}\\nD. {{choices[3]}}\\nAnswer:"
doc_to_choice: ["A", "B", "C", "D"]
doc_to_target: answer
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""

SUITE = """[suite]
name = "mmlu-shaped"
database = "sqlite:///mmlu.sqlite"
[engine]
{engine}
[sampling]
max_tokens = 8
[lm_eval]
include_path = ["tasks"]
tasks = ["mmlu_shaped"]
[schedule]
concurrency = [1, 8]
shuffles = 1
"""


def write_task(directory: Path, questions: int, seed: int = 0) -> None:
    """The task's YAML and its questions (`questions` of them, reproducible per seed)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "mmlu_shaped.yaml").write_text(TASK)
    rng = random.Random(seed)
    with (directory / "mmlu_shaped.jsonl").open("w") as f:
        for i in range(questions):
            a, b = rng.randint(2, 999), rng.randint(2, 999)
            right = a + b
            choices = [right, right + rng.randint(1, 9), right - rng.randint(1, 9), right + 10 * rng.randint(1, 9)]
            rng.shuffle(choices)
            f.write(json.dumps({"id": i, "question": f"What is {a} plus {b}?", "choices": [str(c) for c in choices],
                                "answer": choices.index(right)}) + "\n")


def fake_model(directory: Path, seed: int) -> None:
    """A model directory for the fake engine with the tiny preset's tokenizer (its outputs follow the weights'
    bytes, which `seed` sets)."""
    from evalgate.models.tinymodel import PRESETS, build_tokenizer

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer_file = directory / "tokenizer.json"
    if not tokenizer_file.exists():
        tokenizer = build_tokenizer(PRESETS["tiny"]["vocab_size"])
        tokenizer.save(str(tokenizer_file))
        (directory / "tokenizer_config.json").write_text(json.dumps(
            {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>"}))
        (directory / "config.json").write_text(json.dumps(
            {"architectures": ["LlamaForCausalLM"], "vocab_size": tokenizer.get_vocab_size()}))
    (directory / "model.safetensors").write_bytes(random.Random(seed).randbytes(4096))


def workspace(root: Path, questions: int, vllm_model: Path | None) -> Path:
    write_task(root / "tasks", questions)
    if vllm_model is None:
        fake_model(root / "model", seed=0)
        engine = 'kind = "fake"\nmodel = "model"'
    else:
        engine = f'model = "{vllm_model.resolve()}"\ndtype = "float32"\nmax_model_len = 256\nenforce_eager = true'
    (root / "evalgate.toml").write_text(SUITE.format(engine=engine))
    return root / "evalgate.toml"


def run(questions: int, vllm_model: Path | None = None, root: Path | None = None) -> dict:
    """Create, (fake engine: change the weights,) check; the figures and the check's metric rows."""
    root = root or Path(tempfile.mkdtemp(prefix=f"evalgate-mmlu-{questions}-"))
    suite = workspace(root, questions, vllm_model)
    created = measured(["baseline", "create", str(suite)], cwd=root)
    if vllm_model is None:
        fake_model(root / "model", seed=1)  # new weights at the same path: every output changes, explained
    checked = measured(["check", str(suite), "--json-report", str(root / "check.json")], ok=(0, 1), cwd=root)
    report = json.loads((root / "check.json").read_text())
    database = sum(f.stat().st_size for f in root.glob("mmlu.sqlite*"))
    return {"questions": questions, "requests": sum(report["counts"].values()), "create": created, "check": checked,
            "database_mb": database / 2**20, "counts": report["counts"], "metrics": report["metrics"],
            "changed_components": report["changed_components"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--questions", type=int, default=MMLU_TEST_QUESTIONS)
    parser.add_argument("--vllm", type=Path, help="a model directory: run on vLLM (no weight change)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    figures = run(args.questions, args.vllm)
    if args.json:
        print(json.dumps(figures))
        return
    print(f"{figures['questions']:,} questions, {figures['requests']:,} requests; database {figures['database_mb']:.1f} MB")
    for name in ("create", "check"):
        f = figures[name]
        print(f"{name:>7}: exit {f['exit']}, {f['seconds']:.1f} s, peak RSS {f['peak_rss_mb']:.0f} MB "
              f"(CLI {f['cli_rss_mb']:.0f}, engine {f['engine_rss_mb']:.0f})")
    print(f"check: {figures['counts']}, changed {figures['changed_components']}")
    for m in figures["metrics"]:
        paired = m["paired"] or {}
        print(f"  {m['task']} {m['metric']}: {m['baseline']} -> {m['current']}; paired {paired.get('test')}: "
              f"{paired.get('up')} up, {paired.get('down')} down, p = {paired.get('p_value')}")


if __name__ == "__main__":
    main()
