"""Moving tensors between stage meshes, and how many bytes cross a host boundary doing it.

On one host a move is one `jax.device_put` to the receiving stage's
`NamedSharding`; XLA copies only the shards each receiving device needs.

Across hosts we follow Alpa's cross-mesh resharding with a local
all-gather: the tensor crosses the boundary once, cut into `pieces`
distinct slabs along one dim (the *boundary layout*), each slab from one
sending device to one receiving device, and the receiver then completes its
own layout inside its mesh (an all-gather on the fast intra-host link).
Sending each receiving device its own tile directly (`tile_once=False`)
sends every replicated tile once per replica instead.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import jax

from alpaviz.core.cost import AXIS_NAMES
from alpaviz.core.plan import Spec


@dataclasses.dataclass(frozen=True)
class BoundaryLayout:
    """How a tensor crosses a host boundary: `pieces` slabs along `dim` (None: whole, from one device)."""

    dim: int | None
    pieces: int


def boundary_layout(shape: Sequence[int], senders: int, receivers: int) -> BoundaryLayout:
    """The most slabs (at most one per sending and per receiving device) that split one dim evenly.

    Every process computes the same layout from the same arguments, which a
    transfer between two JAX processes needs.
    """
    for pieces in range(min(senders, receivers), 1, -1):
        for dim, size in enumerate(shape):
            if size % pieces == 0:
                return BoundaryLayout(dim, pieces)
    return BoundaryLayout(None, 1)


def move_local(values: Mapping[str, Any], shardings: Mapping[str, Any]) -> dict[str, Any]:
    """Reshard each value onto the receiver's sharding (one async device_put per tensor)."""
    return {name: jax.device_put(value, shardings[name]) for name, value in values.items()}


def _replicas(spec: Spec, mesh_shape: Sequence[int]) -> int:
    """How many devices of the mesh hold each tile under `spec`."""
    used = {a for axes in spec for a in axes}
    return math.prod(size for name, size in zip(AXIS_NAMES, mesh_shape) if name not in used)


def boundary_bytes(nbytes: int, spec: Spec | None, mesh_shape: Sequence[int], tile_once: bool = True) -> int:
    """Bytes that cross the host boundary to give a receiver with `spec` on `mesh_shape` a tensor of `nbytes`.

    Tile-once: each byte once.  Directly to each device: once per replica
    of its tile (a replicated tensor crosses once per receiving device).
    """
    if tile_once:
        return nbytes
    return nbytes * _replicas(spec or (), mesh_shape)
