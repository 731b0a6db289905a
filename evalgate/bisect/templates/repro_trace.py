"""Replays trace.jsonl around the request in request.json with plain vLLM (no evalgate; written by
`evalgate fuzz`). Exit 0: the request's output differs from its output alone (reproduced); 1: it does not;
2: a file of the pack is missing. See README.md."""
import json
import os
import sys
import uuid

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
here = os.path.dirname(os.path.abspath(__file__))


def load(name):
    path = os.path.join(here, name)
    if not os.path.isfile(path):
        print(f"{name} not found next to this script: run it inside the repro pack", file=sys.stderr)
        sys.exit(2)
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()] if name.endswith(".jsonl") else json.load(f)


engine_doc = load("engine.json")
for name, value in engine_doc["env"].items():
    if value != "<redacted>":
        os.environ.setdefault(name, value)
from vllm import LLM, SamplingParams  # noqa: E402
from vllm.sampling_params import RequestOutputKind  # noqa: E402

request = load("request.json")
events = load("trace.jsonl")
args = dict(engine_doc["engine_args"])
args.setdefault("seed", 0)
llm = LLM(model=engine_doc["model"], tokenizer=engine_doc["tokenizer"], **args)
core = llm.llm_engine
sampling = {k: v for k, v in request["sampling"].items()}


def gated_input(salt):
    if request["prompt_ids"]:
        return {"prompt_token_ids": request["prompt_ids"], "cache_salt": salt}
    if request["messages"]:
        text = llm.get_tokenizer().apply_chat_template(request["messages"], tokenize=False, add_generation_prompt=True)
        return {"prompt_token_ids": llm.get_tokenizer().encode(text, add_special_tokens=False), "cache_salt": salt}
    return {"prompt": request["prompt"], "cache_salt": salt}


alone = llm.generate([gated_input(uuid.uuid4().hex)], SamplingParams(**sampling), use_tqdm=False)[0].outputs[0]
arrivals = sorted([(e["step"], i, e) for i, e in enumerate(events)], key=lambda a: (a[0], a[1]))
active, tokens, step, result = {}, {}, 0, None
salt = uuid.uuid4().hex
while arrivals or core.has_unfinished_requests():
    while arrivals and arrivals[0][0] <= step:
        _, i, e = arrivals.pop(0)
        if e.get("gated"):
            core.add_request("gated", gated_input(salt), SamplingParams(**sampling, output_kind=RequestOutputKind.FINAL_ONLY))
        else:
            rid = "trace-" + e["id"]
            core.add_request(rid, {"prompt_token_ids": e["prompt_ids"], "cache_salt": salt + "-t"},
                             SamplingParams(max_tokens=e["max_tokens"], temperature=0.0, ignore_eos=True,
                                            output_kind=RequestOutputKind.DELTA))
            active[rid] = (e, step)
            tokens[rid] = 0
    for rid, (e, arrived) in list(active.items()):
        cancel = e.get("cancel_after") or {}
        if (cancel.get("steps") is not None and step - arrived >= cancel["steps"]) or (
                cancel.get("tokens") is not None and tokens[rid] >= cancel["tokens"]):
            core.abort_request([rid])
            del active[rid]
    if not core.has_unfinished_requests():
        if arrivals:
            step = max(step + 1, arrivals[0][0])
        continue
    for out in core.step():
        if out.request_id == "gated":
            if out.finished:
                result = out.outputs[0]  # the rest of the trace cannot change it
        else:
            tokens[out.request_id] = tokens.get(out.request_id, 0) + len(out.outputs[0].token_ids)
            if out.finished:
                active.pop(out.request_id, None)
    step += 1
    if result is not None:
        break

print("alone:    ", list(alone.token_ids))
print("in trace: ", list(result.token_ids))
# the level the search judged on (outputs.json "on"): "tokens" compares the token ids alone
on = load("outputs.json").get("on", "bits")
same = list(alone.token_ids) == list(result.token_ids) and (on == "tokens" or all(
    a[t].logprob == b[t].logprob for a, b, t in zip(alone.logprobs or [], result.logprobs or [], alone.token_ids)))
print(f"reproduced: the outputs differ in {on}" if not same else f"not reproduced: the outputs are equal in {on}")
sys.exit(0 if not same else 1)
