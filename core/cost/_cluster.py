"""The device cluster, its submeshes and their 2-D logical views.

Everything here is abstract (shapes, ids, link figures); real JAX devices
are attached only when a plan is compiled or run.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np

from alpaviz.core.cost._calibrate import CACHE_DIR, calibrate as measure
from alpaviz.core.graph import check_int, check_number

AXIS_NAMES: tuple[str, str] = ("x", "y")


@dataclasses.dataclass(frozen=True)
class DeviceSpec:
    """One accelerator: peak FLOP/s, memory bytes and memory bandwidth (bytes/s).

    `peak_flops` is the 16-bit (and default) matmul peak; `fp32_peak_flops`,
    when given, the peak for 32- and 64-bit operands (tensor cores run fp32
    matmuls as TF32 at a fraction of the 16-bit rate).  `launch_s` is the
    fixed cost of starting one executable, paid by every task a stage runs
    (what many small microbatches add up to).  `rate_curve` says how far
    below the peak a small operator runs: (FLOPs of one operator on one
    device, its achieved share of the peak) pairs in increasing FLOPs,
    interpolated in log FLOPs and held flat past either end; empty: every
    operator at the peak (the GPU presets).
    """

    name: str
    peak_flops: float
    memory_bytes: float
    memory_bandwidth: float = 1e12
    fp32_peak_flops: float | None = None
    launch_s: float = 0.0
    rate_curve: tuple[tuple[float, float], ...] = ()

    def __post_init__(self) -> None:
        for field in ("peak_flops", "memory_bytes", "memory_bandwidth"):
            check_number(f"DeviceSpec.{field}", getattr(self, field), positive=True)
        check_number("DeviceSpec.launch_s", self.launch_s, minimum=0)
        if self.fp32_peak_flops is not None:
            check_number("DeviceSpec.fp32_peak_flops", self.fp32_peak_flops, positive=True)
        curve = tuple((float(f), float(r)) for f, r in self.rate_curve)
        object.__setattr__(self, "rate_curve", curve)
        for flops, share in curve:
            check_number("DeviceSpec.rate_curve FLOPs", flops, positive=True)
            check_number("DeviceSpec.rate_curve share of the peak", share, positive=True)
        if any(a[0] >= b[0] for a, b in zip(curve, curve[1:])):
            raise ValueError(f"DeviceSpec.rate_curve must list increasing FLOPs, got {curve}")

    def rate_share(self, flops: float) -> float:
        """The share of the peak an operator of `flops` (on one device) achieves (see `rate_curve`)."""
        curve = self.rate_curve
        if not curve or flops <= 0:
            return 1.0
        return float(np.interp(math.log(flops), [math.log(f) for f, _ in curve], [r for _, r in curve]))

    def peak_flops_for(self, dtype: str | None) -> float:
        """The peak for operands of `dtype` (a name such as 'float32'; None for the default)."""
        if self.fp32_peak_flops is not None and dtype in ("float32", "float64"):
            return self.fp32_peak_flops
        return self.peak_flops


@dataclasses.dataclass(frozen=True)
class Link:
    """An interconnect in the alpha-beta model: latency (s) and bandwidth (bytes/s)."""

    alpha_s: float
    bandwidth_bytes_per_s: float

    def __post_init__(self) -> None:
        check_number("Link.alpha_s", self.alpha_s)
        check_number("Link.bandwidth_bytes_per_s", self.bandwidth_bytes_per_s)
        if self.alpha_s < 0 or self.bandwidth_bytes_per_s <= 0:
            raise ValueError(
                f"Link needs alpha_s >= 0 and bandwidth_bytes_per_s > 0, got "
                f"alpha_s={self.alpha_s!r}, bandwidth_bytes_per_s={self.bandwidth_bytes_per_s!r}"
            )

    def transfer_time(self, nbytes: float) -> float:
        """Seconds to send `nbytes` point to point over this link."""
        return 0.0 if nbytes <= 0 else self.alpha_s + nbytes / self.bandwidth_bytes_per_s


@dataclasses.dataclass(frozen=True)
class LogicalMesh:
    """A submesh seen as a 2-D grid of devices, with the link each axis uses.

    Axis 1 always stays inside a host; axis 0 crosses hosts when the
    submesh spans more than one (`num_hosts` > 1).  The devices of a host
    share its network link: collectives that run at once over axis 0 in
    separate groups each get a share of it.
    """

    shape: tuple[int, int]
    device_ids: tuple[int, ...]
    axis_links: tuple[Link, Link]
    axis_names: tuple[str, str] = AXIS_NAMES
    num_hosts: int = 1

    def __post_init__(self) -> None:
        if len(self.shape) != 2 or min(self.shape) < 1:
            raise ValueError(f"a logical mesh shape is two positive ints, got {self.shape!r}")
        if math.prod(self.shape) != len(self.device_ids):
            raise ValueError(
                f"logical mesh {self.shape} needs {math.prod(self.shape)} devices, "
                f"got {len(self.device_ids)} device ids"
            )

    @property
    def num_devices(self) -> int:
        """How many physical devices this logical mesh spans."""
        return len(self.device_ids)

    def axis_size(self, axes: int | tuple[int, ...]) -> int:
        """Number of devices along one axis or a group of axes."""
        if isinstance(axes, int):
            axes = (axes,)
        return math.prod(self.shape[a] for a in axes)

    def axis_link(self, axes: int | tuple[int, ...]) -> Link:
        """The slowest link among `axes`: a collective over them is bound by it.

        Across hosts, the groups of a collective over `axes` run at once and each host's link carries one
        ring stream per group, so each group gets 1/groups of it (a collective over both axes is one group).
        """
        if isinstance(axes, int):
            axes = (axes,)
        links = [self.axis_links[a] for a in axes if self.shape[a] > 1] or [self.axis_links[a] for a in axes]
        link = min(links, key=lambda link: link.bandwidth_bytes_per_s)
        groups = self.num_devices // self.axis_size(axes)
        if self.num_hosts > 1 and 0 in axes and self.shape[0] > 1 and groups > 1:
            return Link(link.alpha_s, link.bandwidth_bytes_per_s / groups)
        return link


@dataclasses.dataclass(frozen=True)
class Cluster:
    """Hosts of identical devices: a fast link inside a host, a slower one between hosts.

    Example:
        >>> cluster = av.Cluster.a100_node(num_hosts=2)   # 2 x 8 A100-40GB
        >>> cluster.num_devices
        16
    """

    num_hosts: int
    devices_per_host: int
    device: DeviceSpec
    intra_host: Link
    inter_host: Link
    name: str = "cluster"
    # How much faster each busy device of a host runs when only b of its devices are busy
    # (entry b - 1), relative to the rate `device` gives with all of them busy.  Virtual CPU
    # devices share the host's cores, so fewer busy devices each get more; GPUs share nothing
    # of the kind: () means 1.0 at every b.
    busy_speedup: tuple[float, ...] = ()
    # The same measured at several operator sizes, as (FLOPs of one matmul per device, speedups):
    # small operators gain less from the idle cores (their fixed costs shrink less).  () when unmeasured.
    busy_speedup_by_size: tuple[tuple[float, tuple[float, ...]], ...] = ()

    def __post_init__(self) -> None:
        check_int("Cluster.num_hosts", self.num_hosts)
        check_int("Cluster.devices_per_host", self.devices_per_host)
        if self.num_hosts < 1 or self.devices_per_host < 1:
            raise ValueError(
                f"a cluster needs at least one host and one device per host, got "
                f"num_hosts={self.num_hosts}, devices_per_host={self.devices_per_host}"
            )
        if self.busy_speedup and len(self.busy_speedup) != self.devices_per_host:
            raise ValueError(
                f"Cluster.busy_speedup has one entry per number of busy devices (1..{self.devices_per_host}), "
                f"got {len(self.busy_speedup)} entries; pass () when the devices share nothing"
            )
        for b, factor in enumerate(self.busy_speedup, start=1):
            check_number(f"Cluster.busy_speedup[{b - 1}] (with {b} busy devices)", factor, positive=True)
        by_size = tuple((float(f), tuple(float(x) for x in row)) for f, row in self.busy_speedup_by_size)
        object.__setattr__(self, "busy_speedup_by_size", by_size)
        for flops, row in by_size:
            check_number("Cluster.busy_speedup_by_size FLOPs", flops, positive=True)
            if len(row) != self.devices_per_host or not all(x > 0 for x in row):
                raise ValueError(
                    f"Cluster.busy_speedup_by_size at {flops:.4g} FLOPs needs one positive speedup per number "
                    f"of busy devices (1..{self.devices_per_host}), got {row}"
                )
        if any(a[0] >= b[0] for a, b in zip(by_size, by_size[1:])):
            raise ValueError(f"Cluster.busy_speedup_by_size must list increasing FLOPs, got {[f for f, _ in by_size]}")

    def speedup(self, busy_devices: int, flops: float | None = None) -> float:
        """The rate of each busy device of a host with `busy_devices` of them busy, over its all-busy rate,
        for work that runs like one matmul of `flops` per device (None: `busy_speedup`'s size); between
        measured sizes interpolated in log FLOPs, flat past the ends."""
        if not self.busy_speedup or busy_devices < 1:
            return 1.0
        b = min(busy_devices, self.devices_per_host) - 1
        if flops is None or flops <= 0 or not self.busy_speedup_by_size:
            return self.busy_speedup[b]
        sizes = [math.log(f) for f, _ in self.busy_speedup_by_size]
        return float(np.interp(math.log(flops), sizes, [row[b] for _, row in self.busy_speedup_by_size]))

    @property
    def num_devices(self) -> int:
        """All devices of the cluster: hosts times devices per host."""
        return self.num_hosts * self.devices_per_host

    @property
    def whole_submesh(self) -> tuple[int, int]:
        """The submesh shape (hosts, devices per host) that is the whole cluster."""
        return (self.num_hosts, self.devices_per_host)

    # ---- presets -------------------------------------------------------
    @classmethod
    def a100_node(cls, num_hosts: int = 1, devices_per_host: int = 8) -> "Cluster":
        """A100-40GB hosts: NVLink inside, a 25 Gbps-class network between (Alpa's setting)."""
        return cls(
            num_hosts=num_hosts,
            devices_per_host=devices_per_host,
            device=DeviceSpec("A100-40GB", peak_flops=312e12, memory_bytes=40e9, memory_bandwidth=1.55e12,
                              fp32_peak_flops=156e12),
            intra_host=Link(alpha_s=5e-6, bandwidth_bytes_per_s=150e9),
            inter_host=Link(alpha_s=2e-5, bandwidth_bytes_per_s=3.125e9),
            name=f"{num_hosts}x{devices_per_host} A100",
        )

    @classmethod
    def v100_node(cls, num_hosts: int = 1, devices_per_host: int = 8) -> "Cluster":
        """V100-16GB hosts as in the Alpa paper's cluster (NVLink, 25 Gbps between hosts)."""
        return cls(
            num_hosts=num_hosts,
            devices_per_host=devices_per_host,
            device=DeviceSpec("V100-16GB", peak_flops=125e12, memory_bytes=16e9, memory_bandwidth=0.9e12,
                              fp32_peak_flops=15.7e12),
            intra_host=Link(alpha_s=5e-6, bandwidth_bytes_per_s=100e9),
            inter_host=Link(alpha_s=2e-5, bandwidth_bytes_per_s=3.125e9),
            name=f"{num_hosts}x{devices_per_host} V100",
        )

    @classmethod
    def h100_node(cls, num_hosts: int = 1, devices_per_host: int = 8) -> "Cluster":
        """H100-80GB hosts: NVLink 4 inside, 400 Gbps per GPU between hosts."""
        return cls(
            num_hosts=num_hosts,
            devices_per_host=devices_per_host,
            device=DeviceSpec("H100-80GB", peak_flops=989e12, memory_bytes=80e9, memory_bandwidth=3.35e12,
                              fp32_peak_flops=494e12),
            intra_host=Link(alpha_s=3e-6, bandwidth_bytes_per_s=450e9),
            inter_host=Link(alpha_s=1e-5, bandwidth_bytes_per_s=50e9),
            name=f"{num_hosts}x{devices_per_host} H100",
        )

    @classmethod
    def local(
        cls,
        peak_flops: float = 5e10,
        memory_bytes: float = 2e9,
        link: Link = Link(alpha_s=1e-5, bandwidth_bytes_per_s=5e9),
        *,
        calibrate: bool = False,
        cache_dir: str | None = None,
    ) -> "Cluster":
        """The JAX devices of this process (e.g. 8 virtual CPU devices) as one host.

        The default figures are nominal CPU ones.  With `calibrate=True` the
        FLOP/s, memory bandwidth and link are measured on these devices with
        all of them busy (`calibrate()`, cached per machine in `cache_dir`):
        achieved rates, so price with `CostModel(compute_efficiency=1.0,
        memory_efficiency=1.0)` to use them as measured.  Calibration also
        measures how much faster a device runs when fewer of them are busy
        (`busy_speedup`: they share the host's cores) and the cost of one
        launch (`DeviceSpec.launch_s`), which the step simulator prices, and
        the matmul rate against its size (`DeviceSpec.rate_curve`).
        """
        devices = jax.local_devices()
        bandwidth, name = 2e10, f"local {len(devices)}x{devices[0].platform}"
        speedup, launch_s, curve, by_size = (), 0.0, (), ()
        if calibrate:
            cal = measure(CACHE_DIR if cache_dir is None else cache_dir)
            peak_flops, bandwidth = cal.matmul_flops, cal.memory_bandwidth
            if math.isfinite(cal.collective_bandwidth):
                link = Link(alpha_s=cal.collective_alpha_s, bandwidth_bytes_per_s=cal.collective_bandwidth)
            speedup, launch_s, curve = cal.busy_speedup, cal.launch_s, cal.rate_curve
            by_size = cal.busy_speedup_by_size
            name += " (calibrated)"
        return cls(
            num_hosts=jax.process_count(),
            devices_per_host=len(devices),
            device=DeviceSpec(f"local-{devices[0].platform}", peak_flops, memory_bytes, bandwidth,
                              launch_s=launch_s, rate_curve=curve),
            intra_host=link,
            inter_host=link,
            name=name,
            busy_speedup=speedup,
            busy_speedup_by_size=by_size,
        )

    @classmethod
    def ray(
        cls,
        num_hosts: int = 2,
        devices_per_host: int = 4,
        peak_flops: float = 5e10,
        memory_bytes: float = 2e9,
        link: Link = Link(alpha_s=1e-5, bandwidth_bytes_per_s=5e9),
        inter_host: Link = Link(alpha_s=6.7e-3, bandwidth_bytes_per_s=6.1e8),
    ) -> "Cluster":
        """Hosts run as Ray actors, one per host (for tests: each with K virtual CPU devices).

        The inter-host link is what `benchmarks/bench_transport.py` measured between two actors on
        this 2-core machine with `transport="xla"` (a fit over 0.25-16 MB: 6.7 ms per transfer, Ray's
        call included, and 611 MB/s); measure your own hosts the same way and pass `inter_host`.

        Plan on it, then run with `av.parallelize(step, plan, engine="ray",
        ray_options={"address": "auto"})` (no address: a local Ray).
        """
        return cls(
            num_hosts=num_hosts,
            devices_per_host=devices_per_host,
            device=DeviceSpec("ray-cpu", peak_flops, memory_bytes, 2e10),
            intra_host=link,
            inter_host=inter_host,
            name=f"ray {num_hosts}x{devices_per_host} cpu",
        )

    # ---- submeshes -----------------------------------------------------
    def submesh_shapes(self) -> tuple[tuple[int, int], ...]:
        """Alpa's submesh shapes: (1, 2^k) inside a host, then (n, all devices) across n hosts."""
        shapes = []
        size = 1
        while size < self.devices_per_host:
            if self.devices_per_host % size == 0:
                shapes.append((1, size))
            size *= 2
        shapes.extend((n, self.devices_per_host) for n in range(1, self.num_hosts + 1))
        return tuple(dict.fromkeys(shapes))

    def logical_shapes(self, submesh: tuple[int, int]) -> tuple[tuple[int, int], ...]:
        """Logical (dp, mp) views of a submesh; mp divides a host's share so axis 1 stays intra-host."""
        hosts, per_host = submesh
        total = hosts * per_host
        return tuple((total // mp, mp) for mp in range(1, per_host + 1) if per_host % mp == 0)

    def validate_submesh(self, submesh: tuple[int, int]) -> None:
        """Raise unless `submesh` (hosts, devices per host) is a submesh shape of this cluster."""
        if not isinstance(submesh, (tuple, list)) or len(submesh) != 2:
            raise ValueError(f"a submesh is (hosts, devices per host), got {submesh!r}")
        hosts = check_int("submesh hosts", submesh[0])
        per_host = check_int("submesh devices per host", submesh[1])
        if hosts < 1 or per_host < 1 or hosts > self.num_hosts or per_host > self.devices_per_host:
            raise ValueError(
                f"submesh {submesh} does not fit cluster {self.num_hosts} hosts x "
                f"{self.devices_per_host} devices; use one of {self.submesh_shapes()}"
            )
        if hosts > 1 and per_host != self.devices_per_host:
            raise ValueError(
                f"a submesh across {hosts} hosts must use all {self.devices_per_host} devices "
                f"of each host, got {submesh}"
            )

    def logical_mesh(
        self,
        submesh: tuple[int, int],
        logical_shape: tuple[int, int] | None = None,
        first_device: int = 0,
    ) -> LogicalMesh:
        """A logical view of `submesh` whose devices start at global id `first_device`."""
        self.validate_submesh(submesh)
        hosts, per_host = submesh
        logical_shape = logical_shape or (1, hosts * per_host)
        if logical_shape not in self.logical_shapes(submesh):
            raise ValueError(
                f"logical mesh {logical_shape} is not a view of submesh {submesh}; "
                f"choose one of {self.logical_shapes(submesh)}"
            )
        if first_device + hosts * per_host > self.num_devices:
            raise ValueError(
                f"submesh {submesh} starting at device {first_device} runs past the "
                f"cluster's {self.num_devices} devices"
            )
        device_ids = tuple(range(first_device, first_device + hosts * per_host))
        axis0 = self.inter_host if hosts > 1 else self.intra_host
        return LogicalMesh(shape=logical_shape, device_ids=device_ids, axis_links=(axis0, self.intra_host),
                           num_hosts=hosts)

    def with_hosts(self, num_hosts: int) -> "Cluster":
        """The same hosts and links, `num_hosts` of them (a what-if on the cluster's size)."""
        if isinstance(num_hosts, bool) or not isinstance(num_hosts, int) or num_hosts < 1:
            raise ValueError(f"a cluster needs a whole number of hosts >= 1, got {num_hosts!r}")
        name = f"{num_hosts}x{self.devices_per_host} {self.device.name.split('-')[0]}"
        return dataclasses.replace(self, num_hosts=num_hosts, name=name)

    def with_links(self, intra_host: Link | None = None, inter_host: Link | None = None) -> "Cluster":
        """A copy with other link figures, for what-if planning."""
        return dataclasses.replace(
            self, intra_host=intra_host or self.intra_host, inter_host=inter_host or self.inter_host
        )
