"""The oracle: plain vLLM, no evalgate, running the conditions a gate run compares.

    python tests/raw_vllm.py plan.json result.json

plan.json: {"model", "dtype", "engine": {vLLM engine args}, "sampling": {SamplingParams},
"prompts": [{"key", "prompt" or "prompt_token_ids"}], "conditions": [{"name", "concurrency", "salt", "order_seed"?}]}.
Conditions run in the plan's order in one engine. Every request of a condition carries the cache salt
`salt/key`: a new salt is a cold prefix cache, a salt used before is a hot one. A condition is split into
waves of `concurrency` requests submitted together; `order_seed` shuffles the prompts first with Python's
`random.Random(seed).shuffle`, as a shuffled pass does.

result.json: {"conditions": {name: {key: {"ids", "logprob_bits", "cached_tokens"}}}}, with each sampled
token's logprob as the hex of its float64 bits. Deliberately free of evalgate imports, so that what the
gate reports can be checked against what vLLM itself does on this machine.
"""

from __future__ import annotations

import json
import random
import struct
import sys


def main(plan_path: str, result_path: str) -> None:
    from vllm import LLM, SamplingParams

    with open(plan_path, encoding="utf-8") as f:
        plan = json.load(f)
    llm = LLM(model=plan["model"], dtype=plan["dtype"], **plan["engine"])
    params = SamplingParams(**plan["sampling"])
    # text, or token ids as they are (a chat request's templated ids)
    prompts = {p["key"]: {"prompt": p["prompt"]} if "prompt" in p else {"prompt_token_ids": p["prompt_token_ids"]}
               for p in plan["prompts"]}
    results = {}
    for condition in plan["conditions"]:
        keys = list(prompts)
        if condition.get("order_seed") is not None:
            random.Random(condition["order_seed"]).shuffle(keys)
        size = condition["concurrency"]
        outputs = {}
        for start in range(0, len(keys), size):
            wave = keys[start:start + size]
            inputs = [{**prompts[k], "cache_salt": f"{condition['salt']}/{k}"} for k in wave]
            for key, out in zip(wave, llm.generate(inputs, [params] * len(wave), use_tqdm=False)):
                sample = out.outputs[0]
                logprobs = [step[token].logprob for token, step in zip(sample.token_ids, sample.logprobs)]
                outputs[key] = {"ids": list(sample.token_ids),
                                "logprob_bits": [struct.pack("<d", lp).hex() for lp in logprobs],
                                "cached_tokens": out.num_cached_tokens}
        results[condition["name"]] = outputs
    with open(result_path, "w", encoding="utf-8") as f:
        json.dump({"conditions": results}, f)


if __name__ == "__main__":
    main(*sys.argv[1:3])
