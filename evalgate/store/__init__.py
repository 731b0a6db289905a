"""The store: runs, fingerprints, token-level outputs, verdicts and baseline pointers.

A run row is written first with status `running`; outputs are added pass by pass; the final transaction
writes the verdicts, marks the run `complete` and (for a baseline) moves the baseline pointer, so a
baseline can never point at a half-written run. Interrupted or failed runs keep their outputs for
inspection and are never promotable.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from sqlalchemy import func, insert, literal, select
from sqlalchemy.exc import OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from ..errors import ConfigError, StoreError
from ..fingerprint import fingerprint_hash
from ..records import Completion, pack_floats, pack_ids, unpack_floats, unpack_ids
from .db import display_url, make_engine, migrate, sqlite_path
from .models import Baseline, Fingerprint, Output, Request, Run, SampleScore, Score, Verdict, utcnow


@dataclass
class RunRecord:
    """A stored run, loaded for comparison."""

    run: Run
    fingerprint: dict[str, dict]
    requests: dict[str, Request]
    outputs: dict[str, list[Completion]] = field(default_factory=dict)  # key -> completions in pass order

    @property
    def id(self) -> int:
        return self.run.id


def _upsert_insert(dialect: str):
    """The dialect's INSERT that supports ON CONFLICT, or None (then a read-then-write fallback)."""
    if dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    elif dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        return None
    return insert


class Store:
    def __init__(self, url: str):
        self.url = display_url(url)  # for messages: no password
        self.engine = make_engine(url)
        migrate(self.engine, url)
        # Several evalgate processes may store the same new identity or promote at once: "insert if missing"
        # must be one statement (INSERT ... ON CONFLICT), which SQLite and PostgreSQL both have.
        self._upsert_insert = _upsert_insert(self.engine.dialect.name)
        self._session = sessionmaker(self.engine, expire_on_commit=False)

    def session(self) -> Session:
        return self._session()

    def _write(self, fn):
        """Run fn(session) in one transaction; storage failures (disk full, locked) are exit-3 errors."""
        try:
            with self.session() as s, s.begin():
                return fn(s)
        except OperationalError as exc:
            raise StoreError(f"could not write to the database {self.url}: {exc.orig}") from None
        except SQLAlchemyError as exc:
            raise StoreError(f"database error on {self.url}: {exc}") from None

    # --- writing a run ---------------------------------------------------------------------------------

    def create_run(self, suite, kind: str, schedule: dict, fingerprint: dict[str, dict],
                   prompt_ids: dict[str, list[int]], *, shard: str | None = None,
                   shard_group: str | None = None) -> int:
        fp_hash = fingerprint_hash(fingerprint)
        self._check_fits(suite)

        def write(s: Session) -> int:
            self._add_fingerprint(s, fp_hash, fingerprint)
            run = Run(suite_name=suite.name, suite_path=str(suite.path), kind=kind, status="running",
                      schedule=schedule, fingerprint_hash=fp_hash, hardware_class=fingerprint["hardware"]["hash"],
                      shard=shard, shard_group=shard_group)
            s.add(run)
            s.flush()
            locations = suite.locations
            for p in suite.prompts:
                s.add(Request(run_id=run.id, key=p.key, request_hash=suite.request_hash(p), prompt=p.text,
                              prompt_ids=pack_ids(prompt_ids[p.key]), sampling=suite.sampling_for(p),
                              location=locations.get(p.key), request_type=p.request_type))
            return run.id

        return self._write(write)

    def _check_fits(self, suite) -> None:
        """A database server enforces column lengths and refuses NUL in strings (SQLite does neither):
        refuse a suite name or prompt id that would not fit, naming it, before anything is written."""
        if self.engine.dialect.name == "sqlite":
            return
        limit = Run.__table__.c.suite_name.type.length
        if len(suite.name) > limit or "\x00" in suite.name:
            raise ConfigError(f"{suite.path}: [suite].name is {len(suite.name)} characters; {self.url} holds at most "
                              f"{limit} (and no NUL characters)", fix="use a shorter suite name")
        limit = Request.__table__.c.key.type.length
        locations = suite.locations
        for p in suite.prompts:
            if len(p.key) > limit or "\x00" in p.key:
                raise ConfigError(f"{locations.get(p.key) or suite.path}: prompt id is {len(p.key)} characters; "
                                  f"{self.url} holds at most {limit} (and no NUL characters)",
                                  fix="use shorter prompt ids")

    def add_outputs(self, run_id: int, completions: list[Completion]) -> None:
        def write(s: Session) -> None:
            for c in completions:
                k, top_ids, top_lps = c.pack_top()
                s.add(Output(
                    run_id=run_id, request_key=c.key, pass_index=c.pass_index, concurrency=c.concurrency,
                    wave=c.wave, position=c.position, output_ids=pack_ids(c.output_ids),
                    logprobs=pack_floats(c.logprobs), top_k=k, top_ids=top_ids, top_logprobs=top_lps,
                    token_texts=c.token_texts, text=c.text, finish_reason=c.finish_reason, digest=c.digest,
                ))

        self._write(write)

    def finish_run(self, run_id: int, *, status: str, verdict: str | None = None, exit_code: int | None = None,
                   summary: dict | None = None, verdicts: list[dict] | None = None, error: str | None = None,
                   schedule: dict | None = None, baseline_run_id: int | None = None, promote: bool = False) -> None:
        def write(s: Session) -> None:
            run = s.get(Run, run_id)
            run.status, run.verdict, run.exit_code = status, verdict, exit_code
            run.summary, run.error, run.finished_at = summary, error, utcnow()
            run.baseline_run_id = baseline_run_id
            if schedule is not None:
                run.schedule = schedule
            for v in verdicts or []:
                s.add(Verdict(run_id=run_id, request_key=v["key"], verdict=v["verdict"], detail=v))
            if promote:
                self._promote(s, run)

        self._write(write)

    def _add_fingerprint(self, s: Session, fp_hash: str, fingerprint: dict) -> None:
        """Content-addressed: stored once, whoever stores it first."""
        if self._upsert_insert:
            s.execute(self._upsert_insert(Fingerprint).values(hash=fp_hash, components=fingerprint, created_at=utcnow())
                      .on_conflict_do_nothing(index_elements=["hash"]))
        elif s.get(Fingerprint, fp_hash) is None:
            s.add(Fingerprint(hash=fp_hash, components=fingerprint))

    def shard_runs(self, suite_name: str, group: str, kind: str) -> list[Run]:
        with self.session() as s:
            return list(s.scalars(select(Run).where(Run.suite_name == suite_name, Run.shard_group == group,
                                                    Run.kind == kind, Run.shard.is_not(None)).order_by(Run.id)))

    def merge_runs(self, runs: list[Run], fingerprint: dict[str, dict]) -> int:
        """A new run (status `running`) holding the requests and outputs of the given shard runs."""
        first = runs[0]
        fp_hash = fingerprint_hash(fingerprint)
        ids = [r.id for r in runs]

        def write(s: Session) -> int:
            self._add_fingerprint(s, fp_hash, fingerprint)
            run = Run(suite_name=first.suite_name, suite_path=first.suite_path, kind=first.kind, status="running",
                      schedule={**first.schedule, "merged_from": ids}, fingerprint_hash=fp_hash,
                      hardware_class=first.hardware_class, shard=None, shard_group=first.shard_group)
            s.add(run)
            s.flush()
            for model in (Request, Output):  # INSERT ... SELECT: the rows never pass through Python
                table = model.__table__
                columns = [c.name for c in table.c if c.name not in ("id", "run_id")]
                rows = select(literal(run.id), *[table.c[c] for c in columns]).where(table.c.run_id.in_(ids))
                s.execute(insert(table).from_select(["run_id", *columns], rows))
            return run.id

        return self._write(write)

    def mark_incomplete(self, run_id: int, status: str, error: str) -> None:
        """Best effort: a run that could not finish must never look complete."""
        try:
            self.finish_run(run_id, status=status, error=error, exit_code=3)
        except Exception:
            pass  # the row stays `running`, which is just as unpromotable

    # --- lm-eval metrics -------------------------------------------------------------------------------

    def add_scores(self, run_id: int, scores: list[dict], samples: list[dict]) -> None:
        """A run's task metrics and per-document metric values (evalgate/lmeval.py `TaskRun.score`)."""
        def write(s: Session) -> None:
            s.add_all(Score(run_id=run_id, **row) for row in scores)
            s.add_all(SampleScore(run_id=run_id, **row) for row in samples)

        self._write(write)

    def load_scores(self, run_id: int) -> tuple[list[Score], list[SampleScore]]:
        with self.session() as s:
            scores = list(s.scalars(select(Score).where(Score.run_id == run_id).order_by(Score.task, Score.metric)))
            samples = list(s.scalars(select(SampleScore).where(SampleScore.run_id == run_id)
                                     .order_by(SampleScore.task, SampleScore.metric, SampleScore.doc_id)))
        return scores, samples

    # --- baselines -------------------------------------------------------------------------------------

    def _promote(self, s: Session, run: Run) -> None:
        if run.kind not in ("baseline", "check"):
            raise ConfigError(f"run {run.id} is a `{run.kind}` run, not a baseline or check run: it cannot become a baseline",
                              fix="promote a baseline or check run (see `evalgate runs list`)")
        if run.status != "complete":
            raise ConfigError(f"run {run.id} is {run.status}, not complete: it cannot become a baseline",
                              fix="promote a complete run (see `evalgate runs list`)")
        if self._upsert_insert:  # two runners promoting the first baseline at once: the last one wins
            stmt = self._upsert_insert(Baseline).values(suite_name=run.suite_name, hardware_class=run.hardware_class,
                                           run_id=run.id, promoted_at=utcnow())
            s.execute(stmt.on_conflict_do_update(index_elements=["suite_name", "hardware_class"],
                                                 set_={"run_id": stmt.excluded.run_id,
                                                       "promoted_at": stmt.excluded.promoted_at}))
            return
        row = s.scalar(select(Baseline).where(Baseline.suite_name == run.suite_name,
                                              Baseline.hardware_class == run.hardware_class))
        if row is None:
            s.add(Baseline(suite_name=run.suite_name, hardware_class=run.hardware_class, run_id=run.id))
        else:
            row.run_id, row.promoted_at = run.id, utcnow()

    def promote(self, run_id: int) -> Run:
        def write(s: Session) -> Run:
            run = s.get(Run, run_id)
            if run is None:
                raise ConfigError(f"run {run_id} does not exist in {self.url}", fix="see `evalgate runs list`")
            self._promote(s, run)
            return run

        return self._write(write)

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

    # --- reading ---------------------------------------------------------------------------------------

    def runs(self, suite_name: str | None = None, limit: int = 50, kinds: tuple[str, ...] | None = None) -> list[Run]:
        with self.session() as s:
            q = select(Run).order_by(Run.id.desc()).limit(limit)
            if suite_name:
                q = q.where(Run.suite_name == suite_name)
            if kinds:
                q = q.where(Run.kind.in_(kinds))
            return list(s.scalars(q))

    def get_run(self, run_id: int) -> Run:
        with self.session() as s:
            run = s.get(Run, run_id)
        if run is None:
            raise ConfigError(f"run {run_id} does not exist in {self.url}", fix="see `evalgate runs list`")
        return run

    def verdicts(self, run_id: int) -> list[dict]:
        with self.session() as s:
            return [v.detail for v in s.scalars(select(Verdict).where(Verdict.run_id == run_id).order_by(Verdict.id))]

    def load(self, run_id: int) -> RunRecord:
        run = self.get_run(run_id)
        with self.session() as s:
            fp = s.get(Fingerprint, run.fingerprint_hash)
            q = select(Request).where(Request.run_id == run_id).order_by(Request.id)  # prompts-file order
            requests = {r.key: r for r in s.scalars(q)}
            outputs: dict[str, list[Completion]] = defaultdict(list)
            rows = s.scalars(select(Output).where(Output.run_id == run_id).order_by(Output.pass_index, Output.id))
            for o in rows:
                top_ids, top_lps = Completion.unpack_top(o.top_k, o.top_ids, o.top_logprobs)
                req = requests.get(o.request_key)
                outputs[o.request_key].append(Completion(
                    key=o.request_key, prompt_ids=unpack_ids(req.prompt_ids) if req else [],
                    output_ids=unpack_ids(o.output_ids), logprobs=unpack_floats(o.logprobs), top_ids=top_ids,
                    top_logprobs=top_lps, token_texts=list(o.token_texts), text=o.text,
                    finish_reason=o.finish_reason, pass_index=o.pass_index, concurrency=o.concurrency,
                    wave=o.wave, position=o.position, _digest=o.digest,
                ))
        return RunRecord(run=run, fingerprint=fp.components if fp else {}, requests=requests, outputs=dict(outputs))

    # --- `evalgate cost` (evalgate/cost.py, docs/cost.md) ----------------------------------------------

    def add_cost_result(self, **values) -> int:
        """One measured (or unavailable, or failed) candidate of an `evalgate cost` session."""
        from .models import CostResult

        def write(s: Session) -> int:
            row = CostResult(**values)
            s.add(row)
            s.flush()
            return row.id

        return self._write(write)

    def cost_results(self, session: str | None = None, suite_name: str | None = None) -> list:
        """Stored candidates, oldest session first, in their order within the session."""
        from .models import CostResult

        with self.session() as s:
            q = select(CostResult).order_by(CostResult.id)
            if session:
                q = q.where(CostResult.session == session)
            if suite_name:
                q = q.where(CostResult.suite_name == suite_name)
            return list(s.scalars(q))


    # --- `evalgate bisect` (evalgate/bisect/, docs/bisect.md) ---------------------------------------------

    def start_bisect(self, kind: str, suite_name: str | None, subject: dict) -> int:
        from .models import BisectSession

        def write(s: Session) -> int:
            row = BisectSession(kind=kind, suite_name=suite_name, subject=subject, status="running")
            s.add(row)
            s.flush()
            return row.id

        return self._write(write)

    def add_trial(self, session_id: int, *, label: str, config: dict, outcome: str, run_id: int | None = None,
                  detail: dict | None = None, seconds: float | None = None) -> int:
        """Record one trial as soon as it is decided, so an interrupted bisect keeps what it learned."""
        from .models import BisectTrial

        def write(s: Session) -> int:
            step = s.scalar(select(func.count()).select_from(BisectTrial).where(BisectTrial.session_id == session_id))
            row = BisectTrial(session_id=session_id, step=step + 1, label=label, config=config, outcome=outcome,
                              run_id=run_id, detail=detail, seconds=seconds)
            s.add(row)
            s.flush()
            return row.id

        return self._write(write)

    def finish_bisect(self, session_id: int, status: str, result: dict | None = None, error: str | None = None) -> None:
        from .models import BisectSession

        def write(s: Session) -> None:
            row = s.get(BisectSession, session_id)
            row.status, row.result, row.error, row.finished_at = status, result, error, utcnow()

        self._write(write)

    def bisects(self, limit: int = 20) -> list:
        from .models import BisectSession

        with self.session() as s:
            return list(s.scalars(select(BisectSession).order_by(BisectSession.id.desc()).limit(limit)))

    def bisect(self, session_id: int):
        """(session, trials in order) of one bisect."""
        from .models import BisectSession, BisectTrial

        with self.session() as s:
            row = s.get(BisectSession, session_id)
            if row is None:
                raise ConfigError(f"bisect {session_id} does not exist in {self.url}", fix="see `evalgate bisect show`")
            trials = list(s.scalars(select(BisectTrial).where(BisectTrial.session_id == session_id)
                                    .order_by(BisectTrial.step)))
            return row, trials


_open_stores: dict[str, Store] = {}


def open_store(url: str, *, create: bool = True) -> Store:
    """Open (and migrate) a store, once per URL per process; with create=False a missing SQLite file is
    an error, not a new database."""
    path = sqlite_path(url)
    if path is not None and not path.exists():
        _open_stores.pop(url, None)  # deleted or moved since: start afresh
        if not create:
            raise ConfigError(f"no evalgate database at {path}",
                              fix="pass --db or --suite naming an existing database (see `evalgate baseline create`)")
    if url not in _open_stores:
        _open_stores[url] = Store(url)
    return _open_stores[url]


__all__ = ["Store", "RunRecord", "open_store", "Run"]
