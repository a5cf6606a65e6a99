"""The analytic cost model: roofline compute time and alpha-beta collectives.

One object, passed explicitly to every solver.  Anything that plugs in a
different model (e.g. measured profiles) implements `CostModelProtocol`.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from alpaviz.core.cost._cluster import DeviceSpec, Link, LogicalMesh
from alpaviz.core.graph import DATA_MOVEMENT, ELEMENTWISE, check_number

FUSIBLE = ELEMENTWISE | DATA_MOVEMENT

Axes = int | tuple[int, ...]


class CostModelProtocol(Protocol):
    """What the solvers need from a cost model."""

    def compute_time(self, flops: float, nbytes: float, device: DeviceSpec, dtype: str | None = None) -> float:
        """Seconds for `flops` of work reading `nbytes` on one device, at `dtype`'s rate."""
    def op_time(self, primitive: str, flops: float, nbytes: float, device: DeviceSpec,
                dtype: str | None = None) -> float:
        """Seconds for one operator of `primitive` on one device, which may price primitives differently."""
    def all_reduce(self, nbytes: float, mesh: LogicalMesh, axes: Axes) -> float:
        """Seconds to all-reduce `nbytes` per device over `axes` of `mesh`."""
    def all_gather(self, nbytes: float, mesh: LogicalMesh, axes: Axes) -> float:
        """Seconds to all-gather to `nbytes` per device over `axes` of `mesh`."""
    def reduce_scatter(self, nbytes: float, mesh: LogicalMesh, axes: Axes) -> float:
        """Seconds to reduce-scatter `nbytes` per device over `axes` of `mesh`."""
    def all_to_all(self, nbytes: float, mesh: LogicalMesh, axes: Axes) -> float:
        """Seconds to all-to-all `nbytes` per device over `axes` of `mesh`."""
    def send_recv(self, nbytes: float, link: Link) -> float:
        """Seconds to send `nbytes` from one device to another over `link`."""


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Alpha-beta collective costs and a roofline for compute.

    `nbytes` is always the size of the full (logical) message: for an
    all-gather the gathered result, for a reduce-scatter its input.

    Example:
        >>> cm = av.CostModel(compute_efficiency=0.5)
        >>> cm.all_reduce(1e9, mesh, axes=0)
    """

    compute_efficiency: float = 0.5
    memory_efficiency: float = 0.8
    all_to_all_penalty: float = 1.0
    # XLA fuses elementwise and data-movement ops into their neighbours, so most of
    # their operands never reach memory: only this share of their traffic is charged.
    fused_traffic_share: float = 0.1

    def __post_init__(self) -> None:
        for field in ("compute_efficiency", "memory_efficiency", "all_to_all_penalty", "fused_traffic_share"):
            check_number(f"CostModel.{field}", getattr(self, field))
        for field in ("compute_efficiency", "memory_efficiency"):
            value = getattr(self, field)
            if not 0 < value <= 1:
                raise ValueError(f"CostModel.{field} must be in (0, 1], got {value!r}")
        if not 0 <= self.fused_traffic_share <= 1:
            raise ValueError(f"CostModel.fused_traffic_share must be in [0, 1], got {self.fused_traffic_share!r}")

    def compute_time(self, flops: float, nbytes: float, device: DeviceSpec, dtype: str | None = None) -> float:
        """Roofline: the slower of arithmetic (at the peak for `dtype`, less what an operator of this size
        loses, `DeviceSpec.rate_share`) and memory traffic."""
        arithmetic = flops / (device.peak_flops_for(dtype) * self.compute_efficiency * device.rate_share(flops))
        traffic = nbytes / (device.memory_bandwidth * self.memory_efficiency)
        return max(arithmetic, traffic)

    def op_time(self, primitive: str, flops: float, nbytes: float, device: DeviceSpec,
                dtype: str | None = None) -> float:
        """Roofline time of one operator (operands of `dtype`), with fusible operators charged
        `fused_traffic_share` of their bytes."""
        if primitive in FUSIBLE:
            nbytes *= self.fused_traffic_share
        return self.compute_time(flops, nbytes, device, dtype)

    def _collective(self, nbytes: float, mesh: LogicalMesh, axes: Axes, factor) -> float:
        n = mesh.axis_size(axes)
        if n <= 1 or nbytes <= 0:
            return 0.0
        link = mesh.axis_link(axes)
        return link.alpha_s + factor(n) * nbytes / link.bandwidth_bytes_per_s

    def all_reduce(self, nbytes: float, mesh: LogicalMesh, axes: Axes) -> float:
        """alpha + 2 (n-1)/n * B / bandwidth (ring all-reduce)."""
        return self._collective(nbytes, mesh, axes, lambda n: 2 * (n - 1) / n)

    def all_gather(self, nbytes: float, mesh: LogicalMesh, axes: Axes) -> float:
        """alpha + (n-1)/n * B / bandwidth, B the gathered size."""
        return self._collective(nbytes, mesh, axes, lambda n: (n - 1) / n)

    def reduce_scatter(self, nbytes: float, mesh: LogicalMesh, axes: Axes) -> float:
        """alpha + (n-1)/n * B / bandwidth, B the unreduced input size."""
        return self._collective(nbytes, mesh, axes, lambda n: (n - 1) / n)

    def all_to_all(self, nbytes: float, mesh: LogicalMesh, axes: Axes) -> float:
        """alpha + penalty * (n-1)/n^2 * B / bandwidth."""
        return self._collective(nbytes, mesh, axes, lambda n: self.all_to_all_penalty * (n - 1) / n**2)

    def send_recv(self, nbytes: float, link: Link) -> float:
        """Point-to-point transfer, e.g. activations between pipeline stages."""
        return link.transfer_time(nbytes)
