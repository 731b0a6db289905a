"""lm-eval metrics of a run, per task and per document."""

from __future__ import annotations

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from .base import StoreBase
from .models import SampleScore, Score


class ScoreStore(StoreBase):
    # --- lm-eval metrics -------------------------------------------------------------------------------

    def add_scores(self, run_id: int, scores: list[dict], samples: list[dict]) -> None:
        """A run's task metrics and per-document metric values (evalgate/lmeval/tasks.py `TaskRun.score`), in
        place of any it has (a resumed run scores again)."""
        def write(s: Session) -> None:
            s.execute(delete(Score).where(Score.run_id == run_id))
            s.execute(delete(SampleScore).where(SampleScore.run_id == run_id))
            s.add_all(Score(run_id=run_id, **row) for row in scores)
            s.add_all(SampleScore(run_id=run_id, **row) for row in samples)

        self.write(write)

    def load_scores(self, run_id: int) -> tuple[list[Score], list[SampleScore]]:
        with self.session() as s:
            scores = list(s.scalars(select(Score).where(Score.run_id == run_id).order_by(Score.task, Score.metric)))
            samples = list(s.scalars(select(SampleScore).where(SampleScore.run_id == run_id)
                                     .order_by(SampleScore.task, SampleScore.metric, SampleScore.doc_id)))
        return scores, samples
