"""`evalgate cost` results (evalgate/cost.py, docs/cost.md)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from .base import StoreBase
from .models import CostResult


class CostStore(StoreBase):
    # --- `evalgate cost` (evalgate/cost.py, docs/cost.md) ----------------------------------------------

    def add_cost_result(self, **values) -> int:
        """One measured (or unavailable, or failed) candidate of an `evalgate cost` session."""
        def write(s: Session) -> int:
            row = CostResult(**values)
            s.add(row)
            s.flush()
            return row.id

        return self.write(write)

    def cost_results(self, session: str | None = None, suite_name: str | None = None) -> list:
        """Stored candidates, oldest session first, in their order within the session."""
        with self.session() as s:
            q = select(CostResult).order_by(CostResult.id)
            if session:
                q = q.where(CostResult.session == session)
            if suite_name:
                q = q.where(CostResult.suite_name == suite_name)
            return list(s.scalars(q))
