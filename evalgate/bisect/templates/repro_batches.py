#!/usr/bin/env python3
"""Reproduce a divergence with vLLM alone (written by evalgate; needs only vLLM and the model).

Reads the JSON files next to this script, sets the recorded environment before vLLM is imported, starts
one engine with the recorded engine arguments, submits each batch in order (prefix cache reset before
each), and compares the target request's output. Exit 0: the divergence reproduced; 1: it did not;
2: bad arguments or a missing file. See README.md.
"""

import argparse
import json
import os
import re
import struct
import sys
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))


def load(name):
    try:
        with open(os.path.join(HERE, name), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as exc:
        print(f"cannot read {name}: {exc}", file=sys.stderr)
        sys.exit(2)


def bits(values):
    return [struct.pack("<d", float(v)) for v in values]


def first_difference(a, b, criterion):
    """(position, kind) where output b first departs from output a, or None."""
    for i, (x, y) in enumerate(zip(a["token_ids"], b["token_ids"])):
        if x != y:
            return i, "token"
    if len(a["token_ids"]) != len(b["token_ids"]):
        return min(len(a["token_ids"]), len(b["token_ids"])), "length"
    if criterion == "bits":
        for i, (x, y) in enumerate(zip(bits(a["logprobs"]), bits(b["logprobs"]))):
            if x != y:
                return i, "logprob"
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model directory (default: the recorded one, engine.json)")
    parser.add_argument("--tokenizer", help="tokenizer directory (default: the recorded one, or --model)")
    parser.add_argument("--exact", action="store_true", help="also require the recorded outputs bit for bit")
    args = parser.parse_args()

    requests = {r["id"]: r for r in load("requests.json")["requests"]}
    plan = load("batches.json")
    engine = load("engine.json")
    env = load("env.json")

    # The recorded environment, set before vLLM (and torch) are imported: they read it once, at import.
    ignored = re.compile(env.get("ignored_pattern") or "$^")
    for name in list(os.environ):
        upper = name.upper()
        if (upper.startswith(tuple(env.get("watched_prefixes", ()))) and not ignored.search(upper)
                and name not in env["variables"] and name not in env.get("redacted_left_out", ())):
            del os.environ[name]
    os.environ.update(env["variables"])
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process engine core, as evalgate runs it
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("TQDM_DISABLE", "1")

    model = args.model or engine["model"]
    tokenizer = args.tokenizer or (args.model if args.model else engine["tokenizer"])
    if not os.path.isdir(model):
        print(f"model directory {model} not found: pass --model DIR", file=sys.stderr)
        sys.exit(2)

    warnings.filterwarnings("ignore", category=FutureWarning)
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, tokenizer=tokenizer, **engine["engine_args"])
    loras = {}
    if engine.get("adapters"):  # LoRA adapters by name, ids by name order (as evalgate submits them)
        from vllm.lora.request import LoRARequest

        loras = {name: LoRARequest(name, n, path) for n, (name, path) in enumerate(sorted(engine["adapters"].items()), 1)}
    decode = llm.get_tokenizer().decode
    target = plan["target"]
    criterion = plan["criterion"]
    results = []
    for number, batch in enumerate(plan["batches"], 1):
        if hasattr(llm, "reset_prefix_cache"):
            llm.reset_prefix_cache()
        members = [requests[rid] for rid in batch["requests"]]
        inputs = [{"prompt_token_ids": list(r["prompt_token_ids"])} for r in members]
        params = [SamplingParams(**r["sampling"]) for r in members]
        lora = {"lora_request": [loras.get(r.get("adapter")) for r in members]} if loras else {}
        outputs = llm.generate(inputs, params, use_tqdm=False, **lora)
        out = outputs[batch["target_index"]].outputs[0]
        ids = list(out.token_ids)
        logprobs = [float(position[t].logprob) for t, position in zip(ids, out.logprobs or [])]
        got = {"token_ids": ids, "logprobs": logprobs}
        exact = first_difference(batch["expected"], got, "bits") is None
        results.append((batch, got, exact))
        print(f"batch {number}: {batch['label']} ({len(members)} request(s)): {target} -> "
              f"{ids[:12]}{' ...' if len(ids) > 12 else ''}  "
              f"[{'exactly the recorded output' if exact else 'NOT bit-identical to the recorded output'}]")

    all_exact = all(exact for _, _, exact in results)
    if plan["mode"] == "pair":
        (_, a, _), (_, b, _) = results[0], results[1]
        diff = first_difference(a, b, criterion)
        reproduced = diff is not None
        if reproduced:
            i, kind = diff
            ta = a["token_ids"][i] if i < len(a["token_ids"]) else None
            tb = b["token_ids"][i] if i < len(b["token_ids"]) else None
            def show(t):
                return "(end)" if t is None else f"{t} {decode([t])!r}"

            print(f"first difference at output token {i} ({kind}): {show(ta)} in batch 1 vs {show(tb)} in batch 2")
    else:
        (batch, got, _), = results[:1]
        reproduced = first_difference(batch["expected"], got, criterion) is None
    if args.exact and not all_exact:
        print("VERDICT: NOT REPRODUCED exactly (--exact): some batch did not give the recorded output bit for bit")
        return 1
    if reproduced:
        if plan["mode"] == "pair":
            print(f"VERDICT: REPRODUCED: the divergence reproduced: {target}'s output differs between the batches "
                  f"(on {criterion}){'; both match the recorded outputs exactly' if all_exact else ''}")
        else:
            print(f"VERDICT: REPRODUCED: the observed output reproduced (on {criterion})")
        return 0
    print(f"VERDICT: NOT REPRODUCED: {target}'s output "
          + ("is the same in every batch" if plan["mode"] == "pair" else "differs from the observed one")
          + f" (on {criterion}) on this machine")
    return 1


if __name__ == "__main__":
    sys.exit(main())
