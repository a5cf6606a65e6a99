"""`av.solve`: trace, cluster layers, profile stages, run the stage DP, assemble a Plan.

The traced step is one microbatch; a training step runs `num_microbatches`
of them through the pipeline.  Every decision the pins leave open is
solved; what they fix is honoured or reported as a conflict that names them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
import time
from typing import Any, Callable, Literal, Sequence

from alpaviz.core.cost import Cluster, CostModel
from alpaviz.core.graph import OpGraph, check_int, check_number, microbatch_args, trace
from alpaviz.core.inter_op._layer_clustering import cluster_layers
from alpaviz.core.inter_op._measure import measured_stage_cost
from alpaviz.core.inter_op._microbatch_search import best_over_microbatches, global_batch_size, microbatch_counts
from alpaviz.core.inter_op._infeasible import ModelTooLargeError, check_intra_op_pins, constraints_from_pins, diagnose
from alpaviz.core.inter_op._progress import Progress, ProgressFn
from alpaviz.core.inter_op._setup import SolveSetup
from alpaviz.core.inter_op._stage_cost import StageCostFn, default_stage_cost
from alpaviz.core.inter_op._stage_dp import (
    MeshChoice, NoStagePlanError, ScheduleKind, StageChoice, StageSolution, in_flight,
    pipeline_latency, solve_stages, stage_offsets,
)
from alpaviz.core.inter_op._stage_profile import (
    StageProfileCache, mesh_choices, profile_layers, profiled_mesh, stage_cost_table, step_link,
)
from alpaviz.core.plan import (
    InfeasiblePinsError, Layer, Pins, Plan, PredictedCost, Schedule, SolverInfo, Stage, StageCost, check_pins, format_bytes,
    graph_fingerprint,
)


def solve(
    fn_or_graph: Callable[..., Any] | OpGraph,
    *args: Any,
    cluster: Cluster,
    cost_model: CostModel | None = None,
    num_microbatches: int | Literal["auto"] = 1,
    schedule: ScheduleKind = "1f1b",
    pins: Pins | None = None,
    memory_limit: float | None = None,
    cache: StageProfileCache | None = None,
    progress: bool | ProgressFn = True,
    num_layers: int | None = None,
    stage_cost: StageCostFn | None = None,
    profile: bool = False,
    submeshes: Sequence[tuple[int, int]] | None = None,
    tolerance: float = 0.0,
    previous: Plan | None = None,
    workers: int = 1,
    global_batch_argnums: Sequence[int] = (),
) -> Plan:
    """Plan a training step for `cluster`: stages, submeshes, shardings and the pipeline schedule.

    `fn_or_graph` is a step function (traced with `args`) or an `OpGraph`.
    `pins` fix any subset of decisions; `cache` (a `StageProfileCache`)
    makes re-solving after a pin cheap; `num_layers` merges or clusters the
    graph's layers; `stage_cost` replaces the default per-layer cost (the
    intra-op ILP; `analytic_stage_cost` is the closed-form one); `profile=True`
    measures each candidate on the local devices instead.  With `previous`
    (a plan of the same graph) ties are broken towards its stages, so a new
    pin moves only what it must.  `tolerance` > 0 lets the stage DP stop
    once its stages are provably within that fraction of the optimum for the
    profiled costs (0, the default, is exact).  `workers` > 1 profiles in that many
    processes.  `progress` shows tqdm bars, or (a function) is called as
    `progress(phase, done, total)` for each step of each phase (layers
    profiled, DP candidates, microbatch counts).  The traced batch is one microbatch; with
    `global_batch_argnums=(1,)` the given batch argument is the global batch
    instead, and its dim 0 is divided by `num_microbatches` before tracing;
    then `num_microbatches="auto"` tries every count that divides the global
    batch and keeps the fastest plan (a count in `pins` fixes it instead).

    Example:
        >>> cache = av.StageProfileCache()
        >>> plan = av.solve(step, params, batch, cluster=av.Cluster.a100_node(2), num_microbatches=8, cache=cache)
        >>> print(plan.summary())
    """
    started = time.perf_counter()
    check_number("tolerance", tolerance, minimum=0)
    if pins is not None and not isinstance(pins, Pins):
        raise TypeError(f"pins must be an av.Pins, got {type(pins).__name__}")
    pins = Pins() if pins is None else pins
    if pins.num_microbatches is not None:
        num_microbatches = pins.num_microbatches
    if num_microbatches == "auto":
        if isinstance(fn_or_graph, OpGraph):
            raise ValueError("num_microbatches='auto' needs the step function and its global-batch arguments "
                             "(with global_batch_argnums), not an OpGraph")
        cache = StageProfileCache() if cache is None else cache  # shared by every count
        options = dict(cluster=cluster, cost_model=cost_model, schedule=schedule, pins=pins,
                       memory_limit=memory_limit, cache=cache, progress=progress if callable(progress) else False,
                       num_layers=num_layers,
                       stage_cost=stage_cost, profile=profile, submeshes=submeshes, tolerance=tolerance,
                       previous=previous, workers=workers, global_batch_argnums=global_batch_argnums)
        counts = microbatch_counts(global_batch_size(args, global_batch_argnums))
        return best_over_microbatches(
            lambda b: solve(fn_or_graph, *args, num_microbatches=b, **options), counts, "plan", progress)
    Schedule(schedule, num_microbatches)  # the kind and count, checked before any work
    if global_batch_argnums:
        if isinstance(fn_or_graph, OpGraph):
            raise ValueError(
                "global_batch_argnums needs the step function and its arguments, not an OpGraph: "
                "pass solve(train_step, params, batch, ...) or trace the step at microbatch size yourself"
            )
        args = microbatch_args(args, global_batch_argnums, num_microbatches)
    setup = prepare(
        fn_or_graph, *args, cluster=cluster, cost_model=cost_model, pins=pins, memory_limit=memory_limit,
        cache=cache, progress=progress, num_layers=num_layers, stage_cost=stage_cost, profile=profile,
        submeshes=submeshes, workers=workers, num_microbatches=num_microbatches,
    )
    profiled_at = time.perf_counter()
    constraints = constraints_from_pins(pins, setup.table.meshes, setup.graph.num_layers, cluster)
    bar = Progress(progress, "stage DP")
    try:
        solution = solve_stages(
            setup.table, cluster.num_devices, num_microbatches, schedule, setup.memory_limit_bytes,
            constraints, tolerance=tolerance, prefer=_stages_of(previous, setup),
            on_candidate=bar.tick,
        )
    except NoStagePlanError:
        raise diagnose(setup, pins, num_microbatches, schedule) from None
    finally:
        bar.close()
    gap = "optimal" if tolerance == 0 else f"within {tolerance:.1%} of optimal"
    notes = (
        f"stage costs: {setup.stage_cost_name}",
        f"t_max candidates tried: {solution.candidates_tried} of {solution.candidates_total} (branch and bound; "
        f"the stages are {gap} for these profiles)",
        "stage cost = sum of its layers' costs + boundary send/recv (no resharding inside a stage)",
        *control_flow_notes(setup.graph),
    )
    timings = (f"profiling {profiled_at - started:.2f} s ({setup.profiles.profiled} layer profiles computed, "
               f"the rest from the cache), DP {time.perf_counter() - profiled_at:.2f} s",)
    return assemble_plan(setup, solution, pins, num_microbatches, schedule, time.perf_counter() - started,
                         notes, exact=tolerance == 0, timings=timings)


def control_flow_notes(graph: OpGraph) -> tuple[str, ...]:
    """What the plan treats as one operator: loops and branches that are not a scan over layers."""
    return tuple(
        f"{n.name} ({n.source or n.scope or 'control flow'}): {n.note}; it is replicated on its stage's "
        f"mesh and no cut falls inside it"
        for n in graph.nodes if n.primitive in ("scan", "while", "cond") and n.note
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
        need = float(table.state_bytes[s.start, s.stop, s.mesh] + keep * table.activation_bytes[s.start, s.stop, s.mesh]
                     + (0.0 if table.temp_bytes is None else table.temp_bytes[s.start, s.stop, s.mesh]))
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


def resolve(plan_or_pins: Plan | Pins, graph: OpGraph, **options: Any) -> Plan:
    """Re-solve `graph` keeping the pins (and, from a Plan, its cluster, cost model and schedule)."""
    if isinstance(plan_or_pins, Plan):
        plan = plan_or_pins
        plan.check_graph(graph)
        options.setdefault("cluster", plan.cluster)
        options.setdefault("cost_model", plan.cost_model)
        options.setdefault("num_microbatches", plan.schedule.num_microbatches)
        options.setdefault("schedule", plan.schedule.kind)
        options.setdefault("num_layers", len(plan.layers))
        options.setdefault("previous", plan)
        pins = plan.pins
    else:
        pins = plan_or_pins
    if "cluster" not in options:
        raise ValueError("resolve needs cluster=... when given Pins rather than a Plan")
    return solve(graph, pins=pins, **options)


def prepare(
    fn_or_graph: Callable[..., Any] | OpGraph,
    *args: Any,
    cluster: Cluster,
    cost_model: CostModel | None = None,
    pins: Pins = Pins(),
    memory_limit: float | None = None,
    cache: StageProfileCache | None = None,
    progress: bool | ProgressFn = False,
    num_layers: int | None = None,
    stage_cost: StageCostFn | None = None,
    profile: bool = False,
    submeshes: Sequence[tuple[int, int]] | None = None,
    workers: int = 1,
    meshes: Sequence[MeshChoice] | None = None,
    num_microbatches: int = 1,
) -> SolveSetup:
    """Trace and layer the graph, check the pins, and build the stage cost table.

    `meshes` restricts the mesh choices (a baseline that needs only one mesh profiles only that).
    """
    _check_options(cluster, memory_limit, num_layers, workers, submeshes)
    if isinstance(fn_or_graph, OpGraph):
        if args:
            raise ValueError("solve(graph, ...) takes no example arguments when given an OpGraph")
        graph = fn_or_graph
    else:
        graph = trace(fn_or_graph, *args)
    graph = cluster_layers(graph, num_layers)
    cost_model = CostModel() if cost_model is None else cost_model
    cache = StageProfileCache() if cache is None else cache
    check_pins(pins, graph, cluster)
    meshes = tuple(meshes) if meshes is not None else mesh_choices(cluster, submeshes)
    fn = stage_cost if stage_cost is not None else default_stage_cost()
    name = getattr(fn, "__name__", type(fn).__name__)
    if profile:
        fn = measured_stage_cost(fn)
        name = f"measured on local devices (shardings from {name})"
    bar = Progress(progress, "profiling layers")
    try:
        profiles = profile_layers(
            graph, cluster, cost_model, pins, meshes, fn, cache,
            on_profile=bar.tick,
            workers=workers,
            num_microbatches=num_microbatches,
        )
    finally:
        bar.close()
    check_intra_op_pins(pins, profiles)
    limit = cluster.device.memory_bytes if memory_limit is None else float(memory_limit)
    if limit <= 0:
        raise ValueError(f"memory_limit must be positive bytes per device, got {memory_limit}")
    table = stage_cost_table(profiles, cluster, cost_model)
    return SolveSetup(graph, cluster, cost_model, meshes, profiles, table, limit, name)


def _check_options(cluster: Cluster, memory_limit, num_layers, workers, submeshes) -> None:
    """The numeric options of `solve`, refused before any profiling (a NaN limit would hang the diagnosis)."""
    if not isinstance(cluster, Cluster):
        raise TypeError(f"cluster must be an av.Cluster (e.g. av.Cluster.local()), got {type(cluster).__name__}")
    if memory_limit is not None:
        check_number("memory_limit (bytes per device)", memory_limit, positive=True)
    if num_layers is not None:
        check_int("num_layers", num_layers, minimum=1)
    check_int("workers", workers, minimum=1)
    if submeshes is not None:
        shapes = [tuple(s) if isinstance(s, (tuple, list)) else s for s in submeshes]
        for shape in shapes:
            cluster.validate_submesh(shape)
        sizes = sorted({s[0] * s[1] for s in shapes})
        reachable = {0}
        for total in range(1, cluster.num_devices + 1):
            if any(total - size in reachable for size in sizes if size <= total):
                reachable.add(total)
        if cluster.num_devices not in reachable:
            raise ValueError(
                f"submeshes {shapes} cannot tile the cluster's {cluster.num_devices} devices (a plan uses every "
                f"device); add a shape, e.g. one of {cluster.submesh_shapes()}"
            )


def _stages_of(plan: Plan | None, setup: SolveSetup) -> tuple[StageChoice, ...]:
    if plan is None or len(plan.layers) != setup.graph.num_layers:
        return ()
    index = {(m.submesh, m.logical_shape, m.remat): i for i, m in enumerate(setup.table.meshes)}
    return tuple(
        StageChoice(s.layer_start, s.layer_stop, index[(s.submesh, s.logical_mesh, s.remat)])
        for s in plan.stages if (s.submesh, s.logical_mesh, s.remat) in index
    )


# ---- the plan ----------------------------------------------------------------


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

    The step's breakdown is `step_breakdown`'s.
    """
    cluster, profiles = setup.cluster, setup.profiles
    n = len(solution.stages)
    meshes = [setup.table.meshes[s.mesh] for s in solution.stages]
    firsts = stage_offsets(setup.table, solution.stages)
    stages = []
    statuses = set()
    for i, (choice, mesh, first) in enumerate(zip(solution.stages, meshes, firsts)):
        profiled = profiled_mesh(profiles, choice.mesh)
        rows = [(profiles.layers[l], profiles.profiles[l][profiled]) for l in range(choice.start, choice.stop)]
        statuses.update(p.status for _, p in rows)
        fwd = sum(p.forward_s for _, p in rows)
        bwd = sum(p.backward_s for _, p in rows)
        recv_in, recv_back = setup.table.cut_times(choice, first)
        step_bytes = profiles.step_recv_bytes(choice.start, choice.stop)
        step_recv = setup.cost_model.send_recv(step_bytes, step_link(cluster)) if step_bytes else 0.0
        memory = functools.reduce(operator.add, (p.memory for _, p in rows)).with_in_flight(
            in_flight(i, n, num_microbatches, schedule))
        recompute = 0.0
        if mesh.remat:  # the forward runs again in the backward; the table holds what then stays in memory
            recompute = fwd
            at = (choice.start, choice.stop, choice.mesh)
            memory = dataclasses.replace(memory, activations=float(setup.table.activation_bytes[at]),
                                         temporaries=float(setup.table.temp_bytes[at]))
        strategies: dict[str, str] = {}
        specs: dict[str, Any] = {}
        edges: list[tuple[str, str, float]] = []
        for view, p in rows:
            strategies.update(p.named_strategies(view))
            edges += p.named_resharding(view)
            for t, s in p.named_specs(view):
                specs.setdefault(t, s)
        stages.append(Stage(
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
            ),
        ))
    predicted = step_breakdown([s.cost for s in stages], num_microbatches, solution.objective_s,
                               setup.memory_limit_bytes)
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
    return Plan(
        model=setup.graph.name, graph_fingerprint=graph_fingerprint(setup.graph), cluster=cluster,
        cost_model=setup.cost_model, layers=layers, stages=tuple(stages),
        schedule=Schedule(schedule, num_microbatches), predicted=predicted, pins=pins,
        solver=SolverInfo(status=status, seconds=seconds, objective=solution.objective_s, notes=tuple(notes),
                          timings=tuple(timings)),
    )


def step_breakdown(costs: Sequence[StageCost], num_microbatches: int, step_s: float,
                   memory_limit_bytes: float) -> PredictedCost:
    """Where the step's time goes, along its critical path: the slowest stage runs every microbatch.

    Per-microbatch terms count `num_microbatches` times, once-per-step ones
    (the updates, the gradient reductions) once: `compute_s` is the slowest
    stage's computation per microbatch times the count plus the updates'
    computation, `communication_s` likewise with its collectives and the
    once-per-step reductions, `cross_stage_s` its boundary transfers over all
    microbatches, and `bubble_s` the fill and drain (the other stages' times).
    The five add up to `step_s`.
    """
    b = num_microbatches
    slowest = max(costs, key=lambda c: c.microbatch_s)
    bubble = sum(c.microbatch_s for c in costs) - slowest.microbatch_s
    recv = slowest.recv_forward_s + slowest.recv_backward_s
    per_mb_comm = max(slowest.communication_s - slowest.step_communication_s - recv, 0.0)
    per_mb_compute = max(slowest.microbatch_s - recv - per_mb_comm - slowest.resharding_s, 0.0)
    tail = max(step_s - b * slowest.microbatch_s - bubble, 0.0)  # the once-per-step work on the path
    updates = sum(c.update_s for c in costs)
    tail_comm = tail * min(sum(c.step_communication_s for c in costs) / updates, 1.0) if updates > 0 else 0.0
    return PredictedCost(
        step_time_s=step_s,
        compute_s=b * per_mb_compute + tail - tail_comm,
        communication_s=b * per_mb_comm + tail_comm,
        resharding_s=b * slowest.resharding_s,
        cross_stage_s=b * recv,
        bubble_s=bubble,
        max_memory_bytes=max(c.memory_bytes for c in costs),
        memory_limit_bytes=memory_limit_bytes,
    )
