"""evalgate.configuration."""
