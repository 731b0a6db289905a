"""A completion read back from the store: its tokens fetched and decoded the first time anything reads them."""

from __future__ import annotations

from functools import cached_property

from .completion import Completion
from .packing import unpack_ids
from .payload import payload_view


class _FromPayload:
    """An attribute of a stored completion, read from its decoded payload the first time and then kept in
    the instance (like functools.cached_property, without its per-read lock: a judgement reads thousands)."""

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        value = instance.__dict__[self.name] = getattr(instance.view, self.name)
        return value


class _PayloadRead:
    """A stored completion's `PayloadView`, read the first time and then kept in the instance: a judgement
    reads thousands, so no lock (functools.cached_property has one in Python 3.11) and no call after the first."""

    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        view = instance.__dict__["view"] = payload_view(instance._fetch_payload(instance.payload_hash))
        return view


class StoredCompletion(Completion):
    """A completion read back from the store. Its place, digest and finish reason are there at once; its
    tokens are fetched (`fetch_payload(payload_hash)` -> the blob) and decoded, as arrays that view the
    blob, the first time anything reads them; its prompt ids come from its `request` row."""

    def __init__(self, key: str, payload_hash: str, fetch_payload, digest: str, finish_reason: str, *,
                 pass_index: int, concurrency: int, wave: int, position: int, cached_tokens: int | None, request):
        self.key, self.finish_reason, self._digest = key, finish_reason, digest
        self.pass_index, self.concurrency, self.wave, self.position = pass_index, concurrency, wave, position
        self.cached_tokens = cached_tokens
        self.payload_hash, self._fetch_payload, self._request = payload_hash, fetch_payload, request

    view = _PayloadRead()  # the payload, read (once) and its header parsed; arrays and texts made when read

    @cached_property
    def prompt_ids(self) -> list[int]:
        return unpack_ids(self._request.prompt_ids) if self._request is not None else []

    output_ids = _FromPayload()
    logprobs = _FromPayload()
    top_ids = _FromPayload()
    top_logprobs = _FromPayload()
    top_lengths = _FromPayload()
    token_texts = _FromPayload()
    text = _FromPayload()

    # single values read in place: a divergence reads a few of an output it never decodes
    def token_text(self, i: int) -> str | None:
        return self.view.token_text(i)

    def id_at(self, i: int) -> int | None:
        return self.view.id_at(i)

    def logprob_at(self, i: int) -> float | None:
        return self.view.logprob_at(i)

    def margin(self, position: int) -> float | None:
        return self.view.margin(position)
