"""evalgate: a CI gate for LLM serving determinism (batch variance and silent regressions)."""

__version__ = "0.1.0"
