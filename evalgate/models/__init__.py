"""evalgate.models."""
