"""`av.solve`: prepare (trace, layer, profile), run the stage DP, assemble a Plan.

The traced step is one microbatch; a training step runs `num_microbatches`
of them through the pipeline.  Every decision the pins leave open is
solved; what they fix is honoured or reported as a conflict that names them.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

from alpaviz.core.cost import Cluster
from alpaviz.core.graph import OpGraph
from alpaviz.core.inter_op._assemble import assemble_plan
from alpaviz.core.inter_op._infeasible import constraints_from_pins, diagnose
from alpaviz.core.inter_op._interleave import MAX_CHUNKS, interleaved_layouts
from alpaviz.core.inter_op._microbatch_search import args_at_microbatch_size, search_counts
from alpaviz.core.inter_op._options import SolveOptions, with_option_signature
from alpaviz.core.inter_op._prepare import prepare
from alpaviz.core.inter_op._progress import Progress
from alpaviz.core.inter_op._setup import SolveSetup
from alpaviz.core.inter_op._simulated_choice import fastest_simulated, work_bound_s
from alpaviz.core.inter_op._stage_dp import (
    NoStagePlanError, StageChoice, StageConstraints, StageSolution, solve_stages,
)
from alpaviz.core.plan import INTERLEAVED, SCHEDULE_KINDS, InfeasiblePinsError, Pins, Plan


@with_option_signature
def solve(
    fn_or_graph: Callable[..., Any] | OpGraph,
    *args: Any,
    cluster: Cluster,
    options: SolveOptions | None = None,
    **keywords: Any,
) -> Plan:
    """Plan a training step for `cluster`: stages, submeshes, shardings and the pipeline schedule.

    `fn_or_graph` is a step function (traced with `args`) or an `OpGraph`.
    The options (`av.SolveOptions`, whose docstring lists them) come as one
    value, as keywords, or both (the keywords change the value's fields):
    `pins` fix any subset of decisions, `cache` makes re-solving after a pin
    cheap, `num_microbatches="auto"` with `global_batch_argnums` tries every
    count that divides the global batch and keeps the fastest plan.

    Example:
        >>> cache = av.StageProfileCache()
        >>> plan = av.solve(step, params, batch, cluster=av.Cluster.a100_node(2), num_microbatches=8, cache=cache)
        >>> print(plan.summary())
    """
    options = SolveOptions.of(options, **keywords)
    if options.num_microbatches == "auto":
        return search_counts(lambda at_count, graph: solve(graph, cluster=cluster, options=at_count),
                             fn_or_graph, args, options, "plan")
    started = time.perf_counter()
    setup = prepare(fn_or_graph, *args_at_microbatch_size(fn_or_graph, args, options), cluster=cluster,
                    options=options)
    profiled_at = time.perf_counter()
    kinds = SCHEDULE_KINDS if options.schedule == "auto" else (options.schedule,)
    found: dict[str, tuple[Plan, tuple[str, ...]]] = {}
    for kind in kinds:
        try:
            found[kind] = _plan_for_schedule(setup, options, kind, explain=len(kinds) == 1)
        except NoStagePlanError:
            continue  # another schedule may fit; when none does, the reason is found below
    if not found:  # no schedule fits: why, under the default one
        _plan_for_schedule(setup, options, "1f1b", explain=True)
    best = min(found, key=lambda kind: found[kind][0].predicted.step_time_s)
    plan, choice = found[best]
    if len(kinds) > 1:
        choice = (*choice, schedule_choice_note(best, {k: p.predicted.step_time_s for k, (p, _) in found.items()},
                                                kinds))
    timings = (f"profiling {profiled_at - started:.2f} s ({setup.profiles.profiled} layer profiles computed, "
               f"the rest from the cache), stage DP and simulation {time.perf_counter() - profiled_at:.2f} s "
               f"({len(kinds)} schedule{'s' if len(kinds) > 1 else ''})",)
    solver = dataclasses.replace(plan.solver, seconds=time.perf_counter() - started,
                                 notes=(*plan.solver.notes, *choice), timings=timings)
    return dataclasses.replace(plan, solver=solver)


def _plan_for_schedule(setup: SolveSetup, options: SolveOptions, schedule: str,
                       explain: bool) -> tuple[Plan, tuple[str, ...]]:
    """The stage DP under `schedule`, its layouts simulated: the fastest plan and the notes on the choice.

    When nothing fits, `explain` raises the reason (memory, or which pins); otherwise `NoStagePlanError`."""
    if schedule == INTERLEAVED:
        return _interleaved_plan(setup, options, explain)
    solution = _stage_dp(setup, options, schedule, explain)
    gap = "optimal" if options.tolerance == 0 else f"within {options.tolerance:.1%} of optimal"
    notes = (
        f"stage costs: {setup.stage_cost_name}",
        f"t_max candidates tried: {solution.candidates_tried} of {solution.candidates_total} (branch and bound; "
        f"the stages are {gap} for the closed form sum(t_i + u_i) + (B-1) max(t_i) on these profiles)",
        "stage cost = sum of its layers' costs + boundary send/recv (no resharding inside a stage)",
        *control_flow_notes(setup.graph),
    )

    def assemble(proposal):
        return assemble_plan(setup, proposal, options.pins, options.num_microbatches, schedule,
                             0.0, notes, exact=options.tolerance == 0)

    return fastest_simulated(setup, solution.proposals(), options.num_microbatches, assemble)


def _interleaved_plan(setup: SolveSetup, options: SolveOptions, explain: bool) -> tuple[Plan, tuple[str, ...]]:
    """Interleaved 1F1B: the stage DP's 1F1B layouts (cut and count pins left to the chunks), each
    submesh's stage re-cut into chunks (`interleaved_layouts`), the fastest simulated plan."""
    pinned = constraints_from_pins(options.pins, setup.table.meshes, setup.graph.num_layers, setup.cluster)
    # The pins on cuts and on the stage count are the chunks': a pinned count n asks the DP for each
    # submesh count p that n / p chunks can fill.
    counts = ([None] if pinned.num_stages is None else
              [p for p in range(2, pinned.num_stages) if pinned.num_stages % p == 0
               and pinned.num_stages // p <= MAX_CHUNKS])
    proposals: list[StageSolution] = []
    for count in counts:
        submeshes = StageConstraints(num_stages=count, stage_meshes=pinned.stage_meshes)
        try:
            proposals += _stage_dp(setup, options, "1f1b", explain and count is None, submeshes).proposals()
        except NoStagePlanError:
            continue
    m = options.num_microbatches
    layouts, skipped = interleaved_layouts(setup, proposals, m, pinned)
    layouts.sort(key=lambda layout: work_bound_s(setup, layout, m))  # the likeliest first: the bound prunes more
    if not layouts:
        message = (f"interleaved 1F1B found no layout: {'; '.join(skipped) or 'the pins allow none'}. "
                   f"It needs 2 or more submeshes, a microbatch count that is a multiple of their number, "
                   f"and at least twice as many layers; or plan with schedule='1f1b'")
        if explain:
            raise InfeasiblePinsError(message)
        raise NoStagePlanError(message)
    notes = (
        f"stage costs: {setup.stage_cost_name}",
        f"interleaved 1F1B: the stage DP's {len(proposals)} 1F1B layout(s) re-cut into 2 to "
        f"{MAX_CHUNKS} chunks per submesh, the slowest chunk as fast as it can be; {len(layouts)} fit"
        + (f" ({'; '.join(skipped)})" if skipped else ""),
        *control_flow_notes(setup.graph),
    )

    def assemble(proposal):
        return assemble_plan(setup, proposal, options.pins, m, INTERLEAVED, 0.0, notes,
                             exact=options.tolerance == 0)

    return fastest_simulated(setup, layouts, m, assemble)


def schedule_choice_note(best: str, step_s: dict[str, float], tried: tuple[str, ...]) -> str:
    """Which schedule won and by how much, each other schedule's simulated step beside it."""
    others = [f"{kind} {step_s[kind]:.4g} s (+{step_s[kind] / step_s[best] - 1:.1%})"
              for kind in sorted(step_s, key=step_s.get) if kind != best]
    unfit = [kind for kind in tried if kind not in step_s]
    text = f"schedule: {best} chosen, its simulated step {step_s[best]:.4g} s"
    text += f"; {', '.join(others)}" if others else ""
    return text + (f"; {', '.join(unfit)} found no plan that fits" if unfit else "")


def _stage_dp(setup: SolveSetup, options: SolveOptions, schedule: str, explain: bool,
              constraints: StageConstraints | None = None) -> StageSolution:
    """The stage DP under the pins (or `constraints`); when it finds nothing and `explain`, the reason
    (memory or which pins) is raised."""
    if constraints is None:
        constraints = constraints_from_pins(options.pins, setup.table.meshes, setup.graph.num_layers,
                                            setup.cluster)
    bar = Progress(options.progress, "stage DP")
    try:
        return solve_stages(
            setup.table, setup.cluster.num_devices, options.num_microbatches, schedule,
            setup.memory_limit_bytes, constraints, tolerance=options.tolerance,
            prefer=_stages_of(options.previous, setup), on_candidate=bar.tick, proposals=options.simulated_layouts,
        )
    except NoStagePlanError:
        if not explain:
            raise
        raise diagnose(setup, options.pins, options.num_microbatches, schedule) from None
    finally:
        bar.close()


def control_flow_notes(graph: OpGraph) -> tuple[str, ...]:
    """What the plan treats as one operator: loops and branches that are not a scan over layers."""
    return tuple(
        f"{n.name} ({n.source or n.scope or 'control flow'}): {n.note}; it is replicated on its stage's "
        f"mesh and no cut falls inside it"
        for n in graph.nodes if n.primitive in ("scan", "while", "cond") and n.note
    )


def _stages_of(plan: Plan | None, setup: SolveSetup) -> tuple[StageChoice, ...]:
    """The previous plan's stages in this problem's mesh numbering (those whose mesh is still a choice)."""
    if plan is None or len(plan.layers) != setup.graph.num_layers:
        return ()
    index = {(m.submesh, m.logical_shape, m.remat): i for i, m in enumerate(setup.table.meshes)}
    return tuple(
        StageChoice(s.layer_start, s.layer_stop, index[(s.submesh, s.logical_mesh, s.remat)])
        for s in plan.stages if (s.submesh, s.logical_mesh, s.remat) in index
    )


def resolve(plan_or_pins: Plan | Pins, graph: OpGraph, *, options: SolveOptions | None = None,
            **keywords: Any) -> Plan:
    """Re-solve `graph` keeping the pins (and, from a Plan without `options`, its cluster, cost model,
    schedule and layers, with ties broken towards its stages)."""
    if isinstance(plan_or_pins, Plan):
        plan = plan_or_pins
        plan.check_graph(graph)
        keywords.setdefault("cluster", plan.cluster)
        if options is None:
            for name, value in (("cost_model", plan.cost_model), ("num_microbatches", plan.schedule.num_microbatches),
                                ("schedule", plan.schedule.kind), ("num_layers", len(plan.layers)),
                                ("previous", plan)):
                keywords.setdefault(name, value)
        keywords.setdefault("pins", plan.pins)
    else:
        keywords.setdefault("pins", plan_or_pins)
    cluster = keywords.pop("cluster", None)
    if cluster is None:
        raise ValueError("resolve needs cluster=... when given Pins rather than a Plan")
    return solve(graph, cluster=cluster, options=SolveOptions.of(options, **keywords))
