"""The engine runs in a supervised child process, one per run.

Why: an engine that crashes (a kernel segfault, the OOM killer, `kill -9`) must not take evalgate with it.
The parent survives, marks the run incomplete and exits 3, so a crash is never reported as a pass or a
regression. It also gives every run a pristine process (vLLM writes per-process variables into os.environ
and keeps global state), and the engine's memory is returned by the process exit instead of a slow
teardown.

Protocol (child -> parent over a queue): ("run", id) once the run row exists; ("progress", done, total,
label, pass_done, pass_total); then exactly one of ("done", result), ("error", exit code, message, fix) or ("interrupted",). An
error crosses the process boundary as plain values and is rebuilt from its exit code
(`errors.error_for_exit_code`), so every EvalgateError subclass keeps its contract exit code.

The engine's own output (vLLM's and torch's log lines, C-level warnings) goes to a log file when one is
given (`engine_log`): the child points its stdout and stderr there before anything is imported.
The child also asks for SIGTERM when its parent dies, so a killed evalgate never leaves an engine running.

`EVALGATE_INLINE_ENGINE=1` runs the job in this process instead: no isolation (a crash takes evalgate
with it), no engine log, the same errors and the same run bookkeeping. It is for debugging and for the
plumbing tests on the fake engine, which then run in milliseconds; never for a gate you rely on.
"""

from __future__ import annotations

import atexit
import functools
import multiprocessing
import os
import queue as queue_module
import signal
import sys
import time
from dataclasses import replace
from itertools import count
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from ..errors import ConfigError, EngineError, EvalgateError, error_for_exit_code, out_of_memory
from ..owners import current_owner
from ..processes import set_parent_death_signal
from ..timings import Timings
from .request import Progress, RunRequest, RunResult
from .runner import execute_suite

if TYPE_CHECKING:
    from ..configuration.suite import Suite

GRACE_SECONDS = 60  # how long an interrupted child may take to mark its run incomplete
INLINE_ENV = "EVALGATE_INLINE_ENGINE"
_log_numbers = count(1)


def execute_in_worker(request: RunRequest, progress: Progress | None = None) -> RunResult:
    """Execute the run request in a child process, with its `env` set there before the engine is imported;
    return its run id (status still `running`) and timings. The run is owned by this process (`runs list`
    calls it abandoned if this process dies before finishing it). The engine's output goes to
    `engine_log_path` unless the request shows it."""
    engine_log = None if request.show_engine_output or inline() else engine_log_path(request.suite, request.kind)
    labels = {**request.labels, "owner": current_owner(),
              "engine_log": str(engine_log) if engine_log is not None else None}
    return call_in_worker(_execute_job, {"request": replace(request, labels=labels)}, url=request.url,
                          progress=progress, env=request.env, engine_log=engine_log)


def engine_log_path(suite: Suite, kind: str) -> Path:
    """Where a run's engine output goes: .evalgate/logs/ beside the suite file, one file per run."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return suite.root / ".evalgate" / "logs" / f"{kind}-{stamp}-{os.getpid()}-{next(_log_numbers)}.log"


def log_tail(path: Path | None, lines: int = 30) -> str:
    """The last lines of an engine log, or "" when there is none."""
    try:
        text = path.read_text(errors="replace") if path is not None else ""
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _execute_job(*, request: RunRequest, progress: Progress, on_run) -> RunResult:
    timings = Timings()
    run_id = execute_suite(request, timings, progress, on_run)
    return RunResult(run_id, timings)


def call_in_worker(job, kwargs: dict, *, url: str | None = None, progress: Progress | None = None,
                   env: Mapping[str, str | None] | None = None, engine_log: Path | None = None):
    """Call the module-level function `job(**kwargs, progress=, on_run=)` in a fresh child process and
    return its (picklable) result. A run the job announces through `on_run(run_id)` is marked incomplete
    in `url`'s store if the job fails or is interrupted. An error raised here carries `engine_log`."""
    if inline():
        return _call_inline(job, kwargs, url=url, progress=progress, env=env)
    _reap_at_exit()
    ctx = multiprocessing.get_context("spawn")
    messages = ctx.Queue()
    child = ctx.Process(target=_child_main, args=(job, kwargs, messages, env, engine_log), name="evalgate-engine")
    child.start()
    run_id: int | None = None
    try:
        while True:
            try:
                message = messages.get(timeout=0.5)
            except queue_module.Empty:
                if child.is_alive():
                    continue
                try:  # the child may have written its last words just before exiting
                    message = messages.get(timeout=1)
                except queue_module.Empty:
                    raise EngineError(f"the engine process died ({_exit_reason(child.exitcode)}) without "
                                      "finishing the run; the run is stored as incomplete") from None
            tag = message[0]
            if tag == "run":
                run_id = message[1]
            elif tag == "progress" and progress:
                progress(*message[1:])
            elif tag == "done":
                child.join()
                if engine_log is not None and engine_log.is_file() and not engine_log.stat().st_size:
                    engine_log.unlink()  # nothing to read: leave no empty file behind
                return message[1]
            elif tag == "interrupted":
                raise KeyboardInterrupt
            elif tag == "error":
                _, exit_code, text, fix = message
                raise error_for_exit_code(exit_code, text, fix)
    except BaseException as exc:
        _stop(child)
        if isinstance(exc, ConfigError) and engine_log is not None:
            engine_log.unlink(missing_ok=True)  # bad input leaves nothing behind; the message says it all
        else:
            exc.engine_log = engine_log  # the CLI shows its tail
        if run_id is not None and url is not None:
            from ..store import open_store

            status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
            open_store(url).mark_incomplete(run_id, status, str(exc) or status)
            exc.unfinished_run = run_id  # kept with what it stored (a baseline's or check's: `--resume`)
        raise


def reap_resource_tracker() -> None:
    """Stop multiprocessing's resource tracker and wait for it, before this process exits. Spawning the engine
    process starts the tracker as a child of this one; left alone, it ends just after evalgate does and
    stays a zombie until whoever adopts it reaps it (a CI runner, a timing harness). Registered at exit."""
    from multiprocessing import resource_tracker

    stop = getattr(resource_tracker._resource_tracker, "_stop", None)  # CPython's own, since 3.8
    if stop is not None:
        try:
            stop()
        except Exception:  # never let the clean-up turn a verdict into an error
            pass


@functools.cache
def _reap_at_exit() -> None:
    atexit.register(reap_resource_tracker)


def inline() -> bool:
    """Whether jobs run in this process ($EVALGATE_INLINE_ENGINE=1: debugging, plumbing tests)."""
    return os.environ.get(INLINE_ENV, "") not in ("", "0")


def _call_inline(job, kwargs: dict, *, url: str | None, progress: Progress | None,
                 env: Mapping[str, str | None] | None):
    """`call_in_worker` without the child: the job's variables are set for its duration only."""
    saved = {name: os.environ.get(name) for name in env or {}}
    run_ids: list[int] = []
    try:
        _apply_env(env)
        return job(**kwargs, progress=progress or (lambda *_: None), on_run=run_ids.append)
    except BaseException as exc:
        if run_ids and url is not None:
            from ..store import open_store

            status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
            open_store(url).mark_incomplete(run_ids[-1], status, str(exc) or status)
            exc.unfinished_run = run_ids[-1]
        if isinstance(exc, (EvalgateError, KeyboardInterrupt)):
            raise
        error = _engine_failure(exc)  # as the child reports it
        error.unfinished_run = getattr(exc, "unfinished_run", None)
        raise error from exc
    finally:
        _apply_env(saved)


def _engine_failure(exc: BaseException) -> EngineError:
    """An unexpected error of the engine's job, as evalgate reports it: an engine failure (exit 3). A MemoryError's
    own message is empty, so it says what happened and the fix."""
    return out_of_memory() if isinstance(exc, MemoryError) else EngineError(f"{type(exc).__name__}: {exc}")


def _apply_env(env: Mapping[str, str | None] | None) -> None:
    for name, value in (env or {}).items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _stop(child) -> None:
    """Ask the child to stop (SIGTERM: it marks its run incomplete), wait a while, then make sure."""
    if child.is_alive():
        child.terminate()
        child.join(GRACE_SECONDS)
    if child.is_alive():
        child.kill()
        child.join()


def _exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def _child_main(job, kwargs: dict, messages, env: Mapping[str, str | None] | None = None,
                engine_log: Path | None = None) -> None:
    set_parent_death_signal()  # SIGTERM, handled below like a cancel: the run is marked interrupted
    if engine_log is not None:
        _redirect_output(engine_log)
    _apply_env(env)

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    # Only the parent decides to stop (it forwards SIGTERM): a terminal's Ctrl-C reaches the whole process
    # group, and a second interrupt here could cut the child's own clean-up short.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, interrupt)
    outcome, code = ("interrupted",), 130
    try:
        result = job(**kwargs, progress=lambda *figures: messages.put(("progress", *figures)),
                     on_run=lambda run_id: messages.put(("run", run_id)))
        outcome, code = ("done", result), 0
    except KeyboardInterrupt:
        pass
    except EvalgateError as exc:
        outcome, code = ("error", int(exc.exit_code), exc.message, exc.fix), 1
    except BaseException as exc:  # anything else from the engine is an infrastructure error
        error = _engine_failure(exc)
        outcome, code = ("error", int(error.exit_code), error.message, error.fix), 1
    finally:
        # The outcome is decided, and the parent SIGTERMs a child that reported an error: stop listening before
        # sending it. An interrupt from then on would land in the clean-up (a traceback in the engine log's
        # tail) or in the queue's flush (its lock held: this process's exit hangs for GRACE_SECONDS).
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        messages.put(outcome)
        messages.close()
        messages.join_thread()
    # Exit without the interpreter's teardown of torch's and vLLM's module graph (seconds per run, measured
    # 4 s of a 6.6 s exit): the exit handlers still run (a vllm-server engine stops its server there, vLLM
    # its engine-core processes), then the process ends and returns its memory at once.
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _redirect_output(path: Path) -> None:
    """Point this process's stdout and stderr (file descriptors 1 and 2, so C libraries' output too) at
    the engine log, appending."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
