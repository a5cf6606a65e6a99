"""Plans written by hand: stage cuts, meshes and shardings chosen by the user, costs left unknown.

The runtime's tests and the notebook's "launch my own layout" path need a
valid `Plan` without running a solver.  Predicted costs in such a plan are
zero and the plan says so in `SolverInfo(status="pinned", notes=...)`.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from alpaviz.core.cost import Cluster, CostModel
from alpaviz.core.graph import OpGraph, check_int
from alpaviz.core.plan._instructions import check_chunks
from alpaviz.core.plan._pins import Pins
from alpaviz.core.plan._plan import (
    Layer, Plan, PredictedCost, Schedule, SolverInfo, Stage, StageCost, graph_fingerprint,
)
from alpaviz.core.plan._spec import Spec, check_spec, make_spec

UNKNOWN_COSTS_NOTE = "manual plan: predicted costs are unknown (all zero), not estimated"

SpecsArg = Mapping[str, Spec] | Sequence[Mapping[str, Spec]] | None


def manual_plan(
    graph: OpGraph,
    cluster: Cluster,
    *,
    stage_cuts: Sequence[int] = (),
    logical_meshes: tuple[int, int] | Sequence[tuple[int, int]] | None = None,
    partition_specs: SpecsArg = None,
    schedule: Schedule = Schedule("1f1b", 1),
    devices_per_stage: int | None = None,
    cost_model: CostModel = CostModel(),
) -> Plan:
    """A plan with the given cuts, meshes and specs; each stage gets an equal block of devices (each
    submesh, when the schedule is interleaved: stage i runs on the block of submesh i mod p).

    `stage_cuts` are the layers where stages 1.. start.  `logical_meshes`
    is one (rows, cols) shape for every stage or one per stage (default
    (devices, 1): the "x" axis spans the stage).  `partition_specs` is one
    tensor -> Spec mapping for every stage (each stage keeps the tensors
    its operators touch) or one mapping per stage.

    Example:
        >>> plan = manual_plan(graph, av.Cluster.local(), stage_cuts=(1,),
        ...                    partition_specs=data_parallel_specs(graph),
        ...                    schedule=av.Schedule("1f1b", 4))
    """
    layers = _layers(graph)
    cuts = tuple(check_int("a stage cut", c, minimum=1) for c in stage_cuts)
    if devices_per_stage is not None:
        check_int("devices_per_stage", devices_per_stage, minimum=1)
    if not isinstance(schedule, Schedule):
        raise TypeError(f"schedule must be an av.core.Schedule(kind, num_microbatches), got {schedule!r}")
    bounds = (0, *cuts, len(layers))
    if any(b >= c for b, c in zip(bounds, bounds[1:])):
        raise ValueError(
            f"stage_cuts {cuts} must increase strictly inside (0, {len(layers)}): "
            f"graph {graph.name!r} has {len(layers)} layers"
        )
    num_stages = len(bounds) - 1
    check_chunks(schedule.kind, num_stages, schedule.num_microbatches, schedule.chunks)
    submeshes = num_stages // schedule.chunks  # stage i on submesh i mod submeshes
    per_stage = devices_per_stage or cluster.num_devices // submeshes
    if per_stage < 1 or per_stage * submeshes > cluster.num_devices:
        raise ValueError(
            f"{submeshes} submeshes of {per_stage} devices do not fit the cluster's {cluster.num_devices} devices; "
            f"use fewer stages or pass devices_per_stage"
        )
    meshes = _per_stage(logical_meshes, num_stages, "logical_meshes") if logical_meshes is not None else None
    specs = _per_stage_specs(partition_specs, num_stages)
    stages = []
    for i in range(num_stages):
        home = i % submeshes
        device_ids = tuple(range(home * per_stage, (home + 1) * per_stage))
        mesh = tuple(meshes[i]) if meshes is not None else (per_stage, 1)
        touched = _tensors_of_layers(graph, layers[bounds[i]:bounds[i + 1]])
        stage_specs = {}
        for name, spec in specs[i].items():
            if name not in graph.tensor_by_name:
                raise ValueError(f"partition_specs: no tensor named {name!r} in graph {graph.name!r}")
            if name in touched:
                check_spec(graph.tensor(name).shape, spec, mesh, what=f"stage {i} tensor {name!r}")
                stage_specs[name] = tuple(tuple(axes) for axes in spec)
        stages.append(Stage(
            index=i,
            layer_start=bounds[i],
            layer_stop=bounds[i + 1],
            submesh=_submesh(cluster, per_stage),
            device_ids=device_ids,
            logical_mesh=mesh,  # type: ignore[arg-type]
            strategies=(),
            partition_specs=tuple(sorted(stage_specs.items())),
            cost=StageCost(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0),
        ))
    return Plan(
        model=graph.name,
        graph_fingerprint=graph_fingerprint(graph),
        cluster=cluster,
        cost_model=cost_model,
        layers=layers,
        stages=tuple(stages),
        schedule=schedule,
        predicted=PredictedCost(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, cluster.device.memory_bytes),
        pins=Pins(stage_cuts=cuts, num_stages=num_stages),
        solver=SolverInfo(status="pinned", seconds=0.0, objective=0.0, notes=(UNKNOWN_COSTS_NOTE,)),
    )


def data_parallel_specs(graph: OpGraph, batch_prefix: str = "batch", axis: str = "x") -> dict[str, Spec]:
    """Split dim 0 of every batch input on mesh axis `axis` (data parallelism)."""
    out = {}
    for name in graph.inputs:
        if name == batch_prefix or name.startswith(batch_prefix + "."):
            shape = graph.tensor(name).shape
            if shape:
                out[name] = make_spec(axis, *[None] * (len(shape) - 1))
    if not out:
        raise ValueError(f"no graph input starts with {batch_prefix!r}; the inputs are {graph.inputs[:6]}...")
    return out


_COLUMN_SPLIT = ("w_qkv", "w_fc", "b_qkv", "b_fc")
_ROW_SPLIT = ("w_out", "w_proj")


def megatron_specs(graph: OpGraph, axis: str = "y") -> dict[str, Spec]:
    """Megatron-LM tensor parallelism for the zoo's GPT weights.

    w_qkv / w_fc (and their biases) split their output columns on `axis`;
    w_out / w_proj split their input rows on `axis`, so each block needs one
    all-reduce forward and one backward.
    """
    out = {}
    for name in graph.inputs:
        leaf = name.rsplit(".", 1)[-1]
        ndim = len(graph.tensor(name).shape)
        if leaf in _COLUMN_SPLIT:
            out[name] = make_spec(*[None] * (ndim - 1), axis)
        elif leaf in _ROW_SPLIT:
            out[name] = make_spec(axis, *[None] * (ndim - 1))
    if not out:
        raise ValueError(f"graph {graph.name!r} has none of the weights {_COLUMN_SPLIT + _ROW_SPLIT}")
    return out


def _layers(graph: OpGraph) -> tuple[Layer, ...]:
    nodes: list[list[str]] = [[] for _ in range(graph.num_layers)]
    flops = [0.0] * graph.num_layers
    for node in graph.nodes:
        nodes[node.layer].append(node.name)
        flops[node.layer] += node.flops
    return tuple(Layer(i, tuple(n), f) for i, (n, f) in enumerate(zip(nodes, flops)))


def _tensors_of_layers(graph: OpGraph, layers: Sequence[Layer]) -> set[str]:
    out: set[str] = set()
    for layer in layers:
        for name in layer.nodes:
            node = graph.node(name)
            out.update(node.inputs)
            out.update(node.outputs)
    return out


def _submesh(cluster: Cluster, devices: int) -> tuple[int, int]:
    if devices <= cluster.devices_per_host:
        return (1, devices)
    if devices % cluster.devices_per_host:
        raise ValueError(
            f"a stage of {devices} devices spans hosts of {cluster.devices_per_host} devices unevenly; "
            f"use a multiple of {cluster.devices_per_host}"
        )
    return (devices // cluster.devices_per_host, cluster.devices_per_host)


def _per_stage(value, num_stages: int, what: str) -> list:
    if isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return [value] * num_stages
    items = list(value)
    if len(items) != num_stages:
        raise ValueError(f"{what}: got {len(items)} entries for {num_stages} stages; give one per stage")
    return items


def _per_stage_specs(value: SpecsArg, num_stages: int) -> list[Mapping[str, Spec]]:
    if value is None:
        return [{}] * num_stages
    if isinstance(value, Mapping):
        return [value] * num_stages
    return _per_stage(value, num_stages, "partition_specs")
