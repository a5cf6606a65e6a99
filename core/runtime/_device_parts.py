"""Gradients kept as each device's partial sum over the microbatches, reduced once in the update.

Data parallelism splits the batch over some mesh axes, so every device's
backward holds a partial sum of each weight gradient; left to itself, XLA
all-reduces it inside every microbatch's executable.  The plan prices that
reduction once per step, and this module makes the runtime do the same.

A stage evaluates each sum over the batch (`PartialSums.reductions`: a
weight gradient's `dot_general`, a bias gradient's `reduce_sum`) once per
device part of the batch: the batch dimension of its operands is split into
`parts` (the devices along the batch's mesh axes), the operator is vmapped
over the parts, and the result keeps a leading dimension of `parts` sharded
over those axes, one partial sum per device, with no communication.  Linear
work on partial sums runs the same way.  The accumulators carry that
dimension across the microbatches; the update sums it away, and there XLA
inserts the one all-reduce (or reduce-scatter, when the update's gradient is
sharded) that the plan chose.  Any split of a summed dimension gives parts
that add up to the whole, so the numbers are those of the global batch.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any, Mapping, Sequence

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from alpaviz.core.graph import OpGraph, OpNode, PartialSums

_SCATTER_ADD = frozenset({"scatter-add", "scatter_add"})


@dataclasses.dataclass(frozen=True)
class DeviceParts:
    """How one stage keeps its partial sums per device: over which mesh axes, in how many parts."""

    axes: tuple[str, ...]  # the mesh axes the batch is split over
    parts: int  # devices along them
    partial: PartialSums

    def held(self, nodes: Sequence[OpNode]) -> frozenset[str]:
        """The tensors these nodes (one task, in graph order) make and keep as per-device partial sums.

        A sum over the batch is held; linear work on held values is held when
        every result is a partial sum.  What a task reads from outside is
        always a reduced value.
        """
        out: set[str] = set()
        for node in nodes:
            if node.name in self.partial.reductions or (
                any(t in out for t in node.inputs) and all(t in self.partial.tensors for t in node.outputs)
            ):
                out.update(node.outputs)
        return frozenset(out)


def device_parts(graph: OpGraph, partial: PartialSums, specs: Mapping[str, Any],
                 mesh_shape: tuple[int, int], axis_names: Sequence[str], nodes: Sequence[str]) -> DeviceParts | None:
    """The stage's split of its batch sums over devices, or None when it has no reduction to defer.

    The axes are those the plan splits the batch dimension over, read from
    the specs of the operands of the stage's sums over the batch (the most
    common choice when they differ; XLA reshards the others).
    """
    mine = set(nodes)
    reductions = [graph.node(n) for n in partial.reductions if n in mine]
    dims = dict(partial.batch_dims)
    seen: collections.Counter[tuple[str, ...]] = collections.Counter()
    for node in reductions:
        for t in node.inputs:
            if t in dims and t in specs and specs[t][dims[t]]:
                seen[tuple(specs[t][dims[t]])] += 1
    for t, d in dims.items():  # batch inputs the stage reads directly
        if not seen and t in specs and t in graph.inputs and specs[t][d]:
            seen[tuple(specs[t][d])] += 1
    if not reductions or not seen:
        return None
    axes = seen.most_common(1)[0][0]
    sizes = dict(zip(axis_names, mesh_shape))
    parts = math.prod(sizes[a] for a in axes)
    divides = all(graph.tensor(t).shape[dims[t]] % parts == 0 for node in reductions for t in node.inputs if t in dims)
    if parts == 1 or not divides:
        return None
    return DeviceParts(axes=axes, parts=parts, partial=partial)


class PartEvaluator:
    """Runs one executable's nodes with `held` tensors as per-device partial sums (see the module docstring).

    `sharding(name)` is where a reduced tensor lives on the stage's mesh and
    `spec(name)` its plan spec (None: none given).
    """

    def __init__(self, parts: DeviceParts, held: frozenset[str], mesh: Mesh, sharding, spec) -> None:
        self.parts = parts
        self.held = held
        self.mesh = mesh
        self.sharding = sharding
        self.spec = spec
        self.batch_dims = dict(parts.partial.batch_dims)
        self._reduced: dict[int, Any] = {}

    def held_sharding(self, name: str) -> NamedSharding:
        return held_sharding(self.parts, self.mesh, self.spec(name))

    def reduce(self, name: str, value: Any) -> Any:
        return reduce_parts(value, self.sharding(name))

    def apply(self, node: OpNode, args: list[Any]) -> list[Any]:
        """One node's results: split over the parts where held, on reduced operands otherwise."""
        if node.name in self.parts.partial.reductions and node.outputs[0] in self.held:
            outs = self._split_sum(node, args)
        elif node.outputs[0] in self.held:
            axes = [0 if t in self.held else None for t in node.inputs]
            outs = jax.vmap(lambda *a: _bind(node, a), in_axes=axes)(*args)
        else:
            args = [self._reduced_value(t, v) if t in self.held else v for t, v in zip(node.inputs, args)]
            return _bind(node, args)
        return [jax.lax.with_sharding_constraint(v, self.held_sharding(t)) for t, v in zip(node.outputs, outs)]

    def _reduced_value(self, name: str, value: Any) -> Any:
        key = id(value)
        if key not in self._reduced:
            self._reduced[key] = self.reduce(name, value)
        return self._reduced[key]

    def _split_sum(self, node: OpNode, args: list[Any]) -> list[Any]:
        """A sum over the batch, evaluated on each device's part of the batch dimension."""
        n, axes = self.parts.parts, self.parts.axes
        split, in_axes = [], []
        for t, v in zip(node.inputs, args):
            d = self.batch_dims.get(t)
            if d is None:
                split.append(v)
                in_axes.append(None)
                continue
            shape = tuple(v.shape)
            v = v.reshape(shape[:d] + (n, shape[d] // n) + shape[d + 1:])
            layout = [PartitionSpec.UNCONSTRAINED] * (len(shape) + 1)
            layout[d] = _entry(axes)
            split.append(jax.lax.with_sharding_constraint(v, NamedSharding(self.mesh, PartitionSpec(*layout))))
            in_axes.append(d)
        if node.primitive in _SCATTER_ADD and in_axes[0] is None:
            # The operand is added once, on the first part; every part scatters into zeros.
            base = split[0]
            split[0] = jax.numpy.zeros_like(base)
            outs = jax.vmap(lambda *a: _bind(node, a), in_axes=in_axes)(*split)
            return [outs[0].at[0].add(base)]
        return jax.vmap(lambda *a: _bind(node, a), in_axes=in_axes)(*split)


def held_sharding(parts: DeviceParts, mesh: Mesh, spec: Any) -> NamedSharding:
    """A held tensor's `(parts, *shape)` layout: one part per device along the batch axes, the other
    dims as the plan shards the reduced tensor, less those axes."""
    rest = [] if spec is None else [tuple(a for a in dim if a not in parts.axes) for dim in spec]
    entries = [None if not d else d[0] if len(d) == 1 else d for d in rest]
    return NamedSharding(mesh, PartitionSpec(_entry(parts.axes), *entries))


def reduce_parts(value: Any, sharding: NamedSharding) -> Any:
    """A held tensor's sum over its parts, laid out as the plan wants the reduced tensor: XLA's one
    all-reduce, or a reduce-scatter when that layout is sharded."""
    return jax.lax.with_sharding_constraint(value.sum(axis=0), sharding)


def _bind(node: OpNode, args: Sequence[Any]) -> list[Any]:
    outs = node.jax_primitive.bind(*args, **node.jax_params)
    return list(outs) if node.jax_primitive.multiple_results else [outs]


def _entry(axes: tuple[str, ...]) -> Any:
    return axes[0] if len(axes) == 1 else axes
