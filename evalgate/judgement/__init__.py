"""evalgate.judgement."""
