"""The JSON report (schema `evalgate.report/1`, documented in docs/json-report.md)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..verdict import Report


def write_json(report: Report, path: str | Path, extra: dict | None = None) -> None:
    """Write atomically: a CI step never reads half a report."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {**report.to_dict(), **(extra or {})}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(document, indent=2, ensure_ascii=False, allow_nan=True) + "\n", encoding="utf-8")
    tmp.replace(path)
