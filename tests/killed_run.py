"""The evalgate CLI, SIGKILLed at one point of its run: `python killed_run.py WHERE evalgate-args...`.

WHERE is `pass:N` (once the Nth chunk of a pass's outputs is stored), `rescoring` (once the first chunk of a
rescoring is), or `judging` (as judging starts, every output stored). Chunks are 4 outputs here, so a small
suite's pass is stored in several. Run it with $EVALGATE_INLINE_ENGINE=1: the engine then runs in this very
process, and the kill takes the whole run down at once, as a lost node or the OOM killer does, at a point
a test chooses rather than one a timer guesses.
"""

from __future__ import annotations

import os
import signal
import sys

from evalgate.judgement import judging
from evalgate.store import runs


def die(*_args, **_kwargs) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    where = sys.argv.pop(1)
    runs.STORE_EVERY = 4
    add_outputs = runs.RunStore.add_outputs
    chunks = []

    def add_outputs_then_maybe_die(self, run_id, completions):
        add_outputs(self, run_id, completions)
        chunks.append(completions[0].pass_index)
        passes = sum(1 for index in chunks if index >= 0)
        if (where == "rescoring" and chunks[-1] < 0) or where == f"pass:{passes}" and chunks[-1] >= 0:
            die()

    runs.RunStore.add_outputs = add_outputs_then_maybe_die
    if where == "judging":
        judging.judge_stored = die
    from evalgate.cli import main as cli

    cli()


if __name__ == "__main__":
    main()
