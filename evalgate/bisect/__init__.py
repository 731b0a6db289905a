"""Bisecting a change in outputs (docs/bisect.md): which commit (`commits`), which setting (`config`), which
co-batched neighbours (`batch`); and the self-contained repro pack (`repro`).

Every bisector is a `Bisection` (session.py): each trial is recorded in the database as soon as it is
decided, progress is reported as trials done / estimated, and max-steps / max-seconds bounds stop it with
the best answer so far ("inconclusive") instead of running on.
"""
