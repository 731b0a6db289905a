"""Delta debugging (Zeller & Hildebrandt's ddmin): a 1-minimal subset of changes that still fails.

`fails(subset)` runs a trial and says whether the subset reproduces the failure. The caller has checked
that the whole set fails and the empty set does not. Each distinct subset is tried at most once (trials
cost an engine run). The result is 1-minimal: removing any single element makes it pass.
"""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

T = TypeVar("T")


class BudgetExhausted(Exception):
    """Raised by a trial when the bisect's max-steps or max-seconds bound is reached."""


def ddmin(items: Sequence[T], fails: Callable[[list[T]], bool]) -> tuple[list[T], bool]:
    """(smallest failing subset found, whether it is proven 1-minimal). With a budget that runs out,
    the subset is still a failing one, just not proven minimal."""
    current = list(items)
    tried: dict[frozenset[int], bool] = {}
    index = {id(item): i for i, item in enumerate(current)}

    def test(subset: list[T]) -> bool:
        signature = frozenset(index[id(item)] for item in subset)
        if signature not in tried:
            tried[signature] = fails(subset)
        return tried[signature]

    granularity = 2
    try:
        while len(current) >= 2:
            chunks = _split(current, granularity)
            for chunk in chunks:  # a single chunk fails on its own: zoom in
                if test(chunk):
                    current, granularity = chunk, 2
                    break
            else:
                for chunk in chunks if granularity > 2 else []:  # (with 2 chunks, complements are the chunks)
                    complement = [item for item in current if all(item is not c for c in chunk)]
                    if test(complement):
                        current, granularity = complement, max(granularity - 1, 2)
                        break
                else:
                    if granularity >= len(current):
                        break  # every single element is needed
                    granularity = min(len(current), granularity * 2)
    except BudgetExhausted:
        return current, False
    return current, True


def _split(items: list[T], parts: int) -> list[list[T]]:
    size, extra = divmod(len(items), parts)
    chunks, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        chunks.append(items[start:end])
        start = end
    return [c for c in chunks if c]


def naive_trials(count: int, minimal_size: int) -> int:
    """Trials an exhaustive search needs to find a smallest failing subset of `count` items: every subset
    of size 1, 2, ... up to the size found (the figure bisect notes compare against)."""
    from math import comb

    return sum(comb(count, size) for size in range(1, minimal_size + 1))
