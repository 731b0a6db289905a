"""What the tests share besides fixtures (tests/conftest.py): the CLI as a user runs it (in a subprocess, or in
this process for the plumbing tier), suite files, models built once per session, and read-only looks into
a store that do not go through evalgate's own code."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text

from evalgate.kernels.status import KERNELS

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

# torch on 2 cores: one thread is far faster and keeps CPU numerics repeatable between processes.
TEST_ENV = {
    "OMP_NUM_THREADS": "1",
    # vLLM's sampler torch.compiles its rank count (an integer count, the same eager) at its first logprobs
    # request: about 2 s of every engine start here, even with enforce_eager. Every run of the tests, plain vLLM's
    # included, runs it eager.
    "TORCHDYNAMO_DISABLE": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


# A batch effect planted in real vLLM (tests/planted/evalgate_planted_variance.py: a vLLM plugin, every process
# of the engine loads it): for tests that need batch variance on any CPU, whatever its kernels vary in.
PLANTED = Path(__file__).with_name("planted")


def planted_batch_variance(env: dict[str, str]) -> dict[str, str]:
    """What `env` needs for the planted batch effect: the plugin's folder ahead of its PYTHONPATH, switched on."""
    path = os.pathsep.join(p for p in (str(PLANTED), env.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "EVALGATE_TEST_PLANT_BATCH_VARIANCE": "1"}


def planted_linear_variance(env: dict[str, str]) -> dict[str, str]:
    """What `env` needs for the batch effect planted in the GEMM kernels (fewer than 4 rows: one ulp up)."""
    return {**planted_batch_variance(env), "EVALGATE_TEST_PLANT_BATCH_VARIANCE": "0",
            "EVALGATE_TEST_PLANT_LINEAR_VARIANCE": "1"}


class CLI:
    def __init__(self, env: dict[str, str], cwd: Path, prefix: tuple[str, ...] = ()):
        self.env, self.cwd = env, cwd
        self.prefix = prefix  # a command the CLI runs under (e.g. faketime)

    def under(self, *prefix: str) -> CLI:
        """The same CLI run under another command, e.g. `cli.under("faketime", "-f", "@2026-03-01 09:00:00")`."""
        return CLI(self.env, self.cwd, prefix)

    def __call__(self, *args: str, timeout: float = 900, check: int | None = None) -> subprocess.CompletedProcess:
        proc = subprocess.run([*self.prefix, sys.executable, "-m", "evalgate", *map(str, args)], cwd=self.cwd,
                              env=self.env, capture_output=True, text=True, timeout=timeout)
        if check is not None and proc.returncode != check:
            raise AssertionError(f"evalgate {' '.join(map(str, args))} exited {proc.returncode}, expected {check}\n"
                                 f"--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-6000:]}")
        return proc

    def popen(self, *args: str, **kwargs) -> subprocess.Popen:
        """A CLI process a test can interrupt: SIGINT at its default even when pytest itself was started in
        the background (a shell starts background jobs with SIGINT ignored, and children inherit that)."""
        return subprocess.Popen([sys.executable, "-m", "evalgate", *map(str, args)], cwd=self.cwd, env=self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=_interruptible, **kwargs)


def _interruptible() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # Python installs its KeyboardInterrupt handler over it


@dataclass
class Result:
    """What an in-process CLI call left: the same fields as a finished subprocess."""

    returncode: int
    stdout: str
    stderr: str


class InlineCLI:
    """The CLI in this process (typer's CliRunner), the engine job too ($EVALGATE_INLINE_ENGINE): the plumbing
    tier on the fake engine, in milliseconds a call. What only a subprocess proves (signals, the worker
    boundary, kill -9, the engine log) stays on `CLI`."""

    def __init__(self, env: dict[str, str], cwd: Path):
        self.env = {**env, "EVALGATE_INLINE_ENGINE": "1"}
        self.cwd = cwd

    def __call__(self, *args: str, timeout: float = 900, check: int | None = None) -> Result:
        from typer.testing import CliRunner

        from evalgate.cli import app

        # the variables evalgate reads, as the subprocess would see them (CliRunner restores them after)
        env = {k: v for k, v in self.env.items() if os.environ.get(k) != v}
        env.update({k: None for k in os.environ if k.startswith(("EVALGATE_", "GITHUB_")) and k not in self.env})
        before = os.getcwd()
        os.chdir(self.cwd)  # (contextlib.chdir is Python 3.11+)
        try:
            result = CliRunner().invoke(app, [str(a) for a in args], env=env, catch_exceptions=True)
        finally:
            os.chdir(before)
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception
        proc = Result(result.exit_code, result.stdout, result.stderr)
        if check is not None and proc.returncode != check:
            raise AssertionError(f"evalgate {' '.join(map(str, args))} exited {proc.returncode}, expected {check}\n"
                                 f"--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-6000:]}")
        return proc


def cached_model(models_dir: Path, preset: str, seed: int = 0) -> Path:
    """`evalgate build-model --preset PRESET --seed SEED`, built once per session (the build is
    reproducible per seed, so every test may read the same directory; none may write it)."""
    from filelock import FileLock

    out = models_dir / f"{preset}-{seed}"
    with FileLock(str(out) + ".lock"):
        if not (out / "config.json").exists():
            env = dict(os.environ, OMP_NUM_THREADS="1")
            subprocess.run([sys.executable, "-m", "evalgate", "build-model", str(out), "--preset", preset, "--seed",
                            str(seed)], check=True, env=env, capture_output=True)
    return out


def bare_model(directory: Path, seed: int = 0, vocab_size: int = 256) -> Path:
    """A model directory for the fake engine, written without torch: config.json and a weights file of
    seeded bytes (the fake engine's outputs are a function of their hash; no tokenizer: UTF-8 bytes)."""
    import random

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "vocab_size": vocab_size}))
    (directory / "model.safetensors").write_bytes(random.Random(seed).randbytes(4096))
    return directory


def tokenized_model(directory: Path, seed: int = 0) -> Path:
    """A model directory for the fake engine with the tiny preset's real tokenizer (the `tokenizers` library:
    no torch, no model build), for what needs prompt ids and chat templates: tokenizer.json, a
    tokenizer_config.json as transformers writes it, and `bare_model`'s config and weights."""
    from evalgate.models.tinymodel import PRESETS, build_tokenizer

    tokenizer = build_tokenizer(PRESETS["tiny"]["vocab_size"])
    bare_model(directory, seed=seed, vocab_size=tokenizer.get_vocab_size())
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>"}))
    return directory


SQLITE_IN_SUITE_DIR = "sqlite:///evalgate.sqlite"  # relative: the file next to the suite file


def database_url(suite: Path) -> str:
    """The absolute URL of the database a suite file names, resolved as docs/storage.md specifies (a
    relative SQLite path against the suite file's directory), independently of evalgate's own code."""
    with open(suite, "rb") as f:
        database = tomllib.load(f)["suite"]["database"]
    if database.startswith("sqlite:///") and not database.startswith("sqlite:////"):
        return "sqlite:///" + str(Path(suite).parent / database[len("sqlite:///"):])
    return database


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite URL; None for a database server."""
    return Path(url[len("sqlite:///"):]) if url.startswith("sqlite:///") else None


def db_exists(url: str) -> bool:
    """Whether there is anything to read yet: a server database always exists (its tables may not)."""
    path = sqlite_file(url)
    return path is None or path.is_file()


def _engine(url: str):
    path = sqlite_file(url)
    if path is not None and not path.is_file():  # never create a missing SQLite file by reading it
        raise AssertionError(f"no SQLite database at {path}")
    return create_engine(url)


def db_outputs(url: str, where: str, **params) -> list[dict]:
    """The stored outputs matching `where` (SQL on `outputs`), decoded from their payloads, in storage
    order: key, pass, ids, logprob bits, top-k ids and logprob bits, texts, digest, finish reason."""
    from evalgate.records import decode_payload, pack_floats

    rows = db_query(url, "select outputs.request_key, outputs.pass_index, outputs.digest, outputs.finish_reason, "
                         "payloads.data from outputs join payloads on payloads.hash = outputs.payload_hash "
                         f"where {where} order by outputs.id", **params)
    decoded = []
    for key, pass_index, digest, finish_reason, data in rows:
        ids, lps, top_ids, top_lps, token_texts, text = decode_payload(bytes(data))
        decoded.append({"key": key, "pass": pass_index, "ids": ids, "logprob_bits": pack_floats(lps),
                        "top_ids": top_ids, "top_logprob_bits": [pack_floats(row) for row in top_lps],
                        "token_texts": token_texts, "text": text, "digest": digest, "finish_reason": finish_reason})
    return decoded


def db_output_ids(url: str, where: str, **params) -> list[tuple[str, int, list[int]]]:
    """(request key, pass, output ids) of the stored outputs matching `where`."""
    return [(o["key"], o["pass"], o["ids"]) for o in db_outputs(url, where, **params)]


def db_query(url: str, sql: str, **params) -> list[tuple]:
    """Rows of one read-only query on either backend."""
    engine = _engine(url)
    try:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.execute(text(sql), params)]
    finally:
        engine.dispose()


def db_runs(url: str) -> list[tuple]:
    return db_query(url, "select id, kind, status, verdict from runs order by id")


def db_baselines(url: str) -> list[tuple]:
    return db_query(url, "select suite_name, run_id from baselines order by suite_name, hardware_class")


def db_tables(url: str) -> set[str]:
    engine = _engine(url)
    try:
        with engine.connect() as conn:
            return set(inspect(conn).get_table_names())
    finally:
        engine.dispose()


def write_suite(directory: Path, model: Path, prompts: list[str] | list[dict], *, dtype: str = "float32",
                max_tokens: int = 16, concurrency=(1, 4, 16), shuffles: int = 1, extra_engine: str = "",
                name: str = "test", database: str = SQLITE_IN_SUITE_DIR, kind: str = "vllm",
                hot_pass: bool = True, extra_schedule: str = "", batch_invariant: bool = False) -> Path:
    """A suite file plus its prompts file in `directory`; the model is referenced by absolute path; the
    store is `database` (the store_url fixture), by default evalgate.sqlite next to the suite file.
    `batch_invariant` is false unless asked for: most tests hold evalgate to what plain vLLM does on the same
    arrangement, and evalgate's CPU kernels (the product's default) would change what vLLM computes.
    `kind = "fake"`: the fake test engine (evalgate/engines/fake.py), for tests of evalgate's own plumbing."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, p in enumerate(prompts):
        lines.append(json.dumps(p if isinstance(p, dict) else {"id": f"p{i:03d}", "prompt": p}))
    (directory / "prompts.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    suite = directory / "evalgate.toml"
    suite.write_text(f"""
[suite]
name = "{name}"
database = "{database}"
code_paths = ["prompts.jsonl"]

[engine]
kind = "{kind}"
model = "{model}"
dtype = "{dtype}"
max_model_len = 512
enforce_eager = true
seed = 0
batch_invariant = {str(batch_invariant).lower()}
{extra_engine}

[sampling]
max_tokens = {max_tokens}
logprobs = 5

[prompts]
file = "prompts.jsonl"

[schedule]
concurrency = {list(concurrency)}
shuffles = {shuffles}
hot_pass = {str(hot_pass).lower()}
{extra_schedule}
""", encoding="utf-8")
    return suite


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


# --- long prompts for the tiny model ---------------------------------------------------------------------

def variance_prompts(n: int = 48) -> list[str]:
    """The tiny model's long prompts (117-439 of its tokens, longer than vLLM's 128-token CPU cache block).
    What varies on them depends on the CPU (tests/variance.py): tests that need variance ask the survey."""
    from variance import tiny_prompts

    return list(tiny_prompts(n))



# --- the green path, on the fake engine (plumbing) and on vLLM (e2e) ------------------------------------------

GREEN_PROMPTS = [f"Prompt number {i}: the quick brown fox and the {w}" for i, w in
                 enumerate(["dog", "cat", "river", "city", "answer", "model", "colour", "number"] * 3)]


def gate_keys(report: dict, verdict: str = "batch_variance") -> dict[str, set[str]]:
    """Factor -> the requests a report finds varying under it (every factor a request varies under)."""
    found: dict[str, set[str]] = {}
    for r in report["requests"]:
        if r["verdict"] == verdict:
            for factor in r["passes"]["factors"]:
                found.setdefault(factor, set()).add(r["key"])
    return found


def assert_sqlite_beside_suite(store_backend: str, suite, db: str) -> None:
    """On SQLite, the relative `sqlite:///evalgate.sqlite` is the file next to the suite file."""
    if store_backend == "sqlite":
        assert sqlite_file(db) == suite.parent / "evalgate.sqlite" and sqlite_file(db).is_file()


def green_path(cli, tmp_path, model, store_url, store_backend, kind):
    """Create, check, list, show, diff and accept on quiet prompts: every request stable, every pass stored."""
    suite = write_suite(tmp_path / "ws", model, GREEN_PROMPTS, concurrency=(1, 4, 16), shuffles=1,
                        database=store_url, kind=kind, max_tokens=8, batch_invariant=True)
    created = cli("baseline", "create", suite, "--json-report", tmp_path / "create.json", check=0)
    report = read_json(tmp_path / "create.json")
    assert report["counts"]["stable"] == len(GREEN_PROMPTS)
    assert report["promoted"] is True
    # batch invariance requested (the default): on CPU evalgate's kernels are in force; the fake engine has none
    assert ("in force (evalgate CPU kernels" if kind == "vllm" else "NOT in force") in created.stdout

    checked = cli("check", suite, "--json-report", tmp_path / "check.json", check=0)
    report = read_json(tmp_path / "check.json")
    assert report["schema"] == "evalgate.report/1"
    assert report["status"] == "pass" and report["exit_code"] == 0
    assert report["counts"]["stable"] == len(GREEN_PROMPTS)
    assert report["changed_components"] == []
    assert report["requests"] == []
    assert report["batch_invariance"] == (
        {"requested": True, "in_force": True, "reason": "", "kernels": KERNELS} if kind == "vllm" else
        {"requested": True, "in_force": False, "reason": "the fake test engine has no batch-invariant kernels"})
    assert "PASS" in checked.stdout
    if kind == "vllm":  # prompts shorter than one 128-token CPU cache block: the hot pass can hit nothing
        assert report["cache_hits"] == [{"pass": 1, "hit": 0, "missed": len(GREEN_PROMPTS), "unknown": 0}]
        out = " ".join(checked.stdout.split())
        assert "hot pass 1: 0 of 24 requests were served from the prefix cache" in out
        assert "not exercised: prefix cache cold→hot" in out and "invariant under: batch size 1→4" in out

    db = database_url(suite)
    assert_sqlite_beside_suite(store_backend, suite, db)
    assert db_runs(db) == [(1, "baseline", "complete", "pass"), (2, "check", "complete", "pass")]
    # every request at every pass: 3 concurrency levels, the hot pass (1) and a shuffled pass
    per_pass = db_query(db, "select pass_index, concurrency, count(*), max(position) from outputs "
                            "where run_id = 2 group by pass_index, concurrency order by pass_index")
    assert per_pass == [(0, 1, 24, 0), (1, 1, 24, 0), (2, 4, 24, 3), (3, 16, 24, 15), (4, 16, 24, 15)]

    listed = cli("runs", "list", "--suite", suite, check=0)
    assert "baseline" in listed.stdout and "check" in listed.stdout
    shown = cli("runs", "show", "2", "--suite", suite, "--json", check=0)
    assert '"status": "complete"' in shown.stdout
    diffed = cli("diff", "1", "2", "--suite", suite, "--json-report", tmp_path / "diff.json", check=0)
    assert read_json(tmp_path / "diff.json")["counts"]["stable"] == len(GREEN_PROMPTS)
    assert "identity unchanged" in diffed.stdout
    cli("baseline", "accept", "2", "--suite", suite, check=0)
    assert db_baselines(db) == [("test", 2)]
    # the acceptance is recorded on the check's stored report
    accepted = json.loads(cli("runs", "show", "2", "--suite", suite, "--json", check=0).stdout)["report"]
    assert accepted["promoted"] is True and [u["action"] for u in accepted["updates"]] == ["accepted"]


def chromium() -> str:
    """Chromium's executable: a skip where it is not installed, a failure in CI (which installs it)."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")  # Debian's name, then Ubuntu's
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not on PATH: CI must install Debian's `chromium` package for the HTML test")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return exe


def run_chromium(exe: str, profile: Path, url: str, *args: str) -> subprocess.CompletedProcess:
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
           "--enable-logging=stderr", "--v=0", *args, url]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def migration(revision: str):
    """A migration module of migrations/versions/ by its revision (`"0009"`): the encodings it alone knows."""
    import importlib.util

    path = next((Path(__file__).resolve().parents[1] / "migrations" / "versions").glob(f"{revision}_*.py"))
    spec = importlib.util.spec_from_file_location(f"evalgate_migration_{revision}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
