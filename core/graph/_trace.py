"""Trace a JAX training step into an `OpGraph`.

The step is turned into a jaxpr with `jax.make_jaxpr`; call-like primitives
(jit, custom_jvp/vjp, checkpoint) are inlined so that every node is one real
primitive, with the call's name stack prefixed to its body's.  Control flow
(scan, while, cond) stays one node each, with its FLOPs estimated from the
body and a note saying so.  Roles (forward, backward, update) come from the
dataflow (`_step_structure`).
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
from typing import Any, Callable, Sequence

import jax
import numpy as np
from jax.extend import core as jex_core
from jax.extend import source_info_util

from alpaviz.core.graph._flops import primitive_flops
from alpaviz.core.graph._markers import LAYER_BOUNDARY
from alpaviz.core.graph._layers import assign_backward_layers
from alpaviz.core.graph._op_graph import OpGraph, OpNode, TensorInfo, dtype_name
from alpaviz.core.graph._scan import LayerScanUnroller, Value, is_layer_scan
from alpaviz.core.graph._static_leaves import StaticLeaves, dynamic_leaves, split_static
from alpaviz.core.graph._step_structure import RawOp, StepStructureError, find_batch_argnums, infer_roles

# Call-like primitives whose body is spliced into the graph.
_INLINED = frozenset(
    "pjit jit closed_call core_call custom_jvp_call custom_vjp_call custom_vjp_call_jaxpr "
    "remat checkpoint remat2 custom_lin".split()
)
_SUBJAXPR_PARAMS = ("jaxpr", "call_jaxpr", "fun_jaxpr")


def trace(
    fn: Callable[..., Any],
    *example_args: Any,
    name: str | None = None,
    batch_argnums: Sequence[int] | None = None,
) -> OpGraph:
    """Trace `fn(*example_args)` into an operator graph.

    `example_args` may be real arrays or `jax.ShapeDtypeStruct`s; nothing is
    executed or allocated.  `batch_argnums` names the arguments split into
    microbatches; by default they are found (`graph.batch_note` says how):
    the arguments the step does not return updated, whose leaves share one
    leading dimension.

    Example:
        >>> graph = av.trace(train_step, params, opt_state, batch)
        >>> print(graph.summary())
    """
    example_args, static_inputs = split_static(tuple(example_args))
    static_outputs: list[StaticLeaves] = []

    def dynamic_step(*dynamic: Any) -> Any:
        out, static = split_static(fn(*static_inputs.merge(dynamic)))
        static_outputs.append(static)
        return out

    closed, out_shape = jax.make_jaxpr(dynamic_step, return_shape=True)(*example_args)
    builder = _GraphBuilder()
    input_names = _input_names(fn, example_args)
    outer_inputs = [builder.add_input(n, v.aval) for n, v in zip(input_names, closed.jaxpr.invars)]
    batch_nums, batch_note = _batch_argnums(example_args, out_shape, batch_argnums)
    batch_inputs = _leaves_of(example_args, batch_nums, outer_inputs)
    builder.batch_dependent.update(batch_inputs)
    builder.leaves.update(outer_inputs)
    const_names = [builder.add_constant(c) for c in closed.consts]
    outputs = [builder.assembled_output(v) for v in builder.walk(closed.jaxpr, const_names, outer_inputs, "")]
    output_names = tuple(builder.name_output(i, t) for i, t in enumerate(outputs))
    nodes, marked = _assign_roles_and_layers(builder, output_names, batch_inputs)
    graph = OpGraph(
        name=name or getattr(fn, "__name__", "step"),
        nodes=nodes,
        tensors=tuple(builder.tensors.values()),
        inputs=(*outer_inputs, *(p for parts in builder.input_parts.values() for p in parts)),
        outputs=output_names,
        num_layers=1,
        in_tree=jax.tree.structure(example_args),
        out_tree=jax.tree.structure(out_shape),
        constants=builder.constants,
        batch_inputs=batch_inputs,
        batch_argnums=batch_nums,
        batch_note=batch_note,
        input_parts=tuple((leaf, tuple(parts)) for leaf, parts in builder.input_parts.items()),
        output_parts=tuple(builder.output_parts.items()),
        static_inputs=static_inputs,
        static_outputs=static_outputs[-1],
    )
    # Update operators take the layer of the parameter (or gradient) they update.
    full = assign_backward_layers(graph, marked)
    # Drop empty layers (e.g. a marker on the very last forward value).
    compact = {old: new for new, old in enumerate(sorted(set(full.values())))}
    return graph.with_layers({node: compact[layer] for node, layer in full.items()})


def _batch_argnums(args: tuple[Any, ...], out_shape: Any, given: Sequence[int] | None) -> tuple[tuple[int, ...], str]:
    if given is not None:
        nums = tuple(int(i) for i in given)
        for i in nums:
            if not 0 <= i < len(args):
                raise ValueError(f"batch_argnums {nums} names argument {i}, but the step takes {len(args)}")
        return nums, f"argument(s) {list(nums)} are the batch (batch_argnums)"
    try:
        return find_batch_argnums(args, out_shape)
    except StepStructureError as err:
        return (), str(err)


def _leaves_of(args: tuple[Any, ...], argnums: Sequence[int], names: Sequence[str]) -> tuple[str, ...]:
    """The input names of the leaves of arguments `argnums` (args without their static leaves)."""
    counts = [len(dynamic_leaves(a)) for a in args]
    starts = np.cumsum([0, *counts])
    return tuple(names[j] for i in sorted(argnums) for j in range(starts[i], starts[i + 1]))


def _input_names(fn: Callable[..., Any], args: tuple[Any, ...]) -> list[str]:
    """Flattened argument names: the parameter name, then the pytree key path."""
    try:
        arg_names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        arg_names = []
    names = []
    for i, arg in enumerate(args):
        prefix = arg_names[i] if i < len(arg_names) else f"arg{i}"
        for path, _ in jax.tree_util.tree_flatten_with_path(arg)[0]:
            names.append(".".join([prefix, *(_key_str(k) for k in path)]))
    return names


def _key_str(key: Any) -> str:
    for attr in ("key", "idx", "name"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def plain_data(value: Any) -> Any:
    """Convert a primitive param to ints, floats, strings and tuples, or None if opaque."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, np.generic)):
        return np.dtype(value).name
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (tuple, list)):
        items = [plain_data(v) for v in value]
        return tuple(items)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return tuple((f.name, plain_data(getattr(value, f.name))) for f in dataclasses.fields(value))
    return None


class _GraphBuilder(LayerScanUnroller):
    """Turns a jaxpr into nodes and tensors, inlining calls and unrolling scans over layers."""

    def __init__(self) -> None:
        self.tensors: dict[str, TensorInfo] = {}
        self.constants: dict[str, Any] = {}
        self.raw_nodes: list[dict[str, Any]] = []
        # What depends on the batch, and what on constants alone: tells a scan over layers from others.
        self.batch_dependent: set[str] = set()
        self.constant_only: set[str] = set()
        self.leaves: set[str] = set()  # the step's arguments, flattened
        self.slices: dict[tuple[str, int], str] = {}
        self.input_parts: dict[str, list[str]] = {}  # a stacked argument -> its per-layer slices, as inputs
        self.output_parts: dict[str, tuple[str, ...]] = {}  # a stacked result -> the per-layer tensors it stacks

    def _new_tensor(self, aval: Any, kind: str, producer: str | None = None, name: str | None = None) -> str:
        name = name or f"t{len(self.tensors)}"
        self.tensors[name] = TensorInfo(
            name=name,
            shape=tuple(int(d) for d in aval.shape),
            dtype=dtype_name(aval.dtype),
            kind=kind,  # type: ignore[arg-type]
            producer=producer,
        )
        return name

    def add_input(self, name: str, aval: Any) -> str:
        return self._new_tensor(aval, "input", name=name)

    def add_constant(self, value: Any, aval: Any = None) -> str:
        aval = aval if aval is not None else jax.typeof(value)
        name = self._new_tensor(aval, "constant", name=f"c{len(self.constants)}")
        self.constants[name] = value
        self.constant_only.add(name)
        return name

    def name_output(self, index: int, tensor: str) -> str:
        return tensor

    def walk(self, jaxpr: Any, consts: list[str], inputs: list[Value], scope: str, source: str = "") -> list[Value]:
        """Add `jaxpr`'s equations; `scope` and `source` are those of the call it is the body of.

        Values are tensor names, or `_Stacked` per-iteration parts of an unrolled
        scan's output, made into one tensor only when an operator reads it whole.
        """
        env: dict[Any, Value] = {}
        for var, name in zip(jaxpr.constvars, consts):
            env[var] = name
        for var, name in zip(jaxpr.invars, inputs):
            env[var] = name

        def read(v: Any) -> Value:
            if isinstance(v, jex_core.Literal):
                return self.add_constant(v.val, v.aval)
            return env[v]

        for eqn in jaxpr.eqns:
            values = [read(v) for v in eqn.invars]
            sub = _subjaxpr(eqn)
            if sub is not None and eqn.primitive.name in _INLINED:
                inner, inner_consts = sub
                const_names = [self.add_constant(c) for c in inner_consts]
                outs = self.walk(inner, const_names, values, _join(scope, eqn.source_info.name_stack),
                                 _source(eqn) or source)
            elif self.batch_dependent and is_layer_scan(eqn, [self._representative(v) for v in values],
                                                        self.batch_dependent, self.constant_only):
                outs = self._unroll_scan(eqn, values, _join(scope, eqn.source_info.name_stack),
                                         _source(eqn) or source)
            elif self._per_layer(eqn, values):
                outs = [self._apply_per_layer(eqn, values, scope, _source(eqn) or source)]
            else:
                outs = self._add_node(eqn, [self.materialize(v) for v in values], scope, source)
            for var, value in zip(eqn.outvars, outs):
                env[var] = value
        return [read(v) for v in jaxpr.outvars]

    def _inline(self, closed: Any, in_names: list[str], scope: str, source: str) -> list[str]:
        outs = self.walk(closed.jaxpr, [self.add_constant(c) for c in closed.consts], in_names, scope, source)
        return [self.materialize(v) for v in outs]

    def _add_node(self, eqn: Any, in_names: list[str], scope: str, source: str) -> list[str]:
        index = len(self.raw_nodes)
        prim = eqn.primitive.name
        node_name = f"n{index}_{prim}"
        out_names = [self._new_tensor(v.aval, "intermediate", producer=node_name) for v in eqn.outvars]
        if any(t in self.batch_dependent for t in in_names):
            self.batch_dependent.update(out_names)
        elif all(t in self.constant_only for t in in_names):
            self.constant_only.update(out_names)
        in_shapes = [self.tensors[n].shape for n in in_names]
        out_shapes = [self.tensors[n].shape for n in out_names]
        plain = {k: plain_data(v) for k, v in eqn.params.items()}
        flops, note = _node_flops(eqn, prim, in_shapes, out_shapes, plain)
        self.raw_nodes.append(
            dict(
                name=node_name,
                index=index,
                primitive=prim,
                inputs=tuple(in_names),
                outputs=tuple(out_names),
                params=tuple(sorted((k, v) for k, v in plain.items() if v is not None)),
                flops=flops,
                bytes_read=sum(self.tensors[n].nbytes for n in in_names),
                bytes_written=sum(self.tensors[n].nbytes for n in out_names),
                scope=_join(scope, eqn.source_info.name_stack),
                source=_source(eqn) or source,
                note=note,
                jax_primitive=eqn.primitive,
                jax_params=dict(eqn.params),
            )
        )
        return out_names


def _source(eqn: Any) -> str:
    """The user's line that made `eqn` ("file:line (function)"), or "" when JAX kept none."""
    text = source_info_util.summarize(eqn.source_info)
    return "" if text.startswith("unknown") else text


def _join(outer: str, name_stack: Any) -> str:
    inner = str(name_stack)
    return f"{outer}/{inner}" if outer and inner else outer or inner


def _subjaxpr(eqn: Any) -> tuple[Any, list[Any]] | None:
    for key in _SUBJAXPR_PARAMS:
        sub = eqn.params.get(key)
        if sub is None:
            continue
        if hasattr(sub, "jaxpr") and hasattr(sub, "consts"):
            return sub.jaxpr, list(sub.consts)
        if hasattr(sub, "eqns"):
            return sub, []
    return None


def _jaxpr_flops(jaxpr: Any) -> float:
    total = 0.0
    for eqn in jaxpr.eqns:
        sub = _subjaxpr(eqn)
        if sub is not None:
            total += _jaxpr_flops(sub[0])
            continue
        in_shapes = [tuple(v.aval.shape) for v in eqn.invars]
        out_shapes = [tuple(v.aval.shape) for v in eqn.outvars]
        plain = {k: plain_data(v) for k, v in eqn.params.items()}
        total += _node_flops(eqn, eqn.primitive.name, in_shapes, out_shapes, plain)[0]
    return total


def _node_flops(eqn: Any, prim: str, in_shapes, out_shapes, plain) -> tuple[float, str]:
    """FLOPs of a node; control flow is estimated from its body, with a note."""
    if prim == "scan":
        body = eqn.params["jaxpr"].jaxpr
        length = int(eqn.params["length"])
        return length * _jaxpr_flops(body), (f"scan of length {length} kept as one node (it scans over no "
                                             f"stacked parameters, so it is not a stack of layers)")
    if prim == "while":
        body = eqn.params["body_jaxpr"].jaxpr
        return _jaxpr_flops(body), "while loop kept as one node; FLOPs are one iteration's"
    if prim == "cond":
        branches = [_jaxpr_flops(b.jaxpr) for b in eqn.params["branches"]]
        return max(branches, default=0.0), "cond kept as one node; FLOPs are the costliest branch's"
    return primitive_flops(prim, in_shapes, out_shapes, plain), ""


def _assign_roles_and_layers(
    builder: _GraphBuilder, outputs: Sequence[str], batch_inputs: Sequence[str],
) -> tuple[tuple[OpNode, ...], dict[str, int]]:
    """Roles from the dataflow; forward and backward layers from the layer-boundary markers."""
    ops = [RawOp(r["name"], r["inputs"], r["outputs"], r["scope"], r["source"], r["primitive"])
           for r in builder.raw_nodes]
    roles = infer_roles(ops, batch_inputs)

    def is_marker(raw: dict[str, Any], phase: str) -> bool:
        return raw["primitive"] == LAYER_BOUNDARY and dict(raw["params"]).get("phase") == phase

    forward_markers = sum(is_marker(r, "forward") for r in builder.raw_nodes)
    layers: list[int | None] = []
    seen_forward = seen_backward = 0
    for raw, role in zip(builder.raw_nodes, roles):
        if role == "forward":
            layers.append(seen_forward)
            seen_forward += is_marker(raw, "forward")
        elif role == "backward":
            layers.append(forward_markers - seen_backward)
            seen_backward += is_marker(raw, "backward")
        else:
            layers.append(None)
    layer_of = {r["name"]: layer for r, layer in zip(builder.raw_nodes, layers) if layer is not None}
    nodes = tuple(
        OpNode(role=role, layer=layer_of.get(raw["name"], 0), **raw)  # type: ignore[arg-type]
        for raw, role in zip(builder.raw_nodes, roles)
    )
    return nodes, layer_of
