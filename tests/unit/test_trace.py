"""Traces (evalgate/configuration/trace.py) and the fuzz mutations (evalgate/bisect/mutate.py): what a line
means, where the gated requests go, what a replay submits, and that every mutation keeps a trace valid."""

from __future__ import annotations

import json
import random

import pytest

from evalgate.bisect.mutate import MUTATIONS, Shape, in_steps, mutate, synthetic_trace
from evalgate.configuration.trace import Cancel, gated_places, materialize, parse_trace
from evalgate.errors import ConfigError


def encode(text: str) -> list[int]:
    return [len(word) * 7 + i % 3 for i, word in enumerate(text.split())]


def lines(*events) -> list[str]:
    return [json.dumps(e) for e in events]


def test_every_event_form_reads_back_as_it_was_written():
    trace = parse_trace(lines(
        {"at": 0, "tokens": 20, "max_tokens": 4},
        {"at": 0.1, "id": "text", "prompt": "hello", "max_tokens": 2, "cancel_after": 0.05},
        {"at": 0.2, "tokens": 12, "prefix": {"of": "e1", "tokens": 8}, "max_tokens": 5, "cancel_after": {"tokens": 2}},
        {"at": 0.3, "prompt_ids": [5, 6, 7], "max_tokens": 3, "cancel_after": {"steps": 1}},
        {"at": 0.4, "gated": True}), "t.jsonl")
    again = parse_trace(trace.to_jsonl().splitlines(), "again")
    assert again.events == trace.events
    assert trace.summary() == {"events": 4, "cancels": 3, "gated_markers": 1, "unit": "at"}


def test_a_replay_submits_seeded_words_that_share_their_prefix_and_steps_from_seconds():
    trace = parse_trace(lines(
        {"at": 0.0, "tokens": 20, "max_tokens": 4},
        {"at": 0.1, "tokens": 12, "prefix": {"of": "e1", "tokens": 8}, "max_tokens": 5}), "t")
    first, second = materialize(trace, encode, seed=3, step_seconds=0.05)
    assert len(first.prompt_ids) == 20 and len(second.prompt_ids) == 12
    assert second.prompt_ids[:8] == first.prompt_ids[:8] and second.prompt_ids[8:] != first.prompt_ids[8:12]
    assert (first.step, second.step) == (0, 2)
    assert materialize(trace, encode, seed=3) == materialize(trace, encode, seed=3)
    assert materialize(trace, encode, seed=4)[0].prompt_ids != first.prompt_ids


def test_gated_requests_are_split_among_the_markers_in_order_or_go_to_the_middle():
    marked = parse_trace(lines({"step": 0, "tokens": 4, "max_tokens": 2}, {"step": 3, "gated": True},
                               {"step": 9, "gated": True}), "t")
    assert [(p.step, p.position) for p in gated_places(marked, 4)] == [(3, 1), (3, 1), (9, 2), (9, 2)]
    unmarked = parse_trace(lines({"step": 0, "tokens": 4, "max_tokens": 2}, {"step": 4, "tokens": 4, "max_tokens": 2},
                                 {"step": 10, "tokens": 4, "max_tokens": 2}), "t")
    # the first event at or after step 5, after every event of that step
    assert [(p.step, p.position) for p in gated_places(unmarked, 2)] == [(10, 3), (10, 3)]


def test_a_trace_in_seconds_is_fuzzed_in_steps():
    trace = parse_trace(lines({"at": 0.1, "tokens": 4, "max_tokens": 9, "cancel_after": 0.06},
                              {"at": 0.5, "tokens": 4, "max_tokens": 2, "cancel_after": 1.0}), "t")
    steps = in_steps(trace, 0.02)
    assert steps.unit == "step" and [e.offset for e in steps.events] == [5.0, 25.0]
    assert [e.cancel for e in steps.events] == [Cancel("steps", 3), None]  # a cancel after its end never happens


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_every_mutation_keeps_a_trace_a_valid_trace(name):
    shape = Shape(max_model_len=512, block_size=16, capture_sizes=None, max_tokens=8)
    for seed in range(60):
        rng = random.Random(seed)
        trace = MUTATIONS[name](synthetic_trace(6, rng, shape), rng, shape)
        for _ in range(3):
            trace = MUTATIONS[name](trace, rng, shape)
        again = parse_trace(trace.to_jsonl().splitlines(), f"{name} seed {seed}")  # raises if not valid
        assert again.events == tuple(trace.events)
        for request in materialize(trace, encode, seed):
            assert request.prompt_ids and len(request.prompt_ids) < shape.max_model_len


def test_mutations_are_a_pure_function_of_the_seed():
    shape = Shape(max_model_len=256, block_size=16, capture_sizes=(1, 2, 4), max_tokens=6)
    seed_trace = synthetic_trace(5, random.Random(1), shape)
    runs = [mutate(seed_trace, random.Random(7), shape, 4) for _ in range(2)]
    assert runs[0] == runs[1] and len(runs[0][1]) == 4


def test_a_prefix_cycle_or_a_forward_reference_is_refused():
    with pytest.raises(ConfigError, match="t:2: `prefix.of` 'e3' is not an earlier traffic event's id"):
        parse_trace(lines({"step": 0, "tokens": 4, "max_tokens": 2},
                          {"step": 1, "tokens": 4, "prefix": {"of": "e3", "tokens": 2}, "max_tokens": 2},
                          {"step": 2, "tokens": 4, "max_tokens": 2}), "t")


def test_a_loaded_pass_is_compared_with_the_baselines_only_inside_the_same_trace(tmp_path):
    from evalgate.configuration.load import parse_load
    from evalgate.configuration.schedule import Schedule, plan_passes
    from evalgate.judgement.verdict import matching_passes

    def passes(events: list[dict]) -> list:
        path = tmp_path / f"t{len(events)}.jsonl"
        path.write_text("".join(json.dumps(e) + "\n" for e in events))
        load = parse_load({"trace": path.name}, "suite.toml", "load.", (1, 8), tmp_path)
        return plan_passes(Schedule(concurrency=(1, 8), shuffles=0, load=load))

    one = [{"step": 0, "tokens": 8, "max_tokens": 4}]
    baseline, same, other = passes(one), passes(list(one)), passes(one + [{"step": 3, "tokens": 8, "max_tokens": 4}])
    assert [p.traffic is not None for p in baseline] == [False, False, True]  # pass 0, hot, the loaded c=8 pass
    assert "inside trace" in baseline[2].condition_label
    assert [(m.baseline_pass, m.current_pass) for m in matching_passes(baseline, same)] == [(0, 0), (1, 1), (2, 2)]
    assert [(m.baseline_pass, m.current_pass) for m in matching_passes(baseline, other)] == [(0, 0), (1, 1)]


def test_one_cancel_value_says_when_a_client_leaves_for_every_placement():
    """`cancel_after` reads into one Cancel(unit, amount); the step replay, the timed replay and the fuzz
    control all ask it, so a leave time is computed in one place."""
    trace = parse_trace(lines({"step": 0, "tokens": 4, "max_tokens": 9, "cancel_after": 0.06},
                              {"step": 1, "tokens": 4, "max_tokens": 9, "cancel_after": {"tokens": 3}},
                              {"step": 2, "tokens": 4, "max_tokens": 9, "cancel_after": {"steps": 5}},
                              {"step": 3, "tokens": 4, "max_tokens": 9}), "t")
    seconds, tokens, steps, never = (e.cancel for e in trace.traffic)
    assert (seconds, tokens, steps, never) == (Cancel("seconds", 0.06), Cancel("tokens", 3), Cancel("steps", 5), None)
    assert [c.leave_step(0.02) for c in (seconds, tokens, steps)] == [3, None, 5]
    assert [c.leave_seconds(0.02) for c in (seconds, tokens, steps)] == pytest.approx([0.06, 0.06, 0.1])
    assert [c.tokens_received(0.02) for c in (seconds, tokens, steps)] == [3, 3, 5]
    assert parse_trace(trace.to_jsonl().splitlines(), "again").events == trace.events  # written back as read
