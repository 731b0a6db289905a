"""What every `evalgate` command pays before it does anything: `evalgate --help`, and `evalgate runs list`
(as a table and as JSON) and `baseline list` on a store with 100 runs, each a whole process timed from the
outside (median of --repeats). Prints measured figures; not a test (tests/e2e/test_cli_start.py and
tests/unit/test_listing.py hold what they import). `benchmarks/before_after.py` runs it on two checkouts
side by side.

    .venv/bin/python benchmarks/cli_start.py [--repeats 7] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def hundred_runs(work: Path) -> Path:
    """A store with 100 complete runs, written (and so migrated) by the evalgate under test."""
    from evalgate.configuration.suite import load_suite
    from evalgate.fingerprint import COMPONENTS, component
    from evalgate.store import Store

    (work / "model").mkdir()
    (work / "model" / "config.json").write_text("{}")
    (work / "prompts.jsonl").write_text('{"id": "a", "prompt": "hello"}\n')
    (work / "evalgate.toml").write_text('[suite]\nname = "start"\n[engine]\nmodel = "model"\n[prompts]\nfile = "prompts.jsonl"\n')
    suite = load_suite(work / "evalgate.toml")
    store = Store(f"sqlite:///{work / 'e.sqlite'}")
    fingerprint = {name: component({"n": name}) for name in COMPONENTS}
    for i in range(100):  # the first a baseline
        run_id = store.create_run(suite, "baseline" if i == 0 else "check", {"passes": []}, fingerprint, {"a": [1]})
        store.finish_run(run_id, status="complete", verdict="pass", exit_code=0, summary={"stable": 1}, promote=i == 0)
    store.database.dispose()
    return work / "e.sqlite"


def timed(args: list[str], cwd: Path, repeats: int) -> float | None:
    """Median wall seconds of `evalgate ARGS` as a fresh process (the console script's own two lines); None
    when this evalgate cannot run the command (an option it does not have yet)."""
    command = [sys.executable, "-c", "from evalgate.cli import main; main()", *args]
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        if subprocess.run(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode != 0:
            return None
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="evalgate-cli-start-"))
    db = hundred_runs(work)
    figures = {"cli: evalgate --help s": timed(["--help"], work, args.repeats),
               "cli: evalgate runs list (100 runs) s": timed(["runs", "list", "--db", str(db), "--limit", "100"], work,
                                                            args.repeats),
               "cli: evalgate runs list --json (100 runs) s": timed(["runs", "list", "--db", str(db), "--limit", "100",
                                                                     "--json"], work, args.repeats),
               "cli: evalgate baseline list s": timed(["baseline", "list", "--db", str(db)], work, args.repeats)}
    figures = {name: value for name, value in figures.items() if value is not None}
    if args.json:
        print(json.dumps(figures))
        return
    print(f"cli start, median of {args.repeats} whole processes; load average {os.getloadavg()[0]:.2f}")
    for name, value in figures.items():
        print(f"  {name:45} {value:>8.3f}")


if __name__ == "__main__":
    main()
