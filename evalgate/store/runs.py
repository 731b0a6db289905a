"""Runs: the run row, its requests and token-level outputs, shards, and reading a run back.

A run row is written first with status `running` (and its owner process); outputs are added pass by
pass; `finish_run` writes the verdicts and marks it complete in one transaction. A `running` run whose
owner is gone is shown as `abandoned` (listing.py `display_status`), and like every incomplete run it can never
become a baseline.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from itertools import islice

from sqlalchemy import delete, func, insert, literal, select
from sqlalchemy.orm import Session

from ..collector import collector_paused
from ..errors import ConfigError
from ..fingerprint import RunFingerprint, fingerprint_hash
from ..owners import current_owner
from ..records import Completion, encode_pass, pack_ids
from .base import StoreBase
from .loaded import PassOutputs, RunRecord, load_run
from .models import Fingerprint, Output, Payload, Request, Run, Verdict, utcnow

OUTPUT_COLUMNS = ("run_id", "request_key", "pass_index", "concurrency", "wave", "position", "finish_reason", "digest",
                  "cached_tokens", "payload_hash")
REQUEST_COLUMNS = ("run_id", "key", "request_hash", "prompt", "prompt_ids", "sampling", "location", "request_type",
                   "rendered")


# Request rows a new run builds and inserts at a time: a leaderboard-sized suite's are never all built at once.
INSERT_EVERY = 5_000

# The most outputs an `OutputWriter` holds before it hands them to `add_outputs`: a pass (and a rescoring) is
# stored as it runs, never held whole (a leaderboard-sized suite's pass would not fit in memory).
STORE_EVERY = 1024


class OutputWriter:
    """A run's outputs into the store as they come, STORE_EVERY at a time; `flush` stores the rest."""

    def __init__(self, store: RunStore, run_id: int):
        self.store, self.run_id = store, run_id
        self.waiting: list[Completion] = []

    def add(self, outputs: list[Completion]) -> None:
        self.waiting += outputs
        if len(self.waiting) >= STORE_EVERY:
            self.flush()

    def flush(self) -> None:
        if self.waiting:
            self.store.add_outputs(self.run_id, self.waiting)
            self.waiting = []


class RunStore(StoreBase):
    # run id -> each request's latest stored output (`EncodedPass.seen`): the run being written compares its
    # next outputs with it. One run at a time; grown in place, never copied.
    _seen: dict[int, dict[str, bytes]] = {}

    # --- writing a run ---------------------------------------------------------------------------------

    def create_run(self, suite, kind: str, schedule: dict, fingerprint: dict[str, dict],
                   prompt_ids: Mapping[str, Sequence[int]], *, rendered: dict[str, str] | None = None, shard: str | None = None,
                   shard_group: str | None = None, owner: dict | None = None, engine_log: str | None = None) -> int:
        fp_hash = fingerprint_hash(fingerprint)
        self._check_fits(suite)

        # the suite component holds every request's hash already: hashing 5,000 prompts again costs 0.1 s
        hashes = RunFingerprint(fingerprint).request_hashes

        def request_rows(run_id: int) -> Iterator[tuple]:
            for p in suite.prompts:
                yield (run_id, p.key, hashes.get(p.key) or suite.request_hash(p), p.text, pack_ids(prompt_ids[p.key]),
                       suite.sampling_for(p), suite.location_of(p), p.request_type, (rendered or {}).get(p.key))

        def write(s: Session) -> int:
            self.add_fingerprint(s, fp_hash, fingerprint)
            run = Run(suite_name=suite.name, suite_path=str(suite.path), kind=kind, status="running",
                      schedule=schedule, fingerprint_hash=fp_hash, hardware_class=fingerprint["hardware"]["hash"],
                      shard=shard, shard_group=shard_group, owner=owner, engine_log=engine_log)
            s.add(run)
            s.flush()
            rows = request_rows(run.id)  # built and inserted INSERT_EVERY at a time, in the one transaction
            while chunk := list(islice(rows, INSERT_EVERY)):
                self.insert_rows(s, Request.__table__, REQUEST_COLUMNS, chunk)
            return run.id

        with collector_paused():
            return self.write(write)

    def _check_fits(self, suite) -> None:
        """A database server enforces column lengths and refuses NUL in strings (SQLite does neither):
        refuse a suite name or prompt id that would not fit, naming it, before anything is written."""
        if self.database.dialect.name == "sqlite":
            return
        limit = Run.__table__.c.suite_name.type.length
        if len(suite.name) > limit or "\x00" in suite.name:
            raise ConfigError(f"{suite.path}: [suite].name is {len(suite.name)} characters; {self.url} holds at most "
                              f"{limit} (and no NUL characters)", fix="use a shorter suite name")
        limit = Request.__table__.c.key.type.length
        for p in suite.prompts:
            if len(p.key) > limit or "\x00" in p.key:
                raise ConfigError(f"{suite.location_of(p)}: prompt id is {len(p.key)} characters; "
                                  f"{self.url} holds at most {limit} (and no NUL characters)",
                                  fix="use shorter prompt ids")

    def add_outputs(self, run_id: int, completions: list[Completion]) -> None:
        """One pass's outputs, in bulk, encoded together (records.encode_pass). A payload is written once: an
        output equal to one already stored (another pass, another run) only points at it, and an output
        equal to the same request's output in the run's previous pass (what a passing check mostly
        records) is not even encoded again."""
        with collector_paused():
            seen = self._seen.get(run_id)
            encoded = encode_pass(completions, seen)
            rows = [(run_id, c.key, c.pass_index, c.concurrency, c.wave, c.position, c.finish_reason, digest,
                     c.cached_tokens, payload_hash)
                    for c, digest, payload_hash in zip(completions, encoded.digests, encoded.payload_hashes)]

            def write(s: Session) -> None:
                self.insert_rows(s, Payload.__table__, ("hash", "data"), list(encoded.payloads.items()),
                                 new_only="hash")
                self.insert_rows(s, Output.__table__, OUTPUT_COLUMNS, rows)

            self.write(write)
        if seen is None:  # only once stored: a failed write must not count
            self._seen = {run_id: encoded.seen}
        else:
            seen.update(encoded.seen)

    def update_schedule(self, run_id: int, schedule: dict) -> None:
        """Replace a running run's schedule record (the runner drops a planned pass that could not run)."""
        def write(s: Session) -> None:
            s.get(Run, run_id).schedule = schedule

        self.write(write)

    def set_report(self, run_id: int, report: dict) -> None:
        """Replace a judged run's stored report (a run judged before reports were stored; an adoption)."""
        def write(s: Session) -> None:
            s.get(Run, run_id).report = report

        self.write(write)

    def finish_run(self, run_id: int, *, status: str, verdict: str | None = None, exit_code: int | None = None,
                   summary: dict | None = None, verdicts: list[dict] | None = None, error: str | None = None,
                   schedule: dict | None = None, report: dict | None = None, baseline_run_id: int | None = None,
                   promote: bool = False) -> None:
        """Finish a run in one transaction: its status and verdict, its report (judgement/report.py, without
        the per-request verdicts: `verdicts` are their rows), its schedule record, and its promotion."""
        def write(s: Session) -> None:
            run = s.get(Run, run_id)
            run.status, run.verdict, run.exit_code = status, verdict, exit_code
            run.summary, run.error, run.finished_at = summary, error, utcnow()
            run.baseline_run_id = baseline_run_id
            if schedule is not None:
                run.schedule = schedule
            if report is not None:
                run.report = report
            if verdicts:
                s.execute(insert(Verdict), [{"run_id": run_id, "request_key": v["key"], "verdict": v["verdict"],
                                             "detail": v} for v in verdicts])
            if promote:
                self.promote_in(s, run)

        self.write(write)
        self._seen = {}  # the run is written: let its outputs go

    def add_fingerprint(self, s: Session, fp_hash: str, fingerprint: dict) -> None:
        """Content-addressed: stored once, whoever stores it first."""
        if self.upsert_insert:
            s.execute(self.upsert_insert(Fingerprint).values(hash=fp_hash, components=fingerprint, created_at=utcnow())
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
            self.add_fingerprint(s, fp_hash, fingerprint)
            run = Run(suite_name=first.suite_name, suite_path=first.suite_path, kind=first.kind, status="running",
                      schedule={**first.schedule, "merged_from": ids}, fingerprint_hash=fp_hash,
                      hardware_class=first.hardware_class, shard=None, shard_group=first.shard_group,
                      owner=current_owner())
            s.add(run)
            s.flush()
            for model in (Request, Output):  # INSERT ... SELECT: the rows never pass through Python
                table = model.__table__
                columns = [c.name for c in table.c if c.name not in ("id", "run_id")]
                rows = select(literal(run.id), *[table.c[c] for c in columns]).where(table.c.run_id.in_(ids))
                s.execute(insert(table).from_select(["run_id", *columns], rows))
            return run.id

        return self.write(write)

    # --- resuming a run (execution/resume.py) --------------------------------------------------------------

    def unfinished_runs(self, suite_name: str, kind: str, shard: str | None, group: str | None) -> list[Run]:
        """The runs of this suite, kind, shard and group that never finished (running, failed, interrupted),
        newest first."""
        with self.session() as s:
            return list(s.scalars(select(Run).where(
                Run.suite_name == suite_name, Run.kind == kind, Run.status.in_(("running", "failed", "interrupted")),
                Run.shard.is_(None) if shard is None else Run.shard == shard,
                Run.shard_group.is_(None) if group is None else Run.shard_group == group).order_by(Run.id.desc())))

    def reopen_run(self, run_id: int, *, owner: dict | None, engine_log: str | None) -> None:
        """A run continued by another process: `running` again, owned by it, its earlier error cleared."""
        def write(s: Session) -> None:
            run = s.get(Run, run_id)
            run.status, run.error, run.exit_code, run.finished_at = "running", None, None, None
            run.owner, run.engine_log = owner, engine_log

        self.write(write)

    def stored_waves(self, run_id: int) -> dict[int, set[int]]:
        """Pass index -> the waves of it the run has stored (a wave is stored whole: `OutputWriter`)."""
        waves: dict[int, set[int]] = {}
        with self.session() as s:
            for pass_index, wave in s.execute(select(Output.pass_index, Output.wave).distinct().where(
                    Output.run_id == run_id, Output.pass_index >= 0)):
                waves.setdefault(pass_index, set()).add(wave)
        return waves

    def rescored_keys(self, run_id: int) -> dict[int, set[str]]:
        """Rescoring pass index (negative) -> the requests it has stored."""
        keys: dict[int, set[str]] = {}
        with self.session() as s:
            for pass_index, key in s.execute(select(Output.pass_index, Output.request_key).where(
                    Output.run_id == run_id, Output.pass_index < 0)):
                keys.setdefault(pass_index, set()).add(key)
        return keys

    def delete_outputs(self, run_id: int, pass_index: int) -> None:
        """A pass's stored outputs, gone (a probe's pass is run again whole: its proof reads its engine)."""
        self.write(lambda s: s.execute(delete(Output).where(Output.run_id == run_id, Output.pass_index == pass_index)))

    def mark_incomplete(self, run_id: int, status: str, error: str) -> None:
        """Best effort: a run that could not finish must never look complete."""
        try:
            self.finish_run(run_id, status=status, error=error, exit_code=3)
        except Exception:
            pass  # the row stays `running`, which is just as unpromotable

    # --- reading ---------------------------------------------------------------------------------------

    def runs(self, suite_name: str | None = None, limit: int = 50, kinds: tuple[str, ...] | None = None) -> list[Run]:
        with self.session() as s:
            q = select(Run).order_by(Run.id.desc()).limit(limit)
            if suite_name:
                q = q.where(Run.suite_name == suite_name)
            if kinds:
                q = q.where(Run.kind.in_(kinds))
            return list(s.scalars(q))

    def completed_runs(self, suite_name: str) -> int:
        """How many baseline and check runs of the whole suite completed here (the rotating preset's turn).
        Shard runs do not count (their merged run does), so the shards of one CI run share a turn."""
        with self.session() as s:
            return s.scalar(select(func.count()).select_from(Run).where(
                Run.suite_name == suite_name, Run.kind.in_(("baseline", "check")), Run.status == "complete",
                Run.shard.is_(None)))

    def alone_coverage(self, run: Run, window: int, alone: int = 1) -> dict:
        """Of this run's requests, how many ran alone (at concurrency `alone`, the schedule's lowest level)
        in this run or the `window - 1` complete baseline and check runs of its suite on its hardware class
        before it."""
        with self.session() as s:
            earlier = list(s.scalars(select(Run.id).where(
                Run.suite_name == run.suite_name, Run.hardware_class == run.hardware_class,
                Run.kind.in_(("baseline", "check")), Run.status == "complete", Run.shard.is_(None), Run.id < run.id,
            ).order_by(Run.id.desc()).limit(max(window - 1, 0))))
            runs = [run.id, *earlier]
            keys = set(s.scalars(select(Request.key).where(Request.run_id == run.id)))
            alone = set(s.scalars(select(Output.request_key).distinct().where(  # passes, not rescorings (< 0)
                Output.run_id.in_(runs), Output.concurrency == alone, Output.pass_index >= 0)))
        return {"covered": len(keys & alone), "requests": len(keys), "runs": len(runs), "window": window}

    def get_run(self, run_id: int) -> Run:
        with self.session() as s:
            run = s.get(Run, run_id)
        if run is None:
            raise ConfigError(f"run {run_id} does not exist in {self.url}", fix="see `evalgate runs list`")
        return run

    def run_size(self, run_id: int) -> tuple[int, int]:
        """How many requests a run has, and how many outputs of its passes (rescorings not counted)."""
        with self.session() as s:
            requests = s.scalar(select(func.count()).select_from(Request).where(Request.run_id == run_id))
            outputs = s.scalar(select(func.count()).select_from(Output).where(Output.run_id == run_id,
                                                                              Output.pass_index >= 0))
        return requests, outputs

    def has_outputs(self, run_id: int, pass_index: int | None = None) -> bool:
        """Whether the run stored any output (it got past engine start), or any of this pass (a rescoring:
        OWN_RESCORING, BASELINE_RESCORING). Raises for a missing run."""
        self.get_run(run_id)
        query = select(Output.id).where(Output.run_id == run_id)
        if pass_index is not None:
            query = query.where(Output.pass_index == pass_index)
        with self.session() as s:
            return s.scalar(query.limit(1)) is not None

    def verdicts(self, run_id: int) -> list[dict]:
        with self.session() as s:
            return [v.detail for v in s.scalars(select(Verdict).where(Verdict.run_id == run_id).order_by(Verdict.id))]

    def pass_outputs(self, run_id: int, pass_index: int, order: list[str]) -> PassOutputs:
        """One stored pass of a run by request key, read a window at a time in `order` (store/loaded.py)."""
        return PassOutputs(self, run_id, pass_index, order)

    def load(self, run_id: int, only_pass: int | None = None, keys: list[str] | None = None,
             fingerprint: RunFingerprint | None = None) -> RunRecord:
        """A run for comparison (store/loaded.py): its requests and every output's digest at once; its
        completions and their payloads when a comparison needs tokens, that is when digests differ.
        `only_pass`: that pass alone, e.g. one of the run's rescorings (OWN_RESCORING, BASELINE_RESCORING).
        `keys`: those requests alone (`[]`: the run's row and identity). `fingerprint`: the run's, already
        read (a large suite's lists every request: a window of the run does not read it again)."""
        run = self.get_run(run_id)
        if fingerprint is None:
            with self.session() as s:
                fp = s.get(Fingerprint, run.fingerprint_hash)
            fingerprint = RunFingerprint(fp.components if fp else {})
        return load_run(self, run, fingerprint, only_pass, keys)

    def request_windows(self, run_id: int, size: int, absent_from: int | None = None) -> Iterator[list[str]]:
        """The run's request keys, `size` at a time in their stored order; with `absent_from`, only those that
        run lacks."""
        marks = self.placeholders(3).split(", ")
        lacking = f" AND key NOT IN (SELECT key FROM requests WHERE run_id = {marks[2]})" if absent_from is not None else ""
        last = 0
        while True:
            with self.session() as s:
                rows = self.select_rows(s, f"SELECT id, key FROM requests WHERE run_id = {marks[0]} AND id > {marks[1]}"
                                           f"{lacking} ORDER BY id LIMIT {int(size)}",
                                        (run_id, last) + ((absent_from,) if absent_from is not None else ()))
            if not rows:
                return
            yield [key for _, key in rows]
            last = rows[-1][0]

    def request_locations(self, run_id: int) -> Iterator[tuple[str, str | None]]:
        """Each request of the run, (key, location) in stored order, read a batch at a time."""
        with self.session() as s:
            yield from self.iter_rows(s, f"SELECT key, location FROM requests WHERE run_id = {self.placeholders(1)} "
                                         "ORDER BY id", (run_id,))
