"""Processes evalgate supervises: process trees and groups, parent-death signals (who owns a run: owners.py).

psutil does the walking on every OS; the one Linux-only figure is a process's peak RSS (VmHWM), which
psutil does not expose, read from /proc where it exists (the current RSS elsewhere).
"""

from __future__ import annotations

import os
import signal
import sys

import psutil

PR_SET_PDEATHSIG = 1


def set_parent_death_signal(sig: int = signal.SIGTERM) -> bool:
    """Ask Linux to send `sig` to this process when its parent dies (a no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


# --- trees and groups ------------------------------------------------------------------------------------


def tree(pid: int) -> list[psutil.Process]:
    """The process and its live descendants ([] once it is gone)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def peak_rss(pid: int) -> int | None:
    """Peak RSS in bytes of a process and its descendants: the sum of their VmHWM (exact for one process,
    an upper bound for several) where /proc has it, their current RSS elsewhere; None once it is gone."""
    total, found = 0, False
    for process in tree(pid):
        try:
            total += _vmhwm(process.pid) or process.memory_info().rss
            found = True
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total if found else None


def _vmhwm(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def group_members(pgid: int) -> dict[int, int]:
    """{pid: parent pid} of the live processes in a process group (zombies, which an init that does not
    reap could keep forever, do not count)."""
    members = {}
    for process in psutil.process_iter(["ppid", "status"]):
        try:
            if process.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(process.pid) == pgid:
                members[process.pid] = process.info["ppid"]
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


def is_python(pid: int) -> bool:
    """Whether the process runs this interpreter."""
    try:
        return os.path.realpath(psutil.Process(pid).exe()) == os.path.realpath(sys.executable)
    except (psutil.Error, OSError):
        return False


def signal_quietly(pid: int, sig: int, *, group: bool = False) -> None:
    """Send a signal to a process (or its group) that may already be gone."""
    try:
        (os.killpg if group else os.kill)(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
