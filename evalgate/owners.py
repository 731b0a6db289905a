"""Who owns a run: the process that records it, and whether it still runs. Below the store (which records
the owner and shows a run whose owner is gone as `abandoned`) and the execution layer (which owns runs):
only the standard library and psutil.
"""

from __future__ import annotations

import os
import socket

import psutil


def current_owner() -> dict:
    """This process as a run's owner: host, pid and start time (a pid alone can be reused)."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": psutil.Process().create_time()}


def owner_alive(owner: dict | None) -> bool | None:
    """Whether the process that owns a run is still running: None when that cannot be told from here
    (no owner recorded, or it runs on another host)."""
    if not owner or owner.get("host") != socket.gethostname() or owner.get("pid") is None:
        return None
    try:
        process = psutil.Process(int(owner["pid"]))
        alive = process.is_running() and process.status() != psutil.STATUS_ZOMBIE
        return alive and abs(process.create_time() - float(owner.get("started") or 0)) < 1.0
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return False
