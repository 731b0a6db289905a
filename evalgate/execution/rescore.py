"""Rescoring: generated tokens scored again as a continuation of their prompt (teacher forcing), one
prefill per request, alone and cold. What lets a baseline travel to another hardware class
(evalgate/judgement/hardware.py, docs/conditions.md "Across hardware").

Prefill and decode run different kernels, so a rescoring is only ever compared with a rescoring: the
baseline records one of its own tokens on its class; a check on another class rescores the *baseline's*
tokens here, and the two give, per position, how far the classes' numerics lie apart (the envelope) and how
close this machine comes to choosing the baseline's token where it chose another (a near tie or not).

A rescoring is stored with the run it belongs to, as outputs of a pass that is no pass of the schedule
(store/loaded.py `OWN_RESCORING`, `BASELINE_RESCORING`: negative pass indexes): nothing that judges a run's
passes reads it; `Store.load(run_id, only_pass=...)` reads one. A merged run carries its shards' rescorings.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from ..configuration.prompts import SCORING_TYPES, Prompt
from ..engines import Engine
from ..fingerprint import RunFingerprint
from ..records import Completion, unpack_ids
from ..store import BASELINE_RESCORING, OWN_RESCORING, OutputWriter, Store


@dataclass(frozen=True)
class Rescore:
    """Which rescorings a run records: its own first pass's tokens (a baseline; a cross-hardware check, so
    it can be adopted) and another run's (`of_run`: the other class's baseline, rescored on this one)."""

    own: bool = True
    of_run: int | None = None

    @property
    def count(self) -> int:
        """How many rescorings the run records (each a prefill per generating request)."""
        return int(self.own) + (self.of_run is not None)


# (request key, (prompt ids, output ids)), one request at a time: a run's are never all held as lists at once
Tokens = Iterable[tuple[str, tuple[list[int], list[int]]]]

# A rescoring's progress, told with its label: after each request it gets past (scored, reused, stored before a
# resume), then once with ended=True (requests with nothing to score were never among its tokens).
RescoreProgress = Callable[[str, bool], None]

WINDOW = 5_000  # a stored run's requests read at a time (judgement/judging.py reads by windows of this size too)

OWN_LABEL = "rescoring this run's tokens"
BASELINE_LABEL = "rescoring the baseline's tokens"


def tokens_of(completions: Mapping[str, Completion], prompt_ids: Mapping[str, Sequence[int]]) -> Tokens:
    """The generated requests' tokens (a scoring request already is a rescoring: nothing to add)."""
    return ((key, (list(prompt_ids[key]), c.output_ids.tolist())) for key, c in completions.items()
            if c.finish_reason != "scored" and c.output_ids.size)


def tokens_of_run(store: Store, run_id: int, keys: Collection[str]) -> Tokens:
    """A stored run's first-pass tokens of these requests (a shard's), with the prompt ids it ran, read a window
    of requests at a time: a leaderboard-sized baseline's passes are never held whole."""
    for window in store.request_windows(run_id, WINDOW):
        window = [key for key in window if key in keys]
        if not window:
            continue
        record = store.load(run_id, keys=window, fingerprint=RunFingerprint())
        record.prefetch(window)
        first = {}
        for key in window:
            outputs = record.outputs.get(key) or []
            if outputs and record.requests[key].request_type not in SCORING_TYPES:
                first[key] = min(outputs, key=lambda c: c.pass_index)
        yield from tokens_of(first, {key: unpack_ids(record.requests[key].prompt_ids) for key in first})


def score(engine: Engine, tokens: Tokens, salt: str | None, pass_index: int,
          done: ScoredBefore | None = None, stored: Collection[str] = ()) -> Iterator[Completion]:
    """Each request's tokens scored after its prompt, alone and cold (its own cache salt), as they come.
    `done`: rescorings of the same prompt and tokens already made on this engine, reused as they are (a
    prefill is a function of its tokens). `stored`: requests whose rescoring is stored already (a resumed
    run), skipped in their place."""
    adapters = {p.key: p.adapter for p in engine.suite.prompts if p.adapter}
    limit = engine.max_model_len - 1  # the prefill asks for one token more
    wave = 0
    for key, (prompt_ids, output_ids) in tokens:
        if key in stored:  # stored by the process this run continues: its wave is counted all the same
            wave += 1
            continue
        output_ids = output_ids[: max(0, limit - len(prompt_ids))]
        known = done.get(key, prompt_ids + output_ids) if done is not None else None
        if known is not None:
            scored = known
        elif output_ids:
            # under the request's own adapter: the same weights that chose the tokens
            prompt = replace(rescoring_prompt(key, prompt_ids, output_ids), adapter=adapters.get(key))
            scored, = engine.generate([prompt], cache_salt=f"{salt}-rescore") if salt else engine.generate([prompt])
        else:
            continue
        # each request is its own wave; a reused completion is copied, since it is stored under another pass too
        yield replace(scored, pass_index=pass_index, concurrency=1, wave=wave, position=0)
        wave += 1


def store_scored(run: RecordedRun, scored: Iterable[Completion], done: ScoredBefore | None = None) -> None:
    """Rescorings into the run's store as they come (`OutputWriter`: never a whole run's held); `done`: told
    which tokens each scored (the baseline's tokens rescored here, which this run's own may reuse)."""
    writer = OutputWriter(run.store, run.run_id)
    for completion in scored:
        writer.add([completion])
        if done is not None:
            done.tokens[completion.key] = tokens_digest(completion.prompt_ids)
    writer.flush()


def tokens_digest(tokens: Sequence[int]) -> bytes:
    """16 bytes that tell one scored token sequence from another (what `ScoredBefore` keeps per request)."""
    return hashlib.blake2b(array("q", tokens).tobytes(), digest_size=16).digest()


@dataclass
class ScoredBefore:
    """A rescoring this run stored before another (the baseline's tokens, before its own): which tokens each
    request's scored, as a digest, and its stored completions, read back a window at a time as they are
    reused. A leaderboard-sized rescoring is never held: its completions are kilobytes a request."""

    stored: Mapping[str, Completion]  # store.pass_outputs: by key, in the order the reuse asks for them
    tokens: dict[str, bytes] = field(default_factory=dict)  # key -> tokens_digest(prompt and scored ids)

    def get(self, key: str, tokens: list[int]) -> Completion | None:
        """The stored rescoring of `key` when it scored these very tokens, as the engine gave it."""
        if self.tokens.get(key) != tokens_digest(tokens):
            return None
        c = self.stored[key]
        return Completion(key, tokens, c.output_ids, c.logprobs, c.top_ids, c.top_logprobs, c.token_texts, c.text,
                          c.finish_reason, cached_tokens=c.cached_tokens, top_lengths=c.top_lengths)


def rescoring_prompt(key: str, prompt_ids: list[int], output_ids: list[int]) -> Prompt:
    """A scoring request of these tokens after this prompt (an lm-eval loglikelihood request's shape)."""
    return Prompt(key, "", None, 0, request_type="loglikelihood", segments=((tuple(prompt_ids), tuple(output_ids)),),
                  location="rescoring")


@dataclass(frozen=True)
class RecordedRun:
    """The run a rescoring belongs to, as the runner has it: where it is stored, its requests' prompt ids
    (key -> ids), its cache salt, its first pass's outputs (the tokens it rescores of its own) and, a resumed
    run, the requests each rescoring stored already (pass index -> keys)."""

    store: Store
    run_id: int
    prompt_ids: dict[str, Sequence[int]]
    salt: str | None
    first_pass: Mapping[str, Completion]
    rescored: Mapping[int, Collection[str]] = field(default_factory=dict)
    progress: RescoreProgress | None = None


def told(tokens: Tokens, progress: RescoreProgress | None, label: str) -> Tokens:
    """The tokens, telling `progress` as each request is done with (when the next is asked for), and once
    the last is."""
    if progress is None:
        yield from tokens
        return
    for item in tokens:
        yield item
        progress(label, False)
    progress(label, True)


def rescore_run(rescore: Rescore, engine: Engine, run: RecordedRun) -> None:
    """The rescorings a run records, on the engine that ran its passes (before a probe replaces it), under the
    run's cache salt."""
    done = None
    if rescore.of_run is not None:
        done = ScoredBefore(run.store.pass_outputs(run.run_id, BASELINE_RESCORING, list(run.prompt_ids)))
        tokens = told(tokens_of_run(run.store, rescore.of_run, run.prompt_ids.keys()), run.progress, BASELINE_LABEL)
        store_scored(run, score(engine, tokens, run.salt, BASELINE_RESCORING,
                                stored=run.rescored.get(BASELINE_RESCORING, ())), done)
    if rescore.own:
        # where this run chose the baseline's tokens, their rescoring here is this run's own too
        tokens = told(tokens_of(run.first_pass, run.prompt_ids), run.progress, OWN_LABEL)
        store_scored(run, score(engine, tokens, run.salt, OWN_RESCORING, done, stored=run.rescored.get(OWN_RESCORING, ())))
