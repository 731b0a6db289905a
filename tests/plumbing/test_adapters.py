"""LoRA adapters through the real CLI on the fake test engine (plumbing: identity per request, the adapter-mix
factor on a planted case, reports, bad input). What vLLM does with adapters is tested on vLLM in
tests/e2e/test_e2e_adapters.py."""

from __future__ import annotations

import json

import pytest
from helpers import database_url, db_query, read_json, write_suite

LINES = [{"id": f"q{i}", "prompt": f"Question {i}: what follows the number {i}?"} for i in range(3)]


def adapter_dir(path, rank: int = 8, body: bytes = b"weights") -> str:
    """A LoRA adapter directory as far as evalgate reads one (the fake engine hashes its files)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank, "target_modules": ["q_proj"]}))
    (path / "adapter_model.safetensors").write_bytes(body)
    return str(path)


def adapters_suite(tmp_path, fake_model, *, lines=LINES, adapters: str = "", run_under='["base", "support", "legal"]',
                   extra_engine: str = "", **kwargs):
    ws = tmp_path / "ws"
    adapter_dir(ws / "support", body=b"support-1")
    adapter_dir(ws / "legal", body=b"legal-1")
    suite = write_suite(ws, fake_model, lines, max_tokens=6, kind="fake", extra_engine=extra_engine,
                        **{"concurrency": (1,), "shuffles": 0, "hot_pass": False, **kwargs})
    text = suite.read_text().replace('file = "prompts.jsonl"', f'file = "prompts.jsonl"\nadapters = {run_under}')
    suite.write_text(text + (adapters or '\n[adapters]\nsupport = "support"\nlegal = { path = "legal" }\n'))
    return suite


def test_an_edited_adapter_explains_its_own_requests_and_no_other(inline_cli, tmp_path, fake_model):
    suite = adapters_suite(tmp_path, fake_model)
    inline_cli("baseline", "create", suite, "--json-report", tmp_path / "b.json", check=0)
    base = read_json(tmp_path / "b.json")
    assert base["counts"]["stable"] == 9  # three lines under base, support and legal: q0, q0@support, q0@legal, ...
    inline_cli("check", suite, check=0)

    (tmp_path / "ws" / "legal" / "adapter_model.safetensors").write_bytes(b"legal-2")
    proc = inline_cli("check", suite, "--json-report", tmp_path / "c.json", check=0)
    report = read_json(tmp_path / "c.json")
    changed = {r["key"]: r for r in report["requests"] if r["verdict"] != "stable"}
    assert set(changed) == {"q0@legal", "q1@legal", "q2@legal"}
    assert all(r["verdict"] == "explained_change" and r["components"] == ["adapter"] and r["adapter"] == "legal"
               for r in changed.values())
    assert report["changed_components"] == []  # the stack is unchanged: the adapter explains its requests only
    assert report["fingerprint_changes"]["adapter"] == "legal: files changed: adapter_model.safetensors"
    assert "q0@legal: explained_change [adapter legal]" in proc.stdout
    # a repro pack runs each request under its adapter: which one, and where its files are
    inline_cli("repro", "3", "q0@legal", "-o", tmp_path / "pack", "--suite", suite, check=0)
    [request] = read_json(tmp_path / "pack" / "requests.json")["requests"]
    assert request["adapter"] == "legal"
    assert read_json(tmp_path / "pack" / "engine.json")["adapters"] == {
        "legal": str(tmp_path / "ws" / "legal"), "support": str(tmp_path / "ws" / "support")}

    # the prompt text of one line and the adapter both moving: both named, for that request only
    lines = [dict(LINES[0], prompt="Another question"), *LINES[1:]]
    (tmp_path / "ws" / "prompts.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    (tmp_path / "ws" / "legal" / "adapter_model.safetensors").write_bytes(b"legal-3")
    inline_cli("check", suite, "--json-report", tmp_path / "d.json", check=0)
    # (`code` too, for every request: the test suite declares its prompts file as code)
    components = {r["key"]: [c for c in r["components"] if c != "code"] for r in read_json(tmp_path / "d.json")["requests"]}
    assert components["q0"] == ["suite"] and components["q0@support"] == ["suite"]
    assert components["q0@legal"] == ["suite", "adapter"] and components["q1@legal"] == ["adapter"]
    assert "q1@support" not in components and "q1" not in components  # stable


def test_a_line_names_its_adapter_and_a_renamed_copy_of_the_files_is_the_same_adapter(inline_cli, tmp_path, fake_model):
    lines = [*LINES, {"id": "only-support", "prompt": "Refund policy?", "adapter": "support"}]
    suite = adapters_suite(tmp_path, fake_model, lines=lines, run_under='["legal"]')
    inline_cli("baseline", "create", suite, "--json-report", tmp_path / "b.json", check=0)
    assert read_json(tmp_path / "b.json")["counts"]["stable"] == 4
    db_keys = {k for k, in db_query(database_url(suite), "select key from requests where run_id = 1")}
    assert db_keys == {"q0@legal", "q1@legal", "q2@legal", "only-support"}
    # the same files under a new name and directory: the requests' identity is their adapter's content
    adapter_dir(tmp_path / "ws" / "support-v2", body=b"support-1")
    text = suite.read_text().replace('support = "support"', 'support = "support-v2"')
    suite.write_text(text)
    report = inline_cli("check", suite, "--json-report", tmp_path / "c.json", check=0)
    assert read_json(tmp_path / "c.json")["counts"]["stable"] == 4, report.stdout


def test_the_adapter_mix_factor_finds_exactly_the_planted_requests_and_its_remedy_removes_it(inline_cli, tmp_path,
                                                                                              fake_model):
    planted = ["q1@support", "q2"]
    suite = adapters_suite(tmp_path, fake_model, extra_engine=f"fake_vary_with_adapter_mix = {json.dumps(planted)}",
                           extra_schedule='probes = ["adapter_mix"]')
    proc = inline_cli("baseline", "create", suite, "--json-report", tmp_path / "r.json", check=1)
    report = read_json(tmp_path / "r.json")
    varying = {r["key"]: r for r in report["requests"] if r["verdict"] == "batch_variance"}
    assert set(varying) == set(planted)
    assert {r["factor"] for r in varying.values()} == {"adapter_mix"}
    assert varying["q1@support"]["adapter"] == "support" and varying["q2"].get("adapter") is None
    factors = {f["comparison"]: f["differing"] for f in report["factors"]}
    assert factors == {"neighbours: alone→among 3 under its own adapter (adapter_mix probe's control)": 0,
                       "adapter mix: 3 neighbours under its own adapter→under other adapters (adapter_mix)": 2}
    out = " ".join(proc.stdout.split())
    assert "engine.max_num_seqs = 1" in out and "q1@support: batch_variance [adapter support]" in out
    # the remedy, applied: one sequence at a time
    suite.write_text(suite.read_text().replace("seed = 0", "seed = 0\nmax_num_seqs = 1"))
    inline_cli("baseline", "create", suite, check=0)


def test_a_suite_without_adapters_says_why_the_probe_did_not_run(inline_cli, tmp_path, fake_model):
    suite = write_suite(tmp_path / "ws", fake_model, ["one", "two"], kind="fake", concurrency=(1,), shuffles=0,
                        extra_schedule='probes = ["adapter_mix"]')
    proc = inline_cli("baseline", "create", suite, check=0)
    assert "not run: probe adapter_mix: the suite has no [adapters]" in " ".join(proc.stdout.split())


@pytest.mark.parametrize("case, field, words", [
    ("unknown line adapter", "prompts.jsonl:2: field `adapter`", "'legl', not an adapter of the suite"),
    ("unknown run_under", "`prompts.adapters`", "'tax' is not an adapter of the suite"),
    ("not an adapter", "`adapters.legal`", "is not a LoRA adapter (no adapter_config.json)"),
    ("no weights", "`adapters.legal`", "has no adapter weights"),
    ("git lfs pointers", "`adapters.legal`", "holds Git LFS pointers, not the files they stand for (adapter_model.safetensors)"),
    ("rank above max_lora_rank", "`engine.max_lora_rank`", "is 8, below the rank 16 of adapter 'legal'"),
    ("bad name", "`adapters.base`", "'base' cannot name an adapter"),
    ("unknown lm_eval adapter", "`lm_eval.adapter`", "'nobody', not an adapter of the suite"),
])
def test_bad_adapter_input_is_exit_2_naming_the_field_and_writes_nothing(inline_cli, tmp_path, fake_model, case, field,
                                                                          words):
    lines = LINES
    if case == "unknown line adapter":
        lines = [LINES[0], {"id": "x", "prompt": "y", "adapter": "legl"}]
    suite = adapters_suite(tmp_path, fake_model, lines=lines,
                           run_under='["base", "tax"]' if case == "unknown run_under" else '["base"]')
    ws = tmp_path / "ws"
    text = suite.read_text()
    if case == "not an adapter":
        (ws / "legal" / "adapter_config.json").unlink()
    elif case == "no weights":
        (ws / "legal" / "adapter_model.safetensors").unlink()
    elif case == "git lfs pointers":  # a checkout without its LFS objects
        (ws / "legal" / "adapter_model.safetensors").write_bytes(b"version https://git-lfs.github.com/spec/v1\n"
                                                                 b"oid sha256:" + b"0" * 64 + b"\nsize 9\n")
    elif case == "rank above max_lora_rank":
        adapter_dir(ws / "legal", rank=16)
        text = text.replace("seed = 0", "seed = 0\nmax_lora_rank = 8")
    elif case == "bad name":
        text = text.replace("legal = { path", "base = { path")
    elif case == "unknown lm_eval adapter":
        text += '\n[lm_eval]\ntasks = ["demo"]\nadapter = "nobody"\n'
    suite.write_text(text)
    proc = inline_cli("baseline", "create", suite, check=2)
    err = " ".join(proc.stderr.split())
    assert field in err and words in err, err
    assert not (ws / "evalgate.sqlite").exists()


def test_bisect_batch_finds_the_neighbouring_adapter_that_flips_a_request(inline_cli, tmp_path, fake_model):
    """The adapter_mix probe's neighbours are not stored: the bisector rebuilds its wave as the probe built it
    and takes it apart down to one neighbour under another adapter."""
    suite = adapters_suite(tmp_path, fake_model, extra_engine='fake_vary_with_adapter_mix = ["q1@support"]',
                           extra_schedule='probes = ["adapter_mix"]')
    inline_cli("baseline", "create", suite, check=1)
    proc = inline_cli("bisect", "batch", "1", "q1@support", "--suite", suite, check=0)
    out = " ".join(proc.stdout.split())
    assert "the adapter_mix probe's, its neighbours rebuilt" in out
    # the mixed wave: the next requests in suite order (q1@legal, q2, q2@support) under the base model, legal, base;
    # one neighbour under another adapter is enough
    assert "minimal neighbour set: 1-minimal" in out and "the flip reproduces" in out
    assert "with {neighbour 1: q1@legal [adapter base]}" in out, out


def test_shards_merged_judge_an_edited_adapter_as_the_whole_run_does(inline_cli, tmp_path, fake_model):
    suite = adapters_suite(tmp_path, fake_model)
    for i in (1, 2):
        inline_cli("baseline", "create", suite, "--shard", f"{i}/2", "--group", "b", check=0)
    inline_cli("baseline", "create", suite, "--merge", "--group", "b", check=0)
    (tmp_path / "ws" / "support" / "adapter_model.safetensors").write_bytes(b"support-2")
    for i in (1, 2):
        inline_cli("check", suite, "--shard", f"{i}/2", "--group", "c", check=0)
    inline_cli("check", suite, "--merge", "--group", "c", "--json-report", tmp_path / "m.json", check=0)
    changed = {r["key"]: (r["components"], r.get("adapter")) for r in read_json(tmp_path / "m.json")["requests"]}
    assert changed == {f"q{i}@support": (["adapter"], "support") for i in range(3)}


def test_another_models_adapter_is_refused_naming_the_layer_that_does_not_fit(inline_cli, tmp_path):
    """vLLM loads an adapter trained on another model without a word (its matrices go into buffers of this
    model's size) and its requests answer nonsense: the shapes in the safetensors headers are compared with the
    model's weights as the suite loads. GPT-2's Conv1D weights are stored (in, out): PEFT's fan_in_fan_out."""
    import numpy as np
    from safetensors.numpy import save_file

    from evalgate.configuration.adapters import misfit, model_weight_shapes, read_adapter

    ws = tmp_path / "ws"
    model = ws / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "vocab_size": 256}))
    attention = "model.layers.0.self_attn"
    save_file({f"{attention}.q_proj.weight": np.zeros((16, 8), np.float32),
               f"{attention}.v_proj.weight": np.zeros((4, 8), np.float32)}, str(model / "model.safetensors"))

    def lora(path, inputs, v_outputs, **config):
        path.mkdir(parents=True, exist_ok=True)
        (path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2, **config}))
        save_file({f"base_model.model.{attention}.q_proj.lora_A.weight": np.zeros((2, inputs), np.float32),
                   f"base_model.model.{attention}.q_proj.lora_B.weight": np.zeros((16, 2), np.float32),
                   f"base_model.model.{attention}.v_proj.lora_A.weight": np.zeros((2, inputs), np.float32),
                   f"base_model.model.{attention}.v_proj.lora_B.weight": np.zeros((v_outputs, 2), np.float32)},
                  str(path / "adapter_model.safetensors"))

    lora(ws / "mine", 8, 4)
    lora(ws / "wide", 6, 4)  # another model's hidden size
    lora(ws / "kv", 8, 8)  # another model's key/value heads
    suite = write_suite(ws, model, LINES[:1], max_tokens=2, kind="fake", concurrency=(1,), shuffles=0, hot_pass=False)
    base = suite.read_text().replace('file = "prompts.jsonl"', 'file = "prompts.jsonl"\nadapters = ["base", "mine"]')
    suite.write_text(base + '\n[adapters]\nmine = "mine"\n')
    inline_cli("baseline", "create", suite, check=0)
    for name, words in [("wide", "q_proj: its lora_A takes 6 inputs, the model's layer 8"),
                        ("kv", "v_proj: its lora_B gives 8 outputs, the model's layer 4")]:
        suite.write_text(base + f'\n[adapters]\nmine = "{name}"\n')
        err = " ".join(inline_cli("check", suite, check=2).stderr.split())
        assert f"`adapters.mine`: {ws / name} does not fit the model" in err and words in err, err
        assert "another model's adapter" in err

    flipped = model.parent / "conv1d"  # GPT-2 stores (in, out): the same adapter fits its flipped weights
    flipped.mkdir()
    save_file({f"{attention}.q_proj.weight": np.zeros((8, 16), np.float32),
               f"{attention}.v_proj.weight": np.zeros((8, 4), np.float32)}, str(flipped / "model.safetensors"))
    lora(ws / "conv", 8, 4, fan_in_fan_out=True)
    assert misfit(read_adapter("c", ws / "conv", "w", "f"), model_weight_shapes(flipped)) is None
    assert misfit(read_adapter("m", ws / "mine", "w", "f"), model_weight_shapes(flipped)) is not None
