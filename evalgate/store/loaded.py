"""A stored run read back for judging (`RunRecord`): what every comparison needs at once, the rest on first use.

A judgement of two equal runs needs each output's request, pass and digest, and nothing else: they are
read in one scan of a covering index (`ix_outputs_digests`), about 15,000 rows for a run of 5,000 requests
and 3 passes, with each request's key, hash and prompt ids (packed bytes: a judgement against a baseline
compares them). A request's completions (placement, finish reason, payload) and a request's prompt and
sampling are read the first time something looks at them; `RunRecord.prefetch` reads those of
several requests in one query, as the judge does for the requests whose digests differ.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from ..fingerprint import RunFingerprint
from ..records import Completion, StoredCompletion
from .base import CHUNK, chunked
from .models import Request

if TYPE_CHECKING:
    from .base import StoreBase

# Rescorings (execution/rescore.py) are stored with their run as outputs of passes no schedule has: the run's
# own first-pass tokens rescored on its class, and (a check judged across hardware) its baseline's tokens
# rescored on this one. `load_run` reads the schedule's passes only, unless it is asked for one of these.
OWN_RESCORING, BASELINE_RESCORING = -1, -2
# What a judgement reads of every output first: (pass index, digest, cached tokens, request key), as the
# database returns it (a run has thousands: no object is built per row).
DigestRow = tuple[int, str, "int | None", str]


@dataclass
class RunRecord:
    """A run, loaded for comparison. `outputs` maps each request key to its completions in pass order: a
    plain dict for a run held in memory, `StoredOutputs` for a stored one."""

    run: Any
    fingerprint: RunFingerprint  # a plain dict of components is read through RunFingerprint
    requests: Mapping[str, Any]  # key -> a row with Request's columns as attributes, prompts-file order
    outputs: Mapping[str, list[Completion]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.fingerprint, RunFingerprint):
            self.fingerprint = RunFingerprint(self.fingerprint)

    @property
    def id(self) -> int:
        return self.run.id

    @cached_property
    def digests(self) -> dict[str, list[DigestRow]]:
        """Request key -> the `DigestRow` of each of its outputs, in pass order."""
        if isinstance(self.outputs, StoredOutputs):
            return self.outputs.digests
        return {key: [(c.pass_index, c.digest, c.cached_tokens, key) for c in outputs] for key, outputs in self.outputs.items()}

    def prefetch(self, keys: list[str]) -> None:
        """Read these requests' completions and payloads together (a stored run); nothing for one in memory."""
        if isinstance(self.outputs, StoredOutputs):
            self.outputs.prefetch(keys)


class StoredOutputs(Mapping):
    """A stored run's outputs by request key, in pass order. The digests are read at once; a request's
    completions are built when it is first looked up: all the run's at once, or those `prefetch` names."""

    def __init__(self, store: StoreBase, run_id: int, digests: dict[str, list[DigestRow]],
                 requests: Mapping[str, Any], only_pass: int | None = None, window: list[str] | None = None):
        self.store, self.run_id, self.requests, self.only_pass = store, run_id, requests, only_pass
        self.digests = digests  # request key -> its outputs' DigestRows, in pass order
        self.window = window  # the keys it was loaded with (None: the whole run)
        self._completions: dict[str, list[Completion]] = {}
        self.payloads = RunPayloads(store, run_id, window)

    def __getitem__(self, key: str) -> list[Completion]:
        if key not in self.digests:
            raise KeyError(key)
        if key not in self._completions:
            self._read(None)
        return self._completions[key]

    def __contains__(self, key) -> bool:
        return key in self.digests

    def __iter__(self) -> Iterator[str]:
        return iter(self.digests)

    def __len__(self) -> int:
        return len(self.digests)

    def prefetch(self, keys: list[str]) -> None:
        """Read these requests' completions with their payloads, in one query per `CHUNK` keys, or in one
        for the whole run when they are most of it."""
        wanted = [k for k in dict.fromkeys(keys) if k in self.digests and k not in self._completions]
        if len(wanted) * 2 > len(self.digests) and self.window is None:
            self._read(None, with_payloads=True)
            return
        self._read(wanted, with_payloads=True)

    def _read(self, keys: list[str] | None, *, with_payloads: bool = False) -> None:
        """Build the completions of `keys` (None: of every request not built yet: the run's, or the window's),
        `CHUNK` keys a query, and with `with_payloads` keep their payloads."""
        if keys is None and self.window is not None:
            keys = [k for k in self.window if k in self.digests and k not in self._completions]
        for chunk in chunked(keys):
            self._completions.update(read_completions(
                self.store, self.run_id, self.only_pass, chunk, self.payloads, with_payloads=with_payloads,
                requests=self.requests, skip=self._completions))


def read_completions(store: StoreBase, run_id: int, only_pass: int | None, keys: list[str] | None, payloads: RunPayloads,
                     *, with_payloads: bool, requests: Mapping[str, Any], skip: Collection[str] = ()) -> dict[str, list[Completion]]:
    """The completions of `keys` (None: every request's but those in `skip`), in pass order, from their output
    rows (and, `with_payloads`, their payloads into `payloads`), fetched by the driver at once: a run has
    thousands of outputs, and no SQLAlchemy row is built per output."""
    mark = store.placeholders(1)
    which = "pass_index >= 0" if only_pass is None else f"pass_index = {int(only_pass)}"
    data = ", payloads.data FROM outputs JOIN payloads ON payloads.hash = outputs.payload_hash" if with_payloads \
        else ", NULL FROM outputs"
    sql = ("SELECT request_key, pass_index, concurrency, wave, position, finish_reason, digest, cached_tokens, "
           f"payload_hash{data} WHERE run_id = {mark} AND {which}")
    params: tuple = (run_id,)
    if keys is not None:
        sql += f" AND request_key IN ({store.placeholders(len(keys))})"
        params += tuple(keys)
    built: dict[str, list[Completion]] = {}
    with store.session() as s:
        rows = store.select_rows(s, sql, params)  # in pass order below: a database sort costs more
    blobs = payloads.blobs
    for key, pass_index, concurrency, wave, position, finish, digest, cached, payload, blob in rows:
        if key not in skip:
            built.setdefault(key, []).append(StoredCompletion(
                key, payload, payloads, digest, finish, pass_index=pass_index, concurrency=concurrency,
                wave=wave, position=position, cached_tokens=cached, request=requests.get(key)))
            if blob is not None and payload not in blobs:
                blobs[payload] = bytes(blob)
    for completions in built.values():
        completions.sort(key=_pass_order)
    return built


def _pass_order(c: Completion) -> int:
    return c.pass_index


class PassOutputs(Mapping):
    """One stored pass of a run by request key, read a window at a time: a lookup that misses reads the
    outputs, payloads included, of the `CHUNK` requests from that one on (in `order`), in place of the last
    window. What reads a pass back request by request, in order (the rescoring, a probe), so holds a window
    of it, never the pass: a leaderboard-sized run's pass does not fit in memory."""

    def __init__(self, store: StoreBase, run_id: int, pass_index: int, order: list[str]):
        self.store, self.run_id, self.pass_index, self.order = store, run_id, pass_index, order
        self._window: dict[str, Completion] = {}

    @cached_property
    def _positions(self) -> dict[str, int]:
        return {key: i for i, key in enumerate(self.order)}

    @cached_property
    def _stored(self) -> frozenset[str]:
        """The requests the pass has an output of."""
        with self.store.session() as s:
            return frozenset(key for key, in self.store.select_rows(
                s, f"SELECT request_key FROM outputs WHERE run_id = {self.store.placeholders(1)} "
                   f"AND pass_index = {int(self.pass_index)}", (self.run_id,)))

    def __getitem__(self, key: str) -> Completion:
        if key not in self._window:
            if key not in self._stored:
                raise KeyError(key)
            start = self._positions[key]
            keys = [k for k in self.order[start : start + CHUNK] if k in self._stored]
            # the payloads come with the rows; a payload missed would read the window's, never the whole run's
            read = read_completions(self.store, self.run_id, self.pass_index, keys, RunPayloads(self.store, self.run_id, keys),
                                    with_payloads=True, requests={})
            self._window = {k: completions[0] for k, completions in read.items()}
        return self._window[key]

    def __iter__(self) -> Iterator[str]:
        return (key for key in self.order if key in self._stored)

    def __len__(self) -> int:
        return len(self._stored)

    def __contains__(self, key) -> bool:
        return key in self._stored


class RunPayloads:
    """The payloads of one stored run (or of a `window` of its requests), by hash: those read with their
    outputs (`StoredOutputs.prefetch`); the first one wanted that was not reads all of the run's (the window's)."""

    def __init__(self, store: StoreBase, run_id: int, window: list[str] | None = None):
        self.store, self.run_id, self.window = store, run_id, window
        self.blobs: dict[str, bytes] = {}
        self._all = False

    def __call__(self, payload_hash: str) -> bytes:
        if payload_hash not in self.blobs and not self._all:
            mark = self.store.placeholders(1)
            sql = ("SELECT DISTINCT payloads.hash, payloads.data FROM payloads JOIN outputs ON "
                   f"outputs.payload_hash = payloads.hash WHERE outputs.run_id = {mark}")
            with self.store.session() as s:
                for chunk in chunked(self.window):
                    among = "" if chunk is None else f" AND outputs.request_key IN ({self.store.placeholders(len(chunk))})"
                    self.blobs.update((h, bytes(data)) for h, data in self.store.select_rows(
                        s, sql + among, (self.run_id, *(chunk or ()))))
            self._all = True
        return self.blobs[payload_hash]


class StoredRequest:
    """A stored request row: its key, request hash, location, type and prompt ids (packed, compared as bytes:
    every judgement against a baseline compares them) at once; its prompt, sampling and rendering read (for
    the whole run, in one query) the first time one is wanted."""

    __slots__ = ("key", "request_hash", "location", "request_type", "prompt_ids", "_details")

    def __init__(self, key: str, request_hash: str, location: str | None, request_type: str, prompt_ids: bytes,
                 details: RequestDetails):
        self.key, self.request_hash, self.location, self.request_type = key, request_hash, location, request_type
        self.prompt_ids = prompt_ids
        self._details = details

    @property
    def prompt(self) -> str:
        return self._details(self.key)[0]

    @property
    def sampling(self) -> dict:
        return self._details(self.key)[1]

    @property
    def rendered(self) -> str:
        """The prompt as the engine saw it, as text: a chat's rendering, else the prompt itself."""
        return self._details(self.key)[2] or self.prompt


class RequestDetails:
    """The prompt, sampling and rendering of a stored run's requests (or of a `window` of them), read once
    when first wanted."""

    def __init__(self, store: StoreBase, run_id: int, window: list[str] | None = None):
        self.store, self.run_id, self.window = store, run_id, window
        self._rows: dict[str, tuple] | None = None

    def __call__(self, key: str) -> tuple:
        if self._rows is None:
            requests = Request.__table__
            q = select(requests.c.key, requests.c.prompt, requests.c.sampling,
                       requests.c.rendered).where(requests.c.run_id == self.run_id)
            self._rows = {}
            with self.store.session() as s:
                for chunk in chunked(self.window):
                    query = q if chunk is None else q.where(requests.c.key.in_(chunk))
                    self._rows.update((k, (prompt, sampling, rendered)) for k, prompt, sampling, rendered in s.execute(query))
        return self._rows[key]


def load_run(store: StoreBase, run, fingerprint: dict | RunFingerprint, only_pass: int | None = None,
             keys: list[str] | None = None) -> RunRecord:
    """A stored run for comparison: its requests and every output's digest, in two plain queries. Its
    passes; or, with `only_pass`, that pass alone (a rescoring: OWN_RESCORING, BASELINE_RESCORING). With
    `keys`, those requests only (`CHUNK` a query): what a page of a report reads of a large run."""
    details = RequestDetails(store, run.id, keys)
    mark = store.placeholders(1)
    which = "pass_index >= 0" if only_pass is None else f"pass_index = {int(only_pass)}"
    requests: dict[str, StoredRequest] = {}
    digests: dict[str, list[DigestRow]] = {}
    with store.session() as s:
        for chunk in chunked(keys):
            among = "" if chunk is None else f" AND {{column}} IN ({store.placeholders(len(chunk))})"
            params = (run.id,) if chunk is None else (run.id, *chunk)
            for key, request_hash, location, request_type, ids in store.iter_rows(
                    s, "SELECT key, request_hash, location, request_type, prompt_ids FROM requests "
                       f"WHERE run_id = {mark}{among.format(column='key')} ORDER BY id", params):
                requests[key] = StoredRequest(key, request_hash, location, request_type, bytes(ids), details)
            for pass_index, digest, cached, key in store.iter_rows(
                    s, "SELECT pass_index, digest, cached_tokens, request_key FROM outputs WHERE run_id = "
                       f"{mark} AND {which}{among.format(column='request_key')} ORDER BY request_key, pass_index", params):
                # one key string per request, and one digest string for its passes that gave one output: a
                # leaderboard-sized run has millions of rows, mostly equal passes
                outputs = digests.get(key)
                if outputs is None:
                    key = requests[key].key if key in requests else key
                    outputs = digests[key] = []
                else:
                    key = outputs[0][3]
                    if outputs[-1][1] == digest:
                        digest = outputs[-1][1]
                outputs.append((pass_index, digest, cached, key))
    return RunRecord(run=run, fingerprint=fingerprint, requests=requests,
                     outputs=StoredOutputs(store, run.id, digests, requests, only_pass, keys))
