"""The repro pack on recorded outputs (no engine): which batches it holds for batch variance, a silent
regression and an explained change, what it refuses, and the plain script's verdict logic, run against
a stub `vllm` module so its exit codes are checked without an engine (the real engine: test_e2e_bisect_batch)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap

import pytest

from evalgate.bisect.repro import write_repro
from evalgate.configuration.suite import load_suite
from evalgate.errors import ConfigError
from evalgate.fingerprint import COMPONENTS, component
from evalgate.records import Completion
from evalgate.store import Store

PROMPT_IDS = {"a": [1, 10, 11], "b": [1, 20], "c": [1, 30, 31, 32]}


@pytest.fixture
def suite(tmp_path):
    d = tmp_path / "suite"
    (d / "model").mkdir(parents=True)
    (d / "model" / "config.json").write_text("{}")
    (d / "prompts.jsonl").write_text('{"id": "a", "prompt": "A"}\n{"id": "b", "prompt": "B"}\n{"id": "c", "prompt": "C"}\n')
    (d / "evalgate.toml").write_text('[suite]\nname = "unit"\n[engine]\nmodel = "model"\ndtype = "bfloat16"\n'
                                     '[sampling]\nmax_tokens = 3\n[prompts]\nfile = "prompts.jsonl"\n')
    return load_suite(d / "evalgate.toml")


def fingerprint(model: str = "m1") -> dict:
    data = {"model": {"files": {"w": model}}, "engine": {"args": {"dtype": "bfloat16"}},
            "env": {"OMP_NUM_THREADS": "1", "VLLM_API_KEY": "<redacted>"}}
    info = {"model": {"path": "/models/m"}, "tokenizer": {"path": "/models/m"}}
    return {name: component(data.get(name, {"n": name}), info.get(name)) for name in COMPONENTS}


def out(key, pass_index, ids, concurrency, wave, position, lps=None) -> Completion:
    lps = lps or [-1.0 - i for i in range(len(ids))]
    return Completion(key=key, prompt_ids=PROMPT_IDS[key], output_ids=list(ids), logprobs=lps,
                      top_ids=[[t, t + 1] for t in ids], top_logprobs=[[lp, lp - 0.5] for lp in lps],
                      token_texts=[f"t{t}" for t in ids], text="".join(f"t{t}" for t in ids), finish_reason="length",
                      pass_index=pass_index, concurrency=concurrency, wave=wave, position=position)


def run(store: Store, suite, *, passes, fp=None, baseline=None) -> int:
    """passes: one {key: ids} per pass; pass 0 alone (concurrency 1), later passes one wave of all keys."""
    run_id = store.create_run(suite, "check", {}, fp or fingerprint(), PROMPT_IDS)
    for p, ids in enumerate(passes):
        alone = p == 0
        store.add_outputs(run_id, [out(k, p, v, 1 if alone else 3, i if alone else 0, 0 if alone else i)
                                   for i, (k, v) in enumerate(ids.items())])
    store.finish_run(run_id, status="complete", baseline_run_id=baseline)
    return run_id


SAME = {"a": [5, 6, 7], "b": [8, 9, 9], "c": [4, 4, 4]}


def test_batch_variance_pack_holds_the_alone_and_the_crowded_wave(tmp_path, suite):
    store = Store(f"sqlite:///{tmp_path / 'e.sqlite'}")
    run_id = run(store, suite, passes=[SAME, {**SAME, "b": [8, 7, 7]}])
    pack = write_repro(store, run_id, "b", tmp_path / "pack")
    assert pack.kind == "batch_variance" and pack.mode == "pair" and pack.criterion == "tokens"
    batches = json.loads((tmp_path / "pack" / "batches.json").read_text())
    assert [b["requests"] for b in batches["batches"]] == [["b"], ["a", "b", "c"]]
    assert [b["target_index"] for b in batches["batches"]] == [0, 1]
    assert [b["expected"]["token_ids"] for b in batches["batches"]] == [[8, 9, 9], [8, 7, 7]]
    expected = json.loads((tmp_path / "pack" / "expected.json").read_text())
    assert expected["first_divergence"]["position"] == 1 and expected["first_divergence"]["kind"] == "token"
    env = json.loads((tmp_path / "pack" / "env.json").read_text())
    assert env["variables"] == {"OMP_NUM_THREADS": "1"} and env["redacted_left_out"] == ["VLLM_API_KEY"]
    engine = json.loads((tmp_path / "pack" / "engine.json").read_text())
    assert engine["model"] == "/models/m" and engine["engine_args"] == {"dtype": "bfloat16", "seed": 0}
    requests = {r["id"]: r for r in json.loads((tmp_path / "pack" / "requests.json").read_text())["requests"]}
    assert requests["c"]["prompt_token_ids"] == [1, 30, 31, 32] and requests["c"]["sampling"]["max_tokens"] == 3
    script = (tmp_path / "pack" / "repro.py").read_text()
    assert not [n for n in ast.walk(ast.parse(script)) if isinstance(n, (ast.Import, ast.ImportFrom))
                and "evalgate" in ast.dump(n)]
    assert not list(tmp_path.glob(".pack.*"))  # no temporary directory left behind


def test_logprob_only_variance_is_reproduced_on_bits(tmp_path, suite):
    store = Store(f"sqlite:///{tmp_path / 'e.sqlite'}")
    crowded = {k: v for k, v in SAME.items()}
    run_id = store.create_run(suite, "check", {}, fingerprint(), PROMPT_IDS)
    store.add_outputs(run_id, [out(k, 0, v, 1, i, 0) for i, (k, v) in enumerate(SAME.items())])
    store.add_outputs(run_id, [out(k, 1, v, 3, 0, i, lps=[-1.0, -2.0000001, -3.0] if k == "a" else None)
                               for i, (k, v) in enumerate(crowded.items())])
    pack = write_repro(store, run_id, "a", tmp_path / "pack")
    assert pack.criterion == "bits" and pack.divergence.kind == "logprob"


def test_silent_regression_pack_runs_the_baseline_wave_and_the_run_wave(tmp_path, suite):
    store = Store(f"sqlite:///{tmp_path / 'e.sqlite'}")
    base = run(store, suite, passes=[SAME, SAME])
    check = store.create_run(suite, "check", {}, fingerprint(), PROMPT_IDS)  # crowded only: a runtime knob
    store.add_outputs(check, [out(k, 0, v if k != "a" else [5, 6, 1], 3, 0, i) for i, (k, v) in enumerate(SAME.items())])
    store.finish_run(check, status="complete", baseline_run_id=base)
    pack = write_repro(store, check, "a", tmp_path / "pack")
    assert pack.kind == "silent_regression" and pack.mode == "pair"
    batches = json.loads((tmp_path / "pack" / "batches.json").read_text())["batches"]
    assert [b["requests"] for b in batches] == [["a"], ["a", "b", "c"]]
    assert [b["expected"]["token_ids"] for b in batches] == [[5, 6, 7], [5, 6, 1]]


def test_explained_change_pack_reproduces_the_observed_output(tmp_path, suite):
    store = Store(f"sqlite:///{tmp_path / 'e.sqlite'}")
    base = run(store, suite, passes=[SAME])
    check = run(store, suite, passes=[{**SAME, "c": [4, 4, 2]}], fp=fingerprint(model="m2"), baseline=base)
    pack = write_repro(store, check, "c", tmp_path / "pack")
    assert pack.kind == "explained_change" and pack.mode == "single" and "model" in pack.notes[0]
    expected = json.loads((tmp_path / "pack" / "expected.json").read_text())
    assert expected["expected"]["token_ids"] == [4, 4, 4] and expected["observed"]["token_ids"] == [4, 4, 2]
    assert "observed" in (tmp_path / "pack" / "README.md").read_text()


def test_refusals(tmp_path, suite):
    store = Store(f"sqlite:///{tmp_path / 'e.sqlite'}")
    stable = run(store, suite, passes=[SAME, SAME])
    with pytest.raises(ConfigError, match="no request 'zz'"):
        write_repro(store, stable, "zz", tmp_path / "p1")
    with pytest.raises(ConfigError, match="shows no divergence"):
        write_repro(store, stable, "a", tmp_path / "p2")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(ConfigError, match="not an empty directory"):
        write_repro(store, stable, "a", tmp_path / "full")
    assert not (tmp_path / "p1").exists() and not (tmp_path / "p2").exists()


STUB_VLLM = '''
import json, os
class _LP:
    def __init__(self, v): self.logprob = v
class _Seq:
    def __init__(self, ids, lps): self.token_ids, self.logprobs = ids, [{t: _LP(v)} for t, v in zip(ids, lps)]
class _Out:
    def __init__(self, seq): self.outputs = [seq]
class _Tok:
    def decode(self, ids): return "".join(f"t{i}" for i in ids)
class SamplingParams:
    def __init__(self, **kw): self.kw = kw
class LLM:
    def __init__(self, model, tokenizer, **kw):
        self.plan = json.load(open(os.environ["STUB_PLAN"]))
        assert os.environ["OMP_NUM_THREADS"] == "1"
    def get_tokenizer(self): return _Tok()
    def reset_prefix_cache(self): pass
    def generate(self, inputs, params, use_tqdm=True):
        ids, lps = self.plan[str(len(inputs))]
        return [_Out(_Seq(ids, lps)) for _ in inputs]
'''


@pytest.mark.parametrize("alone, crowded, flags, code, verdict", [
    ([8, 9, 9], [8, 7, 7], [], 0, "VERDICT: REPRODUCED"),
    ([8, 9, 9], [8, 9, 9], [], 1, "VERDICT: NOT REPRODUCED"),
    ([8, 9, 1], [8, 7, 7], [], 0, "VERDICT: REPRODUCED"),          # other bits, the divergence is still there
    ([8, 9, 1], [8, 7, 7], ["--exact"], 1, "NOT REPRODUCED exactly"),
    ([8, 9, 9], [8, 7, 7], ["--exact"], 0, "both match the recorded outputs exactly"),
])
def test_script_verdicts(tmp_path, suite, alone, crowded, flags, code, verdict):
    store = Store(f"sqlite:///{tmp_path / 'e.sqlite'}")
    run_id = run(store, suite, passes=[SAME, {**SAME, "b": [8, 7, 7]}])
    write_repro(store, run_id, "b", tmp_path / "pack")
    (tmp_path / "stub" / "vllm").mkdir(parents=True)
    (tmp_path / "stub" / "vllm" / "__init__.py").write_text(textwrap.dedent(STUB_VLLM))
    lps = [-1.0, -2.0, -3.0]
    (tmp_path / "plan.json").write_text(json.dumps({"1": [alone, lps], "3": [crowded, lps]}))
    (tmp_path / "models" / "m").mkdir(parents=True)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path / "stub"), "STUB_PLAN": str(tmp_path / "plan.json")}
    proc = subprocess.run([sys.executable, str(tmp_path / "pack" / "repro.py"), "--model", str(tmp_path / "models" / "m"),
                           *flags], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert verdict in proc.stdout


def test_script_without_the_model_exits_2(tmp_path, suite):
    store = Store(f"sqlite:///{tmp_path / 'e.sqlite'}")
    run_id = run(store, suite, passes=[SAME, {**SAME, "b": [8, 7, 7]}])
    write_repro(store, run_id, "b", tmp_path / "pack")
    proc = subprocess.run([sys.executable, str(tmp_path / "pack" / "repro.py"), "--model", str(tmp_path / "nowhere")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--model" in proc.stderr


def test_the_packs_carry_the_shipped_script_files_which_run_as_files(tmp_path, suite):
    """The two repro scripts are files of the package (evalgate/bisect/templates/, checked by ruff): a pack
    carries them byte for byte, and each runs as a file: without its pack's JSON files beside it, exit 2
    naming the file."""
    from evalgate.bisect.repro import TEMPLATES

    store = Store(f"sqlite:///{tmp_path / 'e.sqlite'}")
    run_id = run(store, suite, passes=[SAME, {**SAME, "b": [8, 7, 7]}])
    write_repro(store, run_id, "b", tmp_path / "pack")
    assert (tmp_path / "pack" / "repro.py").read_bytes() == (TEMPLATES / "repro_batches.py").read_bytes()
    for name, missing in (("repro_batches.py", "requests.json"), ("repro_trace.py", "engine.json")):
        alone = tmp_path / "alone" / name
        alone.parent.mkdir(exist_ok=True)
        alone.write_bytes((TEMPLATES / name).read_bytes())
        proc = subprocess.run([sys.executable, str(alone)], capture_output=True, text=True, timeout=60,
                              env={"PATH": "/usr/bin:/bin"})
        assert proc.returncode == 2 and missing in proc.stderr, (name, proc.returncode, proc.stderr[-500:])
