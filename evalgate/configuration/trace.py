"""Traffic traces: the load a pass runs inside, replayed event by event (docs/traffic.md).

A trace is a JSONL file, one event a line:

    {"at": 0.0, "tokens": 512, "max_tokens": 32}                       a 512-token prompt of seeded words
    {"at": 0.1, "prompt": "Summarise ...", "max_tokens": 64}            a text prompt
    {"at": 0.2, "tokens": 300, "prefix": {"of": "e1", "tokens": 256},   shares e1's first 256 tokens
     "max_tokens": 16, "cancel_after": {"tokens": 4}}                   the client leaves after 4 tokens
    {"at": 0.4, "prompt_ids": [791, 3290, 12], "max_tokens": 8}        token ids (what `evalgate fuzz` writes)
    {"at": 0.5, "gated": true}                                          the suite's requests arrive here

- `at` (seconds) or `step` (engine steps), one of them throughout a trace, in non-decreasing order. The
  in-process kinds place events at engine steps (a `step`, or `at` divided by `step_seconds`); the server
  kinds send them at wall-clock offsets (a `step` times `step_seconds`).
- `cancel_after`: seconds (a number), `{"tokens": n}` (after n tokens received) or `{"steps": n}`.
- `gated: true` marks where the suite's requests run; with several markers they are split among them in
  order; with none, they arrive at the first event at or after the middle of the trace.
- `id`: how a `prefix` names the event (default `e<line>`).

No event's text is stored anywhere: a `tokens` prompt is seeded words (seed: `[load] seed`), and the
outputs of the trace's own requests are never stored.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, NamedTuple, TypeVar

from ..errors import ConfigError
from .config import check_keys, read_text

EVENT_KEYS = {"at", "step", "id", "prompt", "tokens", "prompt_ids", "prefix", "max_tokens", "cancel_after", "gated"}
MAX_TRACE_BYTES = 64 << 20
MAX_EVENTS = 100_000
DEFAULT_STEP_SECONDS = 0.02  # one decode step, for turning `at` into steps and back
WORDS = ("time year people way day man thing woman life child world school state family student group country "
         "problem hand part place case week company system program question work government number night point "
         "home water room mother area money story fact month lot right study book eye job word business issue side "
         "kind head house service friend father power hour game line end member law car city community name").split()


@dataclass(frozen=True)
class Cancel:
    """When a traffic request's client leaves: after `amount` seconds, tokens received, or engine steps.
    One rule turns it into what each placement counts (a request makes one token a step)."""

    unit: str  # "seconds" | "tokens" | "steps"
    amount: float

    def leave_step(self, step_seconds: float = DEFAULT_STEP_SECONDS) -> int | None:
        """Steps after its arrival at which a step-placed replay aborts it (None: a tokens cancel, which
        leaves when it has received its tokens)."""
        if self.unit == "tokens":
            return None
        return int(self.amount) if self.unit == "steps" else max(1, round(self.amount / step_seconds))

    def leave_seconds(self, step_seconds: float = DEFAULT_STEP_SECONDS) -> float:
        """Seconds after its arrival at which a timed replay closes it (HTTP cannot count tokens without
        streaming: a tokens or steps cancel is that many steps' seconds)."""
        return float(self.amount) if self.unit == "seconds" else self.amount * step_seconds

    def tokens_received(self, step_seconds: float = DEFAULT_STEP_SECONDS) -> int:
        """How many tokens it has when it leaves (its max_tokens caps it)."""
        return int(self.amount) if self.unit == "tokens" else self.leave_step(step_seconds)

    def to_json(self) -> float | dict[str, int]:
        return self.amount if self.unit == "seconds" else {self.unit: int(self.amount)}


@dataclass(frozen=True)
class Event:
    """One line of a trace. `offset` is in the trace's unit (`unit`: "at" seconds or "step" steps)."""

    line: int = field(compare=False)  # where it was read (0: made by evalgate), for messages only
    id: str
    offset: float
    gated: bool = False
    prompt: str | None = None
    tokens: int | None = None
    prompt_ids: tuple[int, ...] | None = None
    prefix_of: str | None = None
    prefix_tokens: int = 0
    max_tokens: int = 0
    cancel: Cancel | None = None  # when its client leaves (None: it runs to max_tokens)

    @property
    def cancels(self) -> bool:
        return self.cancel is not None

    def to_json(self, unit: str) -> dict[str, Any]:
        """The event as a trace line (what `load_trace` reads back)."""
        doc: dict[str, Any] = {unit: int(self.offset) if unit == "step" else self.offset, "id": self.id}
        if self.gated:
            return {**doc, "gated": True}
        if self.prompt is not None:
            doc["prompt"] = self.prompt
        elif self.prompt_ids is not None:
            doc["prompt_ids"] = list(self.prompt_ids)
        else:
            doc["tokens"] = self.tokens
        if self.prefix_of is not None:
            doc["prefix"] = {"of": self.prefix_of, "tokens": self.prefix_tokens}
        doc["max_tokens"] = self.max_tokens
        if self.cancel is not None:
            doc["cancel_after"] = self.cancel.to_json()
        return doc


@dataclass(frozen=True)
class Trace:
    events: tuple[Event, ...]
    unit: str = "at"  # "at" (seconds) | "step"
    source: str = ""  # where it came from, for messages

    @property
    def traffic(self) -> list[Event]:
        return [e for e in self.events if not e.gated]

    def with_events(self, events: list[Event]) -> Trace:
        """This trace with other events, in offset order. An event that shares a prefix never arrives before
        the event it shares it with (it is moved to that event's offset), so the trace stays writable."""
        by_id = {e.id: e for e in events}

        def depth(e: Event) -> int:
            return 0 if e.prefix_of not in by_id else 1 + depth(by_id[e.prefix_of])

        for e in sorted(events, key=depth):
            source = by_id.get(e.prefix_of) if e.prefix_of else None
            if source is not None and source.offset > e.offset:
                by_id[e.id] = replace(e, offset=source.offset)
        ordered = sorted(by_id.values(), key=lambda e: (e.offset, depth(e)))
        return replace(self, events=tuple(ordered))

    def keeping(self, events: list[Event]) -> Trace:
        """This trace with only `events` of its traffic (by id: an event may be a changed copy of its own), in
        this trace's order, every gated marker where it stands (a subset replays in the same arrival order)."""
        by_id = {e.id: e for e in events}
        return replace(self, events=tuple(e if e.gated else by_id[e.id] for e in self.events
                                          if e.gated or e.id in by_id))

    def step_of(self, event: Event, step_seconds: float = DEFAULT_STEP_SECONDS) -> int:
        return int(event.offset) if self.unit == "step" else int(round(event.offset / step_seconds))

    def seconds_of(self, event: Event, step_seconds: float = DEFAULT_STEP_SECONDS) -> float:
        return event.offset * step_seconds if self.unit == "step" else event.offset

    @property
    def digest(self) -> str:
        """SHA-256 of the events as evalgate reads them (the same trace written differently: the same digest)."""
        import hashlib

        return hashlib.sha256(self.to_jsonl().encode()).hexdigest()

    def to_jsonl(self) -> str:
        return "".join(json.dumps(e.to_json(self.unit)) + "\n" for e in self.events)

    def summary(self) -> dict[str, Any]:
        traffic = self.traffic
        return {"events": len(traffic), "cancels": sum(e.cancels for e in traffic),
                "gated_markers": len(self.events) - len(traffic), "unit": self.unit}


def load_trace(path: Path) -> Trace:
    """A trace file, checked line by line: every mistake a ConfigError naming the line and the field."""
    text = read_text(path, MAX_TRACE_BYTES, "trace file", too_large="keep a trace under 64 MiB (lengths, not texts)",
                     missing="set [load] trace (or --trace) to an existing JSONL file, or write one with "
                             "`evalgate trace convert`")
    return parse_trace(text.splitlines(), str(path))


def parse_trace(lines: list[str], source: str) -> Trace:
    events: list[Event] = []
    ids: dict[str, Event] = {}
    unit = None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        try:
            doc = json.loads(line)
        except ValueError as exc:
            raise ConfigError(f"{where}: not JSON ({exc})", fix="write one JSON object per line") from None
        if not isinstance(doc, dict):
            raise ConfigError(f"{where}: an event must be a JSON object, got {type(doc).__name__}",
                              fix='e.g. {"at": 0.5, "tokens": 128, "max_tokens": 16}')
        event = parse_event(doc, where, number, ids)
        mine = "at" if "at" in doc else "step"
        if unit is None:
            unit = mine
        elif mine != unit:
            raise ConfigError(f"{where}: `{mine}` in a trace whose first event uses `{unit}`",
                              fix=f"give every event `{unit}` (seconds and steps do not mix)")
        if events and event.offset < events[-1].offset:
            raise ConfigError(f"{where}: `{unit}` = {event.offset:g} is before line {events[-1].line}'s "
                              f"{events[-1].offset:g}: offsets are not sorted",
                              fix=f"sort the trace by `{unit}` (e.g. `sort` the events in the converter)")
        if len(events) >= MAX_EVENTS:
            raise ConfigError(f"{where}: more than {MAX_EVENTS} events", fix="replay a shorter window of the traffic")
        events.append(event)
        ids[event.id] = event
    if not any(not e.gated for e in events):
        raise ConfigError(f"{source}: the trace has no traffic events", fix="add events with a prompt or `tokens`")
    return Trace(tuple(events), unit or "at", source)


def _whole(value: Any, where: str, field: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{where}: `{field}` must be an integer >= {minimum}, got {value!r}",
                          fix=f"set `{field}` to a whole number of at least {minimum}")
    return value


def _seconds(value: Any, where: str, field: str, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0 \
            or (positive and value == 0):
        raise ConfigError(f"{where}: `{field}` must be a finite number of seconds {'> 0' if positive else '>= 0'}, "
                          f"got {value!r}", fix=f"set `{field}` to seconds, e.g. 0.5")
    return float(value)


def parse_event(doc: dict, where: str, line: int, earlier: dict[str, Event]) -> Event:
    check_keys(doc, EVENT_KEYS, where, "")
    if ("at" in doc) == ("step" in doc):
        raise ConfigError(f"{where}: an event needs exactly one of `at` (seconds) and `step`",
                          fix='e.g. "at": 0.25')
    offset = _seconds(doc["at"], where, "at") if "at" in doc else float(_whole(doc["step"], where, "step", 0))
    event_id = doc.get("id", f"e{line}")
    if not isinstance(event_id, str) or not event_id:
        raise ConfigError(f"{where}: `id` must be a non-empty string, got {event_id!r}", fix='e.g. "id": "long-1"')
    if event_id in earlier:
        raise ConfigError(f"{where}: `id` {event_id!r} is also line {earlier[event_id].line}'s", fix="give every event its own id")
    if doc.get("gated", False) is not False:
        if doc["gated"] is not True:
            raise ConfigError(f"{where}: `gated` must be true, got {doc['gated']!r}", fix="write `\"gated\": true` or leave it out")
        extra = sorted(set(doc) - {"at", "step", "id", "gated"})
        if extra:
            raise ConfigError(f"{where}: a gated marker takes no `{extra[0]}`: the suite's requests bring their own",
                              fix=f"remove `{extra[0]}` from the marker, or make it a traffic event (no `gated`)")
        return Event(line, event_id, offset, gated=True)
    if sum(k in doc for k in ("prompt", "tokens", "prompt_ids")) != 1:
        raise ConfigError(f"{where}: an event needs exactly one of `prompt` (text), `tokens` (a length) and "
                          "`prompt_ids` (token ids)", fix='e.g. "tokens": 256 (seeded words), or "prompt": "..."')
    prompt_ids = doc.get("prompt_ids")
    if prompt_ids is not None:
        if not isinstance(prompt_ids, list) or not prompt_ids or not all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt_ids):
            raise ConfigError(f"{where}: `prompt_ids` must be a non-empty list of token ids (integers >= 0)",
                              fix="write the ids as the model's tokenizer gives them, or use `tokens`")
        prompt_ids = tuple(prompt_ids)
    prompt = doc.get("prompt")
    if prompt is not None and (not isinstance(prompt, str) or not prompt):
        raise ConfigError(f"{where}: `prompt` must be a non-empty string", fix="write the prompt text, or use `tokens`")
    tokens = _whole(doc["tokens"], where, "tokens", 1) if "tokens" in doc else None
    if "max_tokens" not in doc:
        raise ConfigError(f"{where}: `max_tokens` is missing", fix='add "max_tokens": the tokens this request generates')
    max_tokens = _whole(doc["max_tokens"], where, "max_tokens", 1)
    prefix_of, prefix_tokens = None, 0
    if "prefix" in doc:
        prefix = doc["prefix"]
        if tokens is None:
            raise ConfigError(f"{where}: `prefix` needs a `tokens` prompt", fix="use `tokens` (the whole prompt's length)")
        if not isinstance(prefix, dict) or set(prefix) != {"of", "tokens"}:
            raise ConfigError(f"{where}: `prefix` must be {{\"of\": <an earlier event's id>, \"tokens\": n}}",
                              fix='e.g. "prefix": {"of": "e1", "tokens": 128}')
        prefix_of = prefix["of"]
        if prefix_of not in earlier or earlier[prefix_of].gated:
            raise ConfigError(f"{where}: `prefix.of` {prefix_of!r} is not an earlier traffic event's id",
                              fix="name an event on an earlier line (ids default to e<line>)")
        if earlier[prefix_of].prompt is not None:
            raise ConfigError(f"{where}: `prefix.of` {prefix_of!r} is a text prompt: a prefix is shared in tokens",
                              fix="share the prefix of a `tokens` or `prompt_ids` event")
        prefix_tokens = _whole(prefix["tokens"], where, "prefix.tokens", 1)
        source = earlier[prefix_of]
        shared = source.tokens if source.prompt_ids is None else len(source.prompt_ids)
        if prefix_tokens > tokens or (shared is not None and prefix_tokens > shared):
            raise ConfigError(f"{where}: `prefix.tokens` = {prefix_tokens} is longer than "
                              f"{'this prompt' if prefix_tokens > tokens else repr(prefix_of)}",
                              fix="share at most the shorter prompt's length")
    cancel = None
    if "cancel_after" in doc:
        after = doc["cancel_after"]
        if isinstance(after, dict):
            if len(after) != 1 or next(iter(after)) not in ("tokens", "steps"):
                raise ConfigError(f"{where}: `cancel_after` must be seconds, {{\"tokens\": n}} or {{\"steps\": n}}",
                                  fix='e.g. "cancel_after": {"tokens": 4}')
            (unit, count), = after.items()
            leave = _whole(count, where, f"cancel_after.{unit}", 1)
            if leave >= max_tokens:  # one token per step: both end with the request's last token
                raise ConfigError(f"{where}: `cancel_after.{unit}` = {leave} is after the end: the request "
                                  f"finishes at max_tokens = {max_tokens}",
                                  fix=f"cancel after fewer than {max_tokens} {unit}, or remove `cancel_after`")
            cancel = Cancel(unit, leave)
        else:
            cancel = Cancel("seconds", _seconds(after, where, "cancel_after", positive=True))
    return Event(line, event_id, offset, prompt=prompt, tokens=tokens, prompt_ids=prompt_ids, prefix_of=prefix_of,
                 prefix_tokens=prefix_tokens, max_tokens=max_tokens, cancel=cancel)


# --- what a replay submits ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TraceRequest:
    """One traffic request, ready for an engine: its prompt ids (or text), when it arrives, when it leaves."""

    id: str
    step: int
    seconds: float
    prompt_ids: tuple[int, ...] | None
    text: str | None
    max_tokens: int
    cancel: Cancel | None

    @property
    def cancels(self) -> bool:
        return self.cancel is not None


@lru_cache(maxsize=8)
def word_ids(encode: Callable[[str], list[int]], seed: int, size: int = 4096) -> tuple[int, ...]:
    """A pool of token ids of seeded words: `tokens` prompts are windows of it (encoded once per engine and
    seed, not once per replay: a server kind encodes over HTTP)."""
    rng = random.Random(seed)
    ids: list[int] = []
    while len(ids) < size:
        ids += encode(" ".join(rng.choice(WORDS) for _ in range(512)))
    return tuple(ids)


def materialize(trace: Trace, encode: Callable[[str], list[int]], seed: int,
                step_seconds: float = DEFAULT_STEP_SECONDS) -> list[TraceRequest]:
    """The trace's traffic as engine requests: a `tokens` prompt is a seeded window of word ids (the same
    for the same seed and event id, on every machine with this tokenizer), a `prefix` starts with its
    event's first tokens."""
    pool = word_ids(encode, seed)
    by_id = {e.id: e for e in trace.traffic}
    ids_of: dict[str, tuple[int, ...] | None] = {}

    def ids(e: Event) -> tuple[int, ...] | None:  # memoized: a prefix's event may arrive later (mutations move events)
        if e.id not in ids_of:
            if e.prompt_ids is not None or e.tokens is None:
                ids_of[e.id] = e.prompt_ids
            else:
                rng = random.Random(f"{seed}:{e.id}")
                start = rng.randrange(len(pool))
                own = [pool[(start + i) % len(pool)] for i in range(e.tokens - e.prefix_tokens)]
                shared = list(ids(by_id[e.prefix_of]) or ())[: e.prefix_tokens] if e.prefix_of else []
                ids_of[e.id] = tuple(shared + own)
        return ids_of[e.id]

    requests = [TraceRequest(e.id, trace.step_of(e, step_seconds), trace.seconds_of(e, step_seconds), ids(e), e.prompt,
                             e.max_tokens, e.cancel) for e in trace.traffic]
    return requests


class Place(NamedTuple):
    """Where a gated request arrives: its step, its offset in seconds, and its place among the trace's events
    (a request arrives after the events before its marker in the trace, and before those after it)."""

    step: int
    seconds: float
    position: int  # the marker's index in `trace.events` (past the last one: after every event of its step)


def gated_places(trace: Trace, count: int, step_seconds: float = DEFAULT_STEP_SECONDS) -> list[Place]:
    """Where each of `count` gated requests arrives: split in order among the markers, each at its marker's
    line (so a marker between two events of one step arrives between them, as the repro pack's plain script
    replays it); with no marker, all of them after the first event at or after the middle of the trace and
    every other event of that step."""
    markers = [(i, e) for i, e in enumerate(trace.events) if e.gated]
    if not markers:
        traffic = trace.traffic
        middle = (traffic[0].offset + traffic[-1].offset) / 2
        markers = [(len(trace.events), next(e for e in traffic if e.offset >= middle))]
    places = []
    for i in range(count):
        position, marker = markers[i * len(markers) // max(count, 1)]
        places.append(Place(trace.step_of(marker, step_seconds), trace.seconds_of(marker, step_seconds), position))
    return places


Gated = TypeVar("Gated")


def arrival_order(trace: Trace, requests: list[TraceRequest], gated: list[Gated],
                  step_seconds: float = DEFAULT_STEP_SECONDS) -> list[tuple[int, TraceRequest | Gated]]:
    """A step-placed replay's requests as (step, request) in the order they are added: by step, then by line
    in the trace, each gated request at its marker's line (several at one marker in their own order). The one
    rule for the replay (execution/replay.py) and for a trace that fixes it in place (fuzz's `isolate`), and
    the one the repro pack's plain script follows."""
    line = {e.id: i for i, e in enumerate(trace.events)}
    placed: list[tuple[int, int, int, Any]] = [(r.step, line[r.id], i, r) for i, r in enumerate(requests)]
    placed += [(place.step, place.position, len(requests) + i, g)
               for i, (g, place) in enumerate(zip(gated, gated_places(trace, len(gated), step_seconds)))]
    placed.sort(key=lambda a: a[:3])
    return [(step, item) for step, _, _, item in placed]


# --- a user's log, as a trace -------------------------------------------------------------------------------

TIME_FIELDS = ("timestamp", "time", "ts", "arrival")
PROMPT_FIELDS = ("prompt_tokens", "input_tokens", "prompt_len", "input_len")
OUTPUT_FIELDS = ("output_tokens", "completion_tokens", "output_len", "generated_tokens")


def convert_log(path: Path) -> Trace:
    """A trace from a simple log of the user's traffic (JSONL or CSV with a header): a timestamp (epoch
    seconds or ISO 8601), a prompt length and an output length per request. Lengths only: no text is read
    into the trace, so none is ever stored."""
    import csv
    import datetime

    text = read_text(path, MAX_TRACE_BYTES, "log", too_large="convert a shorter window of the log",
                     missing="pass the path of an existing log (JSONL or CSV)")
    lines = text.splitlines()
    first = next((ln for ln in lines if ln.strip()), "")
    rows: list[tuple[int, dict]] = []
    if first.lstrip().startswith("{"):
        for number, line in enumerate(lines, 1):
            if line.strip():
                try:
                    rows.append((number, json.loads(line)))
                except ValueError as exc:
                    raise ConfigError(f"{path}:{number}: not JSON ({exc})", fix="one JSON object per line, or a CSV") from None
    else:
        try:  # a spreadsheet's export in a locale whose decimal mark is the comma separates with `;`
            dialect = csv.Sniffer().sniff(first, delimiters=",;\t|")
        except csv.Error:  # one column: nothing to tell
            dialect = csv.excel
        rows = [(n + 2, row) for n, row in enumerate(csv.DictReader(lines, dialect=dialect))]
    if not rows:
        raise ConfigError(f"{path}: the log is empty", fix="give one request per line")

    def field(row: dict, names: tuple[str, ...], where: str):
        for name in names:
            if name in row and row[name] not in (None, ""):
                return row[name]
        raise ConfigError(f"{where}: no {names[0]} (looked for {', '.join(names)})",
                          fix=f"name the column {names[0]}")

    entries = []
    for number, row in rows:
        where = f"{path}:{number}"
        if not isinstance(row, dict):
            raise ConfigError(f"{where}: not an object", fix="one JSON object per line")
        stamp = field(row, TIME_FIELDS, where)
        try:
            seconds = float(stamp)
        except (TypeError, ValueError):
            try:
                seconds = datetime.datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
            except ValueError:
                raise ConfigError(f"{where}: timestamp {stamp!r} is neither epoch seconds nor ISO 8601",
                                  fix="write e.g. 1733216400.25 or 2026-12-03T09:00:00.250Z") from None
        lengths = []
        for names in (PROMPT_FIELDS, OUTPUT_FIELDS):
            value = field(row, names, where)
            try:
                number_ = int(value)
            except (TypeError, ValueError):
                number_ = -1
            if number_ < 1:
                raise ConfigError(f"{where}: `{names[0]}` must be a positive integer, got {value!r}", fix="give token counts")
            lengths.append(number_)
        entries.append((seconds, number, *lengths))
    entries.sort()
    start = entries[0][0]
    events = [Event(i + 1, f"e{i + 1}", round(seconds - start, 6), tokens=prompt, max_tokens=output)
              for i, (seconds, _, prompt, output) in enumerate(entries)]
    return Trace(tuple(events), "at", str(path))


__all__ = ["DEFAULT_STEP_SECONDS", "Cancel", "Event", "Place", "Trace", "TraceRequest", "arrival_order", "convert_log", "gated_places",
           "load_trace", "materialize", "parse_trace"]


# How a replay places a trace's events (evalgate/execution/replay.py): between engine steps, or at offsets in seconds
EXACT, TIMED = "step", "timed"


def replay_stats(trace: Trace, placement: str) -> dict[str, Any]:
    """What a replay did: sent, completed, cancelled (as the trace says), failed, and once the last gated
    request finished, `stopped` (still running: aborted) and `unsent` (not yet due)."""
    return {"placement": placement, "trace": trace.summary(), "sent": 0, "completed": 0, "cancelled": 0,
            "failed": 0, "stopped": 0, "unsent": 0, "gated_arrivals": []}
