"""Runs: the run row, its requests and token-level outputs, shards, and reading a run back.

A run row is written first with status `running` (and its owner process); outputs are added pass by
pass; `finish_run` writes the verdicts and marks it complete in one transaction. A `running` run whose
owner is gone is shown as `abandoned` (`display_status`), and like every incomplete run it can never
become a baseline.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from sqlalchemy import insert, literal, select
from sqlalchemy.orm import Session

from ..errors import ConfigError
from ..fingerprint import fingerprint_hash
from ..processes import current_owner, owner_alive
from ..records import Completion, pack_floats, pack_ids, unpack_floats, unpack_ids
from .base import StoreBase
from .models import Fingerprint, Output, Request, Run, Verdict, utcnow


def display_status(run: Run) -> str:
    """The run's status for people: `abandoned` for a `running` run whose owner process is gone."""
    if run.status == "running" and owner_alive(run.owner) is False:
        return "abandoned"
    return run.status


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


class RunStore(StoreBase):
    # --- writing a run ---------------------------------------------------------------------------------

    def create_run(self, suite, kind: str, schedule: dict, fingerprint: dict[str, dict],
                   prompt_ids: dict[str, list[int]], *, shard: str | None = None,
                   shard_group: str | None = None, owner: dict | None = None, engine_log: str | None = None) -> int:
        fp_hash = fingerprint_hash(fingerprint)
        self._check_fits(suite)

        def write(s: Session) -> int:
            self.add_fingerprint(s, fp_hash, fingerprint)
            run = Run(suite_name=suite.name, suite_path=str(suite.path), kind=kind, status="running",
                      schedule=schedule, fingerprint_hash=fp_hash, hardware_class=fingerprint["hardware"]["hash"],
                      shard=shard, shard_group=shard_group, owner=owner, engine_log=engine_log)
            s.add(run)
            s.flush()
            locations = suite.locations
            for p in suite.prompts:
                s.add(Request(run_id=run.id, key=p.key, request_hash=suite.request_hash(p), prompt=p.text,
                              prompt_ids=pack_ids(prompt_ids[p.key]), sampling=suite.sampling_for(p),
                              location=locations.get(p.key), request_type=p.request_type))
            return run.id

        return self.write(write)

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
                    cached_tokens=c.cached_tokens,
                ))

        self.write(write)

    def update_schedule(self, run_id: int, schedule: dict) -> None:
        """Replace a running run's schedule record (the runner drops a planned pass that could not run)."""
        def write(s: Session) -> None:
            s.get(Run, run_id).schedule = schedule

        self.write(write)

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
                self.promote_in(s, run)

        self.write(write)

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
                    wave=o.wave, position=o.position, cached_tokens=o.cached_tokens, _digest=o.digest,
                ))
        return RunRecord(run=run, fingerprint=fp.components if fp else {}, requests=requests, outputs=dict(outputs))
