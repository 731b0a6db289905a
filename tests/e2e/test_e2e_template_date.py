"""Chat templates that read the calendar, on real vLLM across days (libfaketime's `faketime`: the CLI, the
engine and the server it starts all see the given clock). SmolLM2 with a template of our own that writes the
date both ways Llama 3.x templates do (a `date_string` hook falling back to `strftime_now`, and
`strftime_now` called directly). A baseline made on one day and a check on the next agree: the template
rendered with the baseline's date (before this, every chat request was a silent regression the next day).
With pinning off, the moved prompts are explained by `prompt`, never "nothing changed". The same through
the `vllm-server` kind and lm-eval's `apply_chat_template`. The fake engine's tier: tests/plumbing/test_template_date.py."""

from __future__ import annotations

import os
import shutil
from datetime import datetime
from pathlib import Path

import pytest
from helpers import cached_model, database_url, db_outputs, db_query, read_json, write_suite

from evalgate.records import unpack_ids

TEMPLATE = (
    "{%- if not date_string is defined %}{%- if strftime_now is defined %}"
    "{%- set date_string = strftime_now('%d %b %Y') %}{%- else %}{%- set date_string = '26 Jul 2024' %}{%- endif %}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if loop.first and message['role'] != 'system' %}{{ '<|im_start|>system\\nToday is ' + strftime_now('%A %d %B %Y')"
    " + '.\\nYou are a helpful AI assistant named SmolLM.<|im_end|>\\n' }}{%- endif %}"
    "{%- if message['role'] == 'system' %}{{ '<|im_start|>system\\nCutting Knowledge Date: December 2023\\n"
    "Today Date: ' + date_string + '\\n\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}")
CHATS = [
    {"id": "direct", "messages": [{"role": "user", "content": "What is the date today?"}]},
    {"id": "hook", "messages": [{"role": "system", "content": "Answer with one word."},
                                {"role": "user", "content": "What color is the sky on a clear day?"}]},
    {"id": "text", "prompt": "The capital of Japan is"},
]
DAY1, DAY2 = "2026-03-01 09:00:00", "2026-03-02 23:59:50"  # a check on day 2 ends past midnight, on day 3
LATER = "2026-03-05 12:00:00"
EXAMPLE_TASKS = Path(__file__).resolve().parents[2] / "examples" / "lm_eval" / "tasks"


@pytest.fixture(scope="module")
def faketime() -> str:
    found = shutil.which("faketime")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("faketime is not installed (Debian's `faketime`; .ci/run installs it)")
        pytest.skip("faketime is not installed (apt-get install faketime)")
    return found


@pytest.fixture(scope="module")
def dated_model(models_dir, tmp_path_factory) -> Path:
    """SmolLM2 (weights linked, not copied) with the date-writing template."""
    smollm2 = cached_model(models_dir, "smollm2")
    model = tmp_path_factory.mktemp("dated") / "model"
    model.mkdir()
    for f in smollm2.iterdir():
        if f.name != "chat_template.jinja":
            (model / f.name).symlink_to(f)
    (model / "chat_template.jinja").write_text(TEMPLATE)
    return model


def on(cli, faketime: str, day: str):
    return cli.under(faketime, "-f", f"@{day}")


def decoded(model: Path, url: str, run_id: int) -> dict[str, str]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model))
    return {key: tokenizer.decode(unpack_ids(ids))
            for key, ids in db_query(url, "select key, prompt_ids from requests where run_id = :run", run=run_id)}


def pinned_ids(model: Path, messages: list[dict], day: str) -> list[int]:
    """What transformers itself renders for `messages` with its clock at `day` (independently of evalgate)."""
    from transformers import AutoTokenizer

    moment = datetime.fromisoformat(day)
    return list(AutoTokenizer.from_pretrained(str(model)).apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False,
        strftime_now=lambda fmt: moment.strftime(fmt)))


@pytest.mark.e2e
def test_a_template_that_writes_the_date_is_pinned_across_days_on_vllm(cli, tmp_path, dated_model, faketime):
    suite = write_suite(tmp_path / "ws", dated_model, CHATS, dtype="bfloat16", max_tokens=8, concurrency=(1,),
                        shuffles=0, hot_pass=False)
    url = database_url(suite)
    made = on(cli, faketime, DAY1)("baseline", "create", suite, "--json-report", tmp_path / "create.json", check=0)
    assert "this chat template writes today's date; pinned to 2026-03-01" in made.stdout
    day1 = decoded(dated_model, url, 1)
    assert "Today is Sunday 01 March 2026." in day1["direct"] and "Today Date: 01 Mar 2026" in day1["hook"]
    ids = dict(db_query(url, "select key, prompt_ids from requests where run_id = 1"))
    for line in CHATS[:2]:
        assert unpack_ids(ids[line["id"]]) == pinned_ids(dated_model, line["messages"], DAY1), line["id"]

    checked = on(cli, faketime, DAY2)("check", suite, "--json-report", tmp_path / "check.json", check=0)
    report = read_json(tmp_path / "check.json")
    assert report["counts"]["stable"] == 3 and report["requests"] == []
    assert report["template_date"] == {"date": "2026-03-01", "baseline_date": "2026-03-01"}
    assert "pinned to 2026-03-01 (the baseline's)" in checked.stdout
    assert "rendered prompts: equal, 3 of 3" in checked.stdout

    # pinning off: the template reads the day's clock (the fake clock reached the engine), the chats' prompts
    # moved, and each is explained by `prompt` with both dates shown; the plain prompt is untouched
    suite.write_text(suite.read_text().replace("[suite]\n", '[suite]\ntemplate_date = "wall-clock"\n', 1))
    on(cli, faketime, LATER)("check", suite, "--json-report", tmp_path / "wall.json", check=0)
    report = read_json(tmp_path / "wall.json")
    assert report["counts"]["silent_regression"] == 0 and report["prompts"] == {"compared": 3, "equal": 1}
    moved = {r["key"]: r for r in report["requests"]}
    assert set(moved) <= {"direct", "hook"}  # outputs that did not move are stable whatever the prompt
    for key, verdict in moved.items():
        assert (verdict["verdict"], verdict["components"]) == ("explained_change", ["prompt"]), key
    day5 = decoded(dated_model, url, 3)
    assert "Today is Thursday 05 March 2026." in day5["direct"] and "Today Date: 05 Mar 2026" in day5["hook"]
    assert day5["text"] == day1["text"]


@pytest.mark.e2e
def test_the_server_kind_and_lm_evals_chat_templating_render_with_the_pin_not_the_clock(cli, tmp_path, dated_model,
                                                                                        faketime):
    """`vllm-server` renders chats itself, with its own clock: a template here that reads the calendar is
    rendered here, pinned, and sent as token ids; lm-eval's `apply_chat_template` renders with the pin too.
    One run on day 2, pinned to day 1: every prompt the server ran says day 1. (That a check reuses its
    baseline's date is the same resolution for every kind: the test above, and the plumbing tier.)"""
    tasks = tmp_path / "ws" / "tasks"
    tasks.mkdir(parents=True)
    for name in ("arith.yaml", "arith.jsonl"):
        shutil.copy(EXAMPLE_TASKS / name, tasks)
    suite = write_suite(tmp_path / "ws", dated_model, CHATS, dtype="bfloat16", max_tokens=8, concurrency=(1,),
                        shuffles=0, hot_pass=False, kind="vllm-server")
    suite.write_text(suite.read_text().replace("[suite]\n", '[suite]\ntemplate_date = "2026-03-01"\n', 1)
                     + '\n[lm_eval]\ninclude_path = ["tasks"]\ntasks = ["evalgate_arith"]\n'
                       'limit = 2\nnum_fewshot = 1\napply_chat_template = true\n')
    server_cli = type(cli)({k: v for k, v in cli.env.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}, cli.cwd)
    url = database_url(suite)
    made = on(server_cli, faketime, DAY2)("baseline", "create", suite, "--json-report", tmp_path / "r.json", check=0)
    assert "this chat template writes today's date; pinned to 2026-03-01" in made.stdout
    assert read_json(tmp_path / "r.json")["counts"]["stable"] == 5
    ids = dict(db_query(url, "select key, prompt_ids from requests where run_id = 1"))
    for line in CHATS[:2]:  # what the server ran (the ids it reported): transformers' own rendering at day 1
        assert unpack_ids(ids[line["id"]]) == pinned_ids(dated_model, line["messages"], DAY1), line["id"]
    served = {o["key"]: o for o in db_outputs(url, "run_id = 1 and pass_index = 0")}
    assert all(served[line["id"]]["ids"] for line in CHATS)  # and answered them
    contexts = [p for k, p in db_query(url, "select key, prompt from requests where run_id = 1") if "/" in k]
    assert len(contexts) == 2 and all("Today is Sunday 01 March 2026." in p for p in contexts)
