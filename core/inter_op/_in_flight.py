"""How many microbatches' activations each stage keeps at once: each schedule's own memory rule.

The stage DP, the interleaving pass and the plan's memory breakdown all
price a stage's activations by this count, so it lives in one place.
"""

from __future__ import annotations

import functools

from alpaviz.core.plan import INTERLEAVED, ScheduleKind, build_instructions, max_live_microbatches


def in_flight(stage: int, num_stages: int, num_microbatches: int, schedule: ScheduleKind, chunks: int = 1) -> int:
    """Microbatches whose activations stage `stage` of `num_stages` keeps at once.

    GPipe keeps every microbatch; 1F1B min(n - i, m) on stage i; ZB-H1
    min(n, m) on every stage (a later stage's W's wait longer); interleaved
    1F1B what its submesh's order holds (counted from the order itself).
    """
    if schedule == INTERLEAVED:
        return _interleaved_in_flight(num_stages, num_microbatches, chunks)[stage]
    if schedule == "gpipe":
        return num_microbatches
    if schedule == "zb-h1":
        return min(num_stages, num_microbatches)
    return min(num_stages - stage, num_microbatches)


@functools.lru_cache(maxsize=64)
def _interleaved_in_flight(num_stages: int, num_microbatches: int, chunks: int) -> tuple[int, ...]:
    """Each stage's peak of microbatches in flight under interleaved 1F1B, read from its submesh's list."""
    lists = build_instructions(INTERLEAVED, num_stages, num_microbatches, chunks=chunks)
    return tuple(max_live_microbatches(lists[j % len(lists)], j) for j in range(num_stages))
