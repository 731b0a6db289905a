"""Configuration: what a run is asked to do. The suite file and its tables (suite, prompts, [load], [gate],
shards) and the schedule of passes, checked when the file loads, before any engine starts."""
