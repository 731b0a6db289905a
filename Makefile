# Two commands for a fresh machine (README.md): `make demo` and `make test`.
VENV ?= .venv
# torch on 2 cores: one OpenMP thread is much faster and keeps CPU numerics repeatable.
export OMP_NUM_THREADS ?= 1

.PHONY: setup demo test test-fast bench

setup:
	bash scripts/setup.sh

demo: setup
	$(VENV)/bin/evalgate demo --dir evalgate-demo

test: setup
	$(VENV)/bin/python -m pytest -ra

test-fast: setup
	$(VENV)/bin/python -m pytest -ra -m "not e2e"

bench: setup
	$(VENV)/bin/python benchmarks/check_overhead.py
