"""Every benchmark figure before and after, in one run (`make bench`): each benchmark runs on a checkout of
`--before` (by default the landed commit before payload version 2, the judge of distinct passes on
arrays and the light listings) and on this working tree, one after
the other on the same machine, and the figures are printed side by side with their ratio.

The benchmark scripts are this tree's; the evalgate they measure is chosen by PYTHONPATH. A figure whose
benchmark cannot run on an evalgate is shown as "-".

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/before_after.py [--before 9a32b1c] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BEFORE = "9a32b1c"  # the landed head before "the store, last mile" (e7708aa: before outputs were arrays)


def benchmarks(quick: bool) -> list[list[str]]:
    store = ["store_speed.py", "--json"] + (["--requests", "1000"] if quick else [])
    runs = [store, ["cli_start.py", "--json"] + (["--repeats", "3"] if quick else [])]
    if not quick:
        runs += [["check_vs_raw.py", "--json"], ["check_vs_raw.py", "--json", "--prompts", "540", "--repeats", "1"]]
    return runs


def figures(tree: Path, command: list[str]) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    done = subprocess.run([sys.executable, str(HERE / command[0]), *command[1:]], env=env, cwd=tree,
                          capture_output=True, text=True)
    if done.returncode != 0:
        print(f"  ({command[0]} on {tree}: exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]})")
        return {}
    return json.loads(done.stdout.strip().splitlines()[-1])


def cpu() -> str:
    """The CPU model, its widest vector ISA and the core count (figures mean nothing without them)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return f"{platform.machine()}, {os.cpu_count()} cores"
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")),
                 platform.machine())
    isa = "AVX-512" if " avx512f" in info else "AVX2" if " avx2" in info else "no AVX2"
    return f"{model}, {isa}, {os.cpu_count()} cores"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", default=BEFORE, help="the revision to compare with")
    parser.add_argument("--quick", action="store_true", help="the store at 1,000 requests and the CLI start only")
    args = parser.parse_args()
    before = Path(tempfile.mkdtemp(prefix="evalgate-before-")) / "tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(before), args.before], check=True,
                   capture_output=True)
    try:
        print(f"before: {args.before}; after: this working tree; {cpu()}; load average {os.getloadavg()[0]:.2f}")
        print(f"{'figure':58} {'before':>12} {'after':>12} {'after/before':>13}")
        for command in benchmarks(args.quick):
            old, new = figures(before, command), figures(ROOT, command)
            for name in dict.fromkeys([*old, *new]):
                a, b = old.get(name), new.get(name)
                ratio = f"{b / a:12.2f}x" if a and b is not None else f"{'-':>13}"
                print(f"{name:58} {_num(a):>12} {_num(b):>12} {ratio}")
        print(f"load average at the end {os.getloadavg()[0]:.2f} (tok/s: higher is better; seconds, bytes: lower)")
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(before)], capture_output=True)


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 1000 else f"{value:.3f}"


if __name__ == "__main__":
    main()
