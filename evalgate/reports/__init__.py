"""Renderings of a Report: terminal (rich), JSON (docs/json-report.md), JUnit XML, GitHub Actions summary and
annotations, and a self-contained HTML token diff (docs/ci.md)."""
