"""A tensor drawn as a rectangle split into the regions each device holds (as `jax.debug.visualize_array_sharding`
draws a 2-D array), for any tensor of the plan, intermediates included.

Two dims are drawn: the split ones first, then the first and the last; a dim that is split but not drawn is
named in the note, since then one drawn region holds several different blocks.
"""

from __future__ import annotations

import dataclasses

from alpaviz.widgets._view_model import ShardingRow


@dataclasses.dataclass(frozen=True)
class TensorRegion:
    """One region of the drawn rectangle: its row and column ranges and the devices that hold it."""

    rows: tuple[int, int]
    cols: tuple[int, int]
    devices: tuple[int, ...]

    @property
    def label(self) -> str:
        ids = ",".join(map(str, self.devices)) if len(self.devices) <= 6 else f"{len(self.devices)} devices"
        return f"dev {ids}"


@dataclasses.dataclass(frozen=True)
class TensorPicture:
    """What the sharding view draws for one tensor on one stage's logical mesh."""

    title: str
    row_label: str
    col_label: str
    height: int
    width: int
    regions: tuple[TensorRegion, ...]
    note: str = ""


def _dim_label(row: ShardingRow, dim: int | None) -> str:
    if dim is None:
        return "(one row)"
    axes = row.spec[dim] if dim < len(row.spec) else ()
    how = f"split over {' x '.join(axes)} ({' x '.join(str(dict(zip('xy', row.mesh_shape))[a]) for a in axes)})" \
        if axes else "whole on every device"
    return f"dim {dim} (size {row.shape[dim]}): {how}"


def tensor_picture(row: ShardingRow) -> TensorPicture | None:
    """The picture of `row`'s tensor, or None when its spec does not divide it."""
    blocks = row.blocks
    if not blocks:
        return None
    rank = len(row.shape)
    split = [d for d in range(rank) if d < len(row.spec) and row.spec[d]]
    order = list(dict.fromkeys(split + [0, rank - 1] + list(range(rank)))) if rank else []
    drawn = sorted(order[:2])
    row_dim, col_dim = (None, drawn[0]) if len(drawn) == 1 else (drawn[0], drawn[1]) if drawn else (None, None)
    held: dict[tuple, list[int]] = {}
    for block in blocks:
        r = block.slices[row_dim] if row_dim is not None else (0, 1)
        c = block.slices[col_dim] if col_dim is not None else (0, 1)
        held.setdefault((r, c), []).append(block.device_id)
    regions = tuple(TensorRegion(r, c, tuple(sorted(d))) for (r, c), d in sorted(held.items()))
    hidden = [d for d in split if d not in drawn]
    note = ""
    if hidden:
        note = ("also split, not drawn: " + "; ".join(_dim_label(row, d) for d in hidden)
                + " (each drawn region holds several blocks)")
    elif rank > 2:
        note = f"dims {', '.join(str(d) for d in range(rank) if d not in drawn)} are whole on every device"
    return TensorPicture(
        title=f"{row.tensor} {row.shape} on stage {row.stage}, logical mesh {row.mesh_shape[0]}x{row.mesh_shape[1]}: "
              f"{row.partition_spec}, block {row.shard_shape}",
        row_label=_dim_label(row, row_dim), col_label=_dim_label(row, col_dim),
        height=row.shape[row_dim] if row_dim is not None else 1, width=row.shape[col_dim] if col_dim is not None else 1,
        regions=regions, note=note,
    )
