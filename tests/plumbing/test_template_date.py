"""What the engine saw is identity (issue: "nothing changed" must mean nothing changed), on the fake engine:
a chat template that reads the calendar renders with the suite's pinned date, a check reuses its baseline's,
and a rendered prompt that moves (a date not pinned, a renderer that changed) is explained by `prompt`,
never a silent regression. The same on real vLLM, its server and lm-eval across faked days:
tests/e2e/test_e2e_template_date.py."""

from __future__ import annotations

import shutil
from datetime import date, datetime

import pytest
from helpers import database_url, db_query, read_json, write_suite

from evalgate.configuration import template_date
from evalgate.records import unpack_ids

# Both ways templates read the calendar: Llama 3.x's `date_string` hook with a `strftime_now` fallback (a
# system message), and `strftime_now` called directly (no system message).
TEMPLATE = (
    "{%- if not date_string is defined %}{%- set date_string = strftime_now('%d %b %Y') %}{%- endif %}"
    "{% for m in messages %}{% if loop.first and m['role'] != 'system' %}<s>system: Today is "
    "{{ strftime_now('%A %d %B %Y') }}</s>\n{% endif %}"
    "{% if m['role'] == 'system' %}<s>system: Today Date: {{ date_string }}. {{ m['content'] }}</s>\n"
    "{% else %}<s>{{ m['role'] }}: {{ m['content'] }}</s>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant:{% endif %}")
PROMPTS = [
    {"id": "direct", "messages": [{"role": "user", "content": "What day is it?"}]},
    {"id": "hook", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]},
    {"id": "text", "prompt": "The capital of France is"},
]


@pytest.fixture
def calendar(monkeypatch):
    """Move this process's calendar (the engine runs in it: the plumbing tier). The fake engine renders chats
    with transformers, whose torch sets KMP_* in this process's environment on first import: imported first,
    every in-process run's `env` is the same, as every subprocess run's is."""
    from transformers import AutoTokenizer  # noqa: F401  (the package itself is lazy)

    def move_to(day: str):
        moment = datetime.fromisoformat(day)
        monkeypatch.setattr(template_date, "today", lambda: moment.date())
        monkeypatch.setattr(template_date, "now", lambda: moment)
    return move_to


def dated_suite(tmp_path, tokenized_model, setting: str | None = None):
    model = tmp_path / "model"
    if not model.exists():
        shutil.copytree(tokenized_model, model)
        (model / "chat_template.jinja").write_text(TEMPLATE)
    suite = write_suite(tmp_path / "ws", model, PROMPTS, concurrency=(1, 4), shuffles=0, kind="fake")
    if setting is not None:
        suite.write_text(suite.read_text().replace("[suite]\n", f"[suite]\ntemplate_date = {setting}\n", 1))
    return suite


def rendered(suite, run_id: int) -> dict[str, str]:
    from tokenizers import Tokenizer  # not transformers: importing torch here would set KMP_* in the engine's env

    tokenizer = Tokenizer.from_file(str(suite.parent.parent / "model" / "tokenizer.json"))
    rows = db_query(database_url(suite), "select key, prompt_ids from requests where run_id = :run", run=run_id)
    return {key: tokenizer.decode(unpack_ids(ids), skip_special_tokens=False) for key, ids in rows}


def test_a_baseline_pins_its_day_and_every_later_check_reuses_it(inline_cli, tmp_path, tokenized_model, calendar):
    suite = dated_suite(tmp_path, tokenized_model)
    calendar("2026-03-01T09:00:00")
    made = inline_cli("baseline", "create", suite, "--json-report", tmp_path / "create.json", check=0)
    assert "this chat template writes today's date; pinned to 2026-03-01" in made.stdout
    assert read_json(tmp_path / "create.json")["template_date"] == {"date": "2026-03-01", "baseline_date": None}
    day1 = rendered(suite, 1)
    assert "Today Date: 01 Mar 2026." in day1["hook"] and "Today is Sunday 01 March 2026" in day1["direct"]

    calendar("2026-03-02T23:59:59")  # the next day, at the last second of it
    checked = inline_cli("check", suite, "--json-report", tmp_path / "check.json", check=0)
    report = read_json(tmp_path / "check.json")
    assert report["counts"]["stable"] == 3 and report["requests"] == []
    assert report["template_date"] == {"date": "2026-03-01", "baseline_date": "2026-03-01"}
    assert report["prompts"] == {"compared": 3, "equal": 3}
    assert "pinned to 2026-03-01 (the baseline's)" in checked.stdout
    assert "rendered prompts: equal, 3 of 3" in checked.stdout
    assert rendered(suite, 2) == day1

    # pinning turned off: the template reads the real clock, the prompts move, and `prompt` says where
    wall = dated_suite(tmp_path, tokenized_model, '"wall-clock"')
    unpinned = inline_cli("check", wall, "--json-report", tmp_path / "wall.json", check=0)
    report = read_json(tmp_path / "wall.json")
    verdicts = {r["key"]: r for r in report["requests"]}
    assert set(verdicts) == {"direct", "hook"} and report["counts"]["silent_regression"] == 0
    for key, changed in verdicts.items():
        assert (changed["verdict"], changed["components"]) == ("explained_change", ["prompt"]), key
    assert "01 Mar 2026" in verdicts["hook"]["prompt"]["baseline_text"]
    assert "02 Mar 2026" in verdicts["hook"]["prompt"]["text"]
    assert "Sunday 01 March" in verdicts["direct"]["prompt"]["baseline_text"]
    assert "Monday 02 March" in verdicts["direct"]["prompt"]["text"]
    assert report["prompts"] == {"compared": 3, "equal": 1}
    assert 'not pinned ([suite] template_date = "wall-clock")' in unpinned.stdout
    assert 'rendered prompt differs at token' in unpinned.stdout and '02 Mar 2026' in unpinned.stdout

    # another pinned date, written as a TOML date: explained too, the dates named
    other = dated_suite(tmp_path, tokenized_model, "2026-03-05")
    inline_cli("check", other, "--json-report", tmp_path / "other.json", check=0)
    report = read_json(tmp_path / "other.json")
    assert report["template_date"] == {"date": "2026-03-05", "baseline_date": "2026-03-01"}
    assert {r["key"]: r["components"] for r in report["requests"]} == {"direct": ["prompt"], "hook": ["prompt"]}
    assert "'2026-03-01' -> '2026-03-05'" in report["fingerprint_changes"]["prompt"]


def test_survey_says_the_pin_in_one_line(inline_cli, tmp_path, tokenized_model, calendar):
    """`survey` (and `init`, which runs it) tells a new user the template reads the date, and which one it got."""
    calendar("2026-12-04T10:00:00")
    surveyed = inline_cli("survey", dated_suite(tmp_path, tokenized_model), check=0)
    assert "this chat template writes today's date; pinned to 2026-12-04" in surveyed.stdout


def test_a_suite_whose_templates_never_read_the_calendar_records_no_date(inline_cli, tmp_path, fake_model):
    suite = write_suite(tmp_path / "ws", fake_model, ["one", "two"], concurrency=(1,), shuffles=0, kind="fake")
    made = inline_cli("baseline", "create", suite, "--json-report", tmp_path / "r.json", check=0)
    assert read_json(tmp_path / "r.json")["template_date"] is None and "pinned" not in made.stdout


def test_a_rendering_change_with_every_component_equal_is_explained_by_prompt(inline_cli, tmp_path, fake_model,
                                                                               monkeypatch):
    """A tokenizer that behaves differently while its files, the suite and every component are equal (a
    renderer evalgate does not name, a server's rendering): the prompt ids moved, and `prompt` explains it."""
    from evalgate.engines.fake import FakeEngine

    suite = write_suite(tmp_path / "ws", fake_model, ["alpha beta", "gamma"], concurrency=(1,), shuffles=0,
                        kind="fake")
    inline_cli("baseline", "create", suite, check=0)
    real = FakeEngine.encode
    monkeypatch.setattr(FakeEngine, "encode", lambda self, text: real(self, text.replace("beta", "beta ")))
    inline_cli("check", suite, "--json-report", tmp_path / "r.json", check=0)
    report = read_json(tmp_path / "r.json")
    assert report["changed_components"] == [] and report["counts"]["silent_regression"] == 0
    (moved,) = report["requests"]
    assert (moved["key"], moved["verdict"], moved["components"]) == ("p000", "explained_change", ["prompt"])
    assert moved["prompt"]["baseline_text"] == "alpha beta" and moved["prompt"]["position"] == 10
    assert report["prompts"] == {"compared": 2, "equal": 1}

    # the same outputs from an engine that renders as the baseline did, every component equal: a silent
    # regression is only declared with the rendered prompts equal, and the report says they are
    monkeypatch.setattr(FakeEngine, "encode", real)
    real_row = FakeEngine._row  # another output at every position: what a kernel that changed unnamed does
    monkeypatch.setattr(FakeEngine, "_row", lambda self, weights, ids, i, k, **kw: real_row(self, weights, ids, i + 1, k, **kw))
    regressed = inline_cli("check", suite, "--json-report", tmp_path / "s.json", check=1)
    report = read_json(tmp_path / "s.json")
    assert report["counts"]["silent_regression"] == 2 and report["prompts"] == {"compared": 2, "equal": 2}
    assert "rendered prompts: equal, 2 of 2" in regressed.stdout


def test_a_renderer_upgrade_is_named_in_the_engine_component(inline_cli, tmp_path, fake_model, monkeypatch):
    from evalgate import fingerprint

    suite = write_suite(tmp_path / "ws", fake_model, ["one"], concurrency=(1,), shuffles=0, kind="fake")
    inline_cli("baseline", "create", suite, check=0)
    real = fingerprint.renderer_versions()
    assert set(real) == {"transformers", "tokenizers", "jinja2"} and real["jinja2"]
    monkeypatch.setattr(fingerprint, "renderer_versions", lambda: {**real, "transformers": "99.0.0"})
    inline_cli("check", suite, "--json-report", tmp_path / "r.json", check=0)
    report = read_json(tmp_path / "r.json")
    assert report["changed_components"] == ["engine"]
    assert "renderers" in report["fingerprint_changes"]["engine"] and "99.0.0" in report["fingerprint_changes"]["engine"]


@pytest.mark.parametrize("value", ['"tomorrow"', '"2026-13-01"', "3"])
def test_a_bad_template_date_is_a_usage_error_naming_the_field(inline_cli, tmp_path, fake_model, value):
    suite = write_suite(tmp_path / "ws", fake_model, ["one"], concurrency=(1,), shuffles=0, kind="fake")
    suite.write_text(suite.read_text().replace("[suite]\n", f"[suite]\ntemplate_date = {value}\n", 1))
    proc = inline_cli("baseline", "create", suite, check=2)
    said = " ".join((proc.stdout + proc.stderr).split())
    assert "suite.template_date" in said and "wall-clock" in said and str(suite) in said
    assert not (suite.parent / "evalgate.sqlite").exists()


def test_the_setting_resolves_as_documented():
    assert template_date.parse_template_date(date(2026, 3, 1), "f", "k") == "2026-03-01"
    assert template_date.parse_template_date("2026-03-01T08:30:00", "f", "k") == "2026-03-01T08:30:00"
    assert template_date.parse_template_date(None, "f", "k") == "auto"
    assert template_date.resolve_template_date("auto", "2026-01-02") == "2026-01-02"
    assert template_date.resolve_template_date("auto", "wall-clock") == date.today().isoformat()
    assert template_date.resolve_template_date("2026-05-05", "2026-01-02") == "2026-05-05"
    clock = template_date.TemplateClock("2026-03-01T08:30:00")
    assert clock.render_variables("k")["strftime_now"]("%H:%M %d/%m/%Y") == "08:30 01/03/2026" and clock.reads("k")
