"""`evalgate repro RUN KEY -o DIR`: a self-contained repro pack for one request's divergence.

The pack holds everything needed to show the divergence with vLLM alone, on any machine with the model:
the requests (prompt text and token ids, sampling parameters), the batches to submit (in order, with the
target's expected output in each), the engine arguments, the run's allow-listed environment, its
fingerprint, expected vs observed token ids, a plain Python script (`repro.py`, no evalgate import) and
its README.

Which batches:
- batch variance (the run's passes disagree): the reference pass's wave (alone, if that pass ran at
  concurrency 1) and the wave of the first pass that differs; the script reproduces the divergence if the
  target's output differs between the two batches.
- silent regression (equal to nothing in the baseline, nothing in the identity changed): the baseline's
  wave and the run's wave, both run with the run's configuration (they are the same configuration).
- explained change (some identity component changed): the baseline's configuration cannot be rebuilt
  from the run, so the pack has one batch, the run's wave; the script reproduces the observed output.
`evalgate bisect batch --repro` writes a pack whose batches are [target] and [target + minimal neighbours].

Batches run in one engine, in order, with vLLM's prefix cache reset before each one, so no batch reuses
state from the previous one.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..codec import to_json
from ..configuration.prompts import SCORING_TYPES, Prompt
from ..configuration.schedule import passes_of
from ..errors import ConfigError
from ..fingerprint import ENV_IGNORED, ENV_PREFIXES, REDACTED
from ..fingerprint import delta as fingerprint_delta
from ..judgement.compare import Divergence, first_divergence, within_run
from ..judgement.factors import is_batch_factor, words
from ..records import Completion, unpack_ids
from ..store import RunRecord, Store

PACK_SCHEMA = "evalgate.repro/1"


# --- shared with `bisect batch` ------------------------------------------------------------------------------

TEMPLATES = Path(__file__).parent / "templates"  # the packs' scripts and READMEs, shipped as files


def template(name: str) -> str:
    """A file a pack is written from (evalgate/bisect/templates/: real Python that ruff checks and the
    tests run as files)."""
    return (TEMPLATES / name).read_text(encoding="utf-8")


def check_request(record: RunRecord, key: str) -> None:
    """The request exists in the run, has outputs, and is a generation request (lm-eval scoring requests
    cannot be rebuilt from the store: their windows are not stored)."""
    if key not in record.requests:
        known = sorted(record.requests)
        hint = f" (it has {len(known)}: {', '.join(known[:5])}{' ...' if len(known) > 5 else ''})" if known else ""
        raise ConfigError(f"run {record.id} has no request {key!r}{hint}",
                          fix=f"pick a request key of run {record.id} (`evalgate runs show {record.id}`)")
    if record.requests[key].request_type in SCORING_TYPES:
        raise ConfigError(f"request {key!r} of run {record.id} is an lm-eval {record.requests[key].request_type} "
                          "request: only generation requests can be bisected or reproduced",
                          fix="pick a generation request (a prompts-file line or an lm-eval generate_until request)")
    if not record.outputs.get(key):
        raise ConfigError(f"run {record.id} has no outputs for request {key!r}",
                          fix="pick a complete run (`evalgate runs list`)")


def prompt_of(request) -> Prompt:
    """A stored request as the engine takes it: its token ids and its effective sampling parameters."""
    return Prompt(request.key, request.prompt, max_tokens=None, line=0, prompt_ids=tuple(unpack_ids(request.prompt_ids)),
                  sampling=dict(request.sampling))


def wave_of(record: RunRecord, key: str, pass_index: int) -> list[Completion]:
    """The outputs submitted together with `key` in one pass (its wave), in submission order."""
    mine = next((c for c in record.outputs.get(key, []) if c.pass_index == pass_index), None)
    if mine is None:
        return []
    wave = [c for outputs in record.outputs.values() for c in outputs
            if c.pass_index == pass_index and c.wave == mine.wave]
    return sorted(wave, key=lambda c: c.position)


def criterion_of(divergence: Divergence) -> str:
    """`tokens` if the divergence changed a token id (or the length), else `bits` (logprob bits only)."""
    return "tokens" if divergence.kind in ("token", "length") else "bits"


def output_doc(c: Completion) -> dict:
    return {"token_ids": c.output_ids.tolist(), "logprobs": c.logprobs.tolist(), "text": c.text,
            "token_texts": list(c.token_texts)}


# --- the pack ------------------------------------------------------------------------------------------------

@dataclass
class ReproBatch:
    """One submission of the pack: `keys` in order (the target among them), the target's expected output."""

    label: str
    keys: list[str]
    expected: Completion
    source: str = ""  # where the expected output came from ("run 3, pass 1, wave 0")
    record: RunRecord | None = None  # the run whose requests these keys name (default: the pack's run)


@dataclass
class ReproPack:
    path: Path
    key: str
    kind: str  # batch_variance | silent_regression | explained_change | bisect
    mode: str  # pair (the batches must disagree) | single (the batch must give the observed output)
    batches: list[ReproBatch]
    criterion: str
    divergence: Divergence | None
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"repro pack for {self.key!r} ({self.kind.replace('_', ' ')}) written to {self.path}"]
        for i, b in enumerate(self.batches):
            out.append(f"  batch {i + 1}: {b.label}: {len(b.keys)} request(s)" + (f" ({b.source})" if b.source else ""))
        if self.divergence is not None:
            d = self.divergence
            out.append(f"  first divergence at token {d.position}: {d.reference_id} {d.reference_text!r} -> "
                       f"{d.other_id} {d.other_text!r} (on {self.criterion})")
        out += [f"  note: {n}" for n in self.notes]
        out.append(f"run it: python {self.path / 'repro.py'}   (exit 0: reproduced, 1: not reproduced)")
        return out


def default_batches(store: Store, record: RunRecord, key: str) -> tuple[str, str, list[ReproBatch], Divergence, list[str]]:
    """(kind, mode, batches, divergence, notes) for a request's recorded divergence."""
    completions = record.outputs[key]
    disagreement = within_run(completions, passes_of(record.run.schedule))
    if disagreement is not None:
        ref_pass, other_pass = disagreement.reference_pass, disagreement.other_pass
        ref = next(c for c in completions if c.pass_index == ref_pass)
        other = next(c for c in completions if c.pass_index == other_pass)
        batches = []
        for c, role in ((ref, "reference"), (other, "observed")):
            wave = wave_of(record, key, c.pass_index)
            label = "alone" if len(wave) == 1 else f"{role}: crowded"
            batches.append(ReproBatch(label, [w.key for w in wave], c,
                                      f"run {record.id}, pass {c.pass_index} (concurrency {c.concurrency}), wave {c.wave}"))
        notes = []
        if not (is_batch_factor(disagreement.factor) or disagreement.factor in ("repeat", None)):
            notes.append(f"the recorded difference is attributed to {words(disagreement.factor)}; this pack replays "
                         "the two batches, each in a fresh engine, so it shows batch effects only")
        return "batch_variance", "pair", batches, disagreement.divergence, notes
    baseline_id = record.run.baseline_run_id
    if baseline_id is None:
        raise ConfigError(f"request {key!r} of run {record.id} shows no divergence: its passes agree and the run was "
                          "not compared with a baseline", fix="pick a request with batch variance or a changed output "
                          f"(`evalgate runs show {record.id}`)")
    base = store.load(baseline_id)
    if not base.outputs.get(key):
        raise ConfigError(f"request {key!r} is new in run {record.id} (baseline run {baseline_id} does not have it): "
                          "there is nothing to compare it with", fix="pick a request whose output changed")
    divergence = first_divergence(base.outputs[key][0], completions[0])
    if divergence is None:
        raise ConfigError(f"request {key!r} of run {record.id} shows no divergence: its passes agree and equal "
                          f"baseline run {baseline_id}", fix="pick a request with batch variance or a changed output")
    changed = fingerprint_delta(base.fingerprint, record.fingerprint)
    if base.requests[key].request_hash != record.requests[key].request_hash:
        changed.append("suite")
    observed_wave = wave_of(record, key, completions[0].pass_index)
    observed = ReproBatch(f"observed: run {record.id}" + (" alone" if len(observed_wave) == 1 else
                                                            f", crowded ({len(observed_wave)} requests)"),
                          [w.key for w in observed_wave], completions[0],
                          f"run {record.id}, pass 0 (concurrency {completions[0].concurrency}), wave {completions[0].wave}")
    if changed:
        note = (f"explained change ({', '.join(changed)} changed since baseline run {baseline_id}): the baseline's "
                "configuration cannot be rebuilt from this run, so the script reproduces the observed output; "
                "the baseline's output is recorded in expected.json for comparison")
        return "explained_change", "single", [observed], divergence, [note]
    base_wave = wave_of(base, key, base.outputs[key][0].pass_index)
    reference = ReproBatch(f"reference: baseline run {baseline_id}" + (" alone" if len(base_wave) == 1 else
                                                                       f", crowded ({len(base_wave)} requests)"),
                           [w.key for w in base_wave], base.outputs[key][0],
                           f"run {baseline_id}, pass 0 (concurrency {base.outputs[key][0].concurrency}), "
                           f"wave {base.outputs[key][0].wave}", record=base)
    return "silent_regression", "pair", [reference, observed], divergence, []


def engine_doc(record: RunRecord) -> dict:
    engine = record.fingerprint.engine
    args = dict(engine.get("args", {}))
    args.setdefault("seed", 0)  # evalgate's default (evalgate/engines/vllm_offline.py)
    model = record.fingerprint.local_path("model")
    tokenizer = record.fingerprint.local_path("tokenizer") or model
    if model is None:
        from .trials import suite_of

        suite = suite_of(record)
        model, tokenizer = str(suite.model), str(suite.tokenizer or suite.model)
    # each LoRA adapter the run's requests used: where its files were (the pack loads them from there)
    adapters = record.fingerprint.adapter_paths
    return {"model": model, "tokenizer": tokenizer, "engine_args": args, **({"adapters": adapters} if adapters else {}),
            "recorded": {k: engine.get(k) for k in ("kind", "vllm", "torch", "platform", "dtype", "enforce_eager",
                                                   "prefix_caching", "chunked_prefill", "max_num_seqs",
                                                   "torch_threads", "batch_invariance") if k in engine}}


def env_doc(record: RunRecord) -> dict:
    env = record.fingerprint.env
    return {"variables": {k: v for k, v in sorted(env.items()) if v != REDACTED},
            "redacted_left_out": sorted(k for k, v in env.items() if v == REDACTED),
            # names the run's fingerprint watches: the script unsets the watched names the run did not have
            "watched_prefixes": list(ENV_PREFIXES), "ignored_pattern": ENV_IGNORED.pattern}


def write_repro(store: Store, run_id: int, key: str, out_dir: Path, *, batches: list[ReproBatch] | None = None,
                criterion: str | None = None, kind: str = "bisect") -> ReproPack:
    """Write the pack into `out_dir` (which must not exist or be empty). `batches`: the submissions to make
    (default: the request's recorded divergence, see the module docstring); with `batches`, the script
    checks that the target's output differs between the first two (on `criterion`)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ConfigError(f"{out_dir} exists and is not an empty directory",
                          fix="name a new directory for the repro pack (or remove the old one)")
    record = store.load(run_id)
    check_request(record, key)
    notes: list[str] = []
    if batches is None:
        kind, mode, batches, divergence, notes = default_batches(store, record, key)
    else:
        mode = "pair" if len(batches) >= 2 else "single"
        divergence = first_divergence(batches[0].expected, batches[1].expected) if len(batches) >= 2 else None
    if criterion is None:
        criterion = criterion_of(divergence) if divergence is not None else "bits"
    for b in batches:
        b.record = b.record or record
        missing = [k for k in b.keys if k not in b.record.requests]
        if missing or key not in b.keys:
            raise ConfigError(f"batch {b.label!r} names requests run {b.record.id} does not have: {missing or [key]}")
        scoring = [k for k in b.keys if b.record.requests[k].request_type in SCORING_TYPES]
        if scoring:
            raise ConfigError(f"batch {b.label!r} holds lm-eval scoring requests ({', '.join(scoring[:3])}) that cannot "
                              "be rebuilt from the store", fix="reproduce a run of generation requests")

    # requests.json: one entry per distinct request (a key whose text differs between the runs gets its own id)
    requests: dict[str, dict] = {}
    adapters = record.fingerprint.request_adapters  # the LoRA adapter each request ran under
    batch_docs = []
    for b in batches:
        ids = []
        for k in b.keys:
            req = b.record.requests[k]
            rid = k
            if rid in requests and requests[rid]["request_hash"] != req.request_hash:
                rid = f"{k}@run{b.record.id}"
            requests.setdefault(rid, {"id": rid, "key": k, "run": b.record.id, "request_hash": req.request_hash,
                                      "prompt": req.prompt, "prompt_token_ids": unpack_ids(req.prompt_ids),
                                      "sampling": dict(req.sampling),
                                      **({"adapter": adapters[k]} if k in adapters else {})})
            ids.append(rid)
        batch_docs.append({"label": b.label, "source": b.source, "requests": ids, "target_index": b.keys.index(key),
                           "expected": output_doc(b.expected)})
    fingerprint = record.fingerprint
    engine = engine_doc(record)
    env = env_doc(record)
    expected = {"schema": PACK_SCHEMA, "run": record.id, "target": key, "kind": kind, "mode": mode,
                "criterion": criterion, "expected": {"from": batches[0].source, **output_doc(batches[0].expected)},
                "observed": {"from": batches[-1].source, **output_doc(batches[-1].expected)},
                "first_divergence": to_json(divergence)}
    if kind == "explained_change":
        base = store.load(record.run.baseline_run_id)
        expected["expected"] = {"from": f"baseline run {base.id}, pass 0", **output_doc(base.outputs[key][0])}
        expected["first_divergence"] = to_json(divergence)
    docs = {
        "requests.json": {"schema": PACK_SCHEMA, "requests": list(requests.values())},
        "batches.json": {"schema": PACK_SCHEMA, "target": key, "mode": mode, "criterion": criterion,
                         "batches": batch_docs},
        "engine.json": engine,
        "env.json": env,
        "fingerprint.json": fingerprint,
        "expected.json": expected,
    }
    pack = ReproPack(out_dir, key, kind, mode, batches, criterion, divergence, notes)
    parent = out_dir.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=parent))
    try:
        for name, doc in docs.items():
            (tmp / name).write_text(json.dumps(doc, indent=1, ensure_ascii=False, default=str) + "\n", encoding="utf-8")
        (tmp / "repro.py").write_text(template("repro_batches.py"), encoding="utf-8")
        os.chmod(tmp / "repro.py", 0o755)
        (tmp / "README.md").write_text(_readme(pack, record, engine, env, expected), encoding="utf-8")
        if out_dir.exists():
            out_dir.rmdir()  # empty (checked above)
        os.replace(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return pack


def _readme(pack: ReproPack, record: RunRecord, engine: dict, env: dict, expected: dict) -> str:
    d = pack.divergence
    what = {
        "batch_variance": "the same request gives different outputs depending on which requests share its batch "
                          "(batch variance)",
        "silent_regression": "the request's output differs from the baseline run's although nothing in the identity "
                             "changed (silent regression): the only difference is which requests shared its batch",
        "explained_change": "the request's output differs from the baseline run's, and an identity component "
                            "changed (explained change)",
        "bisect": "the request's output changes when a minimal set of other requests shares its batch "
                  "(found by `evalgate bisect batch`)",
    }[pack.kind]
    lines = [f"# Repro pack: request `{pack.key}` of run {record.id}", "",
             f"What it shows: {what}.", ""]
    if d is not None:
        lines += [f"First divergence at output token {d.position} ({d.kind}): {d.reference_id} {d.reference_text!r} "
                  f"(expected) vs {d.other_id} {d.other_text!r} (observed)"
                  + (f"; expected's top-1 minus top-2 logprob there: {d.margin:.4g}" if d.margin is not None else "")
                  + ".", ""]
    lines += ["## Run it", "", "```bash", "python repro.py            # needs vLLM and the model below; no evalgate",
              "python repro.py --exact    # also require the recorded outputs bit for bit",
              "python repro.py --model DIR --tokenizer DIR   # the model lives elsewhere on this machine", "```", "",
              "Exit codes: `0` the divergence reproduced, `1` it did not, `2` bad arguments or a missing file.", ""]
    if pack.mode == "pair":
        lines += ["The script starts one vLLM engine with the recorded engine arguments and environment, submits each "
                  "batch below in order (one `llm.generate` call each, so the batch's requests share the engine's "
                  "batches; vLLM's prefix cache is reset before each), and compares the target's output between "
                  f"the first two batches on **{pack.criterion}** "
                  + ("(token ids)" if pack.criterion == "tokens" else "(token ids and every logprob bit)")
                  + ". It reproduced if they differ. It also says whether each batch gave exactly the recorded output "
                  "(another CPU or GPU, or another vLLM/torch build, may give other bits and still show the divergence).",
                  ""]
    else:
        lines += ["The script reproduces the **observed** output: the baseline's configuration differs in an identity "
                  "component and cannot be rebuilt from this run, so it runs the run's batch with the run's "
                  f"configuration and checks the target's output equals the observed one on {pack.criterion}. "
                  "The baseline's (expected) output is in `expected.json`.", ""]
    lines += ["## Batches", ""]
    for i, b in enumerate(pack.batches):
        lines.append(f"{i + 1}. {b.label}: `{'`, `'.join(b.keys)}` (target at position {b.keys.index(pack.key)}; "
                     f"recorded in {b.source or 'the bisect'})")
    lines += ["", "## Model and engine", "",
              f"- model: `{engine['model']}`", f"- tokenizer: `{engine['tokenizer']}`",
              f"- engine arguments: `{json.dumps(engine['engine_args'], sort_keys=True)}`"]
    rec = engine.get("recorded", {})
    if rec:
        lines.append("- recorded: " + ", ".join(f"{k} {json.dumps(v, sort_keys=True)}" for k, v in rec.items()))
    lines += [f"- environment set before vLLM is imported: `{json.dumps(env['variables'], sort_keys=True)}`"]
    if env["redacted_left_out"]:
        lines.append(f"- left out (secret-looking, never stored): {', '.join(env['redacted_left_out'])}")
    lines += ["", "## Fingerprint (fingerprint.json)", ""]
    for name, comp in sorted(record.fingerprint.items()):
        lines.append(f"- {name}: `{str(comp.get('hash', ''))[:16]}`")
    lines += ["", "## Files", "",
              "- `requests.json`: every request (prompt text, prompt token ids, sampling parameters)",
              "- `batches.json`: the batches in order, with the target's expected token ids and logprobs in each",
              "- `engine.json`: model, tokenizer and engine arguments (seed 0 unless the suite set one)",
              "- `env.json`: the run's allow-listed environment", "- `fingerprint.json`: the run's identity",
              "- `expected.json`: expected vs observed token ids and the first divergence",
              "- `repro.py`: the script (plain Python + vLLM)", ""]
    lines += [f"Written by evalgate from run {record.id} ({record.run.suite_name}, {record.run.suite_path}).", ""]
    return "\n".join(lines)
