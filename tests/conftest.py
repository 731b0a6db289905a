"""Shared fixtures. End-to-end tests run the real `evalgate` CLI (real vLLM CPU engine, locally built
models) in subprocesses, exactly as a user would; models are built once per session."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# torch on 2 cores: one thread is far faster and keeps CPU numerics repeatable between processes.
TEST_ENV = {
    "OMP_NUM_THREADS": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


@pytest.fixture(scope="session")
def evalgate_home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("evalgate-home")
    return home


@pytest.fixture(scope="session")
def cli_env(evalgate_home) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "OMP_"))}
    env.update(TEST_ENV)
    env["EVALGATE_HOME"] = str(evalgate_home)
    env["VLLM_CACHE_ROOT"] = str(evalgate_home / "vllm-cache")
    env["TORCHINDUCTOR_CACHE_DIR"] = str(evalgate_home / "inductor-cache")
    env["COLUMNS"] = "200"  # rich tables unwrapped, so tests can read them
    return env


class CLI:
    def __init__(self, env: dict[str, str], cwd: Path):
        self.env, self.cwd = env, cwd

    def __call__(self, *args: str, timeout: float = 900, check: int | None = None) -> subprocess.CompletedProcess:
        proc = subprocess.run([sys.executable, "-m", "evalgate", *map(str, args)], cwd=self.cwd, env=self.env,
                              capture_output=True, text=True, timeout=timeout)
        if check is not None and proc.returncode != check:
            raise AssertionError(f"evalgate {' '.join(map(str, args))} exited {proc.returncode}, expected {check}\n"
                                 f"--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-6000:]}")
        return proc

    def popen(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "evalgate", *map(str, args)], cwd=self.cwd, env=self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture
def cli(cli_env, tmp_path) -> CLI:
    return CLI(cli_env, tmp_path)


def _build(preset: str, seed: int, home: Path) -> Path:
    out = home / "models" / f"{preset}-{seed}"
    if not (out / "config.json").exists():
        env = dict(os.environ, OMP_NUM_THREADS="1")
        subprocess.run([sys.executable, "-m", "evalgate", "build-model", str(out), "--preset", preset, "--seed",
                        str(seed)], check=True, env=env, capture_output=True)
    return out


@pytest.fixture(scope="session")
def tiny_model(evalgate_home) -> Path:
    return _build("tiny", 0, evalgate_home)


@pytest.fixture(scope="session")
def small_model(evalgate_home) -> Path:
    return _build("small", 0, evalgate_home)


def write_suite(directory: Path, model: Path, prompts: list[str] | list[dict], *, dtype: str = "float32",
                max_tokens: int = 16, concurrency=(1, 4, 16), shuffles: int = 1, extra_engine: str = "",
                name: str = "test") -> Path:
    """A suite file plus its prompts file in `directory`; the model is referenced by absolute path."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, p in enumerate(prompts):
        lines.append(json.dumps(p if isinstance(p, dict) else {"id": f"p{i:03d}", "prompt": p}))
    (directory / "prompts.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    suite = directory / "evalgate.toml"
    suite.write_text(f"""
[suite]
name = "{name}"
database = "sqlite:///evalgate.sqlite"
code_paths = ["prompts.jsonl"]

[engine]
model = "{model}"
dtype = "{dtype}"
max_model_len = 512
enforce_eager = true
seed = 0
{extra_engine}

[sampling]
max_tokens = {max_tokens}
logprobs = 5

[prompts]
file = "prompts.jsonl"

[schedule]
concurrency = {list(concurrency)}
shuffles = {shuffles}
""", encoding="utf-8")
    return suite


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))
