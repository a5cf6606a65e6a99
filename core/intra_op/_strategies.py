"""Sharding strategies of one operator on a 2-D logical mesh, with their costs.

A strategy maps each mesh axis to at most one dim label (see `_dim_labels`);
both axes may go to the same label.  Names follow Alpa's notation with mesh
axis indices: `S0R = S0R x RR` splits the lhs rows over axis 0;
`RR = RS1 x S1R @ {1}` contracts a split dim and all-reduces over axis 1;
`... @ {1} (reduce-scatter)` scatters the partial sums instead.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from typing import Sequence


from alpaviz.core.cost import CostModel, CostModelProtocol, DeviceSpec, LogicalMesh
from alpaviz.core.graph import OpGraph, OpNode, TensorInfo, dtype_itemsize
from alpaviz.core.intra_op._dim_labels import IDENTITY, DimLabels, dim_labels, is_free
from alpaviz.core.plan import Plan, PlanFormatError, Spec, replicated, spec_name

IDENTITY_STRATEGY = "identity"
# Nominal device for naming only: names never depend on costs.
NAMING_DEVICE = DeviceSpec("naming", peak_flops=1.0, memory_bytes=1.0)


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective a strategy issues: kind, mesh axes and the message bytes the cost model takes."""

    kind: str
    axes: tuple[str, ...]
    nbytes: float


@dataclasses.dataclass(frozen=True)
class Strategy:
    """One way to run an operator: the operand shardings it needs and what it costs.

    `in_specs[i]` is None when operand i is free (a constant or scalar).
    `memory_bytes` is the per-device size of the results.
    """

    name: str
    in_specs: tuple[Spec | None, ...]
    out_specs: tuple[Spec, ...]
    compute_s: float
    communication_s: float
    memory_bytes: float
    collectives: tuple[Collective, ...] = ()

    @property
    def cost_s(self) -> float:
        return self.compute_s + self.communication_s


@functools.lru_cache(maxsize=None)
def _itemsize(dtype: str) -> int:
    return dtype_itemsize(dtype)


def tensor_bytes(tensor: TensorInfo) -> int:
    """`tensor.nbytes` without building a numpy dtype each time (this runs in the solver's inner loops)."""
    return math.prod(tensor.shape) * _itemsize(tensor.dtype)


def shard_bytes(tensor: TensorInfo, spec: Spec | None, mesh: LogicalMesh) -> float:
    """Per-device bytes of `tensor` under `spec` (the full size when free or unsplit)."""
    nbytes = tensor_bytes(tensor)
    if not spec:
        return float(nbytes)
    parts = 1
    for axes in spec:
        for a in axes:
            parts *= mesh.shape[mesh.axis_names.index(a)]
    return nbytes / parts


def usable_axes(mesh: LogicalMesh) -> tuple[str, ...]:
    """Mesh axes with more than one device; splitting over a size-1 axis changes nothing."""
    return tuple(name for name, size in zip(mesh.axis_names, mesh.shape) if size > 1)


def strategy_label(in_specs: Sequence[Spec | None], out_specs: Sequence[Spec], mesh: LogicalMesh,
                   partial: Sequence[str] = (), scatter: bool = False) -> str:
    """Alpa-style name: `OUT = IN1 x IN2`, free operands left out, then the collective."""
    names = mesh.axis_names
    out = ",".join(spec_name(s, names) for s in out_specs)
    ins = " x ".join(spec_name(s, names) for s in in_specs if s is not None)
    text = f"{out} = {ins}" if ins else out
    if partial:
        text += " @ {" + ",".join(str(names.index(a)) for a in partial) + "}"
        if scatter:
            text += " (reduce-scatter)"
    return text


def enumerate_strategies(graph: OpGraph, node: OpNode, mesh: LogicalMesh,
                         cost_model: CostModelProtocol, device: DeviceSpec) -> tuple[Strategy, ...]:
    """Every strategy of `node` on `mesh`, replicated first; names are unique.

    Memoised per process by what they depend on (the operator's shape, mesh, cost model, device):
    a sweep over microbatch counts, a what-if or a re-solve asks for the same operators again.
    """
    operator = _Operator.of(graph, node)
    try:
        return _memoised_strategies(operator, mesh, cost_model, device)
    except TypeError:  # a cost model or parameter that cannot be hashed: enumerate afresh
        return _enumerate(operator, mesh, cost_model, device)


@dataclasses.dataclass(frozen=True)
class _Operator:
    """An operator with its operand records, compared by what its strategies depend on (never names)."""

    signature: tuple
    node: OpNode = dataclasses.field(compare=False)
    ins: tuple[TensorInfo, ...] = dataclasses.field(compare=False)
    outs: tuple[TensorInfo, ...] = dataclasses.field(compare=False)

    @classmethod
    def of(cls, graph: OpGraph, node: OpNode) -> "_Operator":
        ins = tuple(graph.tensor(t) for t in node.inputs)
        outs = tuple(graph.tensor(t) for t in node.outputs)
        signature = (node.primitive, node.params, node.flops, tuple((t.shape, t.dtype, is_free(t)) for t in ins),
                     tuple((t.shape, t.dtype) for t in outs))
        return cls(signature, node, ins, outs)


@functools.lru_cache(maxsize=16384)
def _memoised_strategies(operator: _Operator, mesh: LogicalMesh, cost_model: CostModelProtocol,
                         device: DeviceSpec) -> tuple[Strategy, ...]:
    return _enumerate(operator, mesh, cost_model, device)


def _enumerate(operator: _Operator, mesh: LogicalMesh, cost_model: CostModelProtocol,
               device: DeviceSpec) -> tuple[Strategy, ...]:
    node, ins, outs = operator.node, list(operator.ins), list(operator.outs)
    if node.primitive in IDENTITY:
        return (Strategy(IDENTITY_STRATEGY, (None,) * len(ins), (), 0.0, 0.0, 0.0),)
    labels = dim_labels(node, ins, outs)
    if labels is None:
        in_specs = tuple(None if is_free(t) else replicated(len(t.shape)) for t in ins)
        out_specs = tuple(replicated(len(t.shape)) for t in outs)
        return (_costed(node, ins, outs, in_specs, out_specs, 1, (), mesh, cost_model, device, ""),)
    found: dict[str, Strategy] = {}
    for strategy in _label_strategies(node, ins, outs, labels, mesh, cost_model, device):
        if strategy.name not in found or strategy.cost_s < found[strategy.name].cost_s:
            found[strategy.name] = strategy
    return tuple(found.values())


def strategy_names(graph: OpGraph, node_name: str, mesh: LogicalMesh) -> tuple[str, ...]:
    """The stable strategy names of one operator, for pins and the editor's dropdown."""
    node = graph.node(node_name)
    return tuple(s.name for s in enumerate_strategies(graph, node, mesh, CostModel(), NAMING_DEVICE))


def validate_plan(plan: Plan, graph: OpGraph) -> None:
    """Everything a plan must satisfy to run `graph`: its names (`Plan.check_graph`) and its strategies."""
    plan.check_graph(graph)
    check_plan_strategies(plan, graph)


def check_plan_strategies(plan: Plan, graph: OpGraph) -> None:
    """Raise PlanFormatError unless every strategy in the plan is one its operator has on its stage's mesh."""
    for stage in plan.stages:
        if not stage.strategies:
            continue
        mesh = LogicalMesh(stage.logical_mesh, stage.device_ids, (plan.cluster.intra_host, plan.cluster.intra_host))
        for node, name in stage.strategies:
            if node not in graph.node_by_name:
                raise PlanFormatError(f"plan.stages[{stage.index}].strategies: no operator named {node!r}")
            legal = strategy_names(graph, node, mesh)
            if name not in legal:
                raise PlanFormatError(
                    f"plan.stages[{stage.index}].strategies: {name!r} is not a strategy of {node} on logical mesh "
                    f"{stage.logical_mesh}; it has {len(legal)}, e.g. {list(legal[:3])}"
                )


def _label_strategies(node: OpNode, ins: list[TensorInfo], outs: list[TensorInfo], labels: DimLabels,
                      mesh: LogicalMesh, cost_model: CostModelProtocol, device: DeviceSpec):
    sizes = dict(labels.sizes)
    axis_size = dict(zip(mesh.axis_names, mesh.shape))
    axes = usable_axes(mesh)
    choices = [None, *sorted(sizes)]
    reduced = labels.reduced
    for choice in itertools.product(choices, repeat=len(axes)):
        assign: dict[str, tuple[str, ...]] = {}
        for axis, label in zip(axes, choice):
            if label is not None:
                assign[label] = assign.get(label, ()) + (axis,)
        if any(sizes[lab] % math.prod(axis_size[a] for a in ax) for lab, ax in assign.items()):
            continue

        def spec_of(labs) -> Spec | None:
            if labs is None:
                return None
            return tuple(assign.get(lab, ()) if lab else () for lab in labs)

        in_specs = tuple(spec_of(labs) for labs in labels.inputs)
        in_specs = tuple(
            replicated(len(t.shape)) if s is None and not is_free(t) else s for s, t in zip(in_specs, ins)
        )
        out_specs = tuple(spec_of(labs) for labs in labels.outputs)
        factor = math.prod(axis_size[a] for ax in assign.values() for a in ax)
        partial = tuple(a for a in axes if any(a in assign.get(lab, ()) for lab in reduced))
        yield _costed(node, ins, outs, in_specs, out_specs, factor, partial, mesh, cost_model, device, "")
        if labels.reduce_scatter and len(partial) == 1:
            yield from _reduce_scatter_variants(node, ins, outs, in_specs, out_specs, factor, partial[0],
                                                mesh, cost_model, device)


def _reduce_scatter_variants(node, ins, outs, in_specs, out_specs, factor, axis, mesh, cost_model, device):
    """Scatter the partial sums onto a result dim instead of all-reducing them."""
    axis_size = dict(zip(mesh.axis_names, mesh.shape))
    (out_spec,), (out,) = out_specs, outs
    for d, dim in enumerate(out.shape):
        # Only onto an unsplit dim: XLA realises scattering into an already split dim with extra gathers.
        if out_spec[d] or dim % axis_size[axis]:
            continue
        scattered = tuple(axes + (axis,) if i == d else axes for i, axes in enumerate(out_spec))
        yield _costed(node, ins, outs, in_specs, (scattered,), factor, (axis,), mesh, cost_model, device,
                      "scatter", unreduced=(out_spec,))


def _costed(node: OpNode, ins, outs, in_specs, out_specs, factor: int, partial: tuple[str, ...],
            mesh: LogicalMesh, cost_model: CostModelProtocol, device: DeviceSpec, mode: str,
            unreduced: tuple[Spec, ...] | None = None) -> Strategy:
    """Attach compute (roofline on the per-device share) and collective costs."""
    in_bytes = sum(shard_bytes(t, s, mesh) for t, s in zip(ins, in_specs))
    out_bytes = sum(shard_bytes(t, s, mesh) for t, s in zip(outs, out_specs))
    dtype = (ins or outs)[0].dtype if (ins or outs) else None
    compute = cost_model.op_time(node.primitive, node.flops / factor, in_bytes + out_bytes, device, dtype)
    collectives: list[Collective] = []
    if partial:
        axis_ids = tuple(mesh.axis_names.index(a) for a in partial)
        ids = axis_ids[0] if len(axis_ids) == 1 else axis_ids
        if mode == "scatter":
            message = sum(shard_bytes(t, s, mesh) for t, s in zip(outs, unreduced or out_specs))
            collectives.append(Collective("reduce-scatter", partial, message))
            comm = cost_model.reduce_scatter(message, mesh, ids)
        else:
            collectives.append(Collective("all-reduce", partial, out_bytes))
            comm = cost_model.all_reduce(out_bytes, mesh, ids)
    else:
        comm = 0.0
    name = strategy_label(in_specs, out_specs, mesh, partial, mode == "scatter")
    return Strategy(name, tuple(in_specs), tuple(out_specs), compute, comm, out_bytes, tuple(collectives))
