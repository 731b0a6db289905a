"""The JSON report (schema `evalgate.report/1`, documented in docs/json-report.md)."""

from __future__ import annotations

import json
from pathlib import Path

from ..atomic import write_text_atomic
from ..judgement.report import Report


def write_json(report: Report, path: str | Path) -> None:
    """Write atomically: a CI step never reads half a report."""
    document = report.to_dict()
    write_text_atomic(path, json.dumps(document, indent=2, ensure_ascii=False, allow_nan=True) + "\n")
