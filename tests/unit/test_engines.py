"""The engine registry, the shared Engine behaviour and the fake test engine, without a model runtime."""

from __future__ import annotations

import json
from importlib import metadata

import pytest
from helpers import write_suite

from evalgate import registry
from evalgate.configuration.prompts import Prompt
from evalgate.configuration.suite import load_suite
from evalgate.engines import BUILTIN_ENGINES, Engine, engine_class
from evalgate.engines.fake import FakeEngine
from evalgate.errors import ConfigError, EngineError, ExitCode, MissingDependency, NoBaselineError, error_for_exit_code


def test_every_builtin_kind_is_an_engine_class_of_that_kind():
    for kind in BUILTIN_ENGINES:
        cls = engine_class(kind)
        assert issubclass(cls, Engine) and cls.kind == kind
    with pytest.raises(ConfigError, match="unknown engine kind 'vlm'") as err:
        engine_class("vlm")
    assert "did you mean 'vllm'?" in err.value.fix and "fake" in err.value.fix  # the one message: closest, then all


def test_a_registered_name_must_be_a_subclass_of_the_base(monkeypatch):
    """The registry checks what an entry point names, as lm-eval's does: a class that is not an Engine is refused."""
    point = metadata.EntryPoint(name="wrong", value="evalgate.probes.needle:PROBE", group="evalgate.engines")
    monkeypatch.setattr(registry.metadata, "entry_points", lambda group: [point] if group == "evalgate.engines" else [])
    with pytest.raises(ConfigError, match=r"engine kind 'wrong' \(evalgate.probes.needle:PROBE\) is not a subclass"):
        engine_class("wrong")


def test_a_plugin_kind_from_the_entry_point_group(monkeypatch, tmp_path):
    """A third party registers `evalgate.engines` entry points; the suite file then names the kind."""
    point = metadata.EntryPoint(name="plugged", value="evalgate.engines.fake:FakeEngine", group="evalgate.engines")
    monkeypatch.setattr(registry.metadata, "entry_points", lambda group: [point] if group == "evalgate.engines" else [])
    assert engine_class("plugged") is FakeEngine
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    suite = write_suite(tmp_path / "ws", model, ["hi"], kind="plugged")
    assert load_suite(suite).engine_kind == "plugged"


def test_an_unknown_kind_lists_the_known_ones(tmp_path):
    suite = write_suite(tmp_path, tmp_path, ["hi"], kind="vlm")
    with pytest.raises(ConfigError) as info:
        load_suite(suite)
    assert "`engine.kind` is 'vlm'" in str(info.value) and "fake" in info.value.fix and "vllm" in info.value.fix


def test_errors_rebuilt_from_their_exit_code_keep_it():
    for code, cls in ((2, ConfigError), (3, EngineError), (4, NoBaselineError)):
        error = error_for_exit_code(code, "message", "fix it")
        assert isinstance(error, cls) and error.exit_code == code and error.fix == "fix it"
    original = MissingDependency("vllm")
    rebuilt = error_for_exit_code(int(original.exit_code), original.message, original.fix)
    assert rebuilt.exit_code == ExitCode.USAGE and "pip install" in str(rebuilt)


@pytest.fixture
def fake_suite(tmp_path, tokenized_model):
    def make(model=tokenized_model, **kwargs):
        return load_suite(write_suite(tmp_path / f"ws{len(list(tmp_path.iterdir()))}", model,
                                      [f"prompt {i}" for i in range(4)], kind="fake", **kwargs))
    return make


def outputs(suite, crowded: bool):
    engine = FakeEngine(suite)
    if crowded:
        return engine.generate(suite.prompts)
    return [engine.generate([p])[0] for p in suite.prompts]


def test_fake_outputs_are_a_pure_function_of_weights_and_prompt(fake_suite, tmp_path, tokenized_model):
    import shutil

    suite = fake_suite()
    first, again = outputs(suite, crowded=False), outputs(suite, crowded=True)
    assert [(c.output_ids.tolist(), c.logprobs.tolist()) for c in first] == \
        [(c.output_ids.tolist(), c.logprobs.tolist()) for c in again]
    assert all(len(c.output_ids) == 16 and c.top_ids[i][0] == t for c in first for i, t in enumerate(c.output_ids))
    assert all(c.top(0)[1] == sorted(c.top(0)[1], reverse=True) for c in first)
    assert len({tuple(c.output_ids) for c in first}) == len(first)  # each prompt its own output
    other = tmp_path / "other-weights"
    shutil.copytree(tokenized_model, other)
    (other / "model.safetensors").write_bytes((other / "model.safetensors").read_bytes()[::-1])
    swapped = outputs(fake_suite(model=other), crowded=False)
    assert all(a.output_ids.tolist() != b.output_ids.tolist() for a, b in zip(first, swapped))


def test_fake_batch_effect_only_on_the_named_keys_and_only_crowded(fake_suite):
    suite = fake_suite(extra_engine='fake_vary_with_batch = ["p001"]')
    alone, crowded = outputs(suite, crowded=False), outputs(suite, crowded=True)
    differ = [a.key for a, b in zip(alone, crowded) if a.output_ids.tolist() != b.output_ids.tolist()]
    assert differ == ["p001"]
    a, b = alone[1].output_ids.tolist(), crowded[1].output_ids.tolist()
    assert a[:8] == b[:8] and a[8:] != b[8:]  # from the middle of the output on


def test_fake_scores_the_continuation_tokens(fake_suite):
    engine = FakeEngine(fake_suite())
    prompt = Prompt(key="s", text="", max_tokens=None, line=0, request_type="loglikelihood",
                    segments=(((1, 2, 3), (7, 8)),), continuation=" x")
    (done,) = engine.generate([prompt])
    assert done.output_ids.tolist() == [7, 8] and done.finish_reason == "scored" and done.prompt_ids == [1, 2, 3, 7, 8]


def test_fake_keys_are_checked(tmp_path, tokenized_model):
    suite = write_suite(tmp_path, tokenized_model, ["hi"], kind="fake", extra_engine="fake_vary_with_batch = [1]")
    with pytest.raises(ConfigError, match="fake_vary_with_batch"):
        load_suite(suite)


def test_a_fuzz_mutation_and_a_replay_place_the_gated_request_on_the_same_step(fake_suite):
    """One gated-arrival rule (trace.gated_places): without markers, the first event at or after the middle
    of the trace. The mutations aim at that step (mutate.gated_step), and a replay puts the gated request there."""
    from evalgate.bisect.mutate import gated_step
    from evalgate.configuration.trace import parse_trace
    from evalgate.execution.replay import replay_steps

    # the middle (step 5) is no event: the rule places the gated request at step 10, not 5
    trace = parse_trace([json.dumps(e) for e in ({"step": 0, "tokens": 4, "max_tokens": 2},
                                                 {"step": 4, "tokens": 4, "max_tokens": 2},
                                                 {"step": 10, "tokens": 4, "max_tokens": 2})], "t")
    suite = fake_suite()
    replayed = replay_steps(FakeEngine(suite), trace, suite.prompts[:1])
    assert [a["step"] for a in replayed.stats["gated_arrivals"]] == [gated_step(trace)] == [10]


@pytest.mark.parametrize("line", [0, 1, 2])
def test_a_gated_request_arrives_at_its_markers_line_among_the_events_of_its_step(fake_suite, line):
    """Arrival order is the trace's order, the marker included (as the repro pack's plain script replays it):
    a marker between two events of one step arrives between them, so one event runs when it arrives."""
    from evalgate.configuration.trace import parse_trace
    from evalgate.execution.replay import replay_steps

    events = [{"step": 0, "tokens": 4, "max_tokens": 6}, {"step": 0, "tokens": 4, "max_tokens": 6}]
    events.insert(line, {"step": 0, "gated": True})
    trace = parse_trace([json.dumps(e) for e in events], "t")
    suite = fake_suite()
    replayed = replay_steps(FakeEngine(suite), trace, suite.prompts[:1])
    assert [(a["step"], a["running"]) for a in replayed.stats["gated_arrivals"]] == [(0, line)]


def test_an_engine_argument_of_a_type_its_field_rules_out_is_named():
    """vLLM's EngineArgs annotations decide (here a stand-in for them: no vLLM import in the unit tier): a
    quoted number for an integer field, a number for a flag or a Literal of names; a field of any other
    annotation is vLLM's to check. `max_num_seqs = "4"` otherwise failed after the engine process started,
    with "'<' not supported between instances of 'int' and 'str'" and no field named."""
    import typing

    from evalgate.engines.vllm_offline import engine_arg_problem

    known = {"max_num_seqs": int | None, "enforce_eager": bool, "gpu_memory_utilization": float,
             "kv_cache_dtype": typing.Literal["auto", "fp8"], "tokenizer_mode": typing.Union[typing.Literal["auto"], str],
             "compilation_config": dict | str | None, "hf_overrides": typing.Optional[dict]}
    assert engine_arg_problem("max_num_seqs", "4", known) == ("`max_num_seqs` must be an integer, got str '4'",
                                                              "set `max_num_seqs` to an integer")
    assert engine_arg_problem("max_num_seqs", True, known)[0] == "`max_num_seqs` must be an integer, got bool True"
    assert engine_arg_problem("enforce_eager", 1, known)[0] == "`enforce_eager` must be true or false, got int 1"
    assert engine_arg_problem("kv_cache_dtype", 8, known)[0] == "`kv_cache_dtype` must be a string, got int 8"
    assert "did you mean `max_num_seqs`?" == engine_arg_problem("max_num_seq", 4, known)[1]
    for key, value in [("max_num_seqs", 4), ("enforce_eager", False), ("gpu_memory_utilization", 1),
                       ("gpu_memory_utilization", 0.5), ("kv_cache_dtype", "fp8"), ("tokenizer_mode", "mistral"),
                       ("compilation_config", 3), ("compilation_config", {"level": 0}), ("hf_overrides", {"a": 1})]:
        assert engine_arg_problem(key, value, known) is None, (key, value)
