"""Measure this machine's devices: matmul FLOP/s, memory bandwidth, collective latency and bandwidth.

The local devices are often virtual CPU devices that share a few cores, so
each figure is taken with every device busy at once: that is what a plan
that uses all of them gets.  Results are cached per machine (host, cores,
JAX version, device kind and count) so a notebook pays for them once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import platform
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from alpaviz.core.graph import check_number

# Matmul sides the rate curve measures, the peak being the largest's: on this machine's CPU devices a
# 512-cube matmul reaches about half the rate of a 1024-cube one, and the models' operators are smaller.
RATE_SIZES = (128, 256, 512, 1024)
# The size whose busy-device speedup prices work of unknown size (a stage not priced by operator).
SPEEDUP_SIZE = 512
CACHE_DIR = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) / "alpaviz"


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Measured figures of the local devices, each with every device busy at once."""

    device_kind: str
    num_devices: int
    matmul_flops: float  # per device, f32
    memory_bandwidth: float  # bytes/s per device
    collective_alpha_s: float  # latency of an all-reduce among all devices
    collective_bandwidth: float  # bytes/s in the alpha-beta all-reduce model
    seconds: float  # how long measuring took
    # entry b - 1: each device's matmul rate with only the first b devices busy, over its all-busy rate
    busy_speedup: tuple[float, ...] = ()
    launch_s: float = 0.0  # one launch of a tiny program over all devices
    # (FLOPs of one matmul per device, its rate over the largest's): small operators run below the peak
    rate_curve: tuple[tuple[float, float], ...] = ()
    # (FLOPs of one matmul per device, busy_speedup measured at that size): small operators gain less
    busy_speedup_by_size: tuple[tuple[float, tuple[float, ...]], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "busy_speedup", tuple(float(x) for x in self.busy_speedup))
        object.__setattr__(self, "rate_curve", tuple((float(f), float(r)) for f, r in self.rate_curve))
        object.__setattr__(self, "busy_speedup_by_size", tuple(
            (float(f), tuple(float(x) for x in row)) for f, row in self.busy_speedup_by_size))

    def describe(self) -> str:
        """The figures in a few lines, as `python -m alpaviz calibrate` prints them."""
        curve = ", ".join(f"{b}: {x:.2f}x" for b, x in enumerate(self.busy_speedup, start=1))
        return "\n".join((
            f"{self.num_devices} {self.device_kind} devices (measured in {self.seconds:.1f} s)",
            f"  matmul (f32, all busy)   {self.matmul_flops / 1e9:.1f} GFLOP/s per device",
            f"  memory (all busy)        {self.memory_bandwidth / 1e9:.2f} GB/s per device",
            f"  all-reduce               alpha {self.collective_alpha_s * 1e6:.0f} us, "
            f"{self.collective_bandwidth / 1e9:.2f} GB/s",
            f"  launch                   {self.launch_s * 1e6:.0f} us",
            f"  speedup with b busy      {curve or 'not measured'}",
            "  rate by matmul size      "
            + (", ".join(f"{f / 1e6:.3g} MFLOP: {r:.2f}" for f, r in self.rate_curve) or "not measured"),
            *(f"  speedup at {f / 1e6:.3g} MFLOP  " + ", ".join(f"{b}: {x:.2f}x" for b, x in enumerate(row, start=1))
              for f, row in self.busy_speedup_by_size),
        ))


def calibrate(cache_dir: pathlib.Path | str | None = CACHE_DIR, refresh: bool = False) -> Calibration:
    """Measure (or read from the cache) the local devices' figures in a few seconds.

    Example:
        >>> cal = av.core.calibrate()
        >>> cluster = av.Cluster.local(calibrate=True)
    """
    devices = jax.local_devices()
    key = _machine_key(devices)
    path = None if cache_dir is None else pathlib.Path(cache_dir) / f"calibration-{key}.json"
    if path is not None and path.exists() and not refresh:
        try:
            return Calibration(**json.loads(path.read_text()))
        except (ValueError, TypeError):
            pass  # a stale or damaged cache file: measure again
    started = time.perf_counter()
    mesh = Mesh(np.asarray(devices), ("d",))
    rates = {n: _matmul_flops(mesh, n) for n in RATE_SIZES}
    flops = rates[RATE_SIZES[-1]]  # the peak; smaller operators run at the curve's share of it
    curve = tuple((2.0 * n ** 3, rate / flops) for n, rate in rates.items())
    bandwidth = _memory_bandwidth(mesh)
    alpha, beta = _all_reduce(mesh)
    # each busy count's rate over all busy's, at every size: small operators gain less from idle cores
    by_size = tuple((2.0 * n ** 3, _busy_speedup(devices, rate, n)) for n, rate in rates.items())
    speedup = dict(by_size)[2.0 * SPEEDUP_SIZE ** 3]
    launch = _launch_s(mesh)
    result = Calibration(devices[0].platform, len(devices), flops, bandwidth, alpha, beta,
                         time.perf_counter() - started, speedup, launch, curve, by_size)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(dataclasses.asdict(result)))
    return result


def _machine_key(devices) -> str:
    text = f"v5|{platform.node()}|{os.cpu_count()}|{jax.__version__}|{devices[0].platform}|{len(devices)}"
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _best_time(fn: Callable[[], object], repeats: int = 5) -> float:
    jax.block_until_ready(fn())  # compile and warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def _matmul_flops(mesh: Mesh, n: int = 512) -> float:
    """Per-device FLOP/s of an f32 matmul, every device multiplying its own pair at once."""
    shards = NamedSharding(mesh, PartitionSpec("d"))
    d = mesh.size
    a = jax.device_put(jnp.ones((d, n, n), jnp.float32), shards)
    step = jax.jit(lambda x: jnp.einsum("bij,bjk->bik", x, x), out_shardings=shards)
    seconds = _best_time(lambda: step(a))
    return check_number("measured matmul FLOP/s", 2 * n ** 3 / seconds, positive=True)


def _busy_speedup(devices, all_busy_flops: float, n: int) -> tuple[float, ...]:
    """Each device's n-cube matmul rate with only the first b devices busy, over the all-busy rate,
    for b = 1..len(devices): measured at 1, 2, 4, ... and at every device, interpolated between."""
    d = len(devices)
    measured = {d: 1.0}
    b = 1
    while b < d:
        measured[b] = _matmul_flops(Mesh(np.asarray(devices[:b]), ("d",)), n) / all_busy_flops
        b *= 2
    counts = sorted(measured)
    # Interpolate the time per unit of work (1 / speedup), which grows linearly with the busy
    # devices when they share the cores evenly.
    slowdown = [1.0 / measured[c] for c in counts]
    speedup = [float(1.0 / np.interp(b, counts, slowdown)) for b in range(1, d + 1)]
    # Fewer busy devices never run slower than more: a reading below the next count's is noise.
    for b in range(d - 2, -1, -1):
        speedup[b] = max(speedup[b], speedup[b + 1])
    return tuple(speedup)


def _launch_s(mesh: Mesh) -> float:
    """Seconds to launch a tiny program over all devices and wait for it (the per-task fixed cost)."""
    x = jax.device_put(jnp.ones((mesh.size, 8), jnp.float32), NamedSharding(mesh, PartitionSpec("d")))
    step = jax.jit(lambda v: v + 1.0)
    return check_number("measured launch cost", _best_time(lambda: step(x), repeats=50), minimum=0)


def _memory_bandwidth(mesh: Mesh, n: int = 1 << 22) -> float:
    """Per-device bytes/s of a streaming read-and-write, every device streaming at once."""
    shards = NamedSharding(mesh, PartitionSpec("d"))
    x = jax.device_put(jnp.ones((mesh.size, n), jnp.float32), shards)
    step = jax.jit(lambda v: v * 1.0001 + 1.0, out_shardings=shards)
    seconds = _best_time(lambda: step(x))
    return check_number("measured memory bandwidth", 2 * 4 * n / seconds, positive=True)


def _all_reduce(mesh: Mesh) -> tuple[float, float]:
    """Alpha (s) and bandwidth (bytes/s) of an all-reduce among all devices, from a small and a large message."""
    d = mesh.size
    if d == 1:
        return 0.0, float("inf")
    shards = NamedSharding(mesh, PartitionSpec("d"))
    reduce = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "d"), mesh=mesh, in_specs=PartitionSpec("d"),
                                   out_specs=PartitionSpec("d")))
    timed = {}
    for elements in (256, 1 << 20):
        x = jax.device_put(jnp.ones((d, elements), jnp.float32), shards)
        timed[elements] = _best_time(lambda: reduce(x))
    small, large = timed[256], timed[1 << 20]
    nbytes = 4 * (1 << 20)
    traffic = 2 * (d - 1) / d * nbytes  # the all-reduce model's bytes per device
    beta = traffic / max(large - small, 1e-9)
    return check_number("measured all-reduce latency", small, minimum=0), check_number(
        "measured all-reduce bandwidth", beta, positive=True)
