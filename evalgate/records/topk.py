"""Arrays as the engines hand them over: ids and logprobs as 1-D arrays, and the top-k as (positions, k)
arrays ranked canonically (`rank_top`), so the record of a position never depends on the engine's kernel.

numpy is imported by the functions that use it: the store imports this package, and `evalgate --help` and
`evalgate runs list` start without numpy (tests/e2e/test_cli_start.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


def as_ids(values) -> np.ndarray:
    """Token ids as a 1-D integer array: an int32, int64 or uint16 array as it is, anything else (a list, a
    tensor, another integer type) as int64."""
    import numpy as np

    ids = np.asarray(values)
    if ids.dtype not in (np.int32, np.int64, np.uint16):
        ids = ids.astype(np.int64)
    return ids.reshape(-1)


def as_floats(values) -> np.ndarray:
    """Logprobs as a 1-D float32 or float64 array (other float types widened to float64, exactly)."""
    import numpy as np

    floats = np.asarray(values)
    if floats.dtype not in (np.float32, np.float64):
        floats = floats.astype(np.float64)
    return floats.reshape(-1)


def top_arrays(ids, logprobs, lengths=None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The top-k as (rows, k) id and logprob arrays and each row's length (None: every row has k). Takes
    arrays, or lists of rows of any lengths (padded here with id 0 and logprob 0.0, as in the payload)."""
    import numpy as np

    if isinstance(ids, np.ndarray) and ids.ndim == 2:
        top_ids, top_lps = ids, as_floats(logprobs).reshape(ids.shape)
        if lengths is not None:  # canonical: as wide as the longest row, zeros past each row's end
            lengths = np.asarray(lengths, dtype=np.int64)
            width = int(lengths.max(initial=0))
            top_ids, top_lps = top_ids[:, :width], top_lps[:, :width]
            padding = np.arange(width) >= lengths[:, None]
            if padding.any():
                top_ids = np.where(padding, 0, top_ids)
                top_lps = np.where(padding, 0.0, top_lps).astype(top_lps.dtype)
        elif not len(top_ids):
            top_ids, top_lps = top_ids[:, :0], top_lps[:, :0]
    else:  # rows: lists or 1-D arrays, possibly of different lengths
        rows_ids, rows_lps = list(ids), list(logprobs)
        lengths = np.array([len(row) for row in rows_ids], dtype=np.int64)
        k = int(lengths.max(initial=0))
        top_ids = np.zeros((len(rows_ids), k), dtype=np.int64)
        top_lps = np.zeros((len(rows_ids), k), dtype=np.float64)
        for i, (row_ids, row_lps) in enumerate(zip(rows_ids, rows_lps)):
            top_ids[i, : len(row_ids)] = row_ids
            top_lps[i, : len(row_lps)] = row_lps
    if lengths is not None and (len(lengths) == 0 or (lengths == top_ids.shape[1]).all()):
        lengths = None
    return top_ids, top_lps, lengths


def rank_top(entries, k: int) -> tuple[list[int], list[float]]:
    """The top-k of one position as recorded: (token id, logprob) pairs, each id once, by logprob
    descending and, between exactly equal logprobs, by token id. Engines break such ties in whatever
    order their top-k kernel returns them (two processes on one model were seen to differ), so the
    record never depends on it."""
    best: dict[int, float] = {}
    for token_id, logprob in entries:
        best.setdefault(int(token_id), float(logprob))
    ranked = sorted(best.items(), key=lambda item: (-item[1], item[0]))[:k]
    return [t for t, _ in ranked], [lp for _, lp in ranked]


def rank_top_rows(ids, logprobs, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """`rank_top` for every position at once: `ids` and `logprobs` are (positions, entries) arrays (vLLM's
    flat logprobs: the sampled token, then its top-k). Returns the (positions, k) top-k arrays and the
    row lengths (None when every row has k distinct ids)."""
    import numpy as np

    ids, logprobs = np.asarray(ids), np.asarray(logprobs)
    rows, width = ids.shape
    # an id seen earlier in its row is a repeat (rank_top keeps an id's first entry): mark it
    by_id = np.lexsort((np.broadcast_to(np.arange(width), ids.shape), ids), axis=1)
    sorted_ids = np.take_along_axis(ids, by_id, axis=1)
    repeat_sorted = np.zeros(ids.shape, dtype=bool)
    repeat_sorted[:, 1:] = sorted_ids[:, 1:] == sorted_ids[:, :-1]
    repeat = np.empty_like(repeat_sorted)
    np.put_along_axis(repeat, by_id, repeat_sorted, axis=1)
    # first entries by logprob descending, then id; repeats last
    order = np.lexsort((ids, -logprobs, repeat), axis=1)[:, :k]
    top_ids, top_lps = np.take_along_axis(ids, order, axis=1), np.take_along_axis(logprobs, order, axis=1)
    lengths = np.minimum((~repeat).sum(axis=1), k)
    return top_arrays(top_ids, top_lps, lengths)
