"""Renderings of a Report: terminal (rich) and JSON (docs/json-report.md)."""
