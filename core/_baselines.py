"""Baseline plans under the planner's own cost model, for honest comparisons.

Each baseline is the planner with some decisions pinned or some choices
removed, so it is priced by exactly the same stage profiles:

* `data_parallel`: one stage on the whole cluster, logical mesh (N, 1),
  parameters replicated and the batch split (pinned for the ILP; the
  analytic cost is pure data parallel by construction);
* `megatron_grid`: the best of a grid over DP x TP x PP with uniform stages
  (PP stages of equal layer counts, each on an equal submesh viewed as
  (DP, TP));
* `intra_op_only`: Alpa's ablation with one stage (no pipeline);
* `inter_op_only`: Alpa's ablation with single-device stages (no sharding).
"""

from __future__ import annotations

from typing import Any, Callable

from alpaviz.core._analytic_cost import StageCostFn, analytic_stage_cost, default_stage_cost, state_inputs
from alpaviz.core._cluster import Cluster
from alpaviz.core._graph import OpGraph
from alpaviz.core._layer_clustering import cluster_layers
from alpaviz.core._pins import Pins
from alpaviz.core._plan import Plan
from alpaviz.core._solve import solve
from alpaviz.core._spec import replicated


def _graph(fn_or_graph: Callable[..., Any] | OpGraph, args: tuple, num_layers: int | None) -> OpGraph:
    if isinstance(fn_or_graph, OpGraph):
        graph = fn_or_graph
    else:
        from alpaviz.core._trace import trace

        graph = trace(fn_or_graph, *args)
    return cluster_layers(graph, num_layers)


def whole_cluster(cluster: Cluster) -> tuple[int, int]:
    """The submesh shape that is the whole cluster."""
    return (cluster.num_hosts, cluster.devices_per_host)


def data_parallel_pins(graph: OpGraph, cluster: Cluster) -> Pins:
    """Pins for pure data parallelism: one stage, mesh (N, 1), state replicated, batch split."""
    n = cluster.num_devices
    pins = Pins(num_stages=1).with_submesh(0, whole_cluster(cluster), (n, 1))
    state = state_inputs(graph)
    for name in graph.inputs:
        shape = graph.tensor(name).shape
        if name in state:
            pins = pins.with_partition_spec(name, replicated(len(shape)))
        elif shape and shape[0] % n == 0:
            pins = pins.with_partition_spec(name, (("x",),) + ((),) * (len(shape) - 1))
    return pins


def data_parallel(
    fn_or_graph: Callable[..., Any] | OpGraph, *args: Any, cluster: Cluster,
    stage_cost: StageCostFn | None = None, num_layers: int | None = None, **options: Any,
) -> Plan:
    """Pure data parallelism on every device (raises ModelTooLargeError when the replicas do not fit)."""
    graph = _graph(fn_or_graph, args, num_layers)
    fn = stage_cost if stage_cost is not None else default_stage_cost()
    pins = data_parallel_pins(graph, cluster)
    if fn is analytic_stage_cost:
        pins = Pins(num_stages=1).with_submesh(0, whole_cluster(cluster), (cluster.num_devices, 1))
    return solve(graph, cluster=cluster, pins=pins, stage_cost=fn, **options)


def _submesh_of(devices: int, cluster: Cluster) -> tuple[int, int] | None:
    for shape in cluster.submesh_shapes():
        if shape[0] * shape[1] == devices:
            return shape
    return None


def grid_pins(graph: OpGraph, cluster: Cluster) -> list[tuple[str, Pins]]:
    """Every DP x TP x PP configuration with uniform stages, as (label, pins)."""
    n, num_layers = cluster.num_devices, graph.num_layers
    configs = []
    for pp in range(1, min(n, num_layers) + 1):
        if n % pp:
            continue
        submesh = _submesh_of(n // pp, cluster)
        if submesh is None:
            continue
        cuts = sorted({round(i * num_layers / pp) for i in range(1, pp)})
        for dp, tp in cluster.logical_shapes(submesh):
            pins = Pins(stage_cuts=tuple(cuts), num_stages=pp)
            for stage in range(pp):
                pins = pins.with_submesh(stage, submesh, (dp, tp))
            configs.append((f"dp{dp} x tp{tp} x pp{pp}", pins))
    return configs


def megatron_grid(
    fn_or_graph: Callable[..., Any] | OpGraph, *args: Any, cluster: Cluster,
    stage_cost: StageCostFn | None = None, num_layers: int | None = None, return_all: bool = False,
    **options: Any,
) -> Plan | list[tuple[str, Plan]]:
    """The best Megatron-style grid plan (DP x TP x PP, uniform stages); all of them with `return_all`.

    Configurations that do not fit in memory are skipped; if none fits, the
    last error is raised.
    """
    graph = _graph(fn_or_graph, args, None if num_layers is None else num_layers)
    fn = stage_cost if stage_cost is not None else default_stage_cost()
    options.setdefault("progress", False)
    plans: list[tuple[str, Plan]] = []
    error: ValueError | None = None
    for label, pins in grid_pins(graph, cluster):
        try:
            plans.append((label, solve(graph, cluster=cluster, pins=pins, stage_cost=fn, **options)))
        except ValueError as err:  # does not fit, or a mesh the batch cannot split over
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
    pins = Pins(num_stages=1).with_submesh(0, whole_cluster(cluster))
    return solve(fn_or_graph, *args, cluster=cluster, pins=pins, **options)


def inter_op_only(
    fn_or_graph: Callable[..., Any] | OpGraph, *args: Any, cluster: Cluster, **options: Any,
) -> Plan:
    """Alpa's "inter-op only" ablation: a pipeline of single-device stages (needs layers >= devices)."""
    return solve(fn_or_graph, *args, cluster=cluster, submeshes=[(1, 1)], **options)
