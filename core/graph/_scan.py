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

from typing import Any, Collection, Sequence

import jax
import jax.numpy as jnp

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
