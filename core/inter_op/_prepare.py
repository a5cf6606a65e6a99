"""Everything `solve` decides before the stage DP: trace and layer the step, check the pins against
graph and cluster, profile every layer on every candidate mesh, and build the stage cost table.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from alpaviz.core.cost import Cluster
from alpaviz.core.graph import OpGraph, trace
from alpaviz.core.inter_op._infeasible import check_intra_op_pins
from alpaviz.core.inter_op._layer_clustering import cluster_layers
from alpaviz.core.inter_op._measure import measured_stage_cost
from alpaviz.core.inter_op._options import SolveOptions
from alpaviz.core.inter_op._progress import Progress
from alpaviz.core.inter_op._setup import SolveSetup
from alpaviz.core.inter_op._stage_cost import StageCostFn, default_stage_cost
from alpaviz.core.inter_op._stage_dp import MeshChoice
from alpaviz.core.inter_op._profile_cache import StageProfileCache
from alpaviz.core.inter_op._profile_workers import ProfileWorkers
from alpaviz.core.inter_op._stage_profile import mesh_choices, prefetch_profiles, profile_layers, stage_cost_table
from alpaviz.core.plan import check_pins


def prepare(
    fn_or_graph: Callable[..., Any] | OpGraph,
    *args: Any,
    cluster: Cluster,
    options: SolveOptions = SolveOptions(progress=False),
    meshes: Sequence[MeshChoice] | None = None,
) -> SolveSetup:
    """Trace and layer the graph, check the pins, and build the stage cost table.

    The step is traced as given (`solve` has already cut a global batch to one
    microbatch).  `meshes` restricts the mesh choices (a baseline that needs
    only one mesh profiles only that).
    """
    check_cluster_options(cluster, options)
    if isinstance(fn_or_graph, OpGraph):
        if args:
            raise ValueError("solve(graph, ...) takes no example arguments when given an OpGraph")
        graph = fn_or_graph
    else:
        graph = trace(fn_or_graph, *args)
    graph = cluster_layers(graph, options.num_layers)
    cache = StageProfileCache() if options.cache is None else options.cache
    check_pins(options.pins, graph, cluster)
    meshes = tuple(meshes) if meshes is not None else mesh_choices(cluster, options.submeshes)
    fn, name = stage_cost_of(options)
    bar = Progress(options.progress, "profiling layers")
    try:
        profiles = profile_layers(
            graph, cluster, options.cost_model, options.pins, meshes, fn, cache,
            on_profile=bar.tick,
            workers=options.workers,
            num_microbatches=options.num_microbatches,
        )
    finally:
        bar.close()
    check_intra_op_pins(options.pins, profiles)
    limit = cluster.device.memory_bytes if options.memory_limit is None else float(options.memory_limit)
    table = stage_cost_table(profiles, cluster, options.cost_model)
    return SolveSetup(graph, cluster, options.cost_model, meshes, profiles, table, limit, name)


def prefetch(graph: OpGraph, cluster: Cluster, options: SolveOptions) -> int:
    """Start profiling, in the background on `options.workers` (a running `ProfileWorkers`), the layers
    `solve(graph, cluster=cluster, options=options)` would profile, into `options.cache`; returns how many
    runs started.  The editor asks this for the cluster a user is likely to try next."""
    if not isinstance(options.workers, ProfileWorkers) or options.cache is None:
        raise ValueError("prefetch needs options with a running ProfileWorkers as workers and a StageProfileCache")
    if options.profile:
        return 0  # measured costs need the local devices, which the main process holds
    check_cluster_options(cluster, options)
    graph = cluster_layers(graph, options.num_layers)
    fn, _ = stage_cost_of(options)
    return prefetch_profiles(graph, cluster, options.cost_model, options.pins, mesh_choices(cluster, options.submeshes),
                             fn, options.cache, options.workers, options.num_microbatches)


def stage_cost_of(options: SolveOptions) -> tuple[StageCostFn, str]:
    """The stage-cost function `options` ask for (the ILP by default; measured on the local devices when
    `options.profile`), and the name a plan's solver record gives it."""
    fn = options.stage_cost if options.stage_cost is not None else default_stage_cost()
    name = getattr(fn, "__name__", type(fn).__name__)
    if options.profile:
        return measured_stage_cost(fn), f"measured on local devices (shardings from {name})"
    return fn, name


def check_cluster_options(cluster: Cluster, options: SolveOptions) -> None:
    """The options that depend on the cluster, refused before any profiling."""
    if not isinstance(cluster, Cluster):
        raise TypeError(f"cluster must be an av.Cluster (e.g. av.Cluster.local()), got {type(cluster).__name__}")
    if options.submeshes is None:
        return
    for shape in options.submeshes:
        cluster.validate_submesh(shape)
    sizes = sorted({s[0] * s[1] for s in options.submeshes})
    reachable = {0}
    for total in range(1, cluster.num_devices + 1):
        if any(total - size in reachable for size in sizes if size <= total):
            reachable.add(total)
    if cluster.num_devices not in reachable:
        raise ValueError(
            f"submeshes {list(options.submeshes)} cannot tile the cluster's {cluster.num_devices} devices (a plan "
            f"uses every device); add a shape, e.g. one of {cluster.submesh_shapes()}"
        )
