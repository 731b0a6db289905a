"""Identity that only a real process shows: the runtime libraries a process that imports torch maps
(evalgate/fingerprint.py `runtime_libraries`, part of the vLLM engine's identity)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def test_a_preloaded_openmp_runtime_is_seen_in_a_real_process(tmp_path):
    """A process that imports torch maps torch's libgomp; with the system's preloaded ahead of it, the
    system's is mapped too: another content, another engine identity."""
    system = Path("/usr/lib/x86_64-linux-gnu/libgomp.so.1")
    if not system.is_file():
        pytest.skip("no system libgomp here")
    probe = "import json, torch; from evalgate.fingerprint import runtime_libraries; print(json.dumps(runtime_libraries()))"

    def libraries(**env) -> dict:
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                             env={**os.environ, "EVALGATE_HOME": str(tmp_path), **env})
        return json.loads(out.stdout.splitlines()[-1])

    plain, preloaded = libraries(), libraries(LD_PRELOAD=str(system))
    assert any(name.startswith("libgomp") for name in plain)
    assert preloaded != plain and libraries(LD_PRELOAD=str(system)) == preloaded  # and it is stable
