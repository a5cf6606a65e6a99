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

from typing import Any, Callable

from alpaviz.core.cost import Cluster
from alpaviz.core.graph import OpGraph, trace
from alpaviz.core.inter_op._assemble import evaluate_stages
from alpaviz.core.inter_op._data_parallel import data_parallel_pins
from alpaviz.core.inter_op._layer_clustering import cluster_layers
from alpaviz.core.inter_op._microbatch_search import args_at_microbatch_size, search_counts
from alpaviz.core.inter_op._options import SolveOptions, unused_options, with_option_signature
from alpaviz.core.inter_op._prepare import prepare
from alpaviz.core.inter_op._solve import solve
from alpaviz.core.inter_op._stage_cost import analytic_stage_cost, default_stage_cost
from alpaviz.core.inter_op._stage_dp import MeshChoice, StageChoice
from alpaviz.core.plan import InfeasiblePinsError, Pins, Plan

# A baseline fixes these itself: a value given for one would be silently ignored, so it is refused.
_SET_BY_THE_BASELINE = ("pins", "submeshes", "tolerance", "previous")


def baseline_schedule(options: SolveOptions) -> str:
    """The schedule a baseline runs: the options' own, or 1F1B (what Megatron-LM runs) when they say "auto"."""
    return "1f1b" if options.schedule == "auto" else options.schedule


def _graph(fn_or_graph: Callable[..., Any] | OpGraph, args: tuple, options: SolveOptions) -> OpGraph:
    """The step's graph at microbatch size, layered as the options say."""
    args = args_at_microbatch_size(fn_or_graph, args, options)
    graph = fn_or_graph if isinstance(fn_or_graph, OpGraph) else trace(fn_or_graph, *args)
    return cluster_layers(graph, options.num_layers)


def _mesh_index(meshes, submesh: tuple[int, int], logical: tuple[int, int], remat: bool = False) -> int:
    return next(i for i, m in enumerate(meshes)
                if m.submesh == submesh and m.logical_shape == logical and m.remat == remat)


@with_option_signature
def data_parallel(
    fn_or_graph: Callable[..., Any] | OpGraph, *args: Any, cluster: Cluster, options: SolveOptions | None = None,
    **keywords: Any,
) -> Plan:
    """Pure data parallelism on every device (raises ModelTooLargeError when the replicas do not fit)."""
    options = SolveOptions.of(options, **keywords)
    unused_options(options, _SET_BY_THE_BASELINE, "data-parallel baseline")
    if options.num_microbatches == "auto":
        return search_counts(lambda at_count, graph: data_parallel(graph, cluster=cluster, options=at_count),
                             fn_or_graph, args, options, "data-parallel baseline")
    graph = _graph(fn_or_graph, args, options)
    fn = options.stage_cost if options.stage_cost is not None else default_stage_cost()
    whole = Pins(num_stages=1).with_submesh(0, cluster.whole_submesh, (cluster.num_devices, 1))
    # The analytic cost is pure data parallel by construction; the ILP needs the sharding pinned.
    pins = whole if fn is analytic_stage_cost else data_parallel_pins(graph, cluster)
    only = [MeshChoice(cluster.whole_submesh, (cluster.num_devices, 1))]
    # The ILP may refuse some of these pins (e.g. a tied embedding whose update aliases another
    # layer's); then fewer are pinned (batch split only, then just the mesh) and the plan says so.
    attempts = [pins, data_parallel_pins(graph, cluster, replicate_state=False), whole]
    notes: list[str] = []
    for attempt in dict.fromkeys(attempts):
        try:
            setup = prepare(graph, cluster=cluster, options=options.replace(pins=attempt, stage_cost=fn), meshes=only)
        except InfeasiblePinsError as err:
            if attempt is whole:
                raise
            notes.append(f"data-parallel sharding pins refused: {str(err).splitlines()[0][:160]}")
            continue
        return evaluate_stages(setup, [StageChoice(0, graph.num_layers, 0)], attempt, options.num_microbatches,
                               baseline_schedule(options), notes=tuple(notes))
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


@with_option_signature
def megatron_grid(
    fn_or_graph: Callable[..., Any] | OpGraph, *args: Any, cluster: Cluster, return_all: bool = False,
    options: SolveOptions | None = None, **keywords: Any,
) -> Plan | list[tuple[str, Plan]]:
    """The best Megatron-style grid plan (DP x TP x PP, uniform stages); all that fit with `return_all`.

    Priced from the same stage profiles as `solve` (pass the same `cache`).
    Configurations that do not fit in memory or cannot split the batch are
    skipped; if none fits, the last reason is raised.  Like `solve`, it
    takes `global_batch_argnums` and `num_microbatches="auto"`; it shows no
    progress bars unless asked.
    """
    if options is None:
        keywords.setdefault("progress", False)
    options = SolveOptions.of(options, **keywords)
    unused_options(options, _SET_BY_THE_BASELINE, "Megatron grid")
    if options.num_microbatches == "auto":
        if return_all:
            raise ValueError("return_all=True lists one microbatch count's grid; give num_microbatches as an int")
        return search_counts(lambda at_count, graph: megatron_grid(graph, cluster=cluster, options=at_count),
                             fn_or_graph, args, options, "Megatron grid")
    graph = _graph(fn_or_graph, args, options)
    fn = options.stage_cost if options.stage_cost is not None else default_stage_cost()
    setup = prepare(graph, cluster=cluster, options=options.replace(stage_cost=fn))
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
                plans.append((name, evaluate_stages(setup, stages, Pins(), options.num_microbatches,
                                                    baseline_schedule(options), notes=(f"grid baseline {name}",))))
                break
            except ValueError as err:
                error = err
    if not plans:
        raise error if error is not None else ValueError(f"no grid configuration fits {cluster.name}")
    if return_all:
        return plans
    return min(plans, key=lambda item: item[1].predicted.step_time_s)[1]


@with_option_signature
def intra_op_only(
    fn_or_graph: Callable[..., Any] | OpGraph, *args: Any, cluster: Cluster, options: SolveOptions | None = None,
    **keywords: Any,
) -> Plan:
    """Alpa's "intra-op only" ablation: one stage on the whole cluster, sharding solved."""
    options = SolveOptions.of(options, **keywords)
    unused_options(options, ("pins", "submeshes"), "intra-op-only ablation")
    pins = Pins(num_stages=1).with_submesh(0, cluster.whole_submesh)
    return solve(fn_or_graph, *args, cluster=cluster, options=options.replace(pins=pins))


@with_option_signature
def inter_op_only(
    fn_or_graph: Callable[..., Any] | OpGraph, *args: Any, cluster: Cluster, options: SolveOptions | None = None,
    **keywords: Any,
) -> Plan:
    """Alpa's "inter-op only" ablation: a pipeline of single-device stages (needs layers >= devices)."""
    options = SolveOptions.of(options, **keywords)
    unused_options(options, ("submeshes",), "inter-op-only ablation")
    return solve(fn_or_graph, *args, cluster=cluster, options=options.replace(submeshes=((1, 1),)))
