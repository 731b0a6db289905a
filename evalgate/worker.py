"""The engine runs in a supervised child process, one per run.

Why: an engine that crashes (a kernel segfault, the OOM killer, `kill -9`) must not take evalgate with it.
The parent survives, marks the run incomplete and exits 3, so a crash is never reported as a pass or a
regression. It also gives every run a pristine process (vLLM writes per-process variables into os.environ
and keeps global state), and the engine's memory is returned by the process exit instead of a slow
teardown.

Protocol (child -> parent over a queue): ("run", id) once the run row exists; ("progress", done, total,
label); then exactly one of ("done", result), ("error", class name, message, fix) or ("interrupted",).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import queue as queue_module
import signal

from . import errors
from .errors import EngineError, EvalgateError
from .runner import Progress, Timings, run_suite
from .suite import Schedule, Suite

GRACE_SECONDS = 60  # how long an interrupted child may take to mark its run incomplete


def run_in_worker(suite: Suite, url: str, *, kind: str, schedule: Schedule, timings: Timings,
                  progress: Progress | None = None, labels: dict | None = None,
                  env: dict[str, str | None] | None = None, keys: tuple[str, ...] | None = None) -> int:
    """Execute the suite in a child process; return the run id (status still `running`). `env`: variables
    set in the child's environment only (None unsets one), before the engine is imported (e.g. per
    `evalgate cost` candidate or bisect trial). `keys`: run only these requests (bisect trials)."""
    result = call_in_worker(_run_suite_job, dict(suite=suite, url=url, kind=kind, schedule=schedule,
                                                 labels=labels, keys=keys), url=url, progress=progress, env=env)
    timings.update(result["timings"])
    return result["run_id"]


def _run_suite_job(*, suite, url, kind, schedule, labels, keys, progress, on_run) -> dict:
    timings = Timings()
    run_id = run_suite(suite, url, kind=kind, schedule=schedule, timings=timings, progress=progress,
                       on_run=on_run, labels=labels, keys=keys)
    return {"run_id": run_id, "timings": dict(timings)}


def call_in_worker(job, kwargs: dict, *, url: str | None = None, progress: Progress | None = None,
                   env: dict[str, str | None] | None = None):
    """Call the module-level function `job(**kwargs, progress=, on_run=)` in a fresh child process and
    return its (picklable) result. A run the job announces through `on_run(run_id)` is marked incomplete
    in `url`'s store if the job fails or is interrupted."""
    ctx = multiprocessing.get_context("spawn")
    messages = ctx.Queue()
    child = ctx.Process(target=_child_main, args=(job, kwargs, messages, env), name="evalgate-engine")
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
                return message[1]
            elif tag == "interrupted":
                raise KeyboardInterrupt
            elif tag == "error":
                _, name, text, fix = message
                error_class = getattr(errors, name, EngineError)
                raise error_class(text, fix=fix)
    except BaseException as exc:
        _stop(child)
        if run_id is not None and url is not None:
            from .store import open_store

            status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
            open_store(url).mark_incomplete(run_id, status, str(exc) or status)
        raise


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


def _child_main(job, kwargs: dict, messages, env: dict[str, str | None] | None = None) -> None:
    for name, value in (env or {}).items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    # Only the parent decides to stop (it forwards SIGTERM): a terminal's Ctrl-C reaches the whole process
    # group, and a second interrupt here could cut the child's own clean-up short.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, interrupt)
    code = 0
    try:
        result = job(**kwargs, progress=lambda done, total, label: messages.put(("progress", done, total, label)),
                     on_run=lambda run_id: messages.put(("run", run_id)))
        messages.put(("done", result))
    except KeyboardInterrupt:
        messages.put(("interrupted",))
        code = 130
    except EvalgateError as exc:
        messages.put(("error", type(exc).__name__, exc.message, exc.fix))
        code = 1
    except BaseException as exc:  # anything else from the engine is an infrastructure error
        messages.put(("error", "EngineError", f"{type(exc).__name__}: {exc}", None))
        code = 1
    finally:
        # The outcome is sent, and the parent SIGTERMs a child that reported an error: interrupting the
        # queue's flush here could leave its lock held and hang this process's exit for GRACE_SECONDS.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        messages.close()
        messages.join_thread()
    sys.exit(code)  # no engine teardown: the process exit returns its memory at once
