"""What varies on the machine at hand: a survey at session start, and the oracle the negative controls use.

No fixed prompt set varies on every CPU: on an AVX2 EPYC the tiny fp32 model varies under the prefix
cache and batch size while SmolLM2 does not; on an AVX-512 EPYC it is the other way round (docs/conditions.md).
So the tests that need a real variance source ask `variance_source`, once per test session (shared by the
xdist workers through a file lock): each candidate (model, dtype, prompts, max_tokens) runs in plain vLLM
(tests/raw_vllm.py, no evalgate) under the conditions a gate run compares, and the first candidate whose
requests differ between alone and crowded is the source. Its raw results are also the oracle: a test runs
the gate on the same workload and asserts the gate reports exactly the requests plain vLLM shows
differing, under each factor, and "invariant under" where plain vLLM shows none.

If no real candidate varies (a CPU whose kernels give every row the same bits in every batch), the source is
the planted one: the tiny model in real vLLM with a batch effect planted by a vLLM plugin (tests/planted,
`PLANTED`), surveyed and judged like any other. Its environment (`VarianceSource.env`) goes to every CLI and
oracle call of a test on the source (conftest's `cli`). So the negative controls never skip and never fail
for want of variance; the table says which source it was.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

RAW = Path(__file__).with_name("raw_vllm.py")
# The conditions of a gate run with concurrency (1, n), one hot pass and one shuffle, in its pass order:
# condition -> (reference condition, the gate's factor for that comparison).
COMPARISONS = {"hot": ("alone", "prefix_cache"), "crowded": ("alone", "batch_size"), "order": ("crowded", "order")}
SHUFFLE_SEED = 0  # the gate's default schedule seed: its shuffled pass uses random.Random(0)
WORDS = ("the river city number answer model colour quick brown fox lazy dog over under capital country "
         "garden winter market letter music window silver morning story bridge").split()


def long_prompts(n: int, base_words: int, step: int, seed: int = 0) -> tuple[str, ...]:
    """Seeded word salad, prompt i has base_words + i*step words (longer than a 128-token cache block)."""
    prompts = []
    for i in range(n):
        rng = random.Random(seed * 1000 + i)
        prompts.append(f"Record {i}: " + " ".join(rng.choice(WORDS) for _ in range(base_words + i * step)))
    return tuple(prompts)


def tiny_prompts(n: int = 48) -> tuple[str, ...]:
    """The tiny model's workload (117-439 of its tokens): what varies on the AVX2 EPYC (hot cache 7/48,
    batch size 3/48, logprob bits only)."""
    prompts = []
    for i in range(n):
        rng = random.Random(i)
        prompts.append(f"Record {i}: " + " ".join(rng.choice(WORDS[:16]) for _ in range(30 + (i * 37) % 90)))
    return tuple(prompts)


@dataclass(frozen=True)
class Candidate:
    name: str
    preset: str  # `evalgate build-model --preset`
    dtype: str
    prompts: tuple[str, ...]
    max_tokens: int
    max_model_len: int = 512
    planted: bool = False  # run with the planted batch effect (helpers.planted_batch_variance)

    @property
    def env(self) -> dict[str, str]:
        """What a CLI or oracle call on this workload adds to its environment (this process's PYTHONPATH kept)."""
        from helpers import planted_batch_variance

        return planted_batch_variance(dict(os.environ)) if self.planted else {}

    def keys(self) -> list[str]:
        return [f"p{i:03d}" for i in range(len(self.prompts))]


# Ordered cheapest-first for the CPU at hand (a guess only: the survey measures every one it tries).
# SmolLM2 fp32 varies at decode batch 1 vs more than 1 on the AVX-512 EPYC (every request, first at
# output token 1, so 4 tokens show it); the tiny fp32 model needs 48 long prompts and 16 tokens on AVX2.
SMOLLM2 = Candidate("smollm2 fp32", "smollm2", "float32", long_prompts(6, 120, 8), max_tokens=3)
TINY = Candidate("tiny fp32", "tiny", "float32", tiny_prompts(48), max_tokens=16)
# the last resort, on any CPU: every request that shares a step differs in bits, none alone
PLANTED = Candidate("tiny planted", "tiny", "float32", tiny_prompts(8), max_tokens=8, planted=True)


def candidates() -> list[Candidate]:
    flags = ""
    try:
        flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "")
    except OSError:
        pass
    return [SMOLLM2, TINY] if " avx512f" in flags else [TINY, SMOLLM2]


@dataclass(frozen=True)
class VarianceSource:
    """A workload that varies on this machine, with plain vLLM's own findings for it (the oracle)."""

    candidate: Candidate
    model: Path
    differing: dict[str, list[str]]  # gate factor -> request keys plain vLLM shows differing
    token_flips: dict[str, list[str]]  # gate factor -> those whose token ids differ
    cache_hits: int  # requests of the hot condition served from the prefix cache
    table: str
    # gate factor -> {flipping key: the reference's top-1 minus top-2 logprob where its tokens first differ}
    flip_margins: dict[str, dict[str, float]]

    @property
    def prompts(self) -> list[str]:
        return list(self.candidate.prompts)

    @property
    def dtype(self) -> str:
        return self.candidate.dtype

    @property
    def max_tokens(self) -> int:
        return self.candidate.max_tokens

    @property
    def n(self) -> int:
        return len(self.candidate.prompts)

    @property
    def env(self) -> dict[str, str]:
        return self.candidate.env

    def suite(self, directory: Path, **kwargs) -> Path:
        """A suite file of this workload (conftest.write_suite's keywords)."""
        from helpers import write_suite

        kwargs.setdefault("max_tokens", self.max_tokens)
        kwargs.setdefault("dtype", self.dtype)
        return write_suite(directory, self.model, self.prompts, **kwargs)


def raw_conditions(candidate: Candidate, model: Path, work: Path, env: dict[str, str]) -> dict:
    """Plain vLLM's outputs for the candidate under every condition of COMPARISONS."""
    n = len(candidate.prompts)
    plan = {"model": str(model), "dtype": candidate.dtype,
            "engine": {"max_model_len": candidate.max_model_len, "enforce_eager": True, "seed": 0},
            "sampling": {"temperature": 0.0, "max_tokens": candidate.max_tokens, "logprobs": 5},
            "prompts": [{"key": k, "prompt": p} for k, p in zip(candidate.keys(), candidate.prompts)],
            "conditions": [{"name": "alone", "concurrency": 1, "salt": "alone"},
                           {"name": "hot", "concurrency": 1, "salt": "alone"},
                           {"name": "crowded", "concurrency": n, "salt": "crowded"},
                           {"name": "order", "concurrency": n, "salt": "order", "order_seed": SHUFFLE_SEED}]}
    return run_plain_vllm(plan, work, {**env, **candidate.env})


def run_plain_vllm(plan: dict, work: Path, env: dict[str, str]) -> dict:
    """tests/raw_vllm.py on `plan` in a process of its own: {condition: {key: {"ids", "logprob_bits", ...}}}."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "plan.json").write_text(json.dumps(plan), encoding="utf-8")
    proc = subprocess.run([sys.executable, str(RAW), str(work / "plan.json"), str(work / "result.json")],
                          env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise AssertionError(f"plain vLLM failed on {plan['model']}:\n{proc.stderr[-4000:]}")
    return json.loads((work / "result.json").read_text(encoding="utf-8"))["conditions"]


def outputs_equal(a: dict, b: dict) -> bool:
    """Two plain-vLLM results of one request are the same output: token ids and every logprob bit, nothing else
    (records of two conditions carry different extra fields: `margins`, `cached_tokens`)."""
    return (a["ids"], a["logprob_bits"]) == (b["ids"], b["logprob_bits"])


def differing_keys(reference: dict, other: dict) -> list[str]:
    """The requests whose outputs differ between two conditions (of the keys both ran)."""
    return sorted(k for k in reference if k in other and not outputs_equal(reference[k], other[k]))


def oracle_trace(trace, encode, seed: int = 0) -> list[dict]:
    """evalgate's own Trace as the oracle's `trace` condition replays it (tests/raw_vllm.py): in steps, each event
    with the token ids evalgate's `materialize` gives it, written by evalgate's own `Event.to_json` (the lines of
    a fuzz repro pack's trace.jsonl). So a test never describes an arrangement of its own: it hands the oracle
    the one evalgate runs."""
    from dataclasses import replace

    from evalgate.bisect.mutate import in_steps
    from evalgate.configuration.trace import DEFAULT_STEP_SECONDS, materialize

    trace = in_steps(trace, DEFAULT_STEP_SECONDS)
    ids = {r.id: r.prompt_ids if r.prompt_ids is not None else tuple(encode(r.text)) for r in materialize(trace, encode, seed)}
    return [e.to_json("step") if e.gated else
            replace(e, prompt=None, tokens=None, prefix_of=None, prefix_tokens=0, prompt_ids=ids[e.id]).to_json("step")
            for e in trace.events]


def findings(results: dict) -> tuple[dict[str, list[str]], dict[str, list[str]], int, dict[str, dict[str, float]]]:
    """Per factor the requests that differ and those whose tokens flip, the hot condition's cache hits, and
    per flip the reference's top-1 minus top-2 margin where the tokens first differ (what its class is)."""
    differing, flips, margins = {}, {}, {}
    for condition, (reference, factor) in COMPARISONS.items():
        ref, other = results[reference], results[condition]
        differing[factor] = differing_keys(ref, other)
        flips[factor] = sorted(k for k in ref if ref[k]["ids"] != other[k]["ids"])
        margins[factor] = {}
        for k in flips[factor]:
            a, b = ref[k]["ids"], other[k]["ids"]
            at = first_difference(a, b)
            if at < min(len(a), len(b)):  # a token chosen differently (not one output ending sooner)
                margins[factor][k] = ref[k]["margins"][at]
    hits = sum(1 for out in results["hot"].values() if out["cached_tokens"])
    return differing, flips, hits, margins


def first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def survey(models_dir: Path, env: dict[str, str]) -> dict:
    """Try the candidates in order until one varies alone vs crowded, the planted one last; every tried one is
    in the table."""
    from helpers import cached_model

    rows, chosen = [], None
    # EVALGATE_TEST_VARIANCE=planted: the planted source alone, as on a CPU where nothing real varies
    real = [] if os.environ.get("EVALGATE_TEST_VARIANCE") == "planted" else candidates()
    for candidate in [*real, PLANTED]:
        if candidate.planted and chosen:
            break
        model = cached_model(models_dir, candidate.preset)
        t0 = time.monotonic()
        differing, flips, hits, margins = findings(raw_conditions(candidate, model, models_dir / "survey" / candidate.preset,
                                                                  env))
        rows.append({"candidate": candidate.name, "seconds": round(time.monotonic() - t0, 1), "requests": len(candidate.prompts),
                     "cache_hits": hits, "differing": {f: len(k) for f, k in differing.items()},
                     "token_flips": {f: len(k) for f, k in flips.items()}})
        found = {"candidate": candidate.name, "model": str(model), "differing": differing, "token_flips": flips,
                 "cache_hits": hits, "flip_margins": margins}
        if differing["batch_size"]:
            chosen = chosen or found
            # the first that also drifts in logprob bits alone (what fail_on = "tokens" lets pass) is preferred:
            # every CPU measured has one (docs/conditions.md), so the drift assertions run on every machine
            if set(differing["batch_size"]) - set(flips["batch_size"]):
                chosen = found
                break
    return {"chosen": chosen, "rows": rows}


def render(rows: list[dict]) -> str:
    lines = [f"{'candidate':<14} {'requests':>8} {'hot hits':>8}  differing (token flips) per factor   engine s"]
    for r in rows:
        cells = ", ".join(f"{f} {r['differing'][f]} ({r['token_flips'][f]})" for f in r["differing"])
        lines.append(f"{r['candidate']:<14} {r['requests']:>8} {r['cache_hits']:>8}  {cells}   {r['seconds']}")
    return "\n".join(lines)


@pytest.fixture(scope="session")
def variance_source(models_dir, cli_env) -> VarianceSource:
    """The session's variance source, surveyed once for all workers (the result is kept beside the models)."""
    from filelock import FileLock

    path = models_dir / "variance-survey.json"
    with FileLock(str(path) + ".lock"):
        if not path.is_file():
            env = {k: v for k, v in cli_env.items() if k != "COLUMNS"}
            path.write_text(json.dumps(survey(models_dir, env), indent=1), encoding="utf-8")
    found = json.loads(path.read_text(encoding="utf-8"))
    table = render(found["rows"])
    if os.environ.get("PYTEST_XDIST_WORKER") in (None, "gw0"):
        print(f"\nvariance survey (plain vLLM):\n{table}", file=sys.stderr)
    chosen = found["chosen"]
    if chosen is None:  # not even the planted effect: the plugin did not load (tests/planted)
        pytest.fail(f"no variance source: not even the planted candidate varies alone vs crowded.\n{table}")
    candidate = next(c for c in [*candidates(), PLANTED] if c.name == chosen["candidate"])
    return VarianceSource(candidate, Path(chosen["model"]), chosen["differing"], chosen["token_flips"],
                          chosen["cache_hits"], table, chosen["flip_margins"])
