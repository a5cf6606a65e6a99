"""Pins against the graph and the cluster: every pin that names a layer, stage, mesh, operator or
tensor that cannot exist is refused here, for every pass, with the rule, the value and the fix.
"""

from __future__ import annotations

from alpaviz.core.cost import Cluster
from alpaviz.core.graph import OpGraph
from alpaviz.core.plan._pins import InfeasiblePinsError, Pins


def check_pins(pins: Pins, graph: OpGraph, cluster: Cluster) -> None:
    """Raise InfeasiblePinsError listing every pin that cannot exist on this graph and cluster."""
    problems = _layer_problems(pins, graph, cluster) + _mesh_problems(pins, cluster) + _name_problems(pins, graph)
    if problems:
        raise InfeasiblePinsError("impossible pins:\n  " + "\n  ".join(problems))


def check_pin_names(pins: Pins, graph: OpGraph) -> None:
    """Raise InfeasiblePinsError for a strategy or spec pin naming no operator or tensor of `graph`."""
    problems = _name_problems(pins, graph)
    if problems:
        raise InfeasiblePinsError("impossible pins:\n  " + "\n  ".join(problems))


def _layer_problems(pins: Pins, graph: OpGraph, cluster: Cluster) -> list[str]:
    problems = []
    num_layers = graph.num_layers
    for cut in pins.stage_cuts + pins.forbidden_cuts:
        if cut >= num_layers:
            problems.append(f"cut before layer {cut}: the graph has layers 0..{num_layers - 1}, so a cut is "
                            f"1..{num_layers - 1}")
    max_stages = min(num_layers, cluster.num_devices)
    if pins.num_stages is not None and pins.num_stages > max_stages:
        problems.append(
            f"{pins.num_stages} stages: at most {max_stages} (one layer and one device per stage; "
            f"{num_layers} layers, {cluster.num_devices} devices)"
        )
    limit = pins.num_stages if pins.num_stages is not None else max_stages
    for stage in sorted(set(pins.submesh_map) | set(pins.logical_mesh_map) | set(pins.remat_map)):
        if stage >= limit:
            problems.append(f"stage {stage} is pinned but there can be at most {limit} stages (0..{limit - 1}); "
                            f"unpin it or pin a stage in that range")
    return problems


def _mesh_problems(pins: Pins, cluster: Cluster) -> list[str]:
    problems = []
    for stage, submesh in pins.stage_submeshes:
        try:
            cluster.validate_submesh(submesh)
        except ValueError as err:
            problems.append(f"stage {stage} on submesh {submesh}: {err}")
        else:
            if submesh not in cluster.submesh_shapes():
                problems.append(f"stage {stage} on submesh {submesh}: choose one of {cluster.submesh_shapes()}")
    for stage, logical in pins.stage_logical_meshes:
        submesh = pins.submesh_map.get(stage)
        shapes = [submesh] if submesh is not None else list(cluster.submesh_shapes())
        if not any(tuple(logical) in cluster.logical_shapes(s) for s in shapes):
            of = f"submesh {submesh}" if submesh else "any submesh"
            problems.append(f"stage {stage} logical mesh {logical}: not a view of {of}")
    return problems


def _name_problems(pins: Pins, graph: OpGraph) -> list[str]:
    problems = [f"{node} uses {strategy!r}: there is no operator {node!r} in the graph; remove the pin"
                for node, strategy in pins.strategies if node not in graph.node_by_name]
    problems += [f"{tensor} sharded as {spec}: there is no tensor {tensor!r} in the graph; remove the pin"
                 for tensor, spec in pins.partition_specs if tensor not in graph.tensor_by_name]
    return problems
