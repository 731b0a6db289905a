"""Shared fixtures (helpers without a fixture are in tests/helpers.py). The tests come in three tiers, by
directory: unit/ (functions and classes, no CLI), plumbing/ (the CLI on the fake engine, in this process:
`inline_cli`) and e2e/ (the real vLLM engine, or a subprocess where only one proves the point: `cli`).
`make test-fast` runs the first two."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# rich fixes a console's width when it is made: the in-process CLI's consoles get the same width as the
# subprocess CLI's (cli_env), so tests read unwrapped lines either way
os.environ["COLUMNS"] = "200"
from helpers import CLI, SQLITE_IN_SUITE_DIR, TEST_ENV, InlineCLI, bare_model, cached_model
from helpers import tokenized_model as tokenized_model_dir

pytest_plugins = ["pg", "variance"]  # tests/pg.py: a throwaway PostgreSQL server when EVALGATE_TEST_POSTGRES=1;
# tests/variance.py: what varies on this machine (the survey) and plain vLLM's findings (the oracle)


@pytest.fixture(scope="session")
def evalgate_home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("evalgate-home")
    return home


@pytest.fixture(scope="session")
def cli_env(evalgate_home) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "OMP_"))}
    env.update(TEST_ENV)
    env["EVALGATE_HOME"] = str(evalgate_home)
    env["VLLM_CACHE_ROOT"] = str(evalgate_home / "vllm-cache")
    env["TORCHINDUCTOR_CACHE_DIR"] = str(evalgate_home / "inductor-cache")
    env["COLUMNS"] = "200"  # rich tables unwrapped, so tests can read them
    return env


@pytest.fixture
def cli(cli_env, tmp_path, request) -> CLI:
    """The real CLI in a subprocess, as a user runs it; on the variance source's environment in a test that uses
    it (tests/variance.py: the planted source's, where no real one varies here)."""
    if "variance_source" in request.fixturenames:
        return CLI({**cli_env, **request.getfixturevalue("variance_source").env}, tmp_path)
    return CLI(cli_env, tmp_path)


@pytest.fixture
def inline_cli(cli_env, tmp_path) -> InlineCLI:
    """The CLI and the engine job in this process: the plumbing tier (fake engine only)."""
    return InlineCLI(cli_env, tmp_path)


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory) -> Path:
    """Built models, shared by every test worker of the session (pytest -n): under the session's common
    temporary root, each built once behind a file lock by whichever worker needs it first."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the workers' basetemps are popen-gwN folders of one root
    path = root / "shared-models"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="session")
def tiny_model(models_dir) -> Path:
    return cached_model(models_dir, "tiny")


@pytest.fixture(scope="session")
def arith_model(models_dir) -> Path:
    """The tiny architecture trained on the example lm-eval task's sums (about 80 s to build)."""
    return cached_model(models_dir, "arith")


@pytest.fixture(scope="session")
def tokenized_model(tmp_path_factory) -> Path:
    """A fake-engine model directory with the tiny preset's real tokenizer, built in a second without torch:
    the fast tiers' model wherever prompt ids or a chat template matter and the weights do not."""
    return tokenized_model_dir(tmp_path_factory.mktemp("tokenized-model"))


@pytest.fixture(scope="session")
def fake_model(tmp_path_factory) -> Path:
    """A bare model directory for the fake engine (no torch, no tokenizer)."""
    return bare_model(tmp_path_factory.mktemp("fake-model"))


# --- the store under test: SQLite and PostgreSQL ------------------------------------------------------------

BACKENDS = ["sqlite", "postgresql"]


@pytest.fixture(scope="module", params=BACKENDS)
def store_backend(request) -> str:
    """Every test that uses a store fixture runs once per backend; the PostgreSQL run is skipped unless
    EVALGATE_TEST_POSTGRES=1 (tests/pg.py), and fails instead in CI when it was asked for but cannot run.
    Module scope, so module-scoped workspaces can share one database per backend."""
    if request.param == "postgresql":
        request.getfixturevalue("pg_server")
    return request.param


def new_database(request, backend: str, sqlite_url: str) -> str:
    """sqlite_url for SQLite; a fresh, empty database for PostgreSQL."""
    if backend == "sqlite":
        return sqlite_url
    return request.getfixturevalue("pg_server").create_database(request.node.name)


@pytest.fixture
def store_url(request, store_backend) -> str:
    """`[suite].database` for this test's suite files (write_suite's `database`): the SQLite file next to
    the suite file, or a fresh PostgreSQL database. database_url(suite) gives the URL to read it back."""
    return new_database(request, store_backend, SQLITE_IN_SUITE_DIR)


@pytest.fixture
def db_url(request, store_backend, tmp_path) -> str:
    """An absolute URL of a new, empty store, to open directly: tmp_path/e.sqlite or a fresh PostgreSQL
    database."""
    return new_database(request, store_backend, f"sqlite:///{tmp_path / 'e.sqlite'}")


# --- what depends on the machine ---------------------------------------------------------------------------

# The e2e tests whose assertions take their expectations from what this CPU varies in (docs/design.md, "Tests
# on any CPU"): those on the session's variance survey, and the modules that survey the machine themselves.
MACHINE_FIXTURES = {"variance_source"}
MACHINE_MODULES = {"test_demo", "test_e2e_init", "test_e2e_hardware"}


# --- order: the longest modules first ----------------------------------------------------------------------

# Measured per-module cost (seconds of one worker; an AMX Xeon, `make test --durations`), longest first, the modules
# of the longest single tests (and the arith model's build, which lm_eval waits for) moved up. Two workers that start
# with the long modules finish together; a long module collected last would leave one worker waiting on it.
LONGEST_FIRST = ("test_e2e_lm_eval", "test_e2e_adapters", "test_e2e_bisect_config", "test_smollm2", "test_e2e_hardware",
                 "test_e2e_server", "test_e2e_cpu_kernels", "test_e2e_traffic", "test_e2e_cost", "test_e2e_gate", "test_e2e_bisect_batch",
                 "test_e2e_faults", "test_e2e_template_date", "test_e2e_bisect_commits", "test_demo", "test_e2e_init",
                 "test_e2e_hub", "test_e2e_schedulers", "test_e2e_unicode_secrets", "test_tinymodel", "test_e2e_errors")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by the markers added here
def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: a module's own order is kept
    for item in items:  # the tier is the directory: `-m "not e2e"` is the fast tier
        item.add_marker(item.path.parent.name)
        if item.path.stem in MACHINE_MODULES or MACHINE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker("machine")  # `make test-isa` reruns these under another instruction-set class
