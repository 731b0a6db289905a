"""SQLAlchemy ORM models. The schema is owned by the Alembic migrations in migrations/ (docs/storage.md);
change both together and add a migration, never edit a released one."""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import JSON, BigInteger, Boolean, Float, ForeignKey, Index, Integer, LargeBinary, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from .portable import NulSafeText  # TEXT that keeps U+0000 on PostgreSQL too


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


class Base(DeclarativeBase):
    pass


class Fingerprint(Base):
    """Content-addressed: the same identity is stored once, whatever the number of runs."""

    __tablename__ = "fingerprints"
    hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    components: Mapped[dict] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Run(Base):
    __tablename__ = "runs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    suite_name: Mapped[str] = mapped_column(String(200), index=True)
    suite_path: Mapped[str] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(String(20))  # baseline | check
    # running -> complete | failed | interrupted (shown `abandoned` when its owner died). Only `complete`
    # runs can become baselines.
    status: Mapped[str] = mapped_column(String(20), default="running")
    verdict: Mapped[str | None] = mapped_column(String(40))  # pass | regression | ... once complete
    exit_code: Mapped[int | None] = mapped_column(Integer)
    fingerprint_hash: Mapped[str | None] = mapped_column(ForeignKey("fingerprints.hash"))
    hardware_class: Mapped[str | None] = mapped_column(String(64))
    baseline_run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id"))  # what a check compared against
    schedule: Mapped[dict] = mapped_column(JSON)  # runtime knobs and pass timings: never identity
    # Sharded runs: "i/n" and the label that ties the n shard runs of one CI run together; a merged run
    # has shard NULL and the group of the shards it was made from.
    shard: Mapped[str | None] = mapped_column(String(20))
    shard_group: Mapped[str | None] = mapped_column(String(200), index=True)
    summary: Mapped[dict | None] = mapped_column(JSON)  # verdict counts
    error: Mapped[str | None] = mapped_column(NulSafeText)
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]
    # The process that finishes the run (host, pid, start time): a `running` run whose owner is gone is
    # shown as `abandoned` (evalgate/store/listing.py display_status). NULL for runs stored before 0007.
    owner: Mapped[dict | None] = mapped_column(JSON)
    engine_log: Mapped[str | None] = mapped_column(Text)  # the engine process's log file, if it had one
    # The run's Report (evalgate/judgement/report.py `to_dict`, less the per-request verdicts, which are its
    # `verdicts` rows), written when it is judged; adoption and acceptance are recorded on it (`updates`).
    # NULL: not judged (yet), or judged before 0013 moved reports out of `schedule` and never read since.
    report: Mapped[dict | None] = mapped_column(JSON)


class Request(Base):
    __tablename__ = "requests"
    __table_args__ = (UniqueConstraint("run_id", "key"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(String(500))
    request_hash: Mapped[str] = mapped_column(String(64))
    prompt: Mapped[str] = mapped_column(NulSafeText)
    prompt_ids: Mapped[bytes] = mapped_column(LargeBinary)  # int32 little-endian
    sampling: Mapped[dict] = mapped_column(JSON)
    location: Mapped[str | None] = mapped_column(Text)  # prompts file:line, or task file + doc id
    # generate (plain prompt) | generate_until | loglikelihood | loglikelihood_rolling (lm-eval)
    request_type: Mapped[str] = mapped_column(String(40), default="generate", server_default="generate")
    # a chat request's prompt as rendered by its template (what the engine saw, as text); NULL: `prompt` is it
    rendered: Mapped[str | None] = mapped_column(NulSafeText)


class Payload(Base):
    """What an output is (ids, logprobs, top-k, texts), content-addressed: the passes and runs that produced
    the same output share one row. Encoding: evalgate/records/payload.py `encode_payload`, docs/storage.md."""

    __tablename__ = "payloads"
    hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class Output(Base):
    """One request in one pass: where it ran, its digest (records/packing.py) and its payload."""

    __tablename__ = "outputs"
    # covers what a judgement reads first (evalgate/store/loaded.py): a run's digests never visit a table row
    __table_args__ = (Index("ix_outputs_digests", "run_id", "request_key", "pass_index", "digest", "cached_tokens"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    request_key: Mapped[str] = mapped_column(String(500))
    pass_index: Mapped[int] = mapped_column(Integer)
    concurrency: Mapped[int] = mapped_column(Integer)
    wave: Mapped[int] = mapped_column(Integer)
    position: Mapped[int] = mapped_column(Integer)  # index within its wave
    finish_reason: Mapped[str] = mapped_column(String(40))
    digest: Mapped[str] = mapped_column(String(64))
    # prompt tokens the engine served from its prefix cache; null: the engine did not say (or before 0008)
    cached_tokens: Mapped[int | None] = mapped_column(Integer)
    payload_hash: Mapped[str] = mapped_column(ForeignKey("payloads.hash"))


class Verdict(Base):
    __tablename__ = "verdicts"
    __table_args__ = (UniqueConstraint("run_id", "request_key"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    request_key: Mapped[str] = mapped_column(String(500))
    verdict: Mapped[str] = mapped_column(String(40))
    detail: Mapped[dict] = mapped_column(JSON)


class Baseline(Base):
    """The named pointer: the current baseline run of a suite on a hardware class."""

    __tablename__ = "baselines"
    __table_args__ = (UniqueConstraint("suite_name", "hardware_class"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    suite_name: Mapped[str] = mapped_column(String(200))
    hardware_class: Mapped[str] = mapped_column(String(64))
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"))
    promoted_at: Mapped[datetime] = mapped_column(default=utcnow)
    # An adopted baseline's proof (judgement/hardware.py): judged against which run on which class, with what
    # result. NULL: created or accepted on its own class.
    receipt: Mapped[dict | None] = mapped_column(JSON)


class Score(Base):
    """A task metric of a run (lm-eval metrics such as exact_match or acc), kept beside the token records."""

    __tablename__ = "scores"
    __table_args__ = (UniqueConstraint("run_id", "task", "metric"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    task: Mapped[str] = mapped_column(String(200))
    metric: Mapped[str] = mapped_column(String(200))
    value: Mapped[float | None] = mapped_column(Float)
    stderr: Mapped[float | None] = mapped_column(Float)


class SampleScore(Base):
    """One lm-eval document's metric value in a run, with the request keys it was computed from: a check
    names the documents (and so the requests) whose metric moved."""

    __tablename__ = "sample_scores"
    __table_args__ = (UniqueConstraint("run_id", "task", "doc_id", "metric"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    task: Mapped[str] = mapped_column(String(200))
    doc_id: Mapped[int] = mapped_column(Integer)
    metric: Mapped[str] = mapped_column(String(200))
    value: Mapped[float | None] = mapped_column(Float)
    request_keys: Mapped[list] = mapped_column(JSON)


class CostResult(Base):
    """One candidate engine configuration measured by `evalgate cost` (docs/cost.md): its throughput,
    latency, memory and whether its passes agreed. The candidate's passes are a run of kind `cost`
    (`run_id`); a candidate that could not run (unavailable on this platform, engine failed to start)
    has a row with its reason and no run. `session` ties the candidates of one `evalgate cost` together."""

    __tablename__ = "cost_results"
    __table_args__ = (UniqueConstraint("session", "candidate"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    session: Mapped[str] = mapped_column(String(64), index=True)
    suite_name: Mapped[str] = mapped_column(String(200))
    candidate: Mapped[str] = mapped_column(String(200))
    position: Mapped[int] = mapped_column(Integer)  # order within the session
    status: Mapped[str] = mapped_column(String(20))  # measured | unavailable | failed
    reason: Mapped[str | None] = mapped_column(NulSafeText)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    config: Mapped[dict] = mapped_column(JSON)  # engine args, batch_invariant, env (secrets redacted)
    invariant: Mapped[bool | None] = mapped_column(Boolean)
    differing_requests: Mapped[int | None] = mapped_column(Integer)
    requests: Mapped[int | None] = mapped_column(Integer)
    highest_concurrency: Mapped[int | None] = mapped_column(Integer)
    tokens_per_second: Mapped[float | None] = mapped_column(Float)  # at the highest concurrency
    peak_rss_bytes: Mapped[int | None] = mapped_column(BigInteger)
    engine_load_seconds: Mapped[float | None] = mapped_column(Float)
    figures: Mapped[dict | None] = mapped_column(JSON)  # per concurrency level: throughput and latency
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class BisectSession(Base):
    """One `evalgate bisect` (docs/bisect.md): what it bisects (`subject`: revisions, runs, request key),
    its status (running -> complete | inconclusive | interrupted | failed) and, once done, its result."""

    __tablename__ = "bisect_sessions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(20))  # commits | config | batch
    suite_name: Mapped[str | None] = mapped_column(String(200))
    subject: Mapped[dict] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(20), default="running")
    result: Mapped[dict | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(NulSafeText)
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]


class BisectTrial(Base):
    """One trial of a bisect: a configuration tried (a commit, a set of settings, a batch of requests), what
    it showed (`outcome`: good | bad | skip | error | reference) and the run that holds its outputs, if any."""

    __tablename__ = "bisect_trials"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    session_id: Mapped[int] = mapped_column(ForeignKey("bisect_sessions.id", ondelete="CASCADE"), index=True)
    step: Mapped[int] = mapped_column(Integer)
    label: Mapped[str] = mapped_column(Text)
    config: Mapped[dict] = mapped_column(JSON)
    outcome: Mapped[str] = mapped_column(String(20))
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"))
    detail: Mapped[dict | None] = mapped_column(JSON)
    seconds: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
