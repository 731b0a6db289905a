"""Build small random Llama models locally, with no network: a byte-level BPE trained on an embedded
corpus plus a LlamaForCausalLM initialised from a fixed seed.

The same preset and seed give byte-identical files on every build (pinned by a test), so the demo and the
tests need no model hub. Two presets:
- `tiny` (about 0.9M parameters, head_dim 64 as the CPU attention kernels need, fp32): fast, and shows no batch variance; the green path.
- `small` (about 52M parameters, served in bf16): shows real batch variance on CPU kernels; the negative
  control for the batch-variance and silent-regression verdicts.
- `arith`: the `tiny` architecture trained for about a minute on one-digit sums in the few-shot format of
  the example lm-eval task (examples/lm_eval/tasks/arith.yaml), so that task's exact match is far from zero
  and a checkpoint trained for fewer steps visibly moves it. Training is single-threaded with fixed seeds:
  the same preset, seed and steps give the same bytes on a machine (another CPU may round differently).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from ..errors import MissingDependency
from ..hashing import digest

PRESETS: dict[str, dict] = {
    "tiny": dict(vocab_size=512, hidden_size=128, intermediate_size=352, num_hidden_layers=4, num_attention_heads=2,
                 num_key_value_heads=1, max_position_embeddings=512),
    "small": dict(vocab_size=4096, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
                  num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=1024),
}
PRESETS["arith"] = PRESETS["tiny"]
TRAIN_STEPS = {"arith": 500}  # presets that are trained, and their default number of optimizer steps
BUILDER_VERSION = 1  # bump when the build recipe changes: it is part of the cache key

# A small, fixed English corpus for the tokenizer; the model is random, so content only shapes merges.
_CORPUS = """
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 1000. Question: what is two plus two? Answer: four.
Once upon a time there was a small model that answered every question with care and precision.
def add(a, b): return a + b  # code also appears in prompts
Translate to French: good morning, thank you, see you tomorrow. Bonjour, merci, à demain.
The capital of France is Paris. The capital of Japan is Tokyo. Water boils at one hundred degrees.
Summarize the following text in one sentence. List three colors: red, green, blue.
"""


def _corpus() -> list[str]:
    """The embedded text plus seeded pseudo-words, enough for the BPE to reach every preset's vocabulary."""
    import random

    rng = random.Random(1234)
    syllables = [a + b for a in "bcdfghklmnprstvwz" for b in "aeiou"] + list("aeiou")
    lines = _CORPUS.strip().splitlines()
    for _ in range(3000):
        words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(4, 12))]
        lines.append(" ".join(words) + rng.choice([".", ",", "?", "!", ":", " 12", " 7."]))
    return lines


def build_tokenizer(vocab_size: int):
    """The presets' byte-level BPE (the `tokenizers` library alone: no torch, no transformers), trained on the
    embedded corpus to `vocab_size` tokens, `<s>` and `</s>` included."""
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError as exc:
        raise MissingDependency(exc.name or "tokenizers") from None
    tokenizer = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - 2, special_tokens=["<s>", "</s>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    return tokenizer


def default_cache_dir() -> Path:
    return Path(os.environ.get("EVALGATE_HOME", Path.home() / ".cache" / "evalgate")) / "models"


def build_model(out_dir: str | Path, preset: str = "tiny", seed: int = 0, steps: int | None = None) -> Path:
    """Write a model directory (config, safetensors weights, tokenizer) to out_dir, replacing it. `steps`:
    training steps of a trained preset (default TRAIN_STEPS[preset]); ignored by untrained presets."""
    try:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    except ImportError as exc:
        raise MissingDependency(exc.name or "torch/transformers/tokenizers") from None
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    params = PRESETS[preset]
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Writing model shards" bars: not evalgate's output
    out_dir = Path(out_dir).resolve()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        fast = PreTrainedTokenizerFast(tokenizer_object=build_tokenizer(params["vocab_size"]), bos_token="<s>",
                                       eos_token="</s>")
        fast.save_pretrained(tmp)

        torch.manual_seed(seed)
        config = LlamaConfig(
            **{**params, "vocab_size": len(fast)}, bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
            tie_word_embeddings=False,
            torch_dtype="float32",
        )
        model = LlamaForCausalLM(config)
        recipe = {"preset": preset, "seed": seed, "builder": BUILDER_VERSION, "params": params}
        if preset in TRAIN_STEPS:
            recipe["steps"] = TRAIN_STEPS[preset] if steps is None else steps
            _train_arith(model, fast, recipe["steps"], seed)
        model.save_pretrained(tmp, safe_serialization=True)
        publish_model_dir(tmp, out_dir, recipe)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def publish_model_dir(tmp: Path, out_dir: Path, recipe: dict) -> None:
    """Finish a model built in `tmp`: write its recipe (evalgate-model.json), give every file the same
    permissions (the bytes and modes of a build never depend on the umask), and replace `out_dir` with it."""
    (tmp / "evalgate-model.json").write_text(json.dumps(recipe, sort_keys=True))
    tmp.chmod(0o755)
    for f in tmp.iterdir():
        f.chmod(0o644)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.rename(out_dir)


def _train_arith(model, tokenizer, steps: int, seed: int, batch_size: int = 32, learning_rate: float = 2e-3) -> None:
    """Teach one-digit sums in the example task's few-shot format ("Q: 3 + 4 =\nA: 7", shots joined by a
    blank line); only the answer tokens are scored. Measured: about 85-95% exact match after 500 steps."""
    import random

    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: a fixed reduction order, so the same weights every build
    try:
        rng = random.Random(seed)
        torch.manual_seed(seed)
        facts = [(a, b) for a in range(10) for b in range(10)]

        def example() -> tuple[list[int], list[int]]:
            ids: list[int] = []
            labels: list[int] = []
            for shot in range(3):
                a, b = rng.choice(facts)
                question = tokenizer(("\n\n" if shot else "") + f"Q: {a} + {b} =\nA:").input_ids
                answer = tokenizer(f" {a + b}\n").input_ids
                ids += question + answer
                labels += [-100] * len(question) + answer
            return ids, labels

        optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)
        model.train()
        for step in range(steps):
            batch = [example() for _ in range(batch_size)]
            width = max(len(ids) for ids, _ in batch)
            input_ids = torch.full((batch_size, width), tokenizer.eos_token_id)
            attention = torch.zeros((batch_size, width), dtype=torch.long)
            labels = torch.full((batch_size, width), -100)
            for row, (ids, label) in enumerate(batch):
                input_ids[row, : len(ids)] = torch.tensor(ids)
                attention[row, : len(ids)] = 1
                labels[row, : len(label)] = torch.tensor(label)
            for group in optimizer.param_groups:  # linear decay to zero: a stable end point
                group["lr"] = learning_rate * (1 - step / steps)
            loss = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
    finally:
        torch.set_num_threads(threads)


def cached_model(preset: str = "tiny", seed: int = 0, cache_dir: str | Path | None = None) -> Path:
    """The model for (preset, seed), built once into the cache directory and reused afterwards."""
    recipe = {"preset": preset, "seed": seed, "builder": BUILDER_VERSION, "params": PRESETS[preset]}
    if preset in TRAIN_STEPS:
        recipe["steps"] = TRAIN_STEPS[preset]
    key = digest(recipe)[:12]
    target = Path(cache_dir or default_cache_dir()) / f"{preset}-seed{seed}-{key}"
    if not (target / "config.json").is_file() or not (target / "model.safetensors").is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        build_model(target, preset, seed)
    return target
