"""The factors a pass can change, one at a time (**contract**: the `factor` of a `batch_variance` verdict).

Each pass of a run differs from its reference pass in exactly one factor (evalgate/configuration/schedule.py),
so a difference between the two is attributed to that factor. For each factor: how people read it, and the
settings that remove it (named in reports, measured by `evalgate cost`). The schedule's own factors are
here; a probe that introduces a factor of its own carries its words and remedy (probes/).
"""

from __future__ import annotations

from functools import cache

from ..configuration.remedy import ONE_SEQUENCE, Remedy
from ..configuration.schedule import RENAMED_FACTORS, Pass
from ..probes import PROBES, get_probe

# factor -> (words, remedy, whether it is about who shared the batch)
SCHEDULE_FACTORS: dict[str, tuple[str, Remedy | None, bool]] = {
    "batch_size": ("batch size", ONE_SEQUENCE, True),
    "order": ("order", ONE_SEQUENCE, True),
    "prefix_cache": ("prefix cache", Remedy("a per-request cache_salt in production, or engine.enable_prefix_caching "
                                            "= false", {"enable_prefix_caching": False}), False),
    "repeat": ("repeat (same condition)",
               Remedy("nothing in the schedule explains it: the engine is nondeterministic (check seed and kernels)"),
               False),
}


@cache
def factor_table() -> dict[str, tuple[str, Remedy | None, bool]]:
    """factor -> (words, remedy, batch factor): the schedule's, then those the registered probes introduce."""
    table = dict(SCHEDULE_FACTORS)
    for name in PROBES.names():
        probe = get_probe(name)
        if probe.words:
            table.setdefault(probe.factor, (probe.words, Remedy.of(probe.remedy), probe.batch_factor))
    return table


def _about(factor: str | None) -> tuple[str, Remedy | None, bool] | None:
    return factor_table().get(RENAMED_FACTORS.get(factor or "", factor or ""))


def words(factor: str | None) -> str:
    about = _about(factor)
    return about[0] if about else "unattributed (recorded before conditions)" if not factor else factor


def remedy(factor: str | None) -> str | None:
    """What removes the factor's effect, for people (None: nothing known)."""
    about = _about(factor)
    return about[1].text if about and about[1] else None


def remedy_settings(factor: str | None) -> dict:
    """The [engine] settings that remove the factor's effect (empty: no setting does, or nothing is known)."""
    about = _about(factor)
    return dict(about[1].settings) if about and about[1] else {}


def is_batch_factor(factor: str | None) -> bool:
    """Whether the factor is about who shared the batch: what `evalgate bisect batch` can take apart."""
    about = _about(factor)
    return bool(about and about[2])


def comparison_label(reference: Pass, other: Pass) -> str:
    """`batch size 1→8`: what changed from the reference pass to this one, for people."""
    # a run recorded with a probe no longer installed is labelled by its factor
    probe = get_probe(other.probe) if other.probe in PROBES else None
    if probe is not None:
        return probe.label(reference, other)
    if other.factor == "batch_size":
        return f"batch size {reference.concurrency}→{other.concurrency}"
    if other.factor == "order":
        return f"order (seed {other.order_seed}) at batch size {other.concurrency}"
    if other.factor == "prefix_cache":
        return f"prefix cache {reference.cache}→{other.cache}"
    if other.factor == "repeat":
        return f"repeat of pass {reference.index}"
    if other.factor is None:
        return f"pass {reference.index}→{other.index} (unattributed)"
    return words(other.factor)


def remedies(factors) -> str:
    """`batch size: <what removes it>; prefix cache: ...` for the factors that have a known remedy."""
    return "; ".join(f"{words(f)}: {remedy(f)}" for f in factors if remedy(f))
