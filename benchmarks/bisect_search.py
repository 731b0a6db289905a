"""How many trials (engine runs) the bisect searches need against a naive search, by simulation: the
predicate is a known set of culprits, so this measures the search strategies themselves (ddmin for
`bisect config` and the neighbour set of `bisect batch`, git's binary search for `bisect commits`), not
the engine. Prints a table; not a test. The end-to-end counts on real engines are in docs/bisect.md.

    .venv/bin/python benchmarks/bisect_search.py
"""

from __future__ import annotations

import itertools
import math
import random

from evalgate.bisect.ddmin import ddmin, naive_trials


def ddmin_trials(n: int, culprits: set[int]) -> int:
    calls = 0

    def fails(subset):
        nonlocal calls
        calls += 1
        return culprits <= set(subset)

    found, _ = ddmin(list(range(n)), fails)
    assert set(found) == culprits
    return calls


def main() -> None:
    rng = random.Random(0)
    print("settings/neighbours n | culprits k | ddmin trials (mean, max over placements) | naive, worst case (every subset up to size k)")
    for n in (2, 4, 8, 16, 32, 64):
        for k in (1, 2):
            if k > n:
                continue
            placements = list(itertools.combinations(range(n), k))
            if len(placements) > 200:
                placements = rng.sample(placements, 200)
            counts = [ddmin_trials(n, set(p)) for p in placements]
            print(f"{n:>21} | {k:>10} | {sum(counts) / len(counts):>17.1f}, {max(counts):>3}"
                  f"{'':>18} | {naive_trials(n, k)}")
    print()
    print("commits in range | binary search steps (git bisect) | linear scan (worst)")
    for commits in (8, 32, 128, 1024):
        print(f"{commits:>16} | {math.ceil(math.log2(commits)):>32} | {commits}")


if __name__ == "__main__":
    main()
