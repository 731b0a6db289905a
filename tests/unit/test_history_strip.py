"""The HTML report's history strip (evalgate/reports/history_strip.py): which runs it shows, in which order
and colour, and that each metric's line puts the highest value on top."""

from __future__ import annotations

from evalgate.reports.history_strip import COLOURS, HISTORY_RUNS, history_strip
from evalgate.store.listing import ReportHeader


def row(run, verdict="pass", counts=None, hardware="A", metrics=None, changed=None):
    return ReportHeader(run=run, finished=None, kind="check", verdict=verdict, counts=counts or {"stable": 4},
                        baseline_run=None, hardware_class=hardware, changed=changed, metrics=metrics)


def metric(value):
    return [{"task": "arith", "metric": "acc", "current": value, "delta": None}]


def test_the_strip_shows_this_class_up_to_this_run_oldest_first():
    rows = [row(9), row(8, hardware="B"), row(7, "regression", {"batch_variance": 1}),
            row(6, counts={"explained_change": 2}, changed=["model"]), row(5)]  # newest first, as listed
    strip = history_strip(rows, 7, "A")
    assert [c.title.split(" ")[1] for c in strip.cells] == ["5", "6", "7"]  # no run 8 (class B), no run 9 (later)
    assert [c.colour for c in strip.cells] == [COLOURS["pass"], COLOURS["explained"], COLOURS["regression"]]
    assert [c.current for c in strip.cells] == [False, False, True]
    assert "changed: model" in strip.cells[1].title
    assert strip.cells[1].x - strip.cells[0].x > 0 and strip.sparks == []


def test_a_metric_line_puts_the_highest_value_on_top_and_skips_runs_without_it():
    rows = [row(4, metrics=metric(0.5)), row(3, metrics=None), row(2, metrics=metric(0.75)), row(1, metrics=metric(0.25))]
    strip = history_strip(rows, 4, "A")
    (spark,) = strip.sparks
    ys = [y for _, y, _ in spark.dots]
    assert len(spark.dots) == 3  # run 3 has no stored metrics
    assert ys[1] < ys[2] < ys[0]  # 0.75 highest (smallest y), then 0.5, then 0.25
    assert spark.high == "0.75" and spark.low == "0.25" and spark.label == "arith acc"
    assert "run 2: arith acc = 0.75" in spark.dots[1][2]


def test_no_strip_without_history_and_at_most_the_last_runs():
    assert history_strip([row(1)], 1, "A") is None
    many = [row(i) for i in range(100, 0, -1)]
    strip = history_strip(many, 100, "A")
    assert strip.runs == HISTORY_RUNS and strip.cells[-1].current and strip.cells[0].title.startswith(f"run {101 - HISTORY_RUNS} ")
