"""A `lax.scan` over stacked layer parameters, seen as its iterations.

Large models stack their layers' parameters along a leading axis and scan
a layer body over them (Flax `nn.scan`, Equinox `filter_vmap` + `scan`,
MaxText).  Such a scan, and its transpose in the backward pass, is unrolled
at trace time: iteration i reads slice i of the stacked parameters, the
iterations' per-layer outputs are stacked back, and a layer boundary sits
between iterations.  Every later pass (sharding ILP, stage DP, runtime) then
sees ordinary operators, so a cut can fall between any two iterations and
each iteration's operators are sharded like the unrolled model's.

Other scans (over time steps, whose inputs are all batch data or
constants) stay one operator with a note, and so does every scan of a
function whose batch is unknown (nothing tells parameters from data).
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any, Collection, Sequence, Union

import jax
import jax.numpy as jnp

from alpaviz.core.graph._flops import ELEMENTWISE
from alpaviz.core.graph._markers import layer_boundary_p

MAX_UNROLLED_LENGTH = 512  # a longer scan is no stack of layers anyone trains


def is_layer_scan(eqn: Any, in_names: Sequence[str], batch_dependent: Collection[str],
                  constant: Collection[str]) -> bool:
    """A scan whose scanned-over inputs include stacked parameters (batch-independent, not constants)."""
    if eqn.primitive.name != "scan" or eqn.params["length"] > MAX_UNROLLED_LENGTH:
        return False
    xs = in_names[eqn.params["num_consts"] + eqn.params["num_carry"]:]
    return any(t not in batch_dependent and t not in constant for t in xs)


def index_jaxpr(aval: Any, i: int) -> Any:
    """Slice i of a stacked value, as a closed jaxpr of ordinary primitives."""
    return jax.make_jaxpr(lambda x: jax.lax.index_in_dim(x, i, axis=0, keepdims=False))(_struct(aval))


def stack_jaxpr(avals: Sequence[Any]) -> Any:
    """The iterations' outputs stacked along a new leading axis (what the scan returns)."""
    return jax.make_jaxpr(lambda *parts: jnp.stack(parts))(*(_struct(a) for a in avals))


def _struct(aval: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype)


@dataclasses.dataclass(eq=False)
class _Stacked:
    """An unrolled scan's stacked output, kept as its per-iteration parts until read whole."""

    parts: tuple[str, ...]
    scope: str
    source: str
    name: str | None = None


Value = Union[str, _Stacked]
# Elementwise primitives applied layer by layer to a scan's stacked values (the optimizer's arithmetic).
_PER_LAYER = ELEMENTWISE | {"convert_element_type"}


class LayerScanUnroller:
    """The graph builder's part that unrolls scans over layers (mixed into `_trace._GraphBuilder`).

    Uses the builder's `walk`, `_inline`, `_new_tensor`, `tensors`, `leaves`,
    `slices`, `input_parts` and `output_parts`.
    """

    def assembled_output(self, value: Value) -> str:
        """A step output; a stacked one (updated layer parameters) is left as its parts for the runtime to stack."""
        if not isinstance(value, _Stacked) or value.name is not None:
            return self.materialize(value)
        first = self.tensors[value.parts[0]]
        aval = types.SimpleNamespace(shape=(len(value.parts), *first.shape), dtype=first.dtype)
        name = self._new_tensor(aval, "intermediate", name=f"stacked{len(self.output_parts)}")
        self.output_parts[name] = value.parts
        return name

    def materialize(self, value: Value) -> str:
        """A tensor name for `value`: stacked parts become one stacked tensor (once)."""
        if not isinstance(value, _Stacked):
            return value
        if value.name is None:
            parts = list(value.parts)
            value.name = self._inline(stack_jaxpr([self.tensors[t] for t in parts]), parts, value.scope,
                                      value.source)[0]
        return value.name

    def _per_layer(self, eqn: Any, values: list[Value]) -> bool:
        """An elementwise op on a scan's stacked values (an optimizer step on stacked gradients)."""
        if eqn.primitive.name not in _PER_LAYER or len(eqn.outvars) != 1:
            return False
        if not any(isinstance(v, _Stacked) for v in values):
            return False
        shape = tuple(eqn.outvars[0].aval.shape)
        return all(self._full_shape(v) in (shape, ()) for v in values)

    def _full_shape(self, value: Value) -> tuple[int, ...]:
        if isinstance(value, _Stacked):
            return (len(value.parts), *self.tensors[value.parts[0]].shape)
        return self.tensors[value].shape

    def _apply_per_layer(self, eqn: Any, values: list[Value], scope: str, source: str) -> _Stacked:
        """Run `eqn` once per layer on that layer's slices, so each layer's update stays in its layer."""
        length = next(len(v.parts) for v in values if isinstance(v, _Stacked))
        parts = []
        for i in range(length):
            args = [v.parts[i] if isinstance(v, _Stacked) else v if self._full_shape(v) == () else
                    self._slice(v, i, scope, source) for v in values]
            avals = [jax.ShapeDtypeStruct(self.tensors[a].shape, self.tensors[a].dtype) for a in args]
            closed = jax.make_jaxpr(lambda *xs: eqn.primitive.bind(*xs, **eqn.params))(*avals)
            parts.append(self._inline(closed, args, scope, source)[0])
        return _Stacked(tuple(parts), scope, source)

    def _slice(self, tensor: str, i: int, scope: str, source: str) -> str:
        """Slice i of a stacked tensor, made once however many operators read it.

        A stacked argument of the step (layer parameters, their optimizer
        state) is not sliced by an operator: its slices become inputs of
        their own, which the runtime cuts from the user's array, so each
        stage holds only its layers' share.
        """
        key = (tensor, i)
        if key not in self.slices:
            if tensor in self.leaves:
                info = self.tensors[tensor]
                parts = self.input_parts.setdefault(tensor, [])
                for k in range(len(parts), info.shape[0]):
                    aval = types.SimpleNamespace(shape=info.shape[1:], dtype=info.dtype)
                    parts.append(self._new_tensor(aval, "input", name=f"{tensor}[{k}]"))
                    self.slices[(tensor, k)] = parts[k]
            else:
                self.slices[key] = self._inline(index_jaxpr(self.tensors[tensor], i), [tensor], scope, source)[0]
        return self.slices[key]

    @staticmethod
    def _representative(value: Value) -> str:
        return value.parts[0] if isinstance(value, _Stacked) else value

    def _unroll_scan(self, eqn: Any, in_names: list[str], scope: str, source: str) -> list[str]:
        """A scan over stacked layers as its iterations, with a layer boundary between two (see `_scan`)."""
        p = eqn.params
        length, n_consts, n_carry = int(p["length"]), p["num_consts"], p["num_carry"]
        head = [self.materialize(v) for v in in_names[:n_consts + n_carry]]
        consts, carry, xs = head[:n_consts], head[n_consts:], in_names[n_consts + n_carry:]
        phase = "backward" if "transpose(" in scope else "forward"
        body = p["jaxpr"]
        body_consts = [self.add_constant(c) for c in body.consts]
        order = list(range(length))[::-1] if p["reverse"] else list(range(length))
        ys: dict[int, list[str]] = {}
        for step, i in enumerate(order):
            # An input stacked by an earlier unrolled scan (the forward's residuals) is read part by part.
            sliced = [x.parts[i] if isinstance(x, _Stacked) else self._slice(x, i, scope, source) for x in xs]
            outs = self.walk(body.jaxpr, body_consts, [*consts, *carry, *sliced], f"{scope}/iteration{i}", source)
            carry = [self.materialize(v) for v in outs[:n_carry]]
            ys[i] = [self.materialize(v) for v in outs[n_carry:]]
            if step < length - 1 and carry:
                carry = self._boundary(carry, f"scan iteration {i}", phase, scope, source)
        stacked = [_Stacked(tuple(ys[i][k] for i in range(length)), scope, source)
                   for k in range(len(eqn.outvars) - n_carry)]
        return [*carry, *stacked]

    def _boundary(self, values: list[str], name: str, phase: str, scope: str, source: str) -> list[str]:
        avals = [jax.ShapeDtypeStruct(self.tensors[t].shape, self.tensors[t].dtype) for t in values]
        closed = jax.make_jaxpr(lambda *xs: layer_boundary_p.bind(*xs, name=name, phase=phase))(*avals)
        return self._inline(closed, values, scope, source)
