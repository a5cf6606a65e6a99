"""Plain-data tensor shardings: one tuple of mesh-axis names per tensor dim.

`(("x",), ())` splits dim 0 over mesh axis "x" and replicates dim 1: the
same as `PartitionSpec("x", None)`, and named "S0R" in Alpa's notation.
"""

from __future__ import annotations

from typing import Any, Sequence

from alpaviz.core.cost import AXIS_NAMES

Spec = tuple[tuple[str, ...], ...]


def replicated(ndim: int) -> Spec:
    return ((),) * ndim


def make_spec(*dims: str | Sequence[str] | None) -> Spec:
    """`make_spec("x", None)` -> (("x",), ()); accepts PartitionSpec-style entries."""
    out = []
    for d in dims:
        if d is None:
            out.append(())
        elif isinstance(d, str):
            out.append((d,))
        else:
            out.append(tuple(d))
    return tuple(out)


def spec_name(spec: Spec, axis_names: Sequence[str] = AXIS_NAMES) -> str:
    """Alpa-style short name: "S0R" (dim 0 on axis 0), "S01R", "RR"."""
    parts = []
    for axes in spec:
        parts.append("R" if not axes else "S" + "".join(str(axis_names.index(a)) for a in axes))
    return "".join(parts) or "scalar"


def to_partition_spec(spec: Spec) -> Any:
    """The `jax.sharding.PartitionSpec` for a plain spec."""
    from jax.sharding import PartitionSpec

    entries = [None if not axes else axes[0] if len(axes) == 1 else tuple(axes) for axes in spec]
    return PartitionSpec(*entries)


def from_partition_spec(pspec: Any, ndim: int) -> Spec:
    """A plain spec from a `PartitionSpec` (missing trailing dims are replicated)."""
    dims = list(pspec) + [None] * (ndim - len(pspec))
    return make_spec(*dims)


def shard_shape(shape: Sequence[int], spec: Spec, mesh_shape: Sequence[int],
                axis_names: Sequence[str] = AXIS_NAMES) -> tuple[int, ...]:
    """The per-device block shape; raises if a mesh axis does not divide its dim."""
    check_spec(shape, spec, mesh_shape, axis_names)
    sizes = dict(zip(axis_names, mesh_shape))
    out = []
    for dim, axes in zip(shape, spec):
        parts = 1
        for a in axes:
            parts *= sizes[a]
        out.append(dim // parts)
    return tuple(out)


def check_spec(shape: Sequence[int], spec: Spec, mesh_shape: Sequence[int],
               axis_names: Sequence[str] = AXIS_NAMES, what: str = "tensor") -> None:
    """Raise a ValueError naming the rule if `spec` cannot shard `shape` on the mesh."""
    if len(spec) != len(shape):
        raise ValueError(f"{what}: spec {spec} has {len(spec)} dims but the tensor has shape {tuple(shape)}")
    sizes = dict(zip(axis_names, mesh_shape))
    used: list[str] = []
    for dim_index, (dim, axes) in enumerate(zip(shape, spec)):
        parts = 1
        for a in axes:
            if a not in sizes:
                raise ValueError(f"{what}: unknown mesh axis {a!r}; the mesh axes are {tuple(axis_names)}")
            if a in used:
                raise ValueError(f"{what}: mesh axis {a!r} is used twice in spec {spec}")
            used.append(a)
            parts *= sizes[a]
        if dim % parts:
            raise ValueError(
                f"{what}: dim {dim_index} of size {dim} is not divisible by the {parts} devices of mesh "
                f"axes {axes} (mesh {tuple(mesh_shape)}); pick a mesh axis size that divides {dim}"
            )
