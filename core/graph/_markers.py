"""Identity primitives that mark layer boundaries and survive `jax.grad`.

A marker is an identity on a pytree.  Its forward application records a
layer boundary in the forward pass; its custom VJP applies the same
primitive (phase "backward") to the cotangents, so the boundary shows up in
the backward pass too.  The tracer reads both.
"""

from __future__ import annotations

import functools
from typing import Any, TypeVar

import jax
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir

LAYER_BOUNDARY = "layer_boundary"

_T = TypeVar("_T")

layer_boundary_p = Primitive(LAYER_BOUNDARY)
layer_boundary_p.multiple_results = True
layer_boundary_p.def_impl(lambda *xs, **_: xs)
layer_boundary_p.def_abstract_eval(lambda *avals, **_: avals)
mlir.register_lowering(
    layer_boundary_p,
    mlir.lower_fun(lambda *xs, **_: xs, multiple_results=True),
)


def _batch_rule(args, dims, **params):
    return layer_boundary_p.bind(*args, **params), dims


batching.primitive_batchers[layer_boundary_p] = _batch_rule


def _bind(leaves: list[Any], name: str, phase: str) -> list[Any]:
    if not leaves:
        return leaves
    return list(layer_boundary_p.bind(*leaves, name=name, phase=phase))


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _mark(leaves: list[Any], name: str) -> list[Any]:
    return _bind(leaves, name, "forward")


def _mark_fwd(leaves, name):
    return _bind(leaves, name, "forward"), None


def _mark_bwd(name, _residual, cotangents):
    return (_bind(list(cotangents), name, "backward"),)


_mark.defvjp(_mark_fwd, _mark_bwd)


def mark_layer(x: _T, name: str = "") -> _T:
    """Mark the end of a layer: returns `x` unchanged and records a boundary.

    Example:
        >>> h = av.mark_layer(block(h))   # everything before is one layer
    """
    leaves, treedef = jax.tree.flatten(x)
    return jax.tree.unflatten(treedef, _mark(leaves, name))
