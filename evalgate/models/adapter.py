"""Build a LoRA adapter for a local model with attention projections named as Llama's (`q_proj`, `v_proj`:
Llama, Mistral, Qwen, SmolLM2 ...), with no training and no network: the PEFT layout (`adapter_config.json` +
`adapter_model.safetensors`) vLLM loads, with seeded random A and B matrices on those projections, shaped as
the model's own weights are, large enough to change the model's tokens. For the demo and the tests: a real team
brings adapters it trained; this one only has to be a different adapter per seed, byte-identical per seed.
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

from ..configuration.adapters import model_weight_shapes
from ..errors import ConfigError, MissingDependency

TARGETS = ("q_proj", "v_proj")


def build_adapter(model_dir: str | Path, out_dir: str | Path, rank: int = 8, seed: int = 0, scale: float = 1.0) -> Path:
    """Write a rank-`rank` LoRA adapter for the model in `model_dir` to `out_dir` (replaced if it exists).
    `scale`: the standard deviation of B relative to the default (1.0: enough to flip tokens of the tiny
    models and SmolLM2); another seed gives another adapter."""
    try:
        import torch
        from safetensors.torch import save_file
    except ImportError:
        raise MissingDependency("torch and safetensors") from None
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    if not (model_dir / "config.json").is_file():
        raise ConfigError(f"{model_dir}: no config.json", fix="point at a Hugging Face model directory")
    if rank < 1:
        raise ConfigError(f"--rank is {rank}", fix="use a rank of 1 or more, e.g. 8")
    pattern = re.compile(rf"^(.+\.({'|'.join(TARGETS)}))\.weight$")
    in_order = sorted(model_weight_shapes(model_dir).items(),  # layer by layer (2 before 10), q before v
                      key=lambda item: [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", item[0])])
    targets = {found[1]: shape for name, shape in in_order if (found := pattern.match(name)) and len(shape) == 2}
    if not targets:
        raise ConfigError(f"{model_dir}: no {' or '.join(TARGETS)} weights in its safetensors files: build-adapter makes "
                          "adapters for models whose attention projections are named as Llama's (Llama, Mistral, "
                          "Qwen, SmolLM2 ...)", fix="bring an adapter trained on this model (a PEFT LoRA directory)")
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for module, (outputs, inputs) in targets.items():  # the same bytes for the same seed
        name = f"base_model.model.{module}"
        tensors[f"{name}.lora_A.weight"] = torch.randn(rank, inputs, generator=generator) / inputs ** 0.5
        tensors[f"{name}.lora_B.weight"] = torch.randn(outputs, rank, generator=generator) * scale / rank ** 0.5
    adapter_config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": rank, "lora_dropout": 0.0,
        "target_modules": list(TARGETS), "bias": "none", "fan_in_fan_out": False, "modules_to_save": None,
        "use_rslora": False, "use_dora": False, "base_model_name_or_path": str(model_dir.resolve()),
    }
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir.parent) as tmp:
        staged = Path(tmp) / "adapter"
        staged.mkdir()
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(staged / "adapter_model.safetensors"))
        (staged / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2, sort_keys=True) + "\n")
        if out_dir.exists():
            import shutil

            shutil.rmtree(out_dir)
        staged.rename(out_dir)
    return out_dir
