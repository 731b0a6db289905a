"""What the engine produced for one request in one pass (`Completion`), and the collector a server's JSON
is turned into one with (`Positions`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .packing import output_digest
from .topk import as_floats, as_ids, rank_top, top_arrays

if TYPE_CHECKING:
    import numpy as np


@dataclass(eq=False)
class Completion:
    """What the engine produced for one request in one pass."""

    key: str
    prompt_ids: list[int]
    output_ids: np.ndarray  # (n,) integer
    logprobs: np.ndarray  # (n,) float32 or float64: the sampled token's logprob at each position
    top_ids: np.ndarray  # (rows, k) integer: per position the top-k token ids in rank order (`rank_top`)
    top_logprobs: np.ndarray  # (rows, k) float
    token_texts: list[str]  # decoded text of each output token (derived; ids are the truth)
    text: str
    finish_reason: str
    # Where it ran: filled in by the runner.
    pass_index: int = 0
    concurrency: int = 1
    wave: int = 0
    position: int = 0
    # Prompt tokens the engine served from its prefix cache (vLLM's num_cached_tokens); None: not reported.
    # Not part of the digest: it says how the output was computed, not what it is.
    cached_tokens: int | None = None
    # Entries in each top-k row when some row is shorter than k (then padded with id 0, logprob 0.0); None: all k.
    top_lengths: np.ndarray | None = None
    _digest: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.output_ids, self.logprobs = as_ids(self.output_ids), as_floats(self.logprobs)
        self.top_ids, self.top_logprobs, self.top_lengths = top_arrays(self.top_ids, self.top_logprobs, self.top_lengths)

    @property
    def digest(self) -> str:
        if self._digest is None:
            ids = self.output_ids
            if ids.dtype.itemsize > 4 and ids.size and (ids.min() < -(2**31) or ids.max() >= 2**31):
                raise ValueError(f"request {self.key!r}: a token id does not fit in 32 bits")
            self._digest = output_digest(ids.astype("<i4").tobytes(), self.logprobs.astype("<f8").tobytes())
        return self._digest

    def token_text(self, i: int) -> str | None:
        """The text of output token i; None past the last (a stored output decodes this one alone)."""
        return self.token_texts[i] if 0 <= i < len(self.token_texts) else None

    def id_at(self, i: int) -> int | None:
        """Output token i's id; None past the last."""
        return int(self.output_ids[i]) if i < self.output_ids.size else None

    def logprob_at(self, i: int) -> float | None:
        """Output token i's logprob; None past the last."""
        return float(self.logprobs[i]) if i < self.logprobs.size else None

    def top(self, position: int) -> tuple[list[int], list[float]]:
        """The top-k row of a position: its ids and logprobs, best first (without padding)."""
        n = self.top_ids.shape[1] if self.top_lengths is None else int(self.top_lengths[position])
        return self.top_ids[position, :n].tolist(), self.top_logprobs[position, :n].tolist()

    def top_rows(self) -> tuple[list[list[int]], list[list[float]]]:
        """The top-k as lists of rows (without padding): ids, logprobs."""
        rows = [self.top(i) for i in range(len(self.top_ids))]
        return [ids for ids, _ in rows], [lps for _, lps in rows]

    def margin(self, position: int) -> float | None:
        """Top-1 minus top-2 logprob at a position: small means a near-tie that numerics can flip."""
        if position >= len(self.top_ids):
            return None
        row = self.top(position)[1]
        if len(row) < 2 or row[1] == float("-inf"):
            return None
        return row[0] - row[1]


class Positions:
    """One output's positions, collected one at a time as an engine hands them over (a server's JSON):
    each token id, its logprob and the top-k row, ranked canonically (`rank_top`), so the record of a
    position never depends on the kind that produced it. `completion` turns them into arrays once."""

    def __init__(self, k: int):
        self.k = k
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.top_ids: list[list[int]] = []
        self.top_logprobs: list[list[float]] = []

    def add(self, token_id: int, logprob: float, top) -> None:
        """`top`: (token id, logprob) pairs of the position's top-k, in any order."""
        self.ids.append(int(token_id))
        self.logprobs.append(float(logprob))
        row_ids, row_logprobs = rank_top(top, self.k)
        self.top_ids.append(row_ids)
        self.top_logprobs.append(row_logprobs)

    def completion(self, key: str, prompt_ids: list[int], **fields) -> Completion:
        """The Completion of these positions; `fields`: text, token_texts, finish_reason, cached_tokens."""
        fields.setdefault("token_texts", [])
        return Completion(key=key, prompt_ids=prompt_ids, output_ids=self.ids, logprobs=self.logprobs,
                          top_ids=self.top_ids, top_logprobs=self.top_logprobs, **fields)
