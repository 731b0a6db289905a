"""Which traffic a pass runs with (execution/traffic.py `traffic_for`), and what a plain wave submits: the
runner never branches on it."""

from __future__ import annotations

import json

from evalgate.configuration.load import Load
from evalgate.configuration.schedule import Pass, Schedule
from evalgate.configuration.trace import parse_trace
from evalgate.execution.replay import Salts
from evalgate.execution.traffic import Filler, Plain, Replay, traffic_for

TRACE = parse_trace([json.dumps({"step": 0, "tokens": 4, "max_tokens": 2})], "t")


def test_a_pass_gets_the_suites_load_only_where_it_applies():
    plain, loaded, probe = Pass(0, 1, 0, None), Pass(1, 8, 0, None), Pass(2, 8, 0, None, probe="needle")
    assert type(traffic_for(loaded, Schedule(), None)) is Plain  # no [load]
    filler = Schedule(load=Load(concurrency=(8,), seed=3))
    chosen = traffic_for(loaded, filler, None)
    assert type(chosen) is Filler and chosen.load is filler.load
    assert type(traffic_for(plain, filler, None)) is Plain  # a level the load does not apply to
    assert type(traffic_for(probe, filler, None)) is Plain  # a probe's one factor is the probe's
    traced = Schedule(load=Load(trace="t.jsonl", step_seconds=0.05, seed=7))
    replay = traffic_for(loaded, traced, TRACE)
    assert type(replay) is Replay and (replay.trace, replay.seed, replay.step_seconds) == (TRACE, 7, 0.05)
    # a probe's wave that carries its own trace is replayed with the load's seed and step even so
    assert (traffic_for(probe, traced, TRACE).seed, traffic_for(probe, traced, TRACE).step_seconds) == (7, 0.05)


def test_a_plain_wave_is_generated_with_its_salt_and_records_no_load():
    calls = []

    class Engine:
        def generate(self, prompts, cache_salt=None):
            calls.append((tuple(prompts), cache_salt))
            return [f"out-{p}" for p in prompts]

    from evalgate.probes import Wave

    traffic = Plain()
    wave = Wave(["a", "b"], [True, True])
    assert traffic.run(Engine(), wave, Salts("s1", "s1-t")) == (["out-a", "out-b"], None)
    assert traffic.run(Engine(), wave, Salts()) == (["out-a", "out-b"], None)
    assert calls == [(("a", "b"), "s1"), (("a", "b"), None)] and traffic.pass_stats() is None
