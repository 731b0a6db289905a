"""evalgate: a CI gate for LLM serving determinism (batch variance and silent regressions).

The library's front door; the `evalgate` command wraps the same functions:

    import evalgate

    suite = evalgate.load_suite("evalgate.toml")
    report = evalgate.create_baseline(suite)         # or evalgate.check(suite): a Report
    # on another hardware class: evalgate.check(suite, against=3, adopt=True); report.hardware has the classes
    print(report.status, report.counts)              # "pass", {"stable": 12, "batch_variance": 0, ...}
    store = evalgate.open_store(suite.database)
    # (the history without the model: evalgate.read_suite_header("evalgate.toml").database, [suite] alone)
    diff = evalgate.compare_runs(store, 3, 7)         # judge run 7 against run 3
    report = evalgate.stored_report(store, 7)         # the report stored with run 7, read back whole
    found = evalgate.fuzz("evalgate.toml", budget=600)  # traffic that changes an output, shrunk (FuzzResult)

    from evalgate.survey import survey, machine_table  # what varies here (a run that is never a baseline)
    from evalgate.scaffold import Scaffold, write_scaffold  # `evalgate init`'s files

Names are imported when first used, so `import evalgate` (and `evalgate --help`) stays light.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_FRONT_DOOR = {
    "load_suite": "evalgate.configuration.suite",
    "Suite": "evalgate.configuration.suite",
    "read_suite_header": "evalgate.configuration.suite",
    "create_baseline": "evalgate.gate",
    "check": "evalgate.gate",
    "merge": "evalgate.gate",
    "accept": "evalgate.baselines",
    "adopt_run": "evalgate.baselines",
    "compare_runs": "evalgate.judgement.judging",
    "open_store": "evalgate.store",
    "Store": "evalgate.store",
    "Report": "evalgate.judgement.report",
    "judge_run": "evalgate.judgement.judging",
    "stored_report": "evalgate.judgement.judging",
    "fuzz": "evalgate.bisect.fuzz",
    "load_trace": "evalgate.configuration.trace",
}
__all__ = sorted(_FRONT_DOOR)


def __getattr__(name: str):
    if name in _FRONT_DOOR:
        value = getattr(importlib.import_module(_FRONT_DOOR[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'evalgate' has no attribute {name!r}")
