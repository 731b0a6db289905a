"""Errors that map to the exit-code contract (docs/design.md, "Exit codes").

Every failure a user can cause or meet is one of these; the CLI renders the message and exits with
`exit_code`. Anything else escaping a run is treated as an engine/infrastructure error (exit 3).
"""

from enum import IntEnum


class ExitCode(IntEnum):
    PASS = 0
    REGRESSION = 1
    USAGE = 2
    INFRA = 3
    NO_BASELINE = 4


class EvalgateError(Exception):
    exit_code = ExitCode.INFRA

    def __init__(self, message: str, *, fix: str | None = None):
        super().__init__(message)
        self.message = message
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.message}\n  fix: {self.fix}" if self.fix else self.message


class ConfigError(EvalgateError):
    """Bad suite file, prompts file, argument or database: exit 2, nothing written."""

    exit_code = ExitCode.USAGE


class EngineError(EvalgateError):
    """The engine failed to start or crashed mid-run: exit 3, the run is stored as incomplete."""

    exit_code = ExitCode.INFRA


class StoreError(EvalgateError):
    """The database could not be written or read: exit 3."""

    exit_code = ExitCode.INFRA


def out_of_memory() -> EngineError:
    """A MemoryError, as evalgate reports it (its own message is empty). Linux mostly kills a process that runs
    out of memory instead (a killed engine is reported as such); MemoryError comes from an address-space limit
    (`ulimit -v`, some batch schedulers) or one allocation larger than the machine."""
    return EngineError("out of memory (MemoryError)",
                       fix="give the process more memory (its container's or scheduler's limit, `ulimit -v`), "
                           "or run the suite in shards (`--shard 1/4`, docs/usage.md)")


class NoBaselineError(EvalgateError):
    exit_code = ExitCode.NO_BASELINE


class MissingDependency(ConfigError):
    def __init__(self, package: str, extra: str = "cpu", fix: str | None = None):
        super().__init__(
            f"{package} is not installed in this environment",
            fix=fix or f"pip install -e '.[{extra}]' in an evalgate checkout"
                       + (" --extra-index-url https://download.pytorch.org/whl/cpu" if extra == "cpu" else "")
                       + " (or a git URL: README.md \"Install into your own project\")",
        )


def error_for_exit_code(exit_code: int, message: str, fix: str | None = None) -> EvalgateError:
    """An error rebuilt from plain values (one that crossed a process boundary), keeping its exit code."""
    classes = {int(ExitCode.USAGE): ConfigError, int(ExitCode.NO_BASELINE): NoBaselineError}
    return classes.get(int(exit_code), EngineError)(message, fix=fix)
