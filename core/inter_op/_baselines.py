"""Baseline plans under the planner's own cost model, for honest comparisons.

Each baseline is the planner with some decisions pinned or some choices
removed, so it is priced by exactly the same stage profiles:

* `data_parallel`: one stage on the whole cluster, logical mesh (N, 1),
  parameters replicated and the batch split (pinned for the ILP; the
  analytic cost is pure data parallel by construction);
* `megatron_grid`: the best of a grid over DP x TP x PP with uniform stages
  (PP stages of equal layer counts, each on an equal submesh viewed as
  (DP, TP)), with activation recomputation on every stage where only that fits;
* `intra_op_only`: Alpa's ablation with one stage (no pipeline);
* `inter_op_only`: Alpa's ablation with single-device stages (no sharding).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from alpaviz.core.cost import Cluster
from alpaviz.core.graph import OpGraph, microbatch_args, trace
from alpaviz.core.inter_op._data_parallel import data_parallel_pins
from alpaviz.core.inter_op._layer_clustering import cluster_layers
from alpaviz.core.inter_op._microbatch_search import best_over_microbatches, global_batch_size, microbatch_counts
from alpaviz.core.inter_op._solve import InfeasiblePinsError, evaluate_stages, prepare, solve
from alpaviz.core.inter_op._stage_cost import StageCostFn, analytic_stage_cost, default_stage_cost
from alpaviz.core.inter_op._stage_dp import MeshChoice, StageChoice
from alpaviz.core.inter_op._stage_profile import StageProfileCache
from alpaviz.core.plan import Pins, Plan


def _graph(fn_or_graph: Callable[..., Any] | OpGraph, args: tuple, num_layers: int | None) -> OpGraph:
    if isinstance(fn_or_graph, OpGraph):
        graph = fn_or_graph
    else:
        graph = trace(fn_or_graph, *args)
    return cluster_layers(graph, num_layers)


_SETUP_OPTIONS = ("cost_model", "memory_limit", "cache", "progress", "num_layers", "stage_cost", "profile",
                  "workers")


def _split(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    setup = {k: v for k, v in options.items() if k in _SETUP_OPTIONS}
    run = {k: v for k, v in options.items() if k in ("num_microbatches", "schedule")}
    if "num_microbatches" in run:
        setup["num_microbatches"] = run["num_microbatches"]
    unknown = set(options) - set(setup) - set(run)
    if unknown:
        raise TypeError(f"unknown baseline option(s) {sorted(unknown)}")
    return setup, run


def _at_microbatch_size(baseline: Callable[..., Plan], fn_or_graph, args: tuple, options: dict[str, Any],
                        what: str) -> tuple[tuple, Plan | None]:
    """Apply `global_batch_argnums` to `args`; with `num_microbatches="auto"`, the best count's plan.

    Returns (args at microbatch size, None) when the count is given, or
    (args, the searched plan) when it is "auto".
    """
    argnums = tuple(options.pop("global_batch_argnums", ()))
    count = options.get("num_microbatches", 1)
    if count == "auto":
        if isinstance(fn_or_graph, OpGraph):
            raise ValueError(f"the {what} with num_microbatches='auto' needs the step function and its "
                             f"global-batch arguments (with global_batch_argnums), not an OpGraph")
        options.setdefault("cache", StageProfileCache())
        search = {k: v for k, v in options.items() if k != "num_microbatches"}
        plan = best_over_microbatches(
            lambda b: baseline(fn_or_graph, *args, num_microbatches=b, global_batch_argnums=argnums, **search),
            microbatch_counts(global_batch_size(args, argnums)), what)
        return args, plan
    if argnums:
        if isinstance(fn_or_graph, OpGraph):
            raise ValueError("global_batch_argnums needs the step function and its arguments, not an OpGraph")
        args = microbatch_args(args, argnums, count)
    return args, None


def _mesh_index(meshes, submesh: tuple[int, int], logical: tuple[int, int], remat: bool = False) -> int:
    return next(i for i, m in enumerate(meshes)
                if m.submesh == submesh and m.logical_shape == logical and m.remat == remat)


def data_parallel(
    fn_or_graph: Callable[..., Any] | OpGraph, *args: Any, cluster: Cluster,
    stage_cost: StageCostFn | None = None, num_layers: int | None = None, **options: Any,
) -> Plan:
    """Pure data parallelism on every device (raises ModelTooLargeError when the replicas do not fit)."""
    args, searched = _at_microbatch_size(
        functools.partial(data_parallel, cluster=cluster, stage_cost=stage_cost, num_layers=num_layers),
        fn_or_graph, args, options, "data-parallel baseline")
    if searched is not None:
        return searched
    graph = _graph(fn_or_graph, args, num_layers)
    fn = stage_cost if stage_cost is not None else default_stage_cost()
    setup_options, run = _split(options)
    pins = data_parallel_pins(graph, cluster)
    if fn is analytic_stage_cost:  # pure data parallel by construction; no sharding pins needed
        pins = Pins(num_stages=1).with_submesh(0, cluster.whole_submesh, (cluster.num_devices, 1))
    only = [MeshChoice(cluster.whole_submesh, (cluster.num_devices, 1))]
    # The ILP may refuse some of these pins (e.g. a tied embedding whose update aliases another
    # layer's); then fewer are pinned (batch split only, then just the mesh) and the plan says so.
    layout = Pins(num_stages=1).with_submesh(0, cluster.whole_submesh, (cluster.num_devices, 1))
    attempts = [pins, data_parallel_pins(graph, cluster, replicate_state=False), layout]
    notes: list[str] = []
    for attempt in dict.fromkeys(attempts):
        try:
            setup = prepare(graph, cluster=cluster, pins=attempt, stage_cost=fn, meshes=only, **setup_options)
        except InfeasiblePinsError as err:
            if attempt is layout:
                raise
            notes.append(f"data-parallel sharding pins refused: {str(err).splitlines()[0][:160]}")
            continue
        return evaluate_stages(setup, [StageChoice(0, graph.num_layers, 0)], attempt, notes=tuple(notes), **run)
    raise AssertionError("unreachable: the last attempt raises or returns")


def _submesh_of(devices: int, cluster: Cluster) -> tuple[int, int] | None:
    for shape in cluster.submesh_shapes():
        if shape[0] * shape[1] == devices:
            return shape
    return None


def grid_configs(num_layers: int, cluster: Cluster) -> list[tuple[str, tuple[int, ...], tuple[int, int], tuple[int, int]]]:
    """Every DP x TP x PP configuration with uniform stages: (label, cuts, submesh, (dp, tp))."""
    n = cluster.num_devices
    configs = []
    for pp in range(1, min(n, num_layers) + 1):
        if n % pp:
            continue
        submesh = _submesh_of(n // pp, cluster)
        if submesh is None:
            continue
        cuts = tuple(sorted({round(i * num_layers / pp) for i in range(1, pp)}))
        for dp, tp in cluster.logical_shapes(submesh):
            configs.append((f"dp{dp} x tp{tp} x pp{pp}", cuts, submesh, (dp, tp)))
    return configs


def grid_pins(graph: OpGraph, cluster: Cluster) -> list[tuple[str, Pins]]:
    """The grid configurations as pins (solving with them reproduces `megatron_grid`'s plans)."""
    out = []
    for label, cuts, submesh, logical in grid_configs(graph.num_layers, cluster):
        pins = Pins(stage_cuts=cuts, num_stages=len(cuts) + 1)
        for stage in range(len(cuts) + 1):
            pins = pins.with_submesh(stage, submesh, logical)
        out.append((label, pins))
    return out


def megatron_grid(
    fn_or_graph: Callable[..., Any] | OpGraph, *args: Any, cluster: Cluster,
    stage_cost: StageCostFn | None = None, num_layers: int | None = None, return_all: bool = False,
    **options: Any,
) -> Plan | list[tuple[str, Plan]]:
    """The best Megatron-style grid plan (DP x TP x PP, uniform stages); all that fit with `return_all`.

    Priced from the same stage profiles as `solve` (pass the same `cache`).
    Configurations that do not fit in memory or cannot split the batch are
    skipped; if none fits, the last reason is raised.  Like `solve`, it
    takes `global_batch_argnums` and `num_microbatches="auto"`.
    """
    if return_all and options.get("num_microbatches") == "auto":
        raise ValueError("return_all=True lists one microbatch count's grid; give num_microbatches as an int")
    args, searched = _at_microbatch_size(
        functools.partial(megatron_grid, cluster=cluster, stage_cost=stage_cost, num_layers=num_layers),
        fn_or_graph, args, options, "Megatron grid")
    if searched is not None:
        return searched
    graph = _graph(fn_or_graph, args, num_layers)
    fn = stage_cost if stage_cost is not None else default_stage_cost()
    setup_options, run = _split(options)
    setup_options.setdefault("progress", False)
    setup = prepare(graph, cluster=cluster, stage_cost=fn, **setup_options)
    plans: list[tuple[str, Plan]] = []
    error: ValueError | None = None
    for label, cuts, submesh, logical in grid_configs(graph.num_layers, cluster):
        bounds = (0, *cuts, graph.num_layers)
        # As Megatron-LM: without activation recomputation, or with it on every stage when that is what fits.
        for remat in (False, True):
            mesh = _mesh_index(setup.table.meshes, submesh, logical, remat)
            stages = [StageChoice(a, b, mesh) for a, b in zip(bounds, bounds[1:])]
            name = f"{label} + recompute" if remat else label
            try:
                plans.append((name, evaluate_stages(setup, stages, Pins(), notes=(f"grid baseline {name}",), **run)))
                break
            except ValueError as err:
                error = err
    if not plans:
        raise error if error is not None else ValueError(f"no grid configuration fits {cluster.name}")
    if return_all:
        return plans
    return min(plans, key=lambda item: item[1].predicted.step_time_s)[1]


def intra_op_only(
    fn_or_graph: Callable[..., Any] | OpGraph, *args: Any, cluster: Cluster, **options: Any,
) -> Plan:
    """Alpa's "intra-op only" ablation: one stage on the whole cluster, sharding solved."""
    pins = Pins(num_stages=1).with_submesh(0, cluster.whole_submesh)
    return solve(fn_or_graph, *args, cluster=cluster, pins=pins, **options)


def inter_op_only(
    fn_or_graph: Callable[..., Any] | OpGraph, *args: Any, cluster: Cluster, **options: Any,
) -> Plan:
    """Alpa's "inter-op only" ablation: a pipeline of single-device stages (needs layers >= devices)."""
    return solve(fn_or_graph, *args, cluster=cluster, submeshes=[(1, 1)], **options)
