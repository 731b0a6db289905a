# Two commands for a fresh machine (README.md): `make demo` and `make test`.
VENV ?= .venv
# torch on 2 cores: one OpenMP thread is much faster and keeps CPU numerics repeatable.
export OMP_NUM_THREADS ?= 1

.PHONY: setup demo test test-fast test-isa lint bench

setup:
	bash scripts/setup.sh

demo: setup
	$(VENV)/bin/evalgate demo --dir evalgate-demo

# Two workers: each engine runs on one OpenMP thread, so two test workers use both cores of a small machine;
# worksteal: an idle worker takes queued tests from a busy one (the long end-to-end tests would otherwise
# leave one worker idle while the other works through its queue).
PYTEST_WORKERS ?= 2

test: setup
	$(VENV)/bin/python -m pytest -ra -n $(PYTEST_WORKERS) --dist worksteal --durations=40

# The unit and plumbing tiers (tests/unit, tests/plumbing: the CLI on the fake engine in this process), in
# under a minute; tests/e2e (real vLLM, subprocesses) runs in `make test`.
test-fast: setup
	$(VENV)/bin/python -m pytest -ra -n $(PYTEST_WORKERS) -m "not e2e"

# Another CPU's numerics on this one: the machine-dependent e2e tests (marker `machine`: tests/conftest.py) under
# the lowest instruction-set class this CPU emulates (scripts/lowest_isa.py prints it), so a test that holds only
# where this CPU varies is seen before a CI runner of another kind sees it. Run it and `make test` before a submission.
test-isa: setup
	caps="$$($(VENV)/bin/python scripts/lowest_isa.py)" && echo "make test-isa: $$caps" && \
	env $$caps $(VENV)/bin/python -m pytest -ra -n $(PYTEST_WORKERS) --dist worksteal --durations=15 -m machine

lint: setup
	$(VENV)/bin/ruff check .

# Every figure before and after, in one run (benchmarks/before_after.py): the store's write, load+judge and
# size, the CLI's start, and `evalgate check` against raw vLLM doing the same passes (the suite and one 10x
# larger), on the landed commit before arrays and on this tree. Then the rotating preset's findings and
# engine time against the full schedule's (two schedules of this tree, side by side). Then fuzz: the planted
# fault over 20 seeds, trials per engine-minute on vLLM, and the search where this machine varies. Then what a
# baseline that travels costs: its rescoring, and a cross-hardware check against a same-class one.
bench: setup
	$(VENV)/bin/python benchmarks/before_after.py
	$(VENV)/bin/python benchmarks/rotation_speed.py --rotation 8 16
	$(VENV)/bin/python benchmarks/fuzz_speed.py
	$(VENV)/bin/python benchmarks/hardware_cost.py
