"""Execution: a run in the engine process. The supervised worker, the runner (plan, passes, storage) and
the probes that add targeted passes."""
