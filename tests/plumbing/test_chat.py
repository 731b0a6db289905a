"""Chat prompts (`messages` lines) through the engine interface, with the fake test engine: the tokenizer's
chat template gives the prompt ids; a model without a template, or a template that refuses the messages,
is a usage error naming the prompts file and line, before anything is stored. The real model and vLLM's
own chat rendering: tests/e2e/test_smollm2.py."""

from __future__ import annotations

import shutil

from helpers import database_url, db_exists, db_query, read_json, write_suite

# A ChatML template, as SmolLM2's; it refuses a conversation that does not end with a user turn.
TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>\n{% endfor %}"
            "{% if messages[-1]['role'] != 'user' %}{{ raise_exception('the last message must be the user') }}{% endif %}"
            "{% if add_generation_prompt %}<s>assistant:{% if terse %} (terse){% endif %}{% endif %}")
CHATS = [
    {"id": "c0", "messages": [{"role": "user", "content": "What is the capital of France?"}]},
    {"id": "c1", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
     "chat_template_kwargs": {"terse": True}},
    {"id": "t0", "prompt": "The capital of France is"},
]


def chat_model(tokenized_model, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tokenized_model, model)
    (model / "chat_template.jinja").write_text(TEMPLATE)
    return model


def test_chat_prompt_ids_come_from_the_template(inline_cli, tmp_path, tokenized_model):
    from transformers import AutoTokenizer

    from evalgate.records import unpack_ids

    model = chat_model(tokenized_model, tmp_path)
    suite = write_suite(tmp_path / "ws", model, CHATS, concurrency=(1,), shuffles=0, kind="fake")
    inline_cli("baseline", "create", suite, check=0)
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    ids = {key: unpack_ids(blob) for key, blob in db_query(database_url(suite), "select key, prompt_ids from requests")}
    for line in CHATS[:2]:
        text = tokenizer.apply_chat_template(line["messages"], tokenize=False, add_generation_prompt=True,
                                             **line.get("chat_template_kwargs", {}))
        assert ids[line["id"]] == tokenizer.encode(text, add_special_tokens=False), line["id"]
    assert tokenizer.decode(ids["c1"]).endswith("assistant: (terse)")  # chat_template_kwargs reach the template
    assert ids["t0"] == tokenizer.encode("The capital of France is")

    # the template's arguments are part of the request: changing them is a changed request, never unexplained
    (tmp_path / "ws" / "prompts.jsonl").write_text((tmp_path / "ws" / "prompts.jsonl").read_text()
                                                   .replace('{"terse": true}', '{"terse": false}'))
    inline_cli("check", suite, "--json-report", tmp_path / "r.json", check=0)
    report = read_json(tmp_path / "r.json")
    verdicts = {r["key"]: r for r in report["requests"]}  # the requests that are not stable
    assert verdicts["c1"]["verdict"] == "explained_change" and "suite" in verdicts["c1"]["components"]
    assert set(verdicts) == {"c1"} and report["counts"]["stable"] == 2


def test_a_model_without_a_chat_template_is_a_usage_error_naming_the_line(inline_cli, tmp_path, tokenized_model):
    suite = write_suite(tmp_path / "ws", tokenized_model, [CHATS[2], CHATS[0]], concurrency=(1,), shuffles=0, kind="fake")
    proc = inline_cli("baseline", "create", suite, check=2)
    said = " ".join((proc.stdout + proc.stderr).split())
    assert f"{tmp_path / 'ws' / 'prompts.jsonl'}:2" in said and "has no chat template" in said
    assert not db_exists(database_url(suite))  # exit 2 writes nothing: the prompts are checked before the store opens


def test_a_template_that_refuses_the_messages_is_a_usage_error(inline_cli, tmp_path, tokenized_model):
    model = chat_model(tokenized_model, tmp_path)
    bad = {"id": "c9", "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}
    suite = write_suite(tmp_path / "ws", model, [CHATS[0], bad], concurrency=(1,), shuffles=0, kind="fake")
    proc = inline_cli("baseline", "create", suite, check=2)
    said = " ".join((proc.stdout + proc.stderr).split())
    assert "prompts.jsonl:2" in said and "the chat template refused the messages" in said
    assert "the last message must be the user" in said
    assert not db_exists(database_url(suite))


def test_a_messages_line_that_is_not_a_chat_is_exit_2_naming_file_and_line(inline_cli, tmp_path, tokenized_model):
    bad = {"id": "c9", "messages": [{"role": "user", "text": "Hi"}]}
    suite = write_suite(tmp_path / "ws", tokenized_model, [CHATS[0], bad], concurrency=(1,), shuffles=0, kind="fake")
    proc = inline_cli("baseline", "create", suite, check=2)
    said = " ".join((proc.stdout + proc.stderr).split())
    assert f"{tmp_path / 'ws' / 'prompts.jsonl'}:2" in said
    assert "`messages[0]` must be an object with exactly `role` and `content`" in said
    assert not db_exists(database_url(suite))
