"""pytest plugin (entry point `pytest11`): `pytest --evalgate SUITE` turns every request into a test.

The suite runs once (`evalgate check` against its baseline) in the setup of its first test; each request
is then a test item named by its request key that fails with its token diff. Engine, infrastructure and
"no baseline" problems happen in setup, so pytest reports them as errors, not failures. pytest's own
`--junitxml` and the user's existing CI then gate on it. Does nothing unless `--evalgate` is given.

lm-eval requests exist only once lm-eval builds them (in the run), so an lm-eval task is one test item
named `lm_eval:TASK` that fails with the diffs of its failing requests (a group or tag name covers the
requests of tasks not named themselves).
"""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_addoption(parser):
    group = parser.getgroup("evalgate", "LLM serving determinism gate")
    group.addoption("--evalgate", action="append", default=[], metavar="SUITE",
                    help="run this evalgate suite file as tests (one per request); repeatable")
    group.addoption("--evalgate-strict", action="store_true", default=False,
                    help="explained changes and new/missing requests fail too")
    group.addoption("--evalgate-db", default=None, metavar="URL", help="database URL (overrides the suite's)")
    group.addoption("--evalgate-concurrency", default=None, metavar="LEVELS",
                    help="override the schedule's concurrency levels, e.g. 1,16")


def pytest_collection_modifyitems(session, config, items):
    from .configuration.schedule import concurrency_levels
    from .errors import EvalgateError

    try:
        concurrency_levels(config.getoption("evalgate_concurrency"), "--evalgate-concurrency")
    except EvalgateError as exc:
        raise pytest.UsageError(str(exc)) from None
    for suite_file in config.getoption("evalgate"):
        try:
            items.extend(SuiteCollector.from_parent(session, path=Path(suite_file).resolve()).collect())
        except EvalgateError as exc:  # a suite that does not load is the user's input: pytest's usage error
            raise pytest.UsageError(f"--evalgate {suite_file}: {exc}") from None


class SuiteCollector(pytest.File):
    """The request keys of a suite file (loading it needs no engine)."""

    def collect(self):
        from .configuration.suite import load_suite

        suite = load_suite(self.path, database=self.config.getoption("evalgate_db"))
        self.session_run = SuiteRun(suite, self.config)
        for prompt in suite.prompts:
            yield RequestItem.from_parent(self, name=prompt.key, run=self.session_run)
        named = set(suite.lm_eval.tasks) if suite.lm_eval else set()
        for task in sorted(named):
            yield TaskItem.from_parent(self, name=f"lm_eval:{task}", run=self.session_run, task=task, named=named)


class SuiteRun:
    """Runs the suite once, on first use, and remembers the report (or the error)."""

    def __init__(self, suite, config):
        self.suite, self.config = suite, config
        self.report = None
        self.error: BaseException | None = None

    def get(self):
        if self.report is None and self.error is None:
            from . import gate
            from .configuration.schedule import concurrency_levels, with_overrides

            try:
                levels = concurrency_levels(self.config.getoption("evalgate_concurrency"), "--evalgate-concurrency")
                schedule = with_overrides(self.suite.schedule, levels, where=str(self.suite.path))
                self.report = gate.check(self.suite, schedule=schedule,
                                         strict=self.config.getoption("evalgate_strict"))
            except Exception as exc:  # reported as a pytest error on every request of the suite
                self.error = exc
        if self.error is not None:
            raise EvalgateRunError(str(self.error)) from None
        return self.report


class EvalgateRunError(Exception):
    """The suite could not be run (engine, infrastructure, configuration, no baseline)."""


class RequestRegression(Exception):
    """A request whose verdict is a failure: the message is its token diff."""


class RequestItem(pytest.Item):
    def __init__(self, *, run: SuiteRun, **kwargs):
        super().__init__(**kwargs)
        self.run = run

    def setup(self):
        self.report = self.run.get()  # errors here are pytest errors, not failures

    def runtest(self):
        verdict = next((v for v in self.report.verdicts if v.key == self.name), None)
        if verdict is not None and verdict in self.report.failing:
            raise RequestRegression(describe(verdict))
        if verdict is not None and verdict.verdict != "stable":
            self.add_report_section("call", "evalgate", describe(verdict))

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, (RequestRegression, EvalgateRunError)):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, f"evalgate request {self.name}"


class TaskItem(RequestItem):
    """All requests of one lm-eval task (keys `task/doc/idx/repeat`)."""

    def __init__(self, *, task: str, named: set[str], **kwargs):
        super().__init__(**kwargs)
        self.task, self.named = task, named

    def _mine(self, key: str) -> bool:
        prefix = key.split("/", 1)[0] if key.count("/") >= 3 else None
        if prefix is None:  # a plain prompt
            return False
        return prefix == self.task or (prefix not in self.named and self.task not in self._tasks_seen())

    def _tasks_seen(self) -> set[str]:
        return {v.key.split("/", 1)[0] for v in self.report.verdicts if v.key.count("/") >= 3}

    def runtest(self):
        mine = [v for v in self.report.verdicts if self._mine(v.key)]
        failing = [v for v in mine if v in self.report.failing]
        if failing:
            raise RequestRegression(f"{len(failing)} of {len(mine)} request(s) of lm-eval task {self.task} failed\n\n"
                                    + "\n\n".join(describe(v) for v in failing[:20]))
        changed = [v for v in mine if v.verdict != "stable"]
        if changed:
            self.add_report_section("call", "evalgate", "\n\n".join(describe(v) for v in changed[:20]))

    def reportinfo(self):
        return self.path, None, f"evalgate lm-eval task {self.task}"


def describe(verdict) -> str:
    from .reports.explain import failure_text

    return f"{verdict.key}: {verdict.verdict}\n" + failure_text(verdict)
