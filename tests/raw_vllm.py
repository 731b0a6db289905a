"""The oracle: plain vLLM, no evalgate, running the conditions a gate run compares.

    python tests/raw_vllm.py plan.json result.json

plan.json: {"model", "dtype", "engine": {vLLM engine args}, "sampling": {SamplingParams},
"prompts": [{"key", "prompt" or "prompt_token_ids"}], "conditions": [{"name", "concurrency", "salt", "order_seed"?}]}.
Conditions run in the plan's order in one engine. Every request of a condition carries the cache salt
`salt/key`: a new salt is a cold prefix cache, a salt used before is a hot one. A condition is split into
waves of `concurrency` requests submitted together; `order_seed` shuffles the prompts first with Python's
`random.Random(seed).shuffle`, as a shuffled pass does. `"batch": [keys]` runs only those requests, in
that order (one wave when `concurrency` is their number).

A condition with `"rescore": {key: [token ids]}` (or the name of an earlier condition: its outputs) runs no
generation: each request's prompt ids followed by those tokens, alone, one prefill (`prompt_logprobs`), as a
rescoring does (teacher forcing).

A condition with `"trace": [lines]` replays a step-placed trace around each request in turn (`"keys"`: only
those), stepped by hand (`LLMEngine.add_request`, `step`, `abort_request`) by the rules of evalgate's exact
placement (docs/traffic.md): lines as a fuzz repro pack's trace.jsonl has them, in steps with token ids
(`{"step", "prompt_ids", "max_tokens", "cancel_after"?: {"steps" | "tokens": n}}`, or the marker
`{"step", "gated": true}`), added in
the order of (step, line), so the request arrives at its marker's line; an event leaves when its cancel is
due (aborted) or at its max_tokens (ignore_eos); the replay ends when the request finishes. Tests build the
lines from evalgate's own Trace (variance.oracle_trace), so the arrangement is described once.

result.json: {"conditions": {name: {key: {"ids", "logprob_bits", "cached_tokens", "margins"}}}}, with each
sampled token's logprob as the hex of its float64 bits and each position's top-1 minus top-2 logprob (waves;
not a trace condition's); a rescoring's entries have "ids" (the tokens rescored),
"logprobs" (each one's) and "top" ([top-1 id, top-1 logprob] at each position). Deliberately free of evalgate imports, so that what the
gate reports can be checked against what vLLM itself does on this machine.
"""

from __future__ import annotations

import json
import os
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
        if "rescore" in condition:
            tokens = condition["rescore"]  # {key: ids}, or the name of an earlier condition whose outputs to rescore
            if isinstance(tokens, str):
                tokens = {key: out["ids"] for key, out in results[tokens].items()}
            results[condition["name"]] = rescore(llm, prompts, condition["name"], tokens,
                                                 plan["sampling"].get("logprobs", 5))
            continue
        if "trace" in condition:
            results[condition["name"]] = replay(llm, prompts, condition, params)
            continue
        keys = list(condition.get("batch") or prompts)  # "batch": only these requests, as one wave
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
                                "cached_tokens": out.num_cached_tokens, "margins": [margin(step) for step in sample.logprobs]}
        results[condition["name"]] = outputs
    with open(result_path, "w", encoding="utf-8") as f:
        json.dump({"conditions": results}, f)


def replay(llm, prompts: dict, condition: dict, params) -> dict:
    """Each request (or those of `keys`) at its marker's place in one replay of the trace, cold."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    engine, outputs = llm.llm_engine, {}
    for key in condition.get("keys") or prompts:
        salt = f"{condition['name']}/{key}"
        arrivals = sorted(enumerate(condition["trace"]), key=lambda a: (a[1]["step"], a[0]))
        active, tokens, step, done = {}, {}, 0, None
        while done is None:
            while arrivals and arrivals[0][1]["step"] <= step:
                line, event = arrivals.pop(0)
                if event.get("gated"):
                    engine.add_request(key, {**prompts[key], "cache_salt": salt}, params)
                    continue
                request_id = f"trace-{line}"
                engine.add_request(request_id, {"prompt_token_ids": event["prompt_ids"], "cache_salt": f"{salt}/trace"},
                                   SamplingParams(max_tokens=event["max_tokens"], temperature=0.0, ignore_eos=True,
                                                  output_kind=RequestOutputKind.DELTA))
                active[request_id], tokens[request_id] = (event, step), 0
            for request_id, (event, arrived) in list(active.items()):
                cancel = event.get("cancel_after") or {}
                if (("steps" in cancel and step - arrived >= cancel["steps"])
                        or ("tokens" in cancel and tokens[request_id] >= cancel["tokens"])):
                    engine.abort_request([request_id])
                    del active[request_id]
            if not engine.has_unfinished_requests():
                if not arrivals:
                    raise SystemExit(f"the trace of {condition['name']} has no gated marker")
                step = max(step + 1, arrivals[0][1]["step"])
                continue
            for out in engine.step():
                if out.request_id == key:
                    done = out if out.finished else None
                elif out.request_id in tokens:
                    tokens[out.request_id] += len(out.outputs[0].token_ids)
                    if out.finished:
                        active.pop(out.request_id, None)
            step += 1
        for request_id in active:  # nothing later can change the request's output
            engine.abort_request([request_id])
        sample = done.outputs[0]
        logprobs = [row[token].logprob for token, row in zip(sample.token_ids, sample.logprobs)]
        outputs[key] = {"ids": list(sample.token_ids), "logprob_bits": [struct.pack("<d", lp).hex() for lp in logprobs],
                        "cached_tokens": done.num_cached_tokens}
    return outputs


def margin(step: dict) -> float | None:
    """Top-1 minus top-2 logprob at one position (what a token flip's class is judged by)."""
    top = sorted((lp.logprob for lp in step.values()), reverse=True)
    return top[0] - top[1] if len(top) > 1 else None


def rescore(llm, prompts: dict, name: str, tokens: dict, k: int) -> dict:
    """Each request's given tokens scored as a continuation of its prompt, alone, cold."""
    from vllm import SamplingParams

    tokenizer = llm.get_tokenizer()
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=k)
    outputs = {}
    for key, ids in tokens.items():
        prompt = prompts[key]
        prompt_ids = prompt.get("prompt_token_ids") or tokenizer.encode(prompt["prompt"])
        out = llm.generate([{"prompt_token_ids": list(prompt_ids) + list(ids),
                             "cache_salt": f"{name}/{key}"}], [params], use_tqdm=False)[0]
        rows = out.prompt_logprobs[len(prompt_ids):]
        outputs[key] = {"ids": list(ids), "logprobs": [row[t].logprob for t, row in zip(ids, rows)],
                        "top": [list(max(((i, lp.logprob) for i, lp in row.items()), key=lambda e: (e[1], -e[0])))
                                for row in rows]}
    return outputs


if __name__ == "__main__":
    main(*sys.argv[1:3])
    # the result is written: skip the interpreter's teardown of torch's and vLLM's modules (about 3 s here)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
