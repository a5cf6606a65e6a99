"""Shrink the sharding problem before the ILP, as Alpa does.

Cheap operators (elementwise, reshape, transpose, broadcast, reductions,
...) *follow* their largest operand: they get no variable of their own and
pick, for each choice of the operand's group, their cheapest strategy given
that operand's sharding.  Only dots, convolutions, gathers/scatters, pinned
operators and the stage's input tensors ("anchors") remain as decision
groups, which keeps the ILP small on big graphs.  Pass-through markers
(`layer_boundary`) are aliases and cost nothing.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Mapping, Sequence

from alpaviz.core.cost import CostModelProtocol, DeviceSpec, LogicalMesh
from alpaviz.core.graph import OpGraph, OpNode, TensorInfo
from alpaviz.core.intra_op._dim_labels import IDENTITY, is_free
from alpaviz.core.intra_op._resharding import ReshardingPrices
from alpaviz.core.intra_op._strategies import Strategy, enumerate_strategies, usable_axes
from alpaviz.core.plan import Spec

# Operators that always decide their own sharding.
ANCHORS = frozenset(("dot_general", "conv_general_dilated", "gather", "scatter-add", "scatter_add"))


@dataclasses.dataclass(frozen=True)
class Group:
    """One ILP decision: an anchor operator and its followers, or an input tensor.

    `root` is a node name (`is_tensor` False) or a tensor name; a tensor
    group's options are its candidate specs.
    """

    root: str
    is_tensor: bool
    members: tuple[str, ...]
    num_options: int


@dataclasses.dataclass(frozen=True)
class Simplified:
    """The grouped problem: every operator's strategy and every tensor's spec per group option."""

    groups: tuple[Group, ...]
    group_of_node: Mapping[str, int]
    group_of_tensor: Mapping[str, int]
    alias: Mapping[str, str]
    strategies: Mapping[str, tuple[Strategy, ...]]
    choice: Mapping[str, tuple[int, ...]]
    tensor_specs: Mapping[str, tuple[Spec, ...]]
    nodes: tuple[str, ...]
    nodes_before: int
    free: frozenset[str] = frozenset()
    constant_nodes: tuple[str, ...] = ()

    def resolve(self, tensor: str) -> str:
        """The tensor an alias (a pass-through marker's result) stands for."""
        while tensor in self.alias:
            tensor = self.alias[tensor]
        return tensor

    def is_free(self, graph: OpGraph, tensor: str) -> bool:
        """Constants, scalars and values computed from them alone take any sharding at no cost."""
        return tensor in self.free or is_free(graph.tensor(tensor))


def candidate_specs(tensor: TensorInfo, mesh: LogicalMesh) -> tuple[Spec, ...]:
    """Every valid spec of a tensor: each usable mesh axis on one dim that it divides, or none."""
    axes = usable_axes(mesh)
    sizes = dict(zip(mesh.axis_names, mesh.shape))
    rank = len(tensor.shape)
    found: list[Spec] = []
    for choice in itertools.product([None, *range(rank)], repeat=len(axes)):
        spec = [()] * rank
        for axis, dim in zip(axes, choice):
            if dim is not None:
                spec[dim] = spec[dim] + (axis,)
        if all(dim % math.prod(sizes[a] for a in ax) == 0 for dim, ax in zip(tensor.shape, spec)):
            found.append(tuple(spec))
    return tuple(dict.fromkeys(found))


def simplify(graph: OpGraph, node_names: Sequence[str], mesh: LogicalMesh, cost_model: CostModelProtocol,
             device: DeviceSpec, pinned_nodes: frozenset[str] = frozenset(),
             merge_followers: bool = True) -> Simplified:
    """Group the operators of `node_names` (in graph order) into ILP decisions."""
    builder = _Builder(graph, mesh, cost_model, device)
    for name in node_names:
        builder.add(graph.node(name), merge_followers and name not in pinned_nodes, name in pinned_nodes)
    return Simplified(
        groups=tuple(Group(g["root"], g["is_tensor"], tuple(g["members"]), g["k"]) for g in builder.groups),
        group_of_node=builder.group_of_node,
        group_of_tensor=builder.group_of_tensor,
        alias=builder.alias,
        strategies=builder.strategies,
        choice=builder.choice,
        tensor_specs=builder.tensor_specs,
        nodes=tuple(node_names),
        nodes_before=len(node_names),
        free=frozenset(builder.free),
        constant_nodes=tuple(builder.constant_nodes),
    )


class _Builder:
    def __init__(self, graph: OpGraph, mesh: LogicalMesh, cost_model: CostModelProtocol, device: DeviceSpec):
        self.graph, self.mesh, self.cost_model, self.device = graph, mesh, cost_model, device
        self.groups: list[dict] = []
        self.group_of_node: dict[str, int] = {}
        self.group_of_tensor: dict[str, int] = {}
        self.alias: dict[str, str] = {}
        self.strategies: dict[str, tuple[Strategy, ...]] = {}
        self.choice: dict[str, tuple[int, ...]] = {}
        self.tensor_specs: dict[str, tuple[Spec, ...]] = {}
        self.reshard = ReshardingPrices(graph, mesh, cost_model)
        self.free: set[str] = set()
        self.constant_nodes: list[str] = []

    def resolve(self, tensor: str) -> str:
        while tensor in self.alias:
            tensor = self.alias[tensor]
        return tensor

    def _new_group(self, root: str, is_tensor: bool, k: int) -> int:
        self.groups.append(dict(root=root, is_tensor=is_tensor, members=[], k=k))
        return len(self.groups) - 1

    def _source(self, tensor: str) -> int:
        """The group deciding `tensor`; a tensor made outside the problem gets its own."""
        if tensor not in self.group_of_tensor:
            info = self.graph.tensor(tensor)
            specs = candidate_specs(info, self.mesh)
            g = self._new_group(tensor, True, len(specs))
            self.group_of_tensor[tensor] = g
            self.tensor_specs[tensor] = specs
        return self.group_of_tensor[tensor]

    def _strategies(self, node: OpNode) -> tuple[Strategy, ...]:
        return enumerate_strategies(self.graph, node, self.mesh, self.cost_model, self.device)

    def _cheapest(self, tensor: str, spec: Spec, operand: int, strategies: tuple[Strategy, ...],
                  order: list[int]) -> int:
        """The follower strategy for an operand sharded as `spec`.

        A follower keeps its operand's sharding when it can (as in Alpa):
        the cheapest strategy reading `spec` as it is.  Otherwise (say, a
        reshape that cannot carry the split) the least own cost plus
        resharding; strategies are tried in order of own cost, and since
        resharding is never negative the scan stops once own cost alone
        reaches the best total.
        """
        for j in order:
            if strategies[j].in_specs[operand] == spec:
                return j
        best, pick = float("inf"), order[0]
        for j in order:
            own = strategies[j].cost_s
            if own >= best:
                break
            total = own + self.reshard(tensor, spec, strategies[j].in_specs[operand])
            if total < best:
                best, pick = total, j
        return pick

    def add(self, node: OpNode, may_follow: bool, pinned: bool = False) -> None:
        inputs = [self.resolve(t) for t in node.inputs]
        strategies = self._strategies(node)
        self.strategies[node.name] = strategies
        if node.primitive in IDENTITY:
            for src, dst in zip(inputs, node.outputs):
                self.alias[dst] = src
            return
        live = [(i, t) for i, t in enumerate(inputs)
                if t not in self.free and self.graph.tensor(t).kind != "constant"]
        if not live and not pinned:
            # Computed from constants alone (iota, masks): every device makes its own piece.
            self.free.update(node.outputs)
            self.constant_nodes.append(node.name)
            return
        for _, t in live:
            self._source(t)
        lead = None
        if may_follow and len(strategies) > 1 and node.primitive not in ANCHORS and live:
            lead = max(live, key=lambda it: (self.graph.tensor(it[1]).size, -it[0]))
        if lead is None:
            g = self._new_group(node.name, False, len(strategies))
            picks = tuple(range(len(strategies)))
        else:
            operand, tensor = lead
            g = self.group_of_tensor[tensor]
            order = sorted(range(len(strategies)), key=lambda j: strategies[j].cost_s)
            best: dict[Spec, int] = {}
            for spec in self.tensor_specs[tensor]:
                if spec not in best:
                    best[spec] = self._cheapest(tensor, spec, operand, strategies, order)
            picks = tuple(best[spec] for spec in self.tensor_specs[tensor])
        self.groups[g]["members"].append(node.name)
        self.group_of_node[node.name] = g
        self.choice[node.name] = picks
        for position, out in enumerate(node.outputs):
            self.group_of_tensor[out] = g
            self.tensor_specs[out] = tuple(strategies[j].out_specs[position] for j in picks)
