"""The oracle for LoRA adapters: plain vLLM, no evalgate, running waves of requests under adapters.

    python tests/raw_vllm_adapters.py plan.json result.json

plan.json: {"model", "engine": {vLLM engine args}, "sampling": {SamplingParams}, "adapters": {name: path},
"waves": [[{"prompt", "adapter" (a name, or null: the base model)}, ...], ...]}. Each wave is submitted
together (one `LLM.generate` call), its requests under their adapters' `LoRARequest`s (ids by name order).
result.json: {"first": [{"ids", "logprob_bits"}, ...]}: each wave's first request's output token ids and the
hex of each sampled token's float64 logprob bits (little-endian, as evalgate stores them). Deliberately free of evalgate imports.
"""

from __future__ import annotations

import json
import os
import struct
import sys


def main(plan_path: str, result_path: str) -> None:
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    with open(plan_path, encoding="utf-8") as f:
        plan = json.load(f)
    llm = LLM(model=plan["model"], **plan["engine"])
    params = SamplingParams(**plan["sampling"])
    loras = {name: LoRARequest(name, n, path) for n, (name, path) in enumerate(sorted(plan["adapters"].items()), start=1)}
    first = []
    for wave in plan["waves"]:
        outputs = llm.generate([r["prompt"] for r in wave], params, use_tqdm=False,
                               lora_request=[loras[r["adapter"]] if r["adapter"] else None for r in wave])
        out = outputs[0].outputs[0]
        bits = [struct.pack("<d", position[token].logprob).hex() for token, position in zip(out.token_ids, out.logprobs)]
        first.append({"ids": list(out.token_ids), "logprob_bits": bits})
    with open(result_path, "w", encoding="utf-8") as f:
        json.dump({"first": first}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    # the result is written: skip the interpreter's teardown of torch's and vLLM's modules (about 3 s here)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
