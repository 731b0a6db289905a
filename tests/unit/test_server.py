"""Server engines without vLLM: suite validation of the `openai` / `vllm-server` kinds and [load], the HTTP
client's retries and backoff, and whole runs against a small fake OpenAI-compatible server (stdlib
http.server) that can answer with the wrong model, fail with 503s, or hang."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from helpers import db_baselines, db_runs, read_json

from evalgate.configuration.suite import load_suite
from evalgate.engines.openai_api import ApiClient, RequestFailed
from evalgate.engines.vllm_server import cli_flags
from evalgate.errors import ConfigError
from evalgate.records import rank_top

KEY = "fake-key-4f1c9e"


# --- a fake OpenAI-compatible server -----------------------------------------------------------------------


class FakeServer:
    """Serves `model`; `answer_model` is what completions claim to be; `fail` is a list of statuses to answer
    completions with before succeeding (0: hang past the client's timeout); `always_fail` answers every
    completion with 503."""

    def __init__(self, model="fake/model", answer_model=None, key=KEY):
        self.model, self.answer_model, self.key = model, answer_model or model, key
        self.fail: list[int] = []
        self.always_fail = False
        self.completions = 0
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status, body):
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/version":
                    return self._send(200, {"version": "0.0-fake"})
                if self.path == "/metrics":
                    return self._send(200, 'vllm:cache_config_info{block_size="16",enable_prefix_caching="True",'
                                           'num_gpu_blocks="99"} 1.0\nvllm:num_requests_running{engine="0"} 0.0\n')
                if not self._authorized():
                    return
                if self.path == "/v1/models":
                    return self._send(200, {"data": [{"id": fake.model, "root": "/models/x", "max_model_len": 256}]})
                self._send(404, {"error": {"message": "not found"}})

            def _authorized(self):
                if fake.key and self.headers.get("Authorization") != f"Bearer {fake.key}":
                    self._send(401, {"error": "Unauthorized"})
                    return False
                return True

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if not self._authorized():
                    return
                if self.path == "/tokenize":
                    return self._send(200, {"tokens": [1] + [ord(c) % 200 + 2 for c in body["prompt"][:40]],
                                            "max_model_len": 256})
                if self.path == "/detokenize":
                    return self._send(200, {"prompt": f"<{body['tokens'][0]}>"})
                if self.path != "/v1/completions":
                    return self._send(404, {"error": {"message": "not found"}})
                with fake.lock:
                    fake.completions += 1
                    probe = body.get("prompt") == "evalgate"  # the engine's start-up probe is never failed
                    status = 503 if fake.always_fail and not probe else (fake.fail.pop(0) if fake.fail and not probe else 200)
                if status == 0:
                    time.sleep(3)
                    status = 200
                if status != 200:
                    return self._send(status, {"error": {"message": "overloaded"}})
                n = int(body.get("max_tokens") or 4)
                seed = sum(map(ord, str(body.get("prompt"))))
                ids = [(seed + i) % 50 + 3 for i in range(n)]
                top = [{f"token_id:{t}": -0.5, f"token_id:{t + 100}": -1.25, f"token_id:{t + 101}": -2.0} for t in ids]
                self._send(200, {
                    "model": fake.answer_model, "system_fingerprint": "fake-fp",
                    "choices": [{"index": 0, "text": "x" * n, "token_ids": ids, "prompt_token_ids": [1, 2, 3],
                                 "finish_reason": "length",
                                 "logprobs": {"token_logprobs": [-0.5] * n, "tokens": [f"token_id:{t}" for t in ids],
                                              "top_logprobs": top}}],
                })

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def openai_suite(directory: Path, url: str, *, model="fake/model", extra_engine="", prompts=6, extra="",
                 concurrency=(1, 4)) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "prompts.jsonl").write_text(
        "".join(json.dumps({"id": f"p{i}", "prompt": f"prompt {i}"}) + "\n" for i in range(prompts)))
    suite = directory / "evalgate.toml"
    suite.write_text(f"""
[suite]
name = "srv"
database = "sqlite:///evalgate.sqlite"

[engine]
kind = "openai"
base_url = "{url}"
served_model = "{model}"
api_key_env = "FAKE_SERVER_KEY"
timeout = 1.0
retries = 2
{extra_engine}

[sampling]
max_tokens = 4
logprobs = 2

[prompts]
file = "prompts.jsonl"

[schedule]
concurrency = {list(concurrency)}
shuffles = 0
{extra}
""")
    return suite


def flat(proc) -> str:
    """stdout + stderr with rich's line wrapping undone."""
    return " ".join((proc.stdout + proc.stderr).split())


@pytest.fixture
def fake_cli(inline_cli):
    """The CLI in this process (the engine job too) against the fake server: what a subprocess adds is
    proven by the e2e tier."""
    inline_cli.env = dict(inline_cli.env, FAKE_SERVER_KEY=KEY)
    return inline_cli


# --- suite validation ------------------------------------------------------------------------------------


def _engine_suite(tmp_path: Path, engine: str, extra: str = "") -> Path:
    (tmp_path / "prompts.jsonl").write_text('{"id": "a", "prompt": "hi"}\n')
    (tmp_path / "m").mkdir(exist_ok=True)
    (tmp_path / "m" / "config.json").write_text("{}")
    suite = tmp_path / "s.toml"
    suite.write_text(f"[engine]\n{engine}\n[prompts]\nfile = \"prompts.jsonl\"\n[schedule]\nconcurrency = [1, 8]\n{extra}")
    return suite


@pytest.mark.parametrize("engine, extra, needle", [
    ('kind = "openai"\nserved_model = "m"', "", "`engine.base_url` is missing"),
    ('kind = "openai"\nbase_url = "localhost:8000"\nserved_model = "m"', "", "is not an http(s) URL"),
    ('kind = "openai"\nbase_url = "http://h:1"', "", "`engine.served_model` is missing"),
    ('kind = "openai"\nbase_url = "http://h:1"\nserved_model = "m"\napi_key_env = "sk-123 abc"', "",
     "`engine.api_key_env` = 'sk-123 abc' is not an environment variable name"),
    ('kind = "openai"\nbase_url = "http://h:1"\nserved_model = "m"\ndtype = "bfloat16"', "", "unknown key `engine.dtype`"),
    ('kind = "openai"\nbase_url = "http://h:1"\nserved_model = "m"\ntimeout = 0', "", "`engine.timeout` must be a positive"),
    ('kind = "openai"\nbase_url = "http://h:1"\nserved_model = "m"\nretries = -1', "", "`engine.retries` must be between"),
    ('kind = "openai"\nbase_url = "http://h:1"\nserved_model = "m"\nmodel = "m"\nmodel_hash = "abc"', "",
     "`engine.model_hash` must be a non-empty string, and only without `engine.model`"),
    ('kind = "vllm-server"', "", "`engine.model` is missing"),
    ('kind = "vllm-server"\nmodel = "m"\nport = 8000', "", "`engine.port` is set by evalgate"),
    ('kind = "vllm-server"\nmodel = "m"\napi_key = "sk-1"', "", "`engine.api_key` is set by evalgate"),
    ('kind = "vllm-server"\nmodel = "m"\nstartup_timeout = "long"', "", "`engine.startup_timeout` must be"),
    ('kind = "vllm-serve"\nmodel = "m"', "", "did you mean 'vllm-server'? available engine kinds: vllm, openai, vllm-server"),
    ('model = "m"', "[load]\nfiller = 4\n", "[load] needs a server engine"),
    ('kind = "vllm-server"\nmodel = "m"', "[load]\nfiller = 0\n", "`load.filler` must be >= 1"),
    ('kind = "vllm-server"\nmodel = "m"', "[load]\nconcurrency = [16]\n", "`load.concurrency` names [16]"),
    ('kind = "vllm-server"\nmodel = "m"', "[load]\nrate = -1\n", "`load.rate` must be a finite number >= 0"),
    ('kind = "vllm-server"\nmodel = "m"', "[load]\nfillers = 3\n", "unknown key `load.fillers`"),
])
def test_config_errors_name_the_field(tmp_path, engine, extra, needle):
    with pytest.raises(ConfigError) as err:
        load_suite(_engine_suite(tmp_path, engine, extra))
    assert needle in str(err.value)
    assert err.value.fix


def test_server_config_parsed(tmp_path):
    suite = load_suite(_engine_suite(tmp_path, 'kind = "openai"\nbase_url = "http://h:1/v1/"\nserved_model = "m"\n'
                                                'api_key_env = "K"\nmodel_hash = "sha256:abc"',
                                     "[load]\nfiller = 3\nseed = 5\n"))
    assert suite.model is None and suite.engine_args == {}
    assert suite.server.base_url == "http://h:1" and suite.server.api_key_env == "K" and suite.server.retries == 3
    assert suite.schedule.load.filler == 3 and suite.schedule.load.applies(8) and not suite.schedule.load.applies(1)
    server = load_suite(_engine_suite(tmp_path, 'kind = "vllm-server"\nmodel = "m"\nenforce_eager = true\n'
                                                'max_model_len = 512\ndtype = "float32"\nstartup_timeout = 90'))
    assert server.engine_args == {"enforce_eager": True, "max_model_len": 512, "dtype": "float32"}
    assert server.server.served_model == str(tmp_path / "m") and server.server.startup_timeout == 90


def test_cli_flags():
    assert cli_flags({"enforce_eager": True, "max_model_len": 512, "dtype": "bfloat16", "enable_prefix_caching": False,
                      "served_model_name": ["a", "b"]}) == [
        "--dtype", "bfloat16", "--no-enable-prefix-caching", "--enforce-eager", "--max-model-len", "512",
        "--served-model-name", "a", "b"]


def test_top_k_rank_order_restored():
    # vLLM writes the sampled token first, then the rest of the top-k in rank order
    assert rank_top([(7, -1.0), (3, -0.5), (9, -2.0)], 3) == ([3, 7, 9], [-0.5, -1.0, -2.0])
    assert rank_top([(7, -0.5), (3, -0.6), (9, -2.0)], 2) == ([7, 3], [-0.5, -0.6])
    # sampled outside the top-k (k + 1 entries): it falls off the end
    assert rank_top([(7, -5.0), (3, -0.5), (9, -2.0)], 2) == ([3, 9], [-0.5, -2.0])
    # exactly equal logprobs: by token id, whatever order the engine's top-k kernel returned them in
    # (measured: SmolLM2 bf16, in process [905, 1838] and through the server [1838, 905])
    assert rank_top([(407, -0.1), (1838, -0.9), (905, -0.9)], 3) == ([407, 905, 1838], [-0.1, -0.9, -0.9])
    assert rank_top([(7, -0.5), (7, -0.5), (3, -0.6)], 3) == ([7, 3], [-0.5, -0.6])  # each id once


# --- the HTTP client: retries and backoff -------------------------------------------------------------------


def _client(url, retries=3, timeout=1.0):
    return ApiClient(url, api_key=None, timeout=timeout, retries=retries, backoff=0.01, max_backoff=0.05)


def test_backoff_is_exponential_and_capped():
    client = ApiClient("http://127.0.0.1:1", api_key=None, timeout=1, retries=5)
    assert [client.delay(a) for a in range(6)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0]


def test_retry_503_then_200():
    with FakeServer(key=None) as fake:
        fake.fail = [503, 502]

        async def go():
            client = _client(fake.url)
            out = await client.call("POST", "/v1/completions", {"model": "fake/model", "prompt": "x", "max_tokens": 2})
            await client.aclose()
            return client, out

        client, out = asyncio.run(go())
        assert out["choices"][0]["token_ids"] and fake.completions == 3
        assert client.stats.retries == 2


def test_retries_exhausted_and_client_errors_not_retried():
    with FakeServer(key=None) as fake:
        fake.always_fail = True

        async def go(path="/v1/completions"):
            client = _client(fake.url, retries=2)
            try:
                return await client.call("POST", path, {"prompt": "x"})
            finally:
                await client.aclose()

        with pytest.raises(RequestFailed) as err:
            asyncio.run(go())
        assert err.value.attempts == 3 and err.value.status == 503 and "overloaded" in err.value.reason
        with pytest.raises(RequestFailed) as err:  # 404: a client error is final
            asyncio.run(go("/nowhere"))
        assert err.value.attempts == 1 and not err.value.retryable


def test_timeout_retried_then_success():
    with FakeServer(key=None) as fake:
        fake.fail = [0]  # the first completion hangs 3 s, past the 1 s timeout

        async def go():
            client = _client(fake.url, timeout=1.0)
            try:
                return await client.call("POST", "/v1/completions", {"prompt": "x", "max_tokens": 1}), client
            finally:
                await client.aclose()

        out, client = asyncio.run(go())
        assert out["choices"] and client.stats.retries == 1


def test_connection_refused_is_retried_then_fails():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there

    async def go():
        client = _client(f"http://127.0.0.1:{port}", retries=2)
        try:
            return await client.call("GET", "/v1/models")
        finally:
            await client.aclose()

    with pytest.raises(RequestFailed) as err:
        asyncio.run(go())
    assert err.value.attempts == 3 and "ConnectError" in err.value.reason


# --- whole runs against the fake server (the CLI, as a user runs it) --------------------------------------------


def test_fake_server_run_records_each_request_once(fake_cli, tmp_path):
    with FakeServer() as fake:
        fake.fail = [503, 0]  # the first request meets a 503, then a timeout: retried twice, recorded once
        suite = openai_suite(tmp_path / "ws", fake.url,
                             extra="[load]\nfiller = 2\nfiller_max_tokens = 3\nwarmup = 0.2\n")
        fake_cli("baseline", "create", suite, "--json-report", tmp_path / "r.json", check=0)
    db = f"sqlite:///{tmp_path / 'ws' / 'evalgate.sqlite'}"
    from helpers import db_query

    # pass 1 is the hot pass (the fake server publishes enable_prefix_caching = True)
    assert db_query(db, "select pass_index, count(*), count(distinct request_key) from outputs group by pass_index") == [
        (0, 6, 6), (1, 6, 6), (2, 6, 6)]
    schedule = json.loads(db_query(db, "select schedule from runs")[0][0])
    assert schedule["load"]["filler"] == 2  # recorded, never identity
    loaded = [p for p in schedule["timings"]["passes"] if "load" in p]
    assert [p["concurrency"] for p in loaded] == [4] and loaded[0]["load"]["sent"] >= 2
    fingerprint = json.loads(db_query(db, "select components from fingerprints")[0][0])
    assert fingerprint["engine"]["data"]["cache_config"] == {"block_size": "16", "enable_prefix_caching": "True"}
    assert fingerprint["model"]["data"] == {"served_model": "fake/model"}
    assert read_json(tmp_path / "r.json")["counts"]["stable"] == 6


def test_server_failing_exits_3_naming_requests(fake_cli, tmp_path):
    with FakeServer() as fake:
        suite = openai_suite(tmp_path / "ws", fake.url, concurrency=(4,))
        fake.always_fail = True
        proc = fake_cli("baseline", "create", suite, check=3)
    assert "requests to the server" in flat(proc)
    assert "'p0'" in flat(proc) and "after 3 attempts" in flat(proc)
    db = f"sqlite:///{tmp_path / 'ws' / 'evalgate.sqlite'}"
    assert db_runs(db) == [(1, "baseline", "failed", None)] and db_baselines(db) == []


@pytest.mark.parametrize("served, answered, needle", [
    ("other/model", None, "does not serve 'fake/model' (it serves 'other/model')"),
    ("fake/model", "imposter/model", "answered request 'probe' with model 'imposter/model'"),
])
def test_model_mismatch_exits_2(fake_cli, tmp_path, served, answered, needle):
    with FakeServer(model=served, answer_model=answered) as fake:
        suite = openai_suite(tmp_path / "ws", fake.url)
        proc = fake_cli("baseline", "create", suite, check=2)
    assert needle in flat(proc)
    assert not (tmp_path / "ws" / "evalgate.sqlite").exists()  # exit 2: nothing written


def test_wrong_or_missing_key_exits_2(fake_cli, tmp_path):
    with FakeServer() as fake:
        suite = openai_suite(tmp_path / "ws", fake.url)
        fake_cli.env["FAKE_SERVER_KEY"] = "wr0ng-k3y-value"
        proc = fake_cli("baseline", "create", suite, check=2)
        assert "refused the API key" in flat(proc) and "FAKE_SERVER_KEY" in flat(proc)
        del fake_cli.env["FAKE_SERVER_KEY"]
        proc = fake_cli("baseline", "create", suite, check=2)
        assert "names FAKE_SERVER_KEY, which is not set" in flat(proc)
    assert "wr0ng-k3y-value" not in proc.stderr + proc.stdout
