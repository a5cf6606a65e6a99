"""A Plan from a stage layout: each stage's costs and shardings from its layers' profiles, and where
the step's time goes.

`assemble_plan` turns the stage DP's answer into a Plan; `evaluate_stages`
prices a layout given by hand (the baselines) from the same table.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
import time
from typing import Any, Sequence

from alpaviz.core.inter_op._infeasible import ModelTooLargeError
from alpaviz.core.inter_op._in_flight import in_flight
from alpaviz.core.inter_op._setup import SolveSetup
from alpaviz.core.inter_op._stage_dp import (
    ScheduleKind, StageChoice, StageSolution, pipeline_latency, stage_offsets,
)
from alpaviz.core.inter_op._stage_profile import profiled_mesh, step_link
from alpaviz.core.plan import (
    InfeasiblePinsError, Layer, Pins, Plan, PredictedCost, Schedule, SolverInfo, Stage, StageCost, Timeline,
    format_bytes, predicted_timeline,
)


def assemble_plan(
    setup: SolveSetup,
    solution: StageSolution,
    pins: Pins,
    num_microbatches: int,
    schedule: ScheduleKind,
    seconds: float,
    notes: Sequence[str],
    exact: bool = True,
    timings: Sequence[str] = (),
) -> Plan:
    """Turn a DP solution into a Plan with per-stage costs and a step-time breakdown.

    The plan's price is its simulated step (`predicted_timeline`); the breakdown is `step_breakdown`'s.
    """
    profiles = setup.profiles
    n, v = len(solution.stages), solution.chunks
    offsets = stage_offsets(setup.table, solution.stages[:n // v])  # stage i on submesh i mod (n / v)
    stages, statuses = [], set()
    for i, choice in enumerate(solution.stages):
        stage, layer_statuses = _stage(setup, i, choice, offsets[i % len(offsets)],
                                       in_flight(i, n, num_microbatches, schedule, v))
        stages.append(stage)
        statuses |= layer_statuses
    if "time_limited" in statuses:
        status = "time_limited"
    elif not exact or statuses - {"optimal", "pinned"}:
        status = "heuristic"
    else:
        status = "optimal"
    priced = {}
    for choice in solution.stages:
        column = profiled_mesh(profiles, choice.mesh)
        for l in range(choice.start, choice.stop):
            p = profiles.profiles[l][column]
            priced[l] = (p.compute_s, p.communication_s, p.resharding_s, p.memory.peak)
    layers = tuple(Layer(v.index, v.nodes, v.flops, *priced.get(v.index, (0.0, 0.0, 0.0, 0.0)))
                   for v in profiles.layers)
    unpriced = PredictedCost(solution.objective_s, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, setup.memory_limit_bytes)
    plan = Plan(
        model=setup.graph.name, graph_fingerprint=setup.graph_fingerprint, cluster=setup.cluster,
        cost_model=setup.cost_model, layers=layers, stages=tuple(stages),
        schedule=Schedule(schedule, num_microbatches, chunks=v), predicted=unpriced, pins=pins,
        solver=SolverInfo(status=status, seconds=seconds, objective=solution.objective_s, notes=tuple(notes),
                          timings=tuple(timings)),
    )
    timeline = predicted_timeline(plan, setup.graph)
    return dataclasses.replace(plan, predicted=step_breakdown(plan.stages, timeline, setup.memory_limit_bytes))


def _stage(setup: SolveSetup, i: int, choice: StageChoice, first: int, kept_in_flight: int) -> tuple[Stage, set[str]]:
    """Stage `i` of a DP solution: its layers' profiles summed, with its boundary transfers, its
    recomputation and its memory with `kept_in_flight` microbatches held; and its layers' solver statuses."""
    cluster, profiles, mesh = setup.cluster, setup.profiles, setup.table.meshes[choice.mesh]
    profiled = profiled_mesh(profiles, choice.mesh)
    rows = [(profiles.layers[l], profiles.profiles[l][profiled]) for l in range(choice.start, choice.stop)]
    fwd = sum(p.forward_s for _, p in rows)
    bwd = sum(p.backward_s for _, p in rows)
    recv_in, recv_back = setup.table.cut_times(choice, first)
    step_bytes = profiles.step_recv_bytes(choice.start, choice.stop)
    step_recv = setup.cost_model.send_recv(step_bytes, step_link(cluster)) if step_bytes else 0.0
    memory = functools.reduce(operator.add, (p.memory for _, p in rows)).with_in_flight(kept_in_flight)
    recompute = 0.0
    if mesh.remat:  # the forward runs again in the backward; the table holds what then stays in memory
        recompute = fwd
        at = (choice.start, choice.stop, choice.mesh)
        memory = dataclasses.replace(memory, activations=float(setup.table.activation_bytes[at]),
                                     temporaries=float(setup.table.temp_bytes[at]))
    # What a zero-bubble schedule may defer: nothing on a recomputing stage (its backward stays whole, see
    # `analyze`), all of the first stage's backward (no stage waits for it), else the layers' W parts.
    weight_grad = 0.0 if mesh.remat else bwd if i == 0 else sum(p.weight_grad_s for _, p in rows)
    strategies: dict[str, str] = {}
    specs: dict[str, Any] = {}
    edges: list[tuple[str, str, float]] = []
    for view, p in rows:
        strategies.update(p.named_strategies(view))
        edges += p.named_resharding(view)
        for t, s in p.named_specs(view):
            specs.setdefault(t, s)
    stage = Stage(
        index=i, layer_start=choice.start, layer_stop=choice.stop, submesh=mesh.submesh,
        device_ids=tuple(range(first, first + mesh.num_devices)), logical_mesh=mesh.logical_shape,
        remat=mesh.remat,
        strategies=tuple(sorted(strategies.items())), partition_specs=tuple(sorted(specs.items())),
        resharding_edges=tuple(edges),
        cost=StageCost(
            forward_s=fwd + recv_in, backward_s=bwd + recompute + recv_back,
            update_s=sum(p.update_s for _, p in rows) + step_recv,
            compute_s=sum(p.compute_s for _, p in rows) + recompute,
            communication_s=sum(p.communication_s for _, p in rows) + recv_in + recv_back + step_recv,
            resharding_s=sum(p.resharding_s for _, p in rows),
            memory_bytes=memory.peak, activation_bytes=memory.activations, memory=memory,
            recv_forward_s=recv_in, recv_backward_s=recv_back, recv_update_s=step_recv,
            step_communication_s=sum(p.step_communication_s for _, p in rows) + step_recv,
            weight_grad_s=min(weight_grad, bwd),
        ),
    )
    return stage, {p.status for _, p in rows}


def step_breakdown(stages: Sequence[Stage], timeline: Timeline, memory_limit_bytes: float) -> PredictedCost:
    """The step's price and where its time goes, read from the simulated step (`timeline`).

    `step_time_s` is the timeline's end: the plan's price is the simulation
    of its own instruction lists.  The rest follows the busiest submesh (a
    timeline row; its stages' costs summed when it holds several chunks): its
    forward and backward time split into computation, collectives and
    resharding in the proportions its cost has, its sends as `cross_stage_s`,
    its update split into computation and once-per-step reductions, and its
    idle time as `bubble_s`.  The five add up to `step_time_s`.  A submesh's
    memory is the sum of its stages' peaks.
    """
    rows = timeline.num_stages
    busiest = max(range(rows), key=timeline.busy_s)
    mine = [s.cost for s in stages[busiest::rows]]
    total = lambda field: sum(getattr(c, field) for c in mine)  # noqa: E731
    spent = {"microbatch": 0.0, "send": 0.0, "update": 0.0}
    for e in timeline.events:
        if e.stage == busiest and e.kind != "recv":
            spent["microbatch" if e.kind in ("forward", "backward", "weight_grad") else e.kind] += e.duration_s
    recv = total("recv_forward_s") + total("recv_backward_s")
    comm = max(total("communication_s") - total("step_communication_s") - recv, 0.0)
    compute = max(total("microbatch_s") - recv - comm - total("resharding_s"), 0.0)
    priced = compute + comm + total("resharding_s")
    scale = spent["microbatch"] / priced if priced > 0 else 0.0
    update_s = total("update_s")
    update_comm = spent["update"] * min(total("step_communication_s") / update_s, 1.0) if update_s > 0 else 0.0
    step_s = timeline.total_s
    return PredictedCost(
        step_time_s=step_s,
        compute_s=compute * scale + spent["update"] - update_comm,
        communication_s=comm * scale + update_comm,
        resharding_s=total("resharding_s") * scale,
        cross_stage_s=spent["send"],
        bubble_s=max(step_s - sum(spent.values()), 0.0),
        max_memory_bytes=max(sum(s.cost.memory_bytes for s in stages[row::rows]) for row in range(rows)),
        memory_limit_bytes=memory_limit_bytes,
    )


def evaluate_stages(
    setup: SolveSetup,
    stages: Sequence[StageChoice],
    pins: Pins = Pins(),
    num_microbatches: int = 1,
    schedule: ScheduleKind = "1f1b",
    notes: Sequence[str] = (),
) -> Plan:
    """The Plan for one explicit stage layout, priced from the same table as the DP (no search).

    Raises ModelTooLargeError naming the stage that does not fit.
    """
    started = time.perf_counter()
    table, n = setup.table, len(stages)
    used = sum(setup.table.meshes[s.mesh].num_devices for s in stages)
    if used != setup.cluster.num_devices:
        raise InfeasiblePinsError(f"the stages use {used} devices but the cluster has {setup.cluster.num_devices}")
    times, updates = [], []
    for i, (s, first) in enumerate(zip(stages, stage_offsets(table, stages))):
        size = table.meshes[s.mesh].num_devices
        if not table.placeable(first, size):
            raise InfeasiblePinsError(
                f"stage {i} on submesh {table.meshes[s.mesh].submesh} would start at device {first} and straddle "
                f"two hosts of {setup.cluster.devices_per_host} devices (stages sit on the devices in pipeline "
                f"order); reorder the stages so that the stages inside each host fill it"
            )
        time_s = table.stage_time(s, first)
        if not math.isfinite(time_s):
            raise InfeasiblePinsError(
                f"stage {i} (layers {s.start}..{s.stop - 1}) cannot run on submesh "
                f"{setup.table.meshes[s.mesh].submesh} as logical mesh {setup.table.meshes[s.mesh].logical_shape}: "
                f"{_reason(setup, s)}"
            )
        keep = in_flight(i, n, num_microbatches, schedule)
        need = table.stage_bytes(s, keep)
        if need > setup.memory_limit_bytes:
            raise ModelTooLargeError(
                f"stage {i} (layers {s.start}..{s.stop - 1} on {setup.table.meshes[s.mesh].logical_shape}) needs "
                f"{format_bytes(need)} per device with {keep} microbatches in flight, but the limit is "
                f"{format_bytes(setup.memory_limit_bytes)} per device"
            )
        times.append(time_s)
        updates.append(float(table.update_s[s.start, s.stop, s.mesh]))
    solution = StageSolution(tuple(stages), pipeline_latency(times, updates, num_microbatches), max(times), 0, 0)
    return assemble_plan(setup, solution, pins, num_microbatches, schedule, time.perf_counter() - started,
                         (f"stage costs: {setup.stage_cost_name}", *notes))


def _reason(setup: SolveSetup, stage: StageChoice) -> str:
    profiled = profiled_mesh(setup.profiles, stage.mesh)
    reasons = {setup.profiles.profiles[l][profiled].reason for l in range(stage.start, stage.stop)}
    return "; ".join(sorted(r for r in reasons if r)) or "no layer profile"
