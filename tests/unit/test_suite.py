"""Suite files and schedules: valid files load, every bad input is a ConfigError naming file and field."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from evalgate.configuration.config import DEFAULT_DATABASE, resolve_database_url
from evalgate.configuration.prompts import load_prompts
from evalgate.configuration.schedule import Pass, passes_of, plan_passes, waves, with_overrides
from evalgate.configuration.suite import Schedule, load_suite
from evalgate.errors import ConfigError, ExitCode
from evalgate.judgement.factors import comparison_label

PROMPTS = [{"id": "greet", "prompt": "Hello"}, {"id": 7, "prompt": "Bonjour ✓", "max_tokens": 3,
                                                 "metadata": {"lang": "fr"}}]

BASE = {
    "suite": 'name = "unit"\ndatabase = "sqlite:///db/evalgate.sqlite"',
    "engine": 'model = "model"\ndtype = "float32"\nmax_model_len = 256',
    "sampling": "max_tokens = 8\nlogprobs = 4",
    "prompts": 'file = "prompts.jsonl"',
    "schedule": "concurrency = [1, 4]\nshuffles = 2\nrepeats = 1\nseed = 9",
}


def write_model(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text("{}")
    return directory


def write_prompts(path: Path, prompts=PROMPTS) -> Path:
    path.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in prompts), encoding="utf-8")
    return path


def write_suite(directory: Path, *, name: str = "evalgate.toml", prefix: str = "", prompt_list=PROMPTS,
                **sections: str | None) -> Path:
    """A suite in `directory` with a fake model (config.json only); `sections` replace BASE's tables
    (None drops a table)."""
    directory.mkdir(parents=True, exist_ok=True)
    write_model(directory / "model")
    if prompt_list is not None:
        write_prompts(directory / "prompts.jsonl", prompt_list)
    tables = {**BASE, **sections}
    text = "".join(f"[{prefix}{k}]\n{v}\n\n" for k, v in tables.items() if v is not None)
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path


def config_error(path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_suite(path)
    assert info.value.exit_code == ExitCode.USAGE
    return str(info.value)


# --- valid suites ----------------------------------------------------------------------------------------


def test_load_valid_suite(tmp_path):
    suite = load_suite(write_suite(tmp_path))
    assert suite.name == "unit"
    assert suite.path == tmp_path / "evalgate.toml" and suite.root == tmp_path
    assert suite.model == tmp_path / "model" and suite.tokenizer is None
    assert suite.engine_kind == "vllm" and suite.batch_invariant is True
    assert suite.engine_args == {"dtype": "float32", "max_model_len": 256}
    assert suite.sampling == {"temperature": 0.0, "max_tokens": 8, "logprobs": 4}
    assert isinstance(suite.sampling["temperature"], float)
    assert [(p.key, p.text, p.max_tokens, p.line) for p in suite.prompts] == [
        ("greet", "Hello", None, 1), ("7", "Bonjour ✓", 3, 2)]
    assert suite.sampling_for(suite.prompts[1])["max_tokens"] == 3
    assert suite.schedule == Schedule(concurrency=(1, 4), shuffles=2, repeats=1, seed=9)
    assert [suite.location_of(p) for p in suite.prompts] == [f"{tmp_path / 'prompts.jsonl'}:1", f"{tmp_path / 'prompts.jsonl'}:2"]
    assert suite.database == f"sqlite:///{tmp_path / 'db' / 'evalgate.sqlite'}"
    assert set(suite.identity()["requests"]) == {"greet", "7"}


def test_defaults(tmp_path):
    suite = load_suite(write_suite(tmp_path, suite=None, sampling=None, schedule=None))
    assert suite.name == "evalgate"  # the file's stem
    assert suite.sampling == {"temperature": 0.0, "max_tokens": 32, "logprobs": 5}
    assert suite.schedule == Schedule()
    assert suite.database == "sqlite:///" + str(tmp_path / "baselines" / "evalgate.sqlite")
    assert DEFAULT_DATABASE == "sqlite:///baselines/evalgate.sqlite"


def test_engine_options_and_paths(tmp_path):
    (tmp_path / "tok").mkdir()
    (tmp_path / "templates").mkdir()
    engine = 'model = "model"\ntokenizer = "tok"\nbatch_invariant = false\nenforce_eager = true'
    suite = load_suite(write_suite(tmp_path, engine=engine,
                                   suite='name = "x"\ncode_paths = ["templates", "prompts.jsonl"]',
                                   sampling='temperature = 0.7\nseed = 3\ntop_p = 1\nstop = ["\\n"]'))
    assert suite.tokenizer == tmp_path / "tok" and suite.batch_invariant is False
    assert suite.engine_args == {"enforce_eager": True}
    assert suite.code_paths == [tmp_path / "templates", tmp_path / "prompts.jsonl"]
    assert suite.sampling["temperature"] == 0.7 and suite.sampling["seed"] == 3 and suite.sampling["stop"] == ["\n"]


def test_pyproject_form(tmp_path):
    path = write_suite(tmp_path / "proj", name="pyproject.toml", prefix="tool.evalgate.", suite=None)
    text = '[project]\nname = "something"\n\n' + path.read_text()
    path.write_text(text)
    suite = load_suite(path)
    assert suite.name == "proj"  # the directory name by default
    assert suite.sampling["max_tokens"] == 8 and len(suite.prompts) == 2


def test_pyproject_without_table(tmp_path):
    path = tmp_path / "pyproject.toml"
    path.write_text('[project]\nname = "x"\n')
    msg = config_error(path)
    assert str(path) in msg and "[tool.evalgate]" in msg


def test_pyproject_errors_name_the_prefixed_field(tmp_path):
    path = write_suite(tmp_path, name="pyproject.toml", prefix="tool.evalgate.", sampling="tempurature = 0")
    msg = config_error(path)
    assert str(path) in msg and "tool.evalgate.sampling.tempurature" in msg and "temperature" in msg


def test_crlf_prompts_file(tmp_path):
    path = write_suite(tmp_path)
    (tmp_path / "prompts.jsonl").write_bytes(b'{"id": "a", "prompt": "x"}\r\n\r\n{"id": "b", "prompt": "y"}\r\n')
    suite = load_suite(path)
    assert [(p.key, p.line) for p in suite.prompts] == [("a", 1), ("b", 3)]


def test_files_saved_with_a_byte_order_mark_read_as_without_one(tmp_path):
    """Windows editors save UTF-8 with a byte-order mark first; the TOML and JSON parsers refuse it, and it is
    not content: the suite, its prompts and their identity are those of the same files without it."""
    plain = load_suite(write_suite(tmp_path / "plain"))
    path = write_suite(tmp_path / "marked")
    for name in ("evalgate.toml", "prompts.jsonl"):
        (tmp_path / "marked" / name).write_bytes(b"\xef\xbb\xbf" + (tmp_path / "marked" / name).read_bytes())
    marked = load_suite(path)
    assert [(p.key, p.text, p.line) for p in marked.prompts] == [(p.key, p.text, p.line) for p in plain.prompts]
    assert marked.identity() == plain.identity() and marked.sampling == plain.sampling


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be"])
def test_files_saved_as_utf16_are_refused_saying_so(tmp_path, encoding):
    """Windows PowerShell's `>` writes UTF-16: the error names it and the fix, for the suite and the prompts."""
    path = write_suite(tmp_path / "ws")
    prompts = tmp_path / "ws" / "prompts.jsonl"
    bom = "\ufeff" if encoding == "utf-16-be" else ""  # "utf-16" writes its own mark
    prompts.write_bytes((bom + prompts.read_text()).encode(encoding))
    said = config_error(path)
    assert f"{prompts}:1: not UTF-8" in said and "it is UTF-16" in said and "Out-File -Encoding utf8" in said
    path.write_bytes((bom + path.read_text()).encode(encoding))
    said = config_error(path)
    assert f"{path}: not UTF-8 (byte 0): it is UTF-16" in said and "save the suite file as UTF-8" in said
    prompts.write_bytes(b'{"id": "a", "prompt": "caf\xe9"}\n')
    path.write_text(path.read_bytes().decode(encoding).removeprefix("\ufeff"))
    assert "UTF-16" not in config_error(path)  # Latin-1, say: not UTF-8, and nothing more is claimed


def test_relative_paths_do_not_depend_on_cwd(tmp_path, monkeypatch):
    write_suite(tmp_path / "suite")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    suite = load_suite(Path("..") / "suite" / "evalgate.toml")
    assert suite.model == tmp_path / "suite" / "model"
    assert suite.prompts_file == tmp_path / "suite" / "prompts.jsonl"
    assert suite.database == f"sqlite:///{tmp_path / 'suite' / 'db' / 'evalgate.sqlite'}"


def test_a_path_under_the_home_directory_may_start_with_a_tilde(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    write_model(tmp_path / "home" / "models" / "m")
    write_prompts(tmp_path / "home" / "p.jsonl")
    path = write_suite(tmp_path / "suite", engine='model = "~/models/m"', prompts='file = "~/p.jsonl"')
    suite = load_suite(path)
    assert suite.model == tmp_path / "home" / "models" / "m" and suite.prompts_file == tmp_path / "home" / "p.jsonl"


def test_database_override_from_the_command_line_resolves_against_cwd(tmp_path, monkeypatch):
    path = write_suite(tmp_path / "suite")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert load_suite(path, database="mine.sqlite").database == f"sqlite:///{elsewhere / 'mine.sqlite'}"
    assert load_suite(path, database="sqlite:///x/mine.sqlite").database == f"sqlite:///{elsewhere / 'x' / 'mine.sqlite'}"
    assert load_suite(path, database="postgresql://u@h/db").database == "postgresql://u@h/db"


@pytest.mark.parametrize("url, expected", [
    ("sqlite:///rel/e.sqlite", "sqlite:////root/dir/rel/e.sqlite"),
    ("sqlite:////abs/e.sqlite", "sqlite:////abs/e.sqlite"),
    ("sqlite:///:memory:", "sqlite:///:memory:"),
    ("bare/e.sqlite", "sqlite:////root/dir/bare/e.sqlite"),
    ("postgresql+psycopg://u:p@host:5432/db", "postgresql+psycopg://u:p@host:5432/db"),
])
def test_resolve_database_url(url, expected):
    assert resolve_database_url(url, Path("/root/dir")) == expected


# --- bad suite files -------------------------------------------------------------------------------------


def test_missing_suite_file(tmp_path):
    msg = config_error(tmp_path / "nope.toml")
    assert str(tmp_path / "nope.toml") in msg and "not found" in msg


def test_malformed_toml(tmp_path):
    path = write_suite(tmp_path)
    path.write_text('[suite]\nname = "x"\n\n[sampling\nmax_tokens = 3\n')
    msg = config_error(path)
    assert str(path) in msg and "malformed TOML" in msg and "line 4" in msg


def test_suite_file_not_utf8(tmp_path):
    path = write_suite(tmp_path)
    path.write_bytes(b'[suite]\nname = "caf\xe9"\n')
    msg = config_error(path)
    assert str(path) in msg and "not UTF-8" in msg and "byte 19" in msg


@pytest.mark.parametrize("sections, field, hint", [
    ({"sampling": "tempreature = 0"}, "sampling.tempreature", "did you mean `temperature`"),
    ({"schedule": "concurency = [1]"}, "schedule.concurency", "did you mean `concurrency`"),
    ({"suite": 'nmae = "x"'}, "suite.nmae", "did you mean `name`"),
    ({"prompts": 'file = "prompts.jsonl"\nfiles = "x"'}, "prompts.files", "did you mean `file`"),
    ({"sampling": "zzz = 1"}, "sampling.zzz", "allowed keys:"),
])
def test_unknown_key_with_did_you_mean(tmp_path, sections, field, hint):
    msg = config_error(write_suite(tmp_path, **sections))
    assert str(tmp_path / "evalgate.toml") in msg and f"`{field}`" in msg and hint in msg


def test_unknown_top_level_table(tmp_path):
    path = write_suite(tmp_path)
    path.write_text(path.read_text() + "[sampeling]\nx = 1\n")
    msg = config_error(path)
    assert "unknown key `sampeling`" in msg and "did you mean `sampling`" in msg


@pytest.mark.parametrize("sections, field", [
    ({"sampling": 'max_tokens = "8"'}, "sampling.max_tokens"),
    ({"sampling": "max_tokens = 8.5"}, "sampling.max_tokens"),
    ({"sampling": "max_tokens = true"}, "sampling.max_tokens"),
    ({"sampling": 'temperature = "hot"'}, "sampling.temperature"),
    ({"sampling": "ignore_eos = 1"}, "sampling.ignore_eos"),
    ({"suite": "name = 3"}, "suite.name"),
    ({"suite": 'code_paths = "src"'}, "suite.code_paths"),
    ({"engine": "model = 5"}, "engine.model"),
    ({"schedule": "shuffles = 1.5"}, "schedule.shuffles"),
    ({"schedule": "seed = false"}, "schedule.seed"),
    ({"prompts": "file = 1"}, "prompts.file"),
])
def test_wrong_type(tmp_path, sections, field):
    msg = config_error(write_suite(tmp_path, **sections))
    assert str(tmp_path / "evalgate.toml") in msg and f"`{field}` must be" in msg
    wanted = msg.split(" must be ")[1].split(", got")[0]  # the fix names the same type, in plain English
    assert f"set `{field.split('.')[-1]}` to {wanted}" in msg, msg


def test_table_that_is_not_a_table(tmp_path):
    path = write_suite(tmp_path, sampling=None)
    path.write_text("sampling = 3\n" + path.read_text())
    msg = config_error(path)
    assert "`sampling` must be a table" in msg


@pytest.mark.parametrize("engine, needle", [
    ('model = "no-such-dir"', "no-such-dir"),
    ('model = "prompts.jsonl"', "prompts.jsonl"),  # a file, not a directory
    ('model = "empty"', "empty"),  # a directory without config.json
    ('dtype = "float32"', "`engine.model` is missing"),
    ('model = "model"\ntokenizer = "no-tok"', "`engine.tokenizer`"),
    ('model = "model"\nkind = "tgi"', "`engine.kind`"),
])
def test_bad_model_or_engine(tmp_path, engine, needle):
    (tmp_path / "empty").mkdir(parents=True)
    msg = config_error(write_suite(tmp_path, engine=engine))
    assert str(tmp_path / "evalgate.toml") in msg and needle in msg
    if "model =" in engine and "tokenizer" not in engine and "kind" not in engine:
        assert "`engine.model`" in msg and "config.json" in msg


def test_bad_code_path(tmp_path):
    msg = config_error(write_suite(tmp_path, suite='code_paths = ["src/missing.py"]'))
    assert "`suite.code_paths`" in msg and "src/missing.py" in msg


@pytest.mark.parametrize("concurrency", ["[]", "[0]", "[1, -4]", '["8"]', "[true]", "[1.5]"])
def test_bad_concurrency_list(tmp_path, concurrency):
    msg = config_error(write_suite(tmp_path, schedule=f"concurrency = {concurrency}"))
    assert str(tmp_path / "evalgate.toml") in msg
    assert "`schedule.concurrency` must be a non-empty list of positive integers" in msg


def test_concurrency_not_a_list(tmp_path):
    msg = config_error(write_suite(tmp_path, schedule="concurrency = 8"))
    assert "`schedule.concurrency` must be a list" in msg


@pytest.mark.parametrize("schedule", ["shuffles = -1", "repeats = 0"])
def test_bad_schedule_counts(tmp_path, schedule):
    assert "`schedule.shuffles` must be >= 0" in config_error(write_suite(tmp_path, schedule=schedule))


@pytest.mark.parametrize("logprobs", [0, 1])
def test_logprobs_below_two(tmp_path, logprobs):
    msg = config_error(write_suite(tmp_path, sampling=f"logprobs = {logprobs}"))
    assert "`sampling.logprobs` must be >= 2" in msg and str(tmp_path / "evalgate.toml") in msg


def test_max_tokens_below_one(tmp_path):
    assert "`sampling.max_tokens` must be >= 1" in config_error(write_suite(tmp_path, sampling="max_tokens = 0"))


@pytest.mark.parametrize("setting, said", [
    ("temperature = -0.5", "`sampling.temperature` is -0.5; vLLM takes in [0, 2]"),
    ("temperature = 2.5\nseed = 1", "`sampling.temperature` is 2.5; vLLM takes in [0, 2]"),
    ("top_p = 0", "`sampling.top_p` is 0; vLLM takes in (0, 1]"),
    ("top_p = 1.5", "`sampling.top_p` is 1.5; vLLM takes in (0, 1]"),
    ("min_p = 1.5", "`sampling.min_p` is 1.5; vLLM takes in [0, 1]"),
    ("top_k = -2", "`sampling.top_k` is -2; vLLM takes 0 or -1 for no cut-off, or at least 1"),
    ("repetition_penalty = 0", "`sampling.repetition_penalty` is 0; vLLM takes above 0"),
    ("presence_penalty = 2.5", "`sampling.presence_penalty` is 2.5; vLLM takes in [-2, 2]"),
    ("frequency_penalty = -2.5", "`sampling.frequency_penalty` is -2.5; vLLM takes in [-2, 2]"),
    ('stop = ["", "\\n"]', "`sampling.stop` entries must be non-empty strings"),
    ("temperature = 0.5\nseed = 18446744073709551617", "`sampling.seed` is 18446744073709551617; vLLM takes within 64 bits"),
])
def test_sampling_outside_vllms_bounds_is_refused_as_the_suite_loads(tmp_path, setting, said):
    """vLLM refuses such a request, every request, mid-run: refused at load instead, with the bounds."""
    assert said in config_error(write_suite(tmp_path, sampling=setting))


def test_sampling_at_vllms_bounds_loads(tmp_path):
    edges = "temperature = 2\nseed = 1\ntop_p = 1\nmin_p = 0\ntop_k = -1\nrepetition_penalty = 0.01\n" \
            "presence_penalty = -2\nfrequency_penalty = 2"
    sampling = load_suite(write_suite(tmp_path, sampling=edges)).sampling
    assert sampling["top_k"] == -1 and sampling["temperature"] == 2.0 and sampling["frequency_penalty"] == 2.0


def test_temperature_without_seed(tmp_path):
    msg = config_error(write_suite(tmp_path, sampling="temperature = 0.8"))
    assert "`sampling.temperature` > 0 without `sampling.seed`" in msg
    assert load_suite(write_suite(tmp_path, sampling="temperature = 0.8\nseed = 1")).sampling["seed"] == 1


# --- bad prompts files -----------------------------------------------------------------------------------


def test_prompts_file_missing(tmp_path):
    msg = config_error(write_suite(tmp_path, prompts='file = "nope.jsonl"'))
    assert str(tmp_path / "evalgate.toml") in msg and "`prompts.file`" in msg
    assert str(tmp_path / "nope.jsonl") in msg


def test_prompts_file_is_a_directory(tmp_path):
    (tmp_path / "adir").mkdir()
    msg = config_error(write_suite(tmp_path, prompts='file = "adir"'))
    assert "`prompts.file`" in msg and str(tmp_path / "adir") in msg


def test_prompts_file_field_missing(tmp_path):
    assert "`prompts.file` is missing" in config_error(write_suite(tmp_path, prompts=None))


def prompts_error(tmp_path: Path, raw: bytes) -> str:
    path = write_suite(tmp_path)
    (tmp_path / "prompts.jsonl").write_bytes(raw)
    return config_error(path)


@pytest.mark.parametrize("raw", [b"", b"\n\n   \n"])
def test_empty_prompts_file(tmp_path, raw):
    msg = prompts_error(tmp_path, raw)
    assert str(tmp_path / "prompts.jsonl") in msg and "empty" in msg


def test_duplicate_ids_name_both_lines(tmp_path):
    raw = b'{"id": "a", "prompt": "x"}\n{"id": "b", "prompt": "y"}\n\n{"id": "a", "prompt": "z"}\n'
    msg = prompts_error(tmp_path, raw)
    assert f"{tmp_path / 'prompts.jsonl'}:4" in msg and "duplicate id 'a'" in msg and "line 1" in msg


def test_duplicate_ids_int_and_string(tmp_path):
    msg = prompts_error(tmp_path, b'{"id": 1, "prompt": "x"}\n{"id": "1", "prompt": "y"}\n')
    assert "prompts.jsonl:2" in msg and "duplicate id '1'" in msg


@pytest.mark.parametrize("line, needle", [
    (b'{"id": "a", "prompt": ""}', "field `prompt` must be a non-empty string"),
    (b'{"id": "a"}', "give either `prompt` (text) or `messages` (a chat), not neither"),
    (b'{"id": "a", "prompt": 5}', "field `prompt` must be a non-empty string"),
    (b'{"id": "a", "prompt": "nul \\u0000 here"}', "NUL"),
    (b'{"id": "", "prompt": "x"}', "field `id`"),
    (b'{"id": true, "prompt": "x"}', "field `id`"),
    (b'{"prompt": "x"}', "field `id`"),
    (b'{"id": "a", "prompt": "x", "max_tokens": 0}', "field `max_tokens`"),
    (b'{"id": "a", "prompt": "x", "max_tokens": "3"}', "field `max_tokens`"),
    (b'{"id": "a", "prompt": "x", "temperature": 1}', "unknown field(s) temperature"),
    (b'["a", "x"]', "expected a JSON object"),
    (b'{"id": "a", "prompt": "x",}', "invalid JSON"),
    (b'{"id": "a", "prompt": "caf\xe9"}', "not UTF-8"),
    (b'{"id": "a", "prompt": "x", "messages": [{"role": "user", "content": "x"}]}', "not both"),
    (b'{"id": "a", "messages": "hello"}', "field `messages` must be a non-empty list"),
    (b'{"id": "a", "messages": []}', "field `messages` must be a non-empty list"),
    (b'{"id": "a", "messages": ["hello"]}', "`messages[0]` must be an object with exactly `role` and `content`"),
    (b'{"id": "a", "messages": [{"role": "user"}]}', "`messages[0]` must be an object with exactly `role` and `content`"),
    (b'{"id": "a", "messages": [{"role": "user", "content": "x", "name": "n"}]}', "exactly `role` and `content`"),
    (b'{"id": "a", "messages": [{"role": "robot", "content": "x"}]}', "`messages[0]`.role is 'robot'"),
    (b'{"id": "a", "messages": [{"role": "user", "content": 5}]}', "field `messages[0].content` must be a non-empty string"),
    (b'{"id": "a", "messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": [1]}',
     "field `chat_template_kwargs` must be a JSON object"),
    (b'{"id": "a", "prompt": "x", "chat_template_kwargs": {}}', "only for `messages` prompts"),
])
def test_bad_prompt_line(tmp_path, line, needle):
    msg = prompts_error(tmp_path, b'{"id": "ok", "prompt": "fine"}\n' + line + b"\n")
    assert f"{tmp_path / 'prompts.jsonl'}:2" in msg and needle in msg


def test_chat_prompts_keep_their_conversation_and_template_arguments(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"id": "c", "messages": [{"role": "system", "content": "Be brief."},
                                                        {"role": "user", "content": "Hi"}],
                                "chat_template_kwargs": {"enable_thinking": False}}) + "\n"
                    + json.dumps({"id": "d", "messages": [{"role": "user", "content": "Hi"}]}) + "\n")
    chat, plain_kwargs = load_prompts(path)
    assert chat.chat() == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert chat.chat_template_kwargs == {"enable_thinking": False} and plain_kwargs.chat_template_kwargs is None
    assert json.loads(chat.text) == chat.chat()  # stored and reported as its conversation


@pytest.mark.parametrize("text", [b'[{"id": "a", "prompt": "x"}]\n', b'\n  [\n{"id": "a", "prompt": "x"}\n]\n'])
def test_a_json_array_is_named_with_its_conversion(tmp_path, text):
    """A dataset exported as one JSON array (prompts.json) read line by line said "expected a JSON object" or
    "invalid JSON (column 2)"; it is named as what it is, with the one-line conversion."""
    msg = prompts_error(tmp_path, text)
    assert "prompts.jsonl: a JSON array; a prompts file is JSON Lines" in msg and "jq -c '.[]' prompts.jsonl > prompts-lines.jsonl" in msg


def test_invalid_json_reports_column(tmp_path):
    msg = prompts_error(tmp_path, b'{"id": "a" "prompt": "x"}\n')
    assert "prompts.jsonl:1: invalid JSON" in msg and "column 12" in msg


def test_load_prompts_directly(tmp_path):
    prompts = load_prompts(write_prompts(tmp_path / "p.jsonl"))
    assert [p.key for p in prompts] == ["greet", "7"]


# --- schedule --------------------------------------------------------------------------------------------


def test_plan_passes_changes_one_factor_per_pass():
    passes = plan_passes(Schedule(concurrency=(1, 8), shuffles=2, repeats=2, seed=5))
    assert passes == [
        Pass(0, 1, 0, None, salt_of=0),
        Pass(1, 1, 0, None, cache="hot", reference=0, factor="prefix_cache", salt_of=0),  # reuses pass 0's salts
        Pass(2, 8, 0, None, reference=0, factor="batch_size", salt_of=2),
        Pass(3, 1, 1, None, reference=0, factor="repeat", salt_of=3),
        Pass(4, 8, 1, None, reference=2, factor="repeat", salt_of=4),
        Pass(5, 8, 0, 5, reference=2, factor="order", salt_of=5),
        Pass(6, 8, 0, 6, reference=2, factor="order", salt_of=6),
    ]
    assert passes[5].label == "pass 5: concurrency 8, shuffled (seed 5), cache cold, repeat 0"
    assert passes[1].label == "pass 1: concurrency 1, given order, cache hot, repeat 0"
    # every pass but the first differs from its reference in its factor alone
    by_index = {p.index: p for p in passes}
    for p in passes[1:]:
        ref = by_index[p.reference]
        changed = {name for name, a, b in (("batch_size", ref.concurrency, p.concurrency),
                                           ("order", ref.order_seed, p.order_seed),
                                           ("prefix_cache", ref.cache, p.cache)) if a != b}
        assert changed == ({p.factor} if p.factor != "repeat" else set()), p
    assert comparison_label(by_index[0], by_index[2]) == "batch size 1→8"
    assert comparison_label(by_index[0], by_index[1]) == "prefix cache cold→hot"


def test_plan_passes_shuffles_at_highest_concurrency_and_none():
    assert [p.concurrency for p in plan_passes(Schedule(concurrency=(16, 2), shuffles=1))] == [16, 16, 2, 16]
    assert plan_passes(Schedule(concurrency=(16, 2), shuffles=1))[-1].reference == 0
    assert all(p.order_seed is None for p in plan_passes(Schedule(concurrency=(1, 4), shuffles=0, repeats=3)))
    assert len(plan_passes(Schedule(concurrency=(1, 4), shuffles=0, repeats=3))) == 7
    # no hot pass where the engine has no prefix cache, or where the schedule turns it off
    assert [p.cache for p in plan_passes(Schedule(concurrency=(1, 4)), prefix_caching=False)] == ["cold"] * 3
    assert [p.cache for p in plan_passes(Schedule(concurrency=(1, 4), hot_pass=False))] == ["cold"] * 3


def test_passes_of_a_run_recorded_before_conditions():
    old = {"passes": [{"index": 0, "concurrency": 1, "repeat": 0, "order_seed": None},
                      {"index": 1, "concurrency": 8, "repeat": 0, "order_seed": None}]}
    assert passes_of(old) == [Pass(0, 1, 0, None, cache="cold"), Pass(1, 8, 0, None, cache="unknown", reference=0)]
    new = plan_passes(Schedule())
    assert passes_of({"passes": [p.to_dict() for p in new]}) == new
    assert passes_of(None) == [] and passes_of({}) == []


def test_waves_sizes_and_given_order():
    keys = [f"k{i}" for i in range(10)]
    assert waves(keys, Pass(0, 4, 0, None)) == [keys[0:4], keys[4:8], keys[8:10]]
    assert waves(keys, Pass(0, 1, 0, None)) == [[k] for k in keys]
    assert waves(keys, Pass(0, 64, 0, None)) == [keys]
    assert waves([], Pass(0, 4, 0, None)) == []


def test_shuffle_is_deterministic_by_seed():
    keys = [f"k{i}" for i in range(20)]
    a = waves(keys, Pass(4, 8, 0, 5))
    assert a == waves(list(keys), Pass(9, 8, 1, 5))  # only the seed decides the order
    flat = [k for wave in a for k in wave]
    expected = list(keys)
    random.Random(5).shuffle(expected)
    assert flat == expected and flat != keys and sorted(flat) == sorted(keys)
    assert [len(w) for w in a] == [8, 8, 4]
    assert [k for w in waves(keys, Pass(4, 8, 0, 6)) for k in w] != flat
    assert keys == [f"k{i}" for i in range(20)]  # the caller's list is not shuffled in place


def test_with_overrides():
    s = Schedule(concurrency=(1, 8), shuffles=1, repeats=1, seed=3)
    assert with_overrides(s) == s
    assert with_overrides(s, concurrency=[2, 4], shuffles=0, repeats=2) == Schedule((2, 4), 0, 2, 3)
    assert with_overrides(Schedule(hot_pass=False), repeats=2).hot_pass is False


def test_integer_and_float_spellings_of_a_float_parameter_hash_alike(tmp_path):
    from evalgate.configuration.suite import load_suite

    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (tmp_path / "p.jsonl").write_text('{"id": 1, "prompt": "hi"}\n')
    hashes = []
    for spelling in ("1", "1.0"):
        suite_file = tmp_path / f"s{len(hashes)}.toml"
        suite_file.write_text(f'[engine]\nmodel = "m"\n[sampling]\ntop_p = {spelling}\n[prompts]\nfile = "p.jsonl"\n')
        suite = load_suite(suite_file)
        hashes.append(suite.request_hash(suite.prompts[0]))
    assert hashes[0] == hashes[1]


def test_a_probe_parses_its_own_settings_table(tmp_path):
    """[probes.needle] is read by the needle probe (Probe.options): its keys, typed, with a did-you-mean;
    the run's schedule carries them, and the probe reads them back with its defaults elsewhere."""
    from evalgate.probes import get_probe

    suite = load_suite(write_suite(tmp_path / "new", **{"probes.needle": "batch = 16\nfiller_tokens = 256"}))
    needle = get_probe("needle")
    assert dict(suite.schedule.probe_options) == {"needle": {"batch": 16, "filler_tokens": 256}}
    assert needle.option(suite.schedule, "batch") == 16 and not suite.notes
    assert needle.option(load_suite(write_suite(tmp_path / "plain")).schedule, "batch") == 64  # the default
    with pytest.raises(ConfigError, match=r"(?s)unknown key `probes\.needle\.bach`.*did you mean `batch`"):
        load_suite(write_suite(tmp_path / "typo", **{"probes.needle": "bach = 16"}))
    with pytest.raises(ConfigError, match=r"`probes\.needle\.batch` is 0, below 1"):
        load_suite(write_suite(tmp_path / "zero", **{"probes.needle": "batch = 0"}))
    with pytest.raises(ConfigError, match=r"\[probes\.needl\]: unknown probe 'needl'"):
        load_suite(write_suite(tmp_path / "unknown", **{"probes.needl": "batch = 2"}))
    with pytest.raises(ConfigError, match=r"the prefill_decode probe has no settings"):
        load_suite(write_suite(tmp_path / "none", **{"probes.prefill_decode": "batch = 2"}))


def test_old_needle_keys_still_load_with_a_note_saying_where_they_moved(tmp_path):
    old = load_suite(write_suite(tmp_path / "old", schedule=BASE["schedule"] + "\nneedle_batch = 3\nneedle_filler_tokens = 20"))
    assert dict(old.schedule.probe_options) == {"needle": {"batch": 3, "filler_tokens": 20}}
    assert [n.split(": ", 1)[1] for n in old.notes] == [
        "`[schedule] needle_batch` moved to `[probes.needle] batch`; it is read as before",
        "`[schedule] needle_filler_tokens` moved to `[probes.needle] filler_tokens`; it is read as before"]
    with pytest.raises(ConfigError, match=r"`schedule\.needle_batch` and `probes\.needle\.batch` both set"):
        load_suite(write_suite(tmp_path / "both", schedule=BASE["schedule"] + "\nneedle_batch = 3",
                               **{"probes.needle": "batch = 4"}))


def test_chats_for_a_tokenizer_without_a_chat_template_are_refused_before_an_engine_starts(tmp_path):
    """The files say the tokenizer has no template: refused at load (exit 2, the line, the directory), not
    after an engine start. Where the files name a template, or cannot tell, the engine's tokenizer decides."""
    chats = [PROMPTS[0], {"id": "c", "messages": [{"role": "user", "content": "Hi"}]}]
    path = write_suite(tmp_path / "ws", prompt_list=chats)
    model = tmp_path / "ws" / "model"
    assert load_suite(path).prompts[1].messages  # no tokenizer_config.json: the files cannot tell
    (model / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')
    said = config_error(path)
    assert f"{tmp_path / 'ws' / 'prompts.jsonl'}:2: prompt 'c': a `messages` prompt" in said
    assert f"the tokenizer in {model} has no chat template" in said and "chat_template.jinja" in said
    (model / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    assert load_suite(path).prompts[1].messages
    (model / "chat_template.jinja").unlink()
    (model / "tokenizer_config.json").write_text('{"chat_template": "{{ messages[0][\'content\'] }}"}')
    assert load_suite(path).prompts[1].messages
    (model / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')
    tasks = write_suite(tmp_path / "ws", name="tasks.toml", prompts=None,
                        lm_eval='tasks = ["arith"]\napply_chat_template = true')
    assert "`lm_eval.apply_chat_template` is set, but the tokenizer" in config_error(tasks)
    assert load_suite(write_suite(tmp_path / "ws", name="plain.toml", prompt_list=None, prompts=None,
                                  lm_eval='tasks = ["arith"]')).lm_eval.tasks == ("arith",)


def test_logprobs_above_the_engines_cap_are_refused_as_the_suite_loads(tmp_path):
    """vLLM refuses a request asking more logprobs than `max_logprobs` (20 unless set): mid-run, every
    request. Refused at load instead, naming both settings; a raised or lifted cap loads."""
    said = config_error(write_suite(tmp_path / "over", sampling="logprobs = 25"))
    assert "`sampling.logprobs` is 25, above the vllm engine's cap of 20 (`engine.max_logprobs`, by default)" in said
    assert "max_logprobs = 25 in [engine]" in said
    assert load_suite(write_suite(tmp_path / "at", sampling="logprobs = 20")).sampling["logprobs"] == 20
    for cap in ("25", "-1"):
        raised = write_suite(tmp_path / f"cap{cap}", sampling="logprobs = 25", engine=BASE["engine"] + f"\nmax_logprobs = {cap}")
        assert load_suite(raised).sampling["logprobs"] == 25
    lowered = write_suite(tmp_path / "low", sampling="logprobs = 8", engine=BASE["engine"] + "\nmax_logprobs = 5")
    assert "is 8, above the vllm engine's cap of 5 (`engine.max_logprobs`, set)" in config_error(lowered)
    fake = write_suite(tmp_path / "fake", sampling="logprobs = 25", engine='kind = "fake"\nmodel = "model"')
    assert load_suite(fake).sampling["logprobs"] == 25  # a kind that names no cap


def test_a_model_tokenizer_or_adapter_of_git_lfs_pointers_is_refused_naming_them(tmp_path):
    """A clone without its LFS objects (`git clone` of a Hub model without git-lfs, a CI checkout without
    `lfs: true`) holds pointer files: refused as the suite loads, naming them and `git lfs pull`."""
    pointer = b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"ab" * 32 + b"\nsize 1234567\n"
    path = write_suite(tmp_path / "ws")
    model = tmp_path / "ws" / "model"
    (model / "nested").mkdir()
    (model / "nested" / "loop").symlink_to(model)  # a link back up the tree is walked once
    (model / ".git").mkdir()
    (model / ".git" / "pointer-like").write_bytes(pointer)  # git's own files are not the model's
    (model / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    assert load_suite(path).model == model
    (model / "model.safetensors").write_bytes(pointer)
    said = config_error(path)
    assert f"`engine.model`: {model} holds Git LFS pointers, not the files they stand for (model.safetensors)" in said
    assert "git lfs pull" in said and "lfs: true" in said
    (model / "model.safetensors").write_bytes(b"{}")
    prompts = tmp_path / "ws" / "prompts.jsonl"
    saved = prompts.read_bytes()
    prompts.write_bytes(pointer)
    assert f"{prompts}: a Git LFS pointer, not the prompts file it stands for" in config_error(path)
    prompts.write_bytes(saved)
    tokenizer = tmp_path / "tok"
    tokenizer.mkdir()
    (tokenizer / "tokenizer.json").write_bytes(pointer)
    (model / "model.safetensors").write_bytes(b"{}")
    said = config_error(write_suite(tmp_path / "ws", engine=BASE["engine"] + f'\ntokenizer = "{tokenizer}"'))
    assert "`engine.tokenizer`" in said and "(tokenizer.json)" in said


def test_a_tokenizer_past_the_models_vocabulary_is_refused_as_the_suite_loads(tmp_path):
    """`[engine] tokenizer` naming another model's tokenizer: vLLM fails mid-run on the first token id past the
    embeddings (an IndexError, exit 3). Refused at load, with both sizes; one within the vocabulary loads."""
    path = write_suite(tmp_path / "ws", engine=BASE["engine"] + '\ntokenizer = "tok"')
    (tmp_path / "ws" / "model" / "config.json").write_text('{"vocab_size": 300}')
    tok = tmp_path / "ws" / "tok"
    tok.mkdir()
    vocab = {f"t{i}": i for i in range(290)}
    (tok / "tokenizer.json").write_text(json.dumps({"model": {"vocab": vocab}, "added_tokens": [{"id": 299}]}))
    assert load_suite(path).tokenizer == tok
    (tok / "tokenizer.json").write_text(json.dumps({"model": {"vocab": vocab}, "added_tokens": [{"id": 512}]}))
    said = config_error(path)
    assert f"`engine.tokenizer`: {tok} has token ids up to 512, past the model's vocabulary of 300" in said
    (tok / "tokenizer.json").write_text(json.dumps({"model": {"vocab": [["a", 0.0]] * 400}}))  # a Unigram model's list
    assert "token ids up to 399" in config_error(path)
