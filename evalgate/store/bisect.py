"""`evalgate bisect` sessions and their trials (evalgate/bisect/, docs/bisect.md)."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ..errors import ConfigError
from .base import StoreBase
from .models import BisectSession, BisectTrial, utcnow


class BisectStore(StoreBase):
    # --- `evalgate bisect` (evalgate/bisect/, docs/bisect.md) ---------------------------------------------

    def start_bisect(self, kind: str, suite_name: str | None, subject: dict) -> int:
        def write(s: Session) -> int:
            row = BisectSession(kind=kind, suite_name=suite_name, subject=subject, status="running")
            s.add(row)
            s.flush()
            return row.id

        return self.write(write)

    def add_trial(self, session_id: int, *, label: str, config: dict, outcome: str, run_id: int | None = None,
                  detail: dict | None = None, seconds: float | None = None) -> int:
        """Record one trial as soon as it is decided, so an interrupted bisect keeps what it learned."""
        def write(s: Session) -> int:
            step = s.scalar(select(func.count()).select_from(BisectTrial).where(BisectTrial.session_id == session_id))
            row = BisectTrial(session_id=session_id, step=step + 1, label=label, config=config, outcome=outcome,
                              run_id=run_id, detail=detail, seconds=seconds)
            s.add(row)
            s.flush()
            return row.id

        return self.write(write)

    def finish_bisect(self, session_id: int, status: str, result: dict | None = None, error: str | None = None) -> None:
        def write(s: Session) -> None:
            row = s.get(BisectSession, session_id)
            row.status, row.result, row.error, row.finished_at = status, result, error, utcnow()

        self.write(write)

    def bisects(self, limit: int = 20) -> list:
        with self.session() as s:
            return list(s.scalars(select(BisectSession).order_by(BisectSession.id.desc()).limit(limit)))

    def bisect(self, session_id: int):
        """(session, trials in order) of one bisect."""
        with self.session() as s:
            row = s.get(BisectSession, session_id)
            if row is None:
                raise ConfigError(f"bisect {session_id} does not exist in {self.url}", fix="see `evalgate bisect show`")
            trials = list(s.scalars(select(BisectTrial).where(BisectTrial.session_id == session_id)
                                    .order_by(BisectTrial.step)))
            return row, trials
