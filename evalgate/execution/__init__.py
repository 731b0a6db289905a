"""evalgate.execution."""
