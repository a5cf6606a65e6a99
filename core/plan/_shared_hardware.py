"""What the stages of a plan share while a step runs: each host's cores and each network link.

The stage costs are priced at the rate a device gets with every device of its
host busy (that is how the local devices are calibrated).  While a step runs,
fewer may be busy: virtual CPU devices then share the host's cores among
fewer and each runs faster (`Cluster.busy_speedup`); GPUs share nothing of
the kind, so their speedup is 1.  Small operators gain less from idle cores
than large ones (their fixed costs shrink less), so each stage's speedup is
read at the size of matmul that runs at the stage's own priced rate
(`Cluster.busy_speedup_by_size`).  Transfers that cross the same host's
network link at once, in the same direction, split its bandwidth.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from alpaviz.core.cost import Cluster, CostModelProtocol, DeviceSpec

LinkId = tuple[str, int]


@dataclasses.dataclass(frozen=True)
class SharedHardware:
    """Where each stage's devices sit (host -> how many) on `cluster`, for the step simulator."""

    cluster: Cluster
    stage_hosts: tuple[tuple[tuple[int, int], ...], ...]
    # per stage, the FLOPs of the matmul whose rate its work runs at (None: unknown, `busy_speedup`'s size)
    stage_flops: tuple[float | None, ...] = ()

    @classmethod
    def of(cls, cluster: Cluster, stage_device_ids, stage_flops=()) -> "SharedHardware":
        """From each stage's global device ids (and, optionally, each stage's matmul-equivalent size)."""
        per_host = cluster.devices_per_host
        stage_hosts = []
        for ids in stage_device_ids:
            counts: dict[int, int] = {}
            for d in ids:
                counts[d // per_host] = counts.get(d // per_host, 0) + 1
            stage_hosts.append(tuple(sorted(counts.items())))
        return cls(cluster, tuple(stage_hosts), tuple(stage_flops))

    @classmethod
    def of_plan(cls, plan) -> "SharedHardware":
        """The plan's stages on the plan's cluster, each at the size its priced layers run like."""
        device, sizes = plan.cluster.device, []
        for stage in plan.stages:
            layers = [plan.layers[i] for i in stage.layers]
            flops = sum(layer.flops for layer in layers) / len(stage.device_ids)
            seconds = sum(layer.compute_s for layer in layers)
            sizes.append(matmul_equivalent(device, plan.cost_model, flops / seconds) if seconds > 0 else None)
        return cls.of(plan.cluster, [s.device_ids for s in plan.stages], sizes)

    @property
    def launch_s(self) -> float:
        """The fixed cost of starting one task's executable."""
        return self.cluster.device.launch_s

    @property
    def shares_cores(self) -> bool:
        """Whether a stage's rate depends on how many devices of its hosts are busy (virtual CPU devices)."""
        return bool(self.cluster.busy_speedup)

    def speedup(self, stage: int, busy_by_host: dict[int, int]) -> float:
        """The rate of `stage`'s work, over its priced rate, with `busy_by_host` devices busy on each host."""
        row, most = self._stage_speedups[stage], self.cluster.devices_per_host
        return min(row[min(busy_by_host.get(h, 0), most)] for h, _ in self.stage_hosts[stage])

    @functools.cached_property
    def _stage_speedups(self) -> tuple[tuple[float, ...], ...]:
        """[stage][busy devices 0..devices_per_host]: read at every simulated event, so interpolated once."""
        flops = self.stage_flops or (None,) * len(self.stage_hosts)
        return tuple(tuple(self.cluster.speedup(b, f) for b in range(self.cluster.devices_per_host + 1))
                     for f in flops)

    def links(self, src: int, dst: int) -> tuple[LinkId, ...]:
        """The shared links a transfer from stage `src` to stage `dst` occupies: across hosts, the
        sending host's way out and the receiving host's way in (a network link carries both directions
        at full rate); inside a host, none (each pair of devices has its own path)."""
        src_host, dst_host = self.stage_hosts[src][0][0], self.stage_hosts[dst][0][0]
        if src_host == dst_host:
            return ()
        return (("out", src_host), ("in", dst_host))


def matmul_equivalent(device: DeviceSpec, cost_model: CostModelProtocol, flops_per_s: float) -> float | None:
    """The FLOPs of the matmul `cost_model` prices at `flops_per_s` on `device`: the rate curve read
    backwards, at the curve's sizes (past its ends, its end sizes); None without a curve."""
    sizes = [f for f, _ in device.rate_curve]
    if not sizes:
        return None
    # a measured dip in the curve must not make the answer ambiguous
    rates = np.maximum.accumulate([f / cost_model.compute_time(f, 0.0, device) for f in sizes])
    return float(math.exp(np.interp(flops_per_s, rates, np.log(sizes))))
