"""Baselines: which baseline judges a check (its own hardware class's, else the nearest other class's), and
how a run becomes one by hand: accepted (`baseline accept`), or adopted by proof from another class. Both are
recorded on the run's stored report (`updates`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from .codec import to_json
from .configuration.suite import Suite
from .errors import ConfigError, NoBaselineError
from .fingerprint import hardware_component, hardware_label
from .judgement.judging import record_update, stored_report
from .store import OWN_RESCORING, Run, Store


@dataclass(frozen=True)
class BaselineChoice:
    """The baseline a check is judged against: this hardware class's, or (`cross`) another class's."""

    run_id: int
    cross: bool = False


def find_baseline(suite: Suite, store: Store | None, url: str, against: str | int | None = None,
                  here: dict | None = None) -> BaselineChoice:
    """This class's baseline; else, unless `[gate] other_hardware = "refuse"`, the nearest other class's
    (`nearest_baseline`); `against`: a baseline run id or a hardware class (a prefix of its hash), named.
    `here`: the hardware component of the run to judge (default: this machine's)."""
    here = here or hardware_component()
    if against is not None and str(against).strip():
        return named_baseline(suite, store, url, str(against).strip(), here["hash"])
    run_id = store.baseline_for(suite.name, here["hash"]) if store else None
    if run_id is not None:
        return BaselineChoice(run_id)
    others = store.baselines(suite.name) if store else []
    if others and suite.gate.other_hardware != "refuse":
        return BaselineChoice(nearest_baseline(store, others, here), cross=True)
    hint = ""
    if others:
        hint = (f" (baselines exist for {len(others)} other hardware class(es), and [gate] other_hardware = "
                "\"refuse\" keeps a check to its own class)")
    raise NoBaselineError(
        f"no baseline for suite {suite.name!r} on this hardware ({hardware_label(here)}) in {url}{hint}",
        fix=f"evalgate baseline create {suite.path}",
    )


def nearest_baseline(store: Store, baselines: list, here: dict) -> int:
    """Of several classes' baselines, the nearest to this machine: the same platform (architecture, GPU or
    not), then the same GPU capability or CPU instruction-set family, then the same model; the newest first."""
    def kinship(baseline) -> tuple:
        theirs = store.fingerprint_of(baseline.run_id).part("hardware")
        mine = here["data"]
        gpus = [sorted(tuple(g.get("capability") or ()) for g in d.get("gpus") or []) for d in (mine, theirs)]
        return (theirs.get("machine") == mine.get("machine"), bool(gpus[0]) == bool(gpus[1]), gpus[0] == gpus[1],
                theirs.get("isa") == mine.get("isa"), theirs.get("cpu") == mine.get("cpu"), baseline.promoted_at)

    return max(baselines, key=kinship).run_id


def named_baseline(suite: Suite, store: Store | None, url: str, against: str, here: str) -> BaselineChoice:
    """`--against`: the baseline run of that id, or of the one hardware class whose hash starts so."""
    baselines = store.baselines(suite.name) if store else []
    if against.isdigit():
        found = [b for b in baselines if b.run_id == int(against)]
    else:
        found = [b for b in baselines if b.hardware_class.startswith(against.lower())]
    if len(found) != 1:
        listed = ", ".join(f"run {b.run_id} (class {b.hardware_class[:12]})" for b in baselines) or "none"
        raise ConfigError(f"--against {against}: {'no' if not found else 'more than one'} baseline of suite "
                          f"{suite.name!r} in {url} matches", fix=f"name a baseline run or class; the baselines: {listed}")
    return BaselineChoice(found[0].run_id, cross=found[0].hardware_class != here)


def accept(store: Store, run_id: int) -> Run:
    """Promote a complete run to be the baseline of its suite on its hardware class, recorded on its report."""
    run = store.promote(run_id)
    if stored_report(store, run_id) is not None:
        record_update(store, run_id, "accepted", promoted=True)
    return run


def adopt_run(store: Store, run_id: int) -> Run:
    """Make a check judged against another hardware class's baseline, with no confident flip, the baseline
    of its own class, with a receipt: against which run and class, the counts per class, the envelope and
    the tolerances. A check with a confident flip (or any failure) is never adopted. The adoption is recorded
    on the check's stored report."""
    run = store.get_run(run_id)
    report = stored_report(store, run_id) if run.kind == "check" and run.status == "complete" else None
    section = report.hardware if report is not None else None
    if section is None:
        raise ConfigError(f"run {run_id} is not a complete check judged against another hardware class's baseline",
                          fix="adopt a cross-hardware check (see `evalgate runs list`); promote a same-class run "
                              "with `evalgate baseline accept`")
    if not section.adoptable or run.exit_code != 0:
        why = (f"{section.counts['confident']} confident flip(s) across hardware" if not section.adoptable
               else f"its verdict is {run.verdict}")
        raise ConfigError(f"run {run_id} cannot be adopted: {why}", fix="a baseline must be reproducible and agree "
                          "with the other class up to rounding; look at `evalgate report` for the flips")
    receipt = {"adopted_from": run.baseline_run_id, "from_class": section.baseline_class,
               "from_label": section.baseline_label, "label": section.here_label, "counts": section.counts,
               "compared": section.compared, "envelope": section.envelope,
               "tolerance": to_json(section.tolerance), "mode": section.mode,
               "rescored": store.has_outputs(run_id, OWN_RESCORING)}
    adopted = store.promote(run_id, receipt)
    record_update(store, run_id, "adopted", promoted=True, hardware=replace(section, adopted=True))
    return adopted
