"""A leaderboard-sized suite on the fake engine: evalgate's own cost as the suite grows (issue: 250k requests,
memory flat in suite size). For each size, `evalgate baseline create` of a suite of that many plain prompts
(the default schedule: concurrency 1 and 8, one shuffle, the hot pass, then the rescoring; 32 tokens each) in
a fresh workspace, as a user runs it. Prints its wall time, the peak RSS of its largest process and of each
(the CLI, which judges; the engine child, which runs the passes: sampled every 0.2 s with psutil), and the
database's size, then the ratio of the largest size to 10k. Measured figures; not a test.

`--across` also runs `evalgate check` of the same suite on another hardware class (an instruction-set cap,
`ONEDNN_MAX_CPU_ISA=SSE41`, is one on any machine): the heaviest judgement there is, since it rescores the
baseline's tokens and its own, and judges across the classes with an envelope over every token.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/suite_scale.py [--sizes 1000,10000,50000,250000] [--across] [--json]

`PYTHONPATH=<another checkout>` measures that evalgate instead (the benchmark is this tree's).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

SUITE = """[suite]
name = "scale"
database = "sqlite:///scale.sqlite"
[engine]
kind = "fake"
model = "model"
[sampling]
max_tokens = 32
[prompts]
file = "prompts.jsonl"
[schedule]
concurrency = [1, 8]
shuffles = 1
"""


def workspace(root: Path, size: int) -> Path:
    (root / "model").mkdir(parents=True)
    (root / "model" / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "vocab_size": 256}))
    (root / "model" / "model.safetensors").write_bytes(os.urandom(4096))
    with (root / "prompts.jsonl").open("w") as f:
        for i in range(size):
            f.write(json.dumps({"id": f"q{i:06d}", "prompt": f"Question {i}: what follows {i * 7 % 1000}?"}) + "\n")
    (root / "evalgate.toml").write_text(SUITE)
    return root / "evalgate.toml"


def measured(args: list[str], ok: tuple[int, ...] = (0,), cwd: Path | None = None, env: dict | None = None) -> dict:
    """`evalgate ARGS` run as a user runs it: its wall time and the peak RSS of the CLI and of the engine child."""
    started, log = time.perf_counter(), tempfile.TemporaryFile("w+")  # a file: a pipe left unread would fill
    proc = subprocess.Popen([sys.executable, "-m", "evalgate", *args], cwd=cwd, env={**os.environ, **(env or {})},
                            stdout=subprocess.DEVNULL, stderr=log, text=True)
    top, peaks = psutil.Process(proc.pid), {"cli": 0, "engine": 0}
    while proc.poll() is None:
        try:
            for role, p in [("cli", top), *(("engine", child) for child in top.children(recursive=True))]:
                try:
                    peaks[role] = max(peaks[role], p.memory_info().rss)
                except psutil.Error:
                    pass
        except psutil.Error:
            pass
        time.sleep(0.2)
    seconds = time.perf_counter() - started
    log.seek(0)
    err = log.read()
    if proc.returncode not in ok:
        raise SystemExit(f"evalgate {' '.join(args)}: exit {proc.returncode}\n{err[-2000:]}")
    return {"exit": proc.returncode, "seconds": seconds, "peak_rss_mb": max(peaks.values()) / 2**20,
            "cli_rss_mb": peaks["cli"] / 2**20, "engine_rss_mb": peaks["engine"] / 2**20}


OTHER_CLASS = {"ONEDNN_MAX_CPU_ISA": "SSE41"}


def measure(size: int, across: bool) -> dict:
    root = Path(tempfile.mkdtemp(prefix=f"evalgate-scale-{size}-"))
    suite = workspace(root, size)
    figures = measured(["baseline", "create", str(suite)])
    database = sum(f.stat().st_size for f in root.glob("scale.sqlite*"))
    row = {"requests": size, **figures, "database_mb": database / 2**20}
    if across:
        row["across"] = measured(["check", str(suite)], ok=(0, 1), env=OTHER_CLASS)
    return row


def table(title: str, rows: list[dict]) -> None:
    print(title)
    print(f"{'requests':>9} {'time s':>8} {'peak RSS MB':>12} {'CLI MB':>7} {'engine MB':>10}"
          + (f" {'database MB':>12}" if "database_mb" in rows[0] else ""))
    for r in rows:
        print(f"{r['requests']:>9,} {r['seconds']:>8.1f} {r['peak_rss_mb']:>12.0f} {r['cli_rss_mb']:>7.0f} "
              f"{r['engine_rss_mb']:>10.0f}" + (f" {r['database_mb']:>12.1f}" if "database_mb" in r else ""))
    base = next((r for r in rows if r["requests"] == 10_000), None)
    if base and rows[-1] is not base:
        last = rows[-1]
        print(f"{last['requests']:,} / 10,000: peak RSS {last['peak_rss_mb'] / base['peak_rss_mb']:.2f}x, "
              f"time {last['seconds'] / base['seconds']:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1000,10000,50000,250000")
    parser.add_argument("--across", action="store_true", help="also a check on another hardware class")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = [measure(int(size), args.across) for size in args.sizes.split(",")]
    if args.json:
        print(json.dumps(rows))
        return
    table("baseline create", rows)
    if args.across:
        table(f"check on another hardware class ({' '.join(f'{k}={v}' for k, v in OTHER_CLASS.items())})",
              [{"requests": r["requests"], **r["across"]} for r in rows])


if __name__ == "__main__":
    main()
