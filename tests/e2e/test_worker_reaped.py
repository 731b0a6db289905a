"""Nothing of an evalgate run outlives it: after `evalgate check` exits, no process it started is left, not
even as a zombie (the engine process, and multiprocessing's resource tracker that spawning it starts).
Only a process that adopts orphans can see one, so the test makes itself a child subreaper (Linux)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import time

import pytest
from helpers import write_suite

PR_SET_CHILD_SUBREAPER = 36

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="child subreapers are Linux's")


def adopted_children() -> list[tuple[int, str]]:
    """This process's children: (pid, state), Z for a zombie."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = open(f"/proc/{name}/stat").read()
            except OSError:
                continue
            state, parent = stat.rsplit(")", 1)[1].split()[:2]
            if int(parent) == os.getpid():
                found.append((int(name), state))
    return found


def test_no_process_of_a_check_is_left_after_it_exits(cli_env, tmp_path, fake_model):
    suite = write_suite(tmp_path / "ws", fake_model, ["one", "two", "three"], kind="fake", concurrency=(1, 3))
    env = {k: v for k, v in cli_env.items() if k != "EVALGATE_INLINE_ENGINE"}  # a real engine process
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    before = set(adopted_children())  # the test process's own (a database server of the session, say)
    try:
        for command in (["baseline", "create"], ["check"]):
            done = subprocess.run([sys.executable, "-m", "evalgate", *command, str(suite)], env=env, cwd=tmp_path,
                                  capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, done.stderr
            time.sleep(0.2)  # what exits with evalgate has had time to
            assert set(adopted_children()) - before == set(), command
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        for pid, state in set(adopted_children()) - before:  # never leave a zombie in the test process either
            if state == "Z":
                os.waitpid(pid, os.WNOHANG)
