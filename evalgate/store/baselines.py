"""Baselines: the pointer from a suite and hardware class to the run it is judged against."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..errors import ConfigError
from ..fingerprint import RunFingerprint
from .base import StoreBase
from .models import Baseline, Fingerprint, Run, utcnow


class BaselineStore(StoreBase):
    # --- baselines -------------------------------------------------------------------------------------

    def promote_in(self, s: Session, run: Run, receipt: dict | None = None) -> None:
        if run.kind not in ("baseline", "check"):
            raise ConfigError(f"run {run.id} is a `{run.kind}` run, not a baseline or check run: it cannot become a baseline",
                              fix="promote a baseline or check run (see `evalgate runs list`)")
        if run.status != "complete":
            raise ConfigError(f"run {run.id} is {run.status}, not complete: it cannot become a baseline",
                              fix="promote a complete run (see `evalgate runs list`)")
        if self.upsert_insert:  # two runners promoting the first baseline at once: the last one wins
            stmt = self.upsert_insert(Baseline).values(suite_name=run.suite_name, hardware_class=run.hardware_class,
                                           run_id=run.id, promoted_at=utcnow(), receipt=receipt)
            s.execute(stmt.on_conflict_do_update(index_elements=["suite_name", "hardware_class"],
                                                 set_={"run_id": stmt.excluded.run_id,
                                                       "promoted_at": stmt.excluded.promoted_at,
                                                       "receipt": stmt.excluded.receipt}))
            return
        row = s.scalar(select(Baseline).where(Baseline.suite_name == run.suite_name,
                                              Baseline.hardware_class == run.hardware_class))
        if row is None:
            s.add(Baseline(suite_name=run.suite_name, hardware_class=run.hardware_class, run_id=run.id, receipt=receipt))
        else:
            row.run_id, row.promoted_at, row.receipt = run.id, utcnow(), receipt

    def promote(self, run_id: int, receipt: dict | None = None) -> Run:
        """Make a complete run the baseline of its suite on its hardware class (`receipt`: an adoption's)."""
        def write(s: Session) -> Run:
            run = s.get(Run, run_id)
            if run is None:
                raise ConfigError(f"run {run_id} does not exist in {self.url}", fix="see `evalgate runs list`")
            self.promote_in(s, run, receipt)
            return run

        return self.write(write)

    def fingerprint_of(self, run_id: int) -> RunFingerprint:
        """A run's fingerprint components, without loading the run."""
        with self.session() as s:
            components = s.scalar(select(Fingerprint.components).join(Run, Run.fingerprint_hash == Fingerprint.hash)
                                  .where(Run.id == run_id))
        return RunFingerprint(components or {})

    def baseline_for(self, suite_name: str, hardware_class: str) -> int | None:
        with self.session() as s:
            return s.scalar(select(Baseline.run_id).where(Baseline.suite_name == suite_name,
                                                           Baseline.hardware_class == hardware_class))

    def baselines(self, suite_name: str | None = None) -> list[Baseline]:
        with self.session() as s:
            q = select(Baseline).order_by(Baseline.suite_name)
            if suite_name:
                q = q.where(Baseline.suite_name == suite_name)
            return list(s.scalars(q))
