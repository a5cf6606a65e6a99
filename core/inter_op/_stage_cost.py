"""Stage-cost functions: the pluggable step that prices one layer on one logical mesh.

The inter-op pass asks a `StageCostFn` for the cost of a set of operators on
a logical mesh and gets back a `ShardingPlan`, the same record the intra-op
ILP returns.  Two implementations plug in:

* `ilp_stage_cost` calls the intra-op ILP (`core/intra_op.solve_sharding`),
  the default (`default_stage_cost()`);
* `analytic_stage_cost` is closed-form: data parallelism on mesh axis 0 and
  Megatron-style tensor parallelism on axis 1, priced with the same
  `CostModel`.  The baselines and the fast tests use it.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol, Sequence

from alpaviz.core.cost import Cluster, CostModel, LogicalMesh
from alpaviz.core.graph import OpGraph, OpNode, state_inputs, weight_gradient_nodes
from alpaviz.core.intra_op import solve_sharding
from alpaviz.core.plan import MemoryBreakdown, Pins, ShardingCost, ShardingPlan, Spec

# Operators that only re-view a tensor: a weight seen through them is still a weight.
_VIEWS = frozenset({"transpose", "convert_element_type", "reshape", "broadcast_in_dim", "copy"})


class StageCostFn(Protocol):
    """Prices `nodes` of `graph` on `mesh` for a step of `num_microbatches`; raises ValueError when they cannot
    run there.  Forward and backward times are per microbatch, the update (gradient sync included) per step."""

    def __call__(
        self,
        graph: OpGraph,
        mesh: LogicalMesh,
        cluster: Cluster,
        cost_model: CostModel,
        pins: Pins,
        *,
        nodes: Sequence[str],
        num_microbatches: int = 1,
    ) -> ShardingPlan: ...


def microbatch_size(graph: OpGraph, state: frozenset[str] | None = None) -> int | None:
    """Leading dim of the first non-state input (the traced step is one microbatch)."""
    state = state_inputs(graph) if state is None else state
    for name in graph.inputs:
        tensor = graph.tensor(name)
        if name not in state and tensor.shape:
            return tensor.shape[0]
    return None


@dataclasses.dataclass(frozen=True)
class _LayerFigures:
    """Mesh-independent sums the analytic model needs for one set of nodes."""

    nodes: tuple[OpNode, ...]
    param_bytes: float
    state_bytes: float
    activation_bytes: float
    tp_forward_bytes: float
    params: tuple[str, ...]
    batch_inputs: tuple[str, ...]


def _figures(graph: OpGraph, nodes: Sequence[str]) -> _LayerFigures:
    ops = tuple(graph.node(n) for n in nodes)
    state = state_inputs(graph)
    read_by = {role: set() for role in ("forward", "backward", "update")}
    for op in ops:
        read_by[op.role].update(op.inputs)
    layer_state = sorted(t for t in read_by["update"] if t in state)
    params = [t for t in layer_state if t in read_by["forward"]]
    nbytes = lambda t: graph.tensor(t).nbytes  # noqa: E731
    kept = 0.0
    tp_bytes = 0.0
    for op in ops:
        if op.role != "forward":
            continue
        for out in op.outputs:
            if any(graph.node(c).role == "backward" for c in graph.consumers.get(out, ())):
                kept += nbytes(out)
        if op.primitive == "dot_general" and any(_is_weight(graph, t, state) for t in op.inputs):
            # Megatron pairs a column- and a row-parallel matmul; only the second all-reduces.
            tp_bytes += 0.5 * sum(nbytes(o) for o in op.outputs)
    batch = tuple(
        t for op in ops for t in op.inputs
        if graph.tensor(t).kind == "input" and t not in state and graph.tensor(t).shape
    )
    return _LayerFigures(
        nodes=ops,
        param_bytes=float(sum(nbytes(t) for t in params)),
        state_bytes=float(sum(nbytes(t) for t in layer_state)),
        activation_bytes=kept,
        tp_forward_bytes=tp_bytes,
        params=tuple(params),
        batch_inputs=tuple(dict.fromkeys(batch)),
    )


def _is_weight(graph: OpGraph, tensor: str, state: frozenset[str]) -> bool:
    for _ in range(3):
        if tensor in state:
            return True
        producer = graph.tensor(tensor).producer
        if producer is None:
            return False
        node = graph.node(producer)
        if node.primitive not in _VIEWS or not node.inputs:
            return False
        tensor = node.inputs[0]
    return False


def _param_spec(shape: tuple[int, ...], tp: int) -> Spec:
    """Split the largest dim that `tp` divides over axis "y"; replicate otherwise."""
    spec: list[tuple[str, ...]] = [() for _ in shape]
    if tp > 1 and len(shape) >= 2:
        for dim in sorted(range(len(shape)), key=lambda d: -shape[d]):
            if shape[dim] % tp == 0:
                spec[dim] = ("y",)
                break
    return tuple(spec)


def analytic_stage_cost(
    graph: OpGraph,
    mesh: LogicalMesh,
    cluster: Cluster,
    cost_model: CostModel,
    pins: Pins = Pins(),
    *,
    nodes: Sequence[str],
    num_microbatches: int = 1,
) -> ShardingPlan:
    """Closed-form cost of `nodes` under data parallel (axis 0) x Megatron tensor parallel (axis 1).

    Compute is a per-operator roofline on 1/(dp*tp) of the work (updates on
    1/tp); tensor parallelism all-reduces the output of every other weight
    matmul over axis 1 in forward and again in backward; data parallelism
    all-reduces the gradients over axis 0 once per step (counted in
    `update_s`).  Intra-op pins are not modelled; this is a fallback and a
    baseline, not the ILP.
    """
    dp, tp = mesh.shape
    n = dp * tp
    fig = _figures(graph, nodes)
    batch = microbatch_size(graph)
    if dp > 1 and batch is not None and batch % dp:
        raise ValueError(
            f"data parallel degree {dp} does not divide the microbatch size {batch}; "
            f"use a logical mesh whose first axis divides {batch}"
        )
    times = {"forward": 0.0, "backward": 0.0, "update": 0.0}
    weight_grad, weight_grad_s = weight_gradient_nodes(graph, nodes), 0.0
    for op in fig.nodes:
        share = tp if op.role == "update" else n
        seconds = cost_model.op_time(
            op.primitive, op.flops / share, (op.bytes_read + op.bytes_written) / share, cluster.device,
            graph.operand_dtype(op),
        )
        times[op.role] += seconds
        weight_grad_s += seconds if op.name in weight_grad else 0.0
    compute = sum(times.values())
    tp_comm = cost_model.all_reduce(fig.tp_forward_bytes / dp, mesh, 1) if fig.tp_forward_bytes else 0.0
    grad_sync = cost_model.all_reduce(fig.param_bytes / tp, mesh, 0) if fig.param_bytes else 0.0
    memory = MemoryBreakdown(
        params=fig.param_bytes / tp,
        optimizer_state=(fig.state_bytes - fig.param_bytes) / tp,
        gradients=fig.param_bytes / tp,
        activations=fig.activation_bytes / n,
    )
    specs = [(t, _param_spec(graph.tensor(t).shape, tp)) for t in fig.params]
    if dp > 1:
        specs += [
            (t, (("x",),) + ((),) * (len(graph.tensor(t).shape) - 1))
            for t in fig.batch_inputs if graph.tensor(t).shape[0] % dp == 0
        ]
    cost = ShardingCost(
        compute_s=compute,
        communication_s=2 * tp_comm + grad_sync,
        resharding_s=0.0,
        forward_s=times["forward"] + tp_comm,
        backward_s=times["backward"] + tp_comm,
        update_s=times["update"] + grad_sync,
        memory_bytes=memory.peak,
        activation_bytes=memory.activations,
        memory=memory,
        step_communication_s=grad_sync,
        weight_grad_s=weight_grad_s,
    )
    return ShardingPlan(
        mesh_shape=mesh.shape,
        strategies=(),
        partition_specs=tuple(sorted(specs)),
        objective=num_microbatches * (cost.forward_s + cost.backward_s) + cost.update_s,
        cost=cost,
        status="heuristic",
        seconds=0.0,
        notes=(f"analytic estimate: data parallel {dp} x tensor parallel {tp}",),
    )


def ilp_stage_cost(
    graph: OpGraph,
    mesh: LogicalMesh,
    cluster: Cluster,
    cost_model: CostModel,
    pins: Pins = Pins(),
    *,
    nodes: Sequence[str],
    num_microbatches: int = 1,
    time_limit_s: float = 30.0,
) -> ShardingPlan:
    """The intra-op ILP's sharding and cost for `nodes` on `mesh`, for a step of `num_microbatches`."""
    return solve_sharding(graph, mesh, cluster, cost_model, pins, nodes=nodes, time_limit_s=time_limit_s,
                          num_microbatches=num_microbatches)


def default_stage_cost() -> StageCostFn:
    """The intra-op ILP: what `solve` prices stages with unless told otherwise."""
    return ilp_stage_cost
