"""The plan is the fastest simulated step among the layouts the stage DP proposes.

The DP's closed form ranks layouts cheaply; the step simulator prices a
layout as the runtime will run it.  A layout is simulated only when a bound
says it could still win: every stage runs `B` microbatches of its forward and
backward, at best at the fastest rate its devices reach (the cores' speedup
with one device busy), so no step ends before the busiest stage's work.
"""

from __future__ import annotations

from typing import Callable, Sequence

from alpaviz.core.inter_op._setup import SolveSetup
from alpaviz.core.inter_op._stage_dp import StageSolution
from alpaviz.core.plan import Plan


def work_bound_s(setup: SolveSetup, proposal: StageSolution, num_microbatches: int) -> float:
    """A lower bound on the simulated step of `proposal`: its busiest submesh's compute (all its chunks'
    under interleaved 1F1B, which run one after another) at the fastest rate."""
    table = setup.table
    cluster = setup.cluster
    fastest_rate = max((*cluster.busy_speedup, *(x for _, row in cluster.busy_speedup_by_size for x in row)),
                       default=1.0)
    meshes = len(proposal.stages) // proposal.chunks
    work = [0.0] * meshes
    for j, s in enumerate(proposal.stages):
        work[j % meshes] += float(table.time_s[s.start, s.stop, s.mesh])
    return num_microbatches * max(work) / fastest_rate


def fastest_simulated(setup: SolveSetup, proposals: Sequence[StageSolution], num_microbatches: int,
                      assemble: Callable[[StageSolution], Plan]) -> tuple[Plan, tuple[str, ...]]:
    """The proposal whose simulated step is least (the first on ties), and a note on the choice."""
    plans: list[Plan] = []
    skipped = 0
    best: Plan | None = None
    for proposal in proposals:
        if best is not None and work_bound_s(setup, proposal, num_microbatches) >= best.predicted.step_time_s:
            skipped += 1
            continue
        plans.append(assemble(proposal))
        if best is None or plans[-1].predicted.step_time_s < best.predicted.step_time_s:
            best = plans[-1]
    assert best is not None, "the stage DP proposes at least one layout"
    return best, (_choice_note(plans, best, skipped),)


def _choice_note(plans: list[Plan], best: Plan, skipped: int) -> str:
    def stages(plan: Plan) -> str:
        chunks = plan.schedule.chunks
        text = f"{plan.num_stages} stage{'s' * (plan.num_stages != 1)}"
        return f"{text} ({plan.num_submeshes} submeshes x {chunks} chunks)" if chunks > 1 else text

    if len(plans) == 1 and not skipped:
        return "the step simulator priced the stage DP's one layout"
    priced = ", ".join(f"{stages(p)} {p.predicted.step_time_s * 1e3:.4g} ms" for p in plans)
    unpriced = (f"; {skipped} more not simulated, as their busiest stage's work alone exceeds the best step"
                if skipped else "")
    why = ("the closed form's best" if best is plans[0]
           else f"faster than the closed form's best ({stages(plans[0])}) by "
                f"{plans[0].predicted.step_time_s / best.predicted.step_time_s - 1:.1%}")
    return (f"the step simulator priced {len(plans)} of the layouts the stage DP proposed ({priced}{unpriced}); "
            f"the plan is the fastest, {why}")
