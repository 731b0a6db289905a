"""lm-eval tasks as evalgate suites: `tasks.py` prepares, builds and scores them; `harness.py` is evalgate as
an lm-eval model (it imports lm-eval, and is loaded only for suites that have tasks)."""
