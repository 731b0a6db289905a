"""lm-eval scores a run from its pass 0 as stored, read back a window at a time (`Store.pass_outputs`), never the
pass held whole: the metrics are the same whatever the window. The example tasks on the fake engine, whose
logprobs follow each request's context, so a perplexity moves if any document gets another's answer."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

from helpers import database_url

from evalgate.store import loaded, open_store

EXAMPLE_TASKS = Path(__file__).resolve().parents[2] / "examples" / "lm_eval" / "tasks"

SUITE = """[suite]
name = "scoring"
database = "sqlite:///scoring.sqlite"
[engine]
kind = "fake"
model = "{model}"
[sampling]
max_tokens = 4
[lm_eval]
include_path = ["tasks"]
tasks = ["evalgate_sentences", "evalgate_capitals"]
[schedule]
concurrency = [1]
shuffles = 0
"""


def scored(inline_cli, ws: Path, model: Path) -> tuple[dict, list[tuple]]:
    """A baseline of the example tasks: (task metric -> value, every per-document value)."""
    shutil.copytree(EXAMPLE_TASKS, ws / "tasks")
    suite = ws / "evalgate.toml"
    suite.write_text(SUITE.format(model=model), encoding="utf-8")
    inline_cli("baseline", "create", suite, check=0)
    scores, samples = open_store(database_url(suite)).load_scores(1)
    return ({(s.task, s.metric): s.value for s in scores},
            sorted((s.task, s.doc_id, s.metric, s.value) for s in samples))


def test_lm_eval_scores_pass_zero_read_a_window_at_a_time_as_if_read_whole(inline_cli, tmp_path, tokenized_model,
                                                                           monkeypatch):
    whole = scored(inline_cli, tmp_path / "whole", tokenized_model)  # the example tasks fit one window
    reads = []
    read = loaded.read_completions

    def counted(store, run_id, pass_index, keys, *args, **kwargs):
        reads.append(math.inf if keys is None else len(keys))  # None: the whole pass
        return read(store, run_id, pass_index, keys, *args, **kwargs)

    monkeypatch.setattr(loaded, "CHUNK", 2)  # every lookup past the last window reads two requests anew
    monkeypatch.setattr(loaded, "read_completions", counted)
    windowed = scored(inline_cli, tmp_path / "windowed", tokenized_model)
    metrics, samples = whole
    assert windowed == whole
    assert {"word_perplexity,none", "bits_per_byte,none", "acc,none"} <= {metric for _, metric in metrics}
    assert len({value for (task, _), value in metrics.items() if task == "evalgate_sentences"}) > 1 and samples
    assert reads and max(reads) <= 2  # what scoring read of pass 0: two requests at a time
