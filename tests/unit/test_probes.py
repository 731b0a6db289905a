"""The probe registry: a built-in probe is one module of evalgate/probes/, found by its name."""

from __future__ import annotations

import pytest

from evalgate.configuration.schedule import HOT, Pass, Schedule, plan_passes
from evalgate.errors import ConfigError
from evalgate.judgement.factors import SCHEDULE_FACTORS, comparison_label, factor_table, is_batch_factor, remedy, words
from evalgate.probes import BUILTIN_PROBES, PRESETS, PlanContext, Probe, get_probe, plan_probes, probe_names


@pytest.mark.parametrize("name", sorted(BUILTIN_PROBES))
def test_every_builtin_probe_is_its_module_and_its_factor_has_words_and_a_remedy(name):
    probe = get_probe(name)
    assert isinstance(probe, Probe) and probe.name == name
    # either it changes a factor of the schedule's (whose words are the schedule's), or a factor of its own,
    # which it names for people: never both, never neither
    assert (probe.factor in SCHEDULE_FACTORS) != bool(probe.words), (probe.factor, probe.words)
    assert probe.factor in factor_table() and remedy(probe.factor)  # reports can name it and its remedy


def test_presets_name_registered_probes_and_unknown_names_are_none():
    assert all(set(names) <= set(BUILTIN_PROBES) for names in PRESETS.values())
    assert set(BUILTIN_PROBES) <= set(probe_names())
    with pytest.raises(ConfigError, match="unknown probe 'neddle'") as err:
        get_probe("neddle")
    assert "did you mean 'needle'?" in err.value.fix
    assert is_batch_factor("neighbours") and is_batch_factor("batch_size") and not is_batch_factor("prefix_cache")


def context(**kwargs) -> PlanContext:
    schedule = Schedule(concurrency=(1, 8), shuffles=0)
    values = dict(schedule=schedule, passes=plan_passes(schedule), requests=8, generating=8, longest_prompt=100,
                  max_model_len=512, capture_sizes=None, kv_block_size=128, starts_engines=True, prefix_caching=True,
                  adapters=("support",))
    return PlanContext(**{**values, **kwargs})


def test_planning_puts_own_engines_last_and_says_why_a_probe_cannot_run():
    ctx = context()
    added, not_run = plan_probes(PRESETS["vllm"], ctx)
    assert not_run == []
    order = [p.probe for p in added]
    assert order[-2:] == ["chunked_prefill", "preemption"] and all(p.engine_args for p in added[-2:])
    assert [p.index for p in added] == list(range(len(ctx.passes), len(ctx.passes) + len(added)))
    hot = next(p for p in added if p.probe == "prefix_cache")
    assert (hot.cache, hot.factor, hot.reference) == (HOT, "prefix_cache", 0)
    assert comparison_label(ctx.passes[0], hot) == "prefix cache cold→half the prompt cached (prefix_cache probe)"

    _, not_run = plan_probes(("batch_edges", "prefill_decode", "prefix_cache", "preemption", "adapter_mix"),
                             context(requests=2, generating=0, prefix_caching=False, starts_engines=False, adapters=()))
    reasons = {n["pass"]: n["reason"] for n in not_run}
    assert set(reasons) == {"probe batch_edges", "probe prefill_decode", "probe prefix_cache", "probe preemption",
                            "probe adapter_mix"}
    assert "no [adapters]" in reasons["probe adapter_mix"]
    assert "needs at least 3" in reasons["probe batch_edges"]
    assert "only the in-process `vllm` kind" in reasons["probe preemption"]


def test_a_pass_recorded_with_the_old_factor_name_reads_as_today():
    from evalgate.configuration.schedule import passes_of

    record = {"passes": [Pass(0, 1, 0, None, salt_of=0).to_dict(),
                         {**Pass(1, 1, 0, None, reference=0, factor="chunked_prefill", probe="chunked_prefill",
                                 salt_of=1).to_dict(), "factor": "chunking"}]}
    assert passes_of(record)[1].factor == "chunked_prefill" and words("chunking") == "chunked prefill"


CONDITION_FIELDS = ("concurrency", "order_seed", "cache", "engine_args", "traffic")


@pytest.mark.parametrize("name", sorted(BUILTIN_PROBES))
def test_every_probe_pass_differs_from_its_reference_in_one_recorded_condition(name):
    """One factor per comparison: a probe pass differs from its reference in at most one recorded condition
    besides being the probe's (prefill_decode: none, its waves rescore), and a probe's treatment from its own
    control in nothing recorded but the variant. What the waves change is the behaviour tests' to show
    (tests/plumbing/test_traffic.py: the cancel probe's planted faults; docs/conditions.md's audit)."""
    ctx = context(placement="step", capture_sizes=(1, 2, 4, 8))
    added, not_run = plan_probes((name,), ctx)
    assert not_run == [] and added
    passes = {p.index: p for p in [*ctx.passes, *added]}
    for p in added:
        reference = passes[p.reference]
        changed = [f for f in CONDITION_FIELDS if getattr(p, f) != getattr(reference, f)]
        if reference.probe == p.probe and reference.variant != p.variant:
            assert changed == [], (name, p)  # treatment vs control
        else:
            assert len(changed) <= 1, (name, p, changed)


def test_the_cancel_probes_control_is_its_treatment_with_neighbours_finishing_instead_of_aborted():
    from evalgate.configuration.trace import materialize
    from evalgate.probes.cancel import CANCELLED, cancel_trace

    def encode(text: str) -> list[int]:
        return [len(word) for word in text.split()]

    treatment = materialize(cancel_trace(12, 512), encode, seed=0)
    control = materialize(cancel_trace(12, 512, aborted=False), encode, seed=0)
    assert len(treatment) == len(control) == CANCELLED
    for aborted, finished in zip(treatment, control):
        assert (aborted.prompt_ids, aborted.step) == (finished.prompt_ids, finished.step)  # the same neighbour
        assert finished.cancels is False and aborted.cancel.leave_step() == finished.max_tokens  # leaves on the same step
        assert aborted.cancel.unit == "steps" and aborted.max_tokens > aborted.cancel.amount  # only the abort ends it
    leaves = [r.cancel.leave_step() for r in treatment]
    assert leaves == sorted(set(leaves))  # one after another


def test_remedies_are_data_that_a_suite_accepts(tmp_path):
    """Each factor's remedy declares its [engine] settings once (configuration/remedy.py): the survey writes
    them, `cost` prices them, and a suite with them loads on the engine kind it names."""
    from helpers import write_suite

    from evalgate.configuration.suite import load_suite
    from evalgate.cost import default_candidates
    from evalgate.judgement.factors import remedy_settings
    from evalgate.survey import remedy_args, unremedied

    settings = {factor: remedy_settings(factor) for factor in factor_table()}
    assert settings["batch_size"] == settings["neighbours"] == {"max_num_seqs": 1}
    assert settings["prefix_cache"] == {"enable_prefix_caching": False}
    assert settings["chunked_prefill"] == {"enable_chunked_prefill": False}
    assert unremedied(list(settings)) == [f for f, s in settings.items() if not s] and "cancel" in unremedied(["cancel"])
    args = remedy_args(list(settings))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}", encoding="utf-8")
    extra = "\n".join(f"{key} = {str(value).lower()}" for key, value in args.items())
    suite = load_suite(write_suite(tmp_path / "s", model, ["a"], extra_engine=extra))
    assert {key: suite.engine_args[key] for key in args} == args
    priced = {c.name: c.engine_args for c in default_candidates()}
    assert priced["max-num-seqs-1"] == settings["batch_size"] and priced["no-prefix-cache"] == settings["prefix_cache"]


def test_the_adapter_mix_probes_neighbours_differ_between_its_passes_in_their_adapters_alone():
    """Control and treatment share the neighbours' prompts and places; the treatment's neighbours run under
    every other adapter and the base model in turn, the control's under the request's own."""
    from evalgate.configuration.prompts import Prompt
    from evalgate.probes.adapter_mix import mix_neighbours, other_adapters

    prompts = {k: Prompt(k, f"text {k}", None, n + 1, adapter=a)
               for n, (k, a) in enumerate([("p1", None), ("p1@x", "x"), ("p2@y", "y"), ("p3", None)])}
    order, adapters = list(prompts), ["x", "y"]
    request = prompts["p1@x"]
    same = mix_neighbours(request, order, prompts, 5, adapters, mixed=False)
    mixed = mix_neighbours(request, order, prompts, 5, adapters, mixed=True)
    assert [p.text for p in same] == [p.text for p in mixed] == ["text p2@y", "text p3", "text p1", "text p2@y", "text p3"]
    assert [p.adapter for p in same] == ["x"] * 5
    assert [p.adapter for p in mixed] == [None, "y", None, "y", None] == (other_adapters("x", adapters) * 3)[:5]
    assert other_adapters(None, adapters) == ["x", "y"]
    alone = {"only": Prompt("only", "t", None, 1, adapter="x")}
    assert [p.adapter for p in mix_neighbours(alone["only"], ["only"], alone, 2, ["x"], mixed=True)] == [None, None]


def test_labelling_the_schedules_passes_never_scans_the_installed_plugins(monkeypatch):
    """A judgement labels every comparison: a pass of no probe, or of a built-in one, is labelled without
    reading every installed distribution's entry points (that scan took 20 ms a label)."""
    from evalgate import registry

    def scan(group):
        raise AssertionError(f"scanned the {group!r} entry points")

    passes = plan_passes(Schedule(concurrency=(1, 8), shuffles=1))
    monkeypatch.setattr(registry.metadata, "entry_points", scan)
    assert "batch size 1→8" in [comparison_label(passes[0], p) for p in passes[1:]]
