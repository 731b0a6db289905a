"""evalgate.lmeval."""
