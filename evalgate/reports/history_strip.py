"""The HTML report's history strip: a suite's last runs on one hardware class at a glance, as inline SVG
(no script, nothing fetched: the page's Content-Security-Policy allows neither).

One square per judged run, oldest on the left, coloured by its verdict (pass; pass with explained changes;
regression), the run the page shows outlined; under it one sparkline per lm-eval metric over the same runs.
Each square and point carries a `<title>` (the browser's tooltip): the run, its verdict counts, what changed,
the metric's value. Built from `store.listing.history_rows` (the reports stored with the runs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .explain import number_text

if TYPE_CHECKING:
    from ..store.listing import ReportHeader

HISTORY_RUNS = 20  # runs shown
CELL = 18  # px per run
SPARK_HEIGHT = 28  # px per metric line
LABEL_WIDTH = 220  # px for a metric's name, left of its line
COLOURS = {"pass": "#2e7d32", "explained": "#f9a825", "regression": "#c62828"}


@dataclass(frozen=True)
class Cell:
    x: int
    colour: str
    title: str
    current: bool


@dataclass(frozen=True)
class Spark:
    label: str
    y: int  # the line's top
    points: str  # the polyline's "x,y x,y ..."
    dots: list[tuple[int, int, str]]  # (x, y, title) per run that has the metric
    low: str
    high: str


@dataclass(frozen=True)
class HistoryStrip:
    width: int
    height: int
    cells: list[Cell]
    sparks: list[Spark] = field(default_factory=list)
    runs: int = 0


def verdict_class(row: ReportHeader) -> str:
    if row.verdict == "regression":
        return "regression"
    return "explained" if row.counts.get("explained_change") else "pass"


def _title(row: ReportHeader) -> str:
    counts = ", ".join(f"{k} {v}" for k, v in row.counts.items())
    changed = f"; changed: {', '.join(row.changed)}" if row.changed else ""
    return f"run {row.run} ({row.kind}, {row.finished or 'unfinished'}): {row.verdict}; {counts}{changed}"


def history_strip(rows: list[ReportHeader], run_id: int, hardware_class: str | None) -> HistoryStrip | None:
    """The strip for the page of `run_id`: the judged runs of its hardware class up to it (rows newest first,
    as `history_rows` returns them). None when there is no history to show (fewer than two runs)."""
    shown = [r for r in rows if r.run <= run_id and r.hardware_class == hardware_class][:HISTORY_RUNS][::-1]
    if len(shown) < 2:
        return None
    cells = [Cell(LABEL_WIDTH + i * CELL, COLOURS[verdict_class(r)], _title(r), r.run == run_id)
             for i, r in enumerate(shown)]
    names = list(dict.fromkeys((m["task"], m["metric"]) for r in shown for m in r.metrics or []))
    sparks = []
    for n, (task, metric) in enumerate(names):
        top = CELL + 8 + n * SPARK_HEIGHT
        values = {i: m["current"] for i, r in enumerate(shown) for m in r.metrics or []
                  if (m["task"], m["metric"]) == (task, metric) and isinstance(m.get("current"), (int, float))}
        if not values:
            continue
        low, high = min(values.values()), max(values.values())
        span = (high - low) or 1.0

        def y(value: float, top: int = top, low: float = low, span: float = span) -> int:
            return round(top + (SPARK_HEIGHT - 8) * (1 - (value - low) / span))  # the highest value on top

        dots = [(LABEL_WIDTH + i * CELL + CELL // 2, y(v), f"run {shown[i].run}: {task} {metric} = {number_text(v)}")
                for i, v in sorted(values.items())]
        sparks.append(Spark(f"{task} {metric}", top, " ".join(f"{x},{y_}" for x, y_, _ in dots), dots,
                            number_text(low), number_text(high)))
    height = CELL + 8 + len(sparks) * SPARK_HEIGHT
    return HistoryStrip(LABEL_WIDTH + len(shown) * CELL + 60, height, cells, sparks, len(shown))
