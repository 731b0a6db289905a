"""The rotating preset (schedule.plan_rotating): one crowded pass of every request, plus this turn's
rotation slot alone, cold and hot. The planner's promise (every request alone within `rotation` turns),
the suite keys, and the plumbing through the CLI on the fake engine (what a real engine shows under it
is tested on vLLM in test_e2e_rotation.py)."""

from __future__ import annotations

import pytest
from helpers import read_json, write_suite

from evalgate.configuration.schedule import COLD, HOT, ROTATING, Schedule, plan_passes, rotation_slot, waves
from evalgate.configuration.suite import load_suite
from evalgate.errors import ConfigError

KEYS = [f"req-{i}" for i in range(500)]


def sample_of(turn: int, rotation: int, keys=KEYS) -> list[str]:
    [_, alone, *_] = plan_passes(Schedule(concurrency=(1, 32), preset=ROTATING, rotation=rotation, turn=turn))
    return [k for wave in waves(keys, alone) for k in wave]


@pytest.mark.parametrize("rotation", [1, 2, 7, 16])
@pytest.mark.parametrize("first_turn", [0, 5, 1_000_003])
def test_every_request_runs_alone_once_in_any_rotation_consecutive_turns(rotation, first_turn):
    samples = [sample_of(turn, rotation) for turn in range(first_turn, first_turn + rotation)]
    alone = [k for sample in samples for k in sample]
    assert sorted(alone) == sorted(KEYS)  # every key once: covered, and never twice in one rotation
    assert all(sample == sample_of(turn + rotation, rotation) for turn, sample in enumerate(samples, first_turn))
    sizes = [len(s) for s in samples]
    assert max(sizes) - min(sizes) <= 0.6 * len(KEYS) / rotation + 10  # a hash spreads them evenly enough


def test_a_request_keeps_its_slot_when_the_suite_changes():
    before = {k: rotation_slot(k, 16) for k in KEYS}
    more = KEYS + [f"new-{i}" for i in range(100)]
    assert {k: rotation_slot(k, 16) for k in more if k in before} == before
    assert set(sample_of(3, 16, more)) >= set(sample_of(3, 16))


def test_the_plan_compares_the_sample_alone_with_the_crowd_then_hot_with_cold():
    crowded, alone, hot = plan_passes(Schedule(concurrency=(1, 8, 32), preset=ROTATING, rotation=4, turn=6))
    assert (crowded.concurrency, crowded.cache, crowded.reference, crowded.sample) == (32, COLD, None, None)
    assert (alone.concurrency, alone.cache, alone.reference, alone.factor, alone.sample) == (1, COLD, 0, "batch_size", "2/4")
    assert (hot.concurrency, hot.cache, hot.reference, hot.factor, hot.salt_of) == (1, HOT, 1, "prefix_cache", 1)
    assert hot.sample == alone.sample and alone.salt_of != crowded.salt_of
    # the alone condition is the full schedule's pass 0 condition: baselines of either preset pair up
    full = plan_passes(Schedule(concurrency=(1, 32), shuffles=0))
    assert {p.condition for p in full} == {crowded.condition, alone.condition, hot.condition}
    no_hot = plan_passes(Schedule(concurrency=(1, 32), preset=ROTATING, hot_pass=False))
    assert [p.factor for p in no_hot] == [None, "batch_size"]
    assert [p.factor for p in plan_passes(Schedule(concurrency=(1, 32), preset=ROTATING), prefix_caching=False)] \
        == [None, "batch_size"]


@pytest.mark.parametrize("schedule, message", [
    ('preset = "cheap"', "`schedule.preset` is 'cheap'"),
    ('preset = "rotating"\nrotation = 0', "`schedule.rotation` must be >= 1"),
    ('rotation = 4', "`schedule.rotation` is a setting of the rotating preset"),
    ('preset = "rotating"\nrepeats = 2', "`schedule.repeats` does not go with `preset = \"rotating\"`"),
    ('preset = "rotating"\nprobes = ["needle"]', "`schedule.probes` does not go with"),
])
def test_bad_rotating_settings_name_the_field(tmp_path, fake_model, schedule, message):
    suite = write_suite(tmp_path, fake_model, ["a"], kind="fake", concurrency=(1, 8), shuffles=0,
                        extra_schedule=schedule)
    with pytest.raises(ConfigError) as info:
        load_suite(suite)
    assert message in str(info.value) and str(suite) in str(info.value)


def test_a_rotating_suite_needs_two_levels_and_takes_no_shuffles(tmp_path, fake_model):
    one = write_suite(tmp_path / "one", fake_model, ["a"], kind="fake", concurrency=(8,), shuffles=0,
                      extra_schedule='preset = "rotating"')
    with pytest.raises(ConfigError, match="needs two levels"):
        load_suite(one)
    shuffled = write_suite(tmp_path / "two", fake_model, ["a"], kind="fake", concurrency=(1, 8), shuffles=1,
                           extra_schedule='preset = "rotating"')
    with pytest.raises(ConfigError, match="`schedule.shuffles` does not go with"):
        load_suite(shuffled)


PROMPTS = [f"Question {i}: what follows the number {i}?" for i in range(12)]


def test_a_batch_effect_is_found_in_the_turn_its_request_runs_alone(inline_cli, tmp_path, fake_model):
    """Fake engine, `p004` varies when it shares a wave. Three runs of rotation 3: exactly the run whose
    turn is p004's slot flags it (factor batch_size); after three runs every request has run alone."""
    inline_cli.env.pop("EVALGATE_ROTATION_TURN", None)
    suite = write_suite(tmp_path / "ws", fake_model, PROMPTS, max_tokens=4, kind="fake", concurrency=(1, 12),
                        shuffles=0, extra_engine='fake_vary_with_batch = ["p004"]',
                        extra_schedule='preset = "rotating"\nrotation = 3')
    flagged, coverage = [], []
    for turn in range(3):
        command = ("baseline", "create", suite, "--allow-variance") if turn == 0 else ("check", suite)
        proc = inline_cli(*command, "--json-report", tmp_path / f"r{turn}.json", check=None)
        report = read_json(tmp_path / f"r{turn}.json")
        varying = {r["key"]: r["factor"] for r in report["requests"] if r["verdict"] == "batch_variance"}
        flagged.append(varying)
        coverage.append(report["alone_coverage"])
        sample = {k for k in (f"p{i:03d}" for i in range(12)) if rotation_slot(k, 3) == turn}
        batch = next(f for f in report["factors"] if f["factor"] == "batch_size")
        assert batch["compared"] == len(sample)  # only the sample ran alone
        assert proc.returncode == (1 if "p004" in sample else 0)
    assert [f for f in flagged if f] == [{"p004": "batch_size"}]
    assert flagged.index({"p004": "batch_size"}) == rotation_slot("p004", 3)
    assert [c["runs"] for c in coverage] == [1, 2, 3] and coverage[-1]["covered"] == coverage[-1]["requests"] == 12
    assert "alone coverage: 100% over the last 3 runs (12 of 12 requests)" in " ".join(proc.stdout.split())


def test_the_turn_can_come_from_the_environment(inline_cli, tmp_path, fake_model):
    suite = write_suite(tmp_path / "ws", fake_model, PROMPTS, max_tokens=4, kind="fake", concurrency=(1, 12),
                        shuffles=0, extra_engine='fake_vary_with_batch = ["p004"]',
                        extra_schedule='preset = "rotating"\nrotation = 3')
    inline_cli.env["EVALGATE_ROTATION_TURN"] = str(rotation_slot("p004", 3) + 3 * 41)
    inline_cli("baseline", "create", suite, "--json-report", tmp_path / "r.json", check=1)
    assert [r["key"] for r in read_json(tmp_path / "r.json")["requests"]] == ["p004"]
    inline_cli.env["EVALGATE_ROTATION_TURN"] = "soon"
    proc = inline_cli("baseline", "create", suite, check=2)
    assert "$EVALGATE_ROTATION_TURN is 'soon'" in proc.stderr


def test_command_line_overrides_that_break_the_preset_are_refused(tmp_path, fake_model):
    from evalgate.configuration.schedule import with_overrides

    suite = load_suite(write_suite(tmp_path, fake_model, ["a"], kind="fake", concurrency=(1, 8), shuffles=0,
                                   extra_schedule='preset = "rotating"'))

    def resolve_schedule(suite, concurrency=None, shuffles=None, repeats=None):
        return with_overrides(suite.schedule, concurrency, shuffles, repeats, where=str(suite.path))

    assert resolve_schedule(suite, [1, 16]).concurrency == (1, 16)
    with pytest.raises(ConfigError, match="--shuffles does not go with"):
        resolve_schedule(suite, shuffles=1)
    with pytest.raises(ConfigError, match="--repeats does not go with"):
        resolve_schedule(suite, repeats=2)
    with pytest.raises(ConfigError, match="--concurrency needs two levels"):
        resolve_schedule(suite, [16])
