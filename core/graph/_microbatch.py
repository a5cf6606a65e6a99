"""From a step's global-batch arguments to the shapes of one microbatch."""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np

from alpaviz.core.graph._static_leaves import is_static_leaf


def microbatch_struct(x: jax.ShapeDtypeStruct, m: int, argnum: int) -> jax.ShapeDtypeStruct:
    """One leaf of a batch argument with dim 0 divided by `m`."""
    if not x.shape or x.shape[0] % m:
        raise ValueError(
            f"argument {argnum} is a batch argument, but a leaf of shape {x.shape} cannot be split into "
            f"{m} microbatches along dim 0; use a batch size divisible by {m} or change "
            f"plan.schedule.num_microbatches"
        )
    return jax.ShapeDtypeStruct((x.shape[0] // m, *x.shape[1:]), x.dtype)


def microbatch_args(args: Sequence[Any], batch_argnums: Sequence[int], num_microbatches: int) -> tuple[Any, ...]:
    """Abstract copies of `args` whose batch arguments hold one microbatch.

    Example:
        >>> micro = microbatch_args((params, batch), batch_argnums=(1,), num_microbatches=4)
    """
    for i in batch_argnums:
        if not 0 <= i < len(args):
            raise ValueError(f"batch_argnums {tuple(batch_argnums)} names argument {i}, but the step takes {len(args)}")
    abstract = jax.tree.map(
        lambda x: x if is_static_leaf(x) else jax.ShapeDtypeStruct(np.shape(x), jax.numpy.result_type(x)), tuple(args))
    micro = list(abstract)
    for i in batch_argnums:
        micro[i] = jax.tree.map(lambda x, i=i: x if is_static_leaf(x) else microbatch_struct(x, num_microbatches, i),
                                abstract[i])
    return tuple(micro)


def split_microbatch(value: Any, m: int, k: int) -> Any:
    """Microbatch k of m of a batch leaf (numpy stays numpy; no copy to a device)."""
    size = np.shape(value)[0] // m
    return value[k * size:(k + 1) * size]
