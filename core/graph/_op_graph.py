"""The operator graph: a frozen DAG of primitive applications and tensors.

Solvers read only the plain fields (names, shapes, FLOPs, params).  The
runtime additionally needs the JAX primitive and its raw params to execute a
sub-graph; those live in fields excluded from equality and serialisation.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from functools import cached_property
from typing import Any, Iterable, Literal, Mapping, Sequence

import numpy as np

Role = Literal["forward", "backward", "update"]
TensorKind = Literal["input", "constant", "intermediate"]

ROLES: tuple[Role, ...] = ("forward", "backward", "update")

# Bytes per element of JAX's typed PRNG keys, which numpy has no dtype for.
_KEY_ITEMSIZE = {"key<fry>": 8, "key<rbg>": 16, "key<unsafe_rbg>": 16}


def dtype_name(dtype: Any) -> str:
    """A dtype as a plain string: numpy's name, or JAX's for typed PRNG keys (`key<fry>`)."""
    try:
        return np.dtype(dtype).name
    except TypeError:
        return str(dtype)


def dtype_itemsize(name: str) -> int:
    """Bytes per element of a dtype named by `dtype_name`."""
    if name.startswith("key<"):
        return _KEY_ITEMSIZE.get(name, 16)
    return np.dtype(name).itemsize


def is_float_dtype(name: str) -> bool:
    """Floating point, bf16, fp16 and fp8 included (numpy alone does not count ml_dtypes as inexact)."""
    if name.startswith("key<"):
        return False
    import jax.numpy as jnp  # lazy: the graph's data model is plain numpy

    return bool(jnp.issubdtype(np.dtype(name), jnp.floating) or jnp.issubdtype(np.dtype(name), jnp.complexfloating))


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """One value in the graph: a graph input, a constant, or an op output."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    kind: TensorKind
    producer: str | None = None

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes on one device when unsharded: elements times the dtype's size."""
        return self.size * dtype_itemsize(self.dtype)


@dataclasses.dataclass(frozen=True)
class OpNode:
    """One primitive application.

    `params` holds the primitive's parameters converted to plain data (ints,
    strings, tuples) so that strategy enumeration can read them without JAX.
    """

    name: str
    index: int
    primitive: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    params: tuple[tuple[str, Any], ...]
    flops: float
    bytes_read: int
    bytes_written: int
    role: Role
    layer: int
    scope: str = ""
    note: str = ""
    source: str = dataclasses.field(default="", compare=False)  # the user's line, "file:line (function)"
    # Raw JAX objects for the runtime; not compared, hashed or serialised.
    jax_primitive: Any = dataclasses.field(default=None, compare=False, repr=False)
    jax_params: Any = dataclasses.field(default=None, compare=False, repr=False)

    def param(self, key: str, default: Any = None) -> Any:
        """Return one plain-data parameter of the primitive."""
        for name, value in self.params:
            if name == key:
                return value
        return default


@dataclasses.dataclass(frozen=True)
class OpGraph:
    """A traced training step: nodes in topological order and their tensors.

    `inputs` are the flattened arguments of the traced function (pytree
    order, named by key path), `outputs` its flattened results.
    `batch_inputs` are the inputs split into microbatches (the leaves of
    arguments `batch_argnums`), and `batch_note` says how they were found.
    """

    name: str
    nodes: tuple[OpNode, ...]
    tensors: tuple[TensorInfo, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    num_layers: int
    # pytree structures and constant values, for the runtime only.
    in_tree: Any = dataclasses.field(default=None, compare=False, repr=False)
    out_tree: Any = dataclasses.field(default=None, compare=False, repr=False)
    constants: Any = dataclasses.field(default=None, compare=False, repr=False)
    batch_inputs: tuple[str, ...] = ()
    batch_argnums: tuple[int, ...] = ()
    batch_note: str = ""
    # A stacked argument read layer by layer (a scan over layers) -> its slices along dim 0, which are
    # extra inputs after the arguments' leaves; the runtime cuts them from the argument.
    input_parts: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # A stacked output no operator makes -> the per-layer tensors the runtime stacks into it.
    output_parts: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # Argument and result leaves that are not arrays (an Equinox activation), kept out of the trace; a
    # `StaticLeaves` each, for the runtime only.
    static_inputs: Any = dataclasses.field(default=None, compare=False, repr=False)
    static_outputs: Any = dataclasses.field(default=None, compare=False, repr=False)

    @cached_property
    def leaf_inputs(self) -> tuple[str, ...]:
        """The inputs that are the step's argument leaves, in pytree order (the per-layer parts excluded)."""
        parts = sum(len(p) for _, p in self.input_parts)
        return self.inputs[:len(self.inputs) - parts]

    def input_values(self, leaves: Sequence[Any]) -> dict[str, Any]:
        """Input name -> value for the step's (dynamic) argument leaves, the per-layer parts cut from their stacks."""
        if len(leaves) != len(self.leaf_inputs):
            raise ValueError(f"expected {len(self.leaf_inputs)} input leaves, got {len(leaves)}")
        values = dict(zip(self.leaf_inputs, leaves))
        for leaf, parts in self.input_parts:
            values.update((part, values[leaf][i]) for i, part in enumerate(parts))
        return values

    @cached_property
    def output_tensors(self) -> frozenset[str]:
        """What the step returns, with the parts of stacked outputs: every tensor a task must hand back."""
        return frozenset(self.outputs) | frozenset(p for _, parts in self.output_parts for p in parts)

    def arguments(self, args: Sequence[Any]) -> list[Any]:
        """The step's traced argument leaves: all but the static ones (see `_static_leaves`)."""
        from alpaviz.core.graph._static_leaves import dynamic_leaves

        return dynamic_leaves(tuple(args))

    def results(self, outputs: Sequence[Any]) -> Any:
        """The step's returned pytree from its flat traced outputs, the static result leaves put back."""
        import jax  # lazy: the graph's data model is plain data

        tree = jax.tree.unflatten(self.out_tree, list(outputs))
        return tree if self.static_outputs is None else self.static_outputs.merge(tree)

    @cached_property
    def output_paths(self) -> Mapping[str, str]:
        """Output tensor -> where it sits in the step's returned pytree (`[2]['num_tokens']`), for messages."""
        if self.out_tree is None:
            return {}
        import jax  # lazy: the graph's data model is plain data

        tree = jax.tree.unflatten(self.out_tree, list(range(len(self.outputs))))
        found = jax.tree_util.tree_flatten_with_path(tree)[0]
        return {self.outputs[i]: jax.tree_util.keystr(path) or "the result" for path, i in found}

    @cached_property
    def node_by_name(self) -> Mapping[str, OpNode]:
        return {node.name: node for node in self.nodes}

    @cached_property
    def node_position(self) -> Mapping[str, int]:
        """Operator name -> its index in `nodes` (graph order)."""
        return {node.name: i for i, node in enumerate(self.nodes)}

    @cached_property
    def tensor_by_name(self) -> Mapping[str, TensorInfo]:
        return {tensor.name: tensor for tensor in self.tensors}

    @cached_property
    def consumers(self) -> Mapping[str, tuple[str, ...]]:
        """Tensor name -> names of the nodes that read it."""
        readers: dict[str, list[str]] = {t.name: [] for t in self.tensors}
        for node in self.nodes:
            for name in dict.fromkeys(node.inputs):
                readers[name].append(node.name)
        return {name: tuple(users) for name, users in readers.items()}

    def node(self, name: str) -> OpNode:
        """The operator called `name`; a KeyError says so if there is none."""
        try:
            return self.node_by_name[name]
        except KeyError:
            raise KeyError(f"no operator named {name!r} in graph {self.name!r}") from None

    def tensor(self, name: str) -> TensorInfo:
        """The tensor called `name`; a KeyError says so if there is none."""
        try:
            return self.tensor_by_name[name]
        except KeyError:
            raise KeyError(f"no tensor named {name!r} in graph {self.name!r}") from None

    def operand_dtype(self, node: OpNode) -> str | None:
        """The dtype an operator computes in (its first operand's; its result's when it has none)."""
        names = node.inputs or node.outputs
        return self.tensor(names[0]).dtype if names else None

    @property
    def total_flops(self) -> float:
        """FLOPs of one step on the global batch, summed over every operator."""
        return float(sum(node.flops for node in self.nodes))

    def flops_by_primitive(self) -> dict[str, float]:
        """FLOPs per JAX primitive (dot_general, conv, ...), to see where the step's work goes."""
        totals: Counter[str] = Counter()
        for node in self.nodes:
            totals[node.primitive] += node.flops
        return dict(totals)

    def flops_by_role(self) -> dict[str, float]:
        """FLOPs per role (forward, backward, update), every role present even at zero."""
        totals = {role: 0.0 for role in ROLES}
        for node in self.nodes:
            totals[node.role] += node.flops
        return totals

    def nodes_in_layers(self, layers: Iterable[int]) -> tuple[OpNode, ...]:
        """The operators of the given layers, in graph order: what one stage would run."""
        wanted = set(layers)
        return tuple(node for node in self.nodes if node.layer in wanted)

    def layer_flops(self) -> tuple[float, ...]:
        """FLOPs per layer, indexed by layer: the balance the stage DP works from."""
        totals = [0.0] * self.num_layers
        for node in self.nodes:
            totals[node.layer] += node.flops
        return tuple(totals)

    def with_layers(self, layer_of_node: Mapping[str, int]) -> "OpGraph":
        """Return a copy whose nodes carry a new layer assignment."""
        nodes = tuple(dataclasses.replace(n, layer=layer_of_node[n.name]) for n in self.nodes)
        num_layers = max(layer_of_node.values(), default=-1) + 1
        return dataclasses.replace(self, nodes=nodes, num_layers=num_layers)

    def summary(self) -> str:
        """A short human-readable table: operators per primitive and FLOPs per role."""
        counts = Counter(node.primitive for node in self.nodes)
        flops = self.flops_by_primitive()
        lines = [
            f"OpGraph {self.name!r}: {len(self.nodes)} operators, {len(self.tensors)} tensors, "
            f"{len(self.inputs)} inputs, {self.num_layers} layers, {self.total_flops:.4g} FLOPs",
            "  " + ", ".join(f"{role} {value:.3g}" for role, value in self.flops_by_role().items()),
            f"  {'primitive':<24}{'count':>8}{'FLOPs':>14}",
        ]
        for prim, count in counts.most_common():
            lines.append(f"  {prim:<24}{count:>8}{flops[prim]:>14.4g}")
        return "\n".join(lines)
