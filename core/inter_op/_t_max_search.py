"""The stage DP's search over `t_max`, the bound on every stage's time, and the layouts it proposes.

The closed form `sum(t_i + u_i) + (B - 1) * max(t_i)` ranks layouts fast but
not exactly (it adds the updates in series, and knows nothing of what stages
share); so besides its best layout the search hands on the best it found for
each stage count, for the step simulator to price.
"""

from __future__ import annotations

import dataclasses
import math


def search_t_max(problem, candidates, lo, runs, tolerance, on_candidate):
    """Branch and bound over the sorted `t_max` candidates from index `lo`.

    The least sum V(t) under a bound t never grows with t, so between two
    tried candidates a < i < b the objective V(c_i) + (B - 1) c_i is at least
    V(c_b) + (B - 1) c_{a+1}.  An interval whose bound cannot beat the best
    found (divided by 1 + tolerance) is dropped untried; the others are split
    at their middle, lowest t first.  Exact at tolerance 0: it returns what
    trying every candidate would.  `runs` holds the results already known
    (the loosest candidate's and the feasibility bisection's); it gains the new ones.
    """
    slope = problem.num_microbatches - 1
    top = candidates.size - 1
    if lo not in runs:
        runs[lo] = problem.run(float(candidates[lo]))
    tried = len(runs)

    def better(best: Best, index: int) -> Best:
        t_max = float(candidates[index])
        objective = runs[index].value + slope * t_max
        return Best(objective, t_max, runs[index].n_total) if objective < best.objective else best

    best = Best(math.inf, math.inf, None)
    for index in sorted(runs):
        best = better(best, index)
    pending = [(lo, top)] if lo != top else []
    while pending:
        a, b = pending.pop()
        if b - a < 2 or runs[b].value + slope * float(candidates[a + 1]) >= best.objective / (1 + tolerance):
            continue
        mid = (a + b) // 2
        if mid not in runs:
            runs[mid] = problem.run(float(candidates[mid]))
            tried += 1
        best = better(best, mid)
        if on_candidate is not None:
            on_candidate(tried, candidates.size)
        pending += [(mid, b), (a, mid)]  # the lower half first: small t_max is where B-1 weighs
    return best, tried


@dataclasses.dataclass(frozen=True)
class Best:
    objective: float
    t_max: float
    n_total: int | None


def propose_layouts(problem, candidates, runs, best: "Best", limit: int) -> list[tuple[float, int]]:
    """Up to `limit` (t_max, stage count) pairs, the closed form's best first, then the best tried run of
    each other stage count in the closed form's order.

    Every pair is one layout the DP traces back; the branch and bound has tried only the candidates
    that could win under the closed form, so a stage count's best is the best among those."""
    slope = problem.num_microbatches - 1
    per_count: dict[int, tuple[float, float]] = {}
    for index, run in runs.items():
        t_max = float(candidates[index])
        for count, value in run.by_stages.items():
            objective = value + slope * t_max
            if count not in per_count or objective < per_count[count][0]:
                per_count[count] = (objective, t_max)
    chosen = [(best.t_max, best.n_total)]
    for count, (_, t_max) in sorted(per_count.items(), key=lambda item: item[1][0]):
        if len(chosen) >= limit:
            break
        if count != best.n_total:
            chosen.append((t_max, count))
    return chosen
