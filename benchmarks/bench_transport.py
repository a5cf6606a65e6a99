"""Tensors crossing a host boundary between two Ray host actors, per transport: bytes and measured speed.

Two actors of 4 virtual CPU devices each (this machine's stand-in for two
hosts).  Part 1 times one transfer of a float32 tensor that the receiving
mesh holds whole on each of its 4 devices (replicated: where tile-once
matters) for each backend and size, and fits the link's latency and
bandwidth (least squares over the sizes), which `av.Cluster.ray` takes as
its inter-host figures.  Part 2 runs a 2-stage GPT (stage 0 on a 4x1 mesh,
stage 1 on 1x4 on the other host) for a few steps per backend and prints
the bytes that cross the boundary per step and the step time.

    .venv/bin/python benchmarks/bench_transport.py [--sizes-mb 0.25 1 4 16] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def _probe_class():
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from alpaviz.core.runtime._host_actor import HostActor, _wait_until_ready, make_transport

    class Probe(HostActor):
        """A host actor that moves one test tensor with a chosen transport."""

        def use(self, transport: str) -> None:
            self.transport = make_transport(transport)

        def make(self, shape, devices) -> None:
            world = jax.devices()
            mesh = Mesh(np.array([world[d] for d in devices]), ("x",))
            self.value = jax.device_put(np.ones(shape, np.float32), NamedSharding(mesh, PartitionSpec("x")))
            jax.block_until_ready(self.value)
            self.replicated = NamedSharding(mesh, PartitionSpec())

        def send(self, transfer) -> object:
            return self.transport.send(transfer, {"x": self.value})

        def expect(self, transfer) -> None:
            self.arrived = self.transport.expect(transfer)

        def receive(self, transfer, payload) -> float:
            arrived = payload if payload is not None else self.arrived
            _wait_until_ready(arrived.values(), 0)
            got = self.transport.receive(transfer, arrived, {"x": self.replicated})
            jax.block_until_ready(got)
            self.transport.step_done()
            return float(np.asarray(got["x"]).ravel()[0])

    return Probe


def _transfer_times(args) -> list[dict]:
    import ray

    from alpaviz.core.runtime._cross_mesh import boundary_bytes
    from alpaviz.core.runtime._transport import Transfer

    probe = ray.remote(num_cpus=1)(_probe_class())
    actors = [probe.remote(h, 4) for h in range(2)]
    coordinator = ray.get(actors[0].coordinator_address.remote())
    ray.get([a.join.remote(coordinator, 2, h, 120) for h, a in enumerate(actors)])
    rows = []
    for transport, tile_once in (("xla", True), ("xla", False), ("object_store", True)):
        ray.get([a.use.remote(transport) for a in actors])
        for mb in args.sizes_mb:
            rows_, cols = 1024, max(1, int(mb * 2**20 / 4 / 1024))
            shape = (rows_, cols)
            ray.get([a.make.remote(shape, (4 * h, 4 * h + 1, 4 * h + 2, 4 * h + 3)) for h, a in enumerate(actors)])
            transfer = Transfer(key=(0, "forward", 1, "forward", 0), tensors=("x",), shapes=(shape,),
                                dtypes=("float32",), src_devices=(0, 1, 2, 3), dst_devices=(4, 5, 6, 7),
                                dst_mesh_shape=(1, 4), dst_specs=(None,), tile_once=tile_once)
            seconds = []
            for _ in range(args.repeats + 1):
                start = time.perf_counter()
                payload = actors[0].send.remote(transfer)
                if transport == "xla":
                    actors[1].expect.remote(transfer)
                    payload = None
                ray.get(actors[1].receive.remote(transfer, payload))
                seconds.append(time.perf_counter() - start)
            nbytes = shape[0] * shape[1] * 4
            crossing = boundary_bytes(nbytes, (), (1, 4), tile_once)
            rows.append({"transport": transport, "tile_once": tile_once, "tensor_bytes": nbytes,
                         "crossing_bytes": crossing, "seconds": statistics.median(seconds[1:])})
    for actor in actors:
        ray.kill(actor)
    return rows


def _fit(rows: list[dict]) -> tuple[float, float]:
    """Latency and bandwidth of `seconds = alpha + crossing_bytes / bandwidth`, by least squares."""
    import numpy as np

    x = np.array([r["crossing_bytes"] for r in rows], float)
    y = np.array([r["seconds"] for r in rows], float)
    slope, alpha = np.polyfit(x, y, 1)
    return max(alpha, 0.0), 1.0 / slope if slope > 0 else float("inf")


def _steps(args) -> list[dict]:
    import jax
    import numpy as np

    import alpaviz as av
    from alpaviz.core.plan._manual_plan import data_parallel_specs, manual_plan
    from alpaviz.core.plan._plan import Schedule

    step, params, batch = av.models.gpt(num_layers=4, hidden=256, seq_len=64, vocab=512, batch_size=16)
    graph = av.trace(step, params, batch)
    plan = manual_plan(graph, av.Cluster.ray(2, 4), stage_cuts=(2,), logical_meshes=[(4, 1), (1, 4)],
                       partition_specs=data_parallel_specs(graph), schedule=Schedule("1f1b", 4))
    rows = []
    for transport, tile_once in (("xla", True), ("xla", False), ("object_store", True)):
        parallel = av.parallelize(step, plan, engine="ray", transport=transport, example_args=(params, batch),
                                  ray_options={"tile_once": tile_once}, record_trace=False)
        try:
            p = params
            p, loss = parallel(p, batch)  # compile and warm up
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                p, loss = parallel(p, batch)
                np.asarray(loss)
                times.append(time.perf_counter() - start)
            rows.append({"transport": transport, "tile_once": tile_once,
                         "crossing_bytes_per_step": parallel._engine.crossing_bytes(),
                         "step_s": statistics.median(times), "loss": float(np.asarray(loss))})
        finally:
            parallel.close()
    del jax
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[0.25, 1.0, 4.0, 16.0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        transfers = _transfer_times(args)
        steps = _steps(args)
    finally:
        ray.shutdown()
    print("one tensor to a receiver that holds it whole on each of its 4 devices (median of "
          f"{args.repeats}; includes Ray's call overhead):")
    print(f"{'transport':<14}{'tile-once':>10}{'tensor MB':>11}{'crossing MB':>13}{'ms':>9}{'MB/s':>9}")
    for r in transfers:
        print(f"{r['transport']:<14}{str(r['tile_once']):>10}{r['tensor_bytes'] / 2**20:>11.2f}"
              f"{r['crossing_bytes'] / 2**20:>13.2f}{r['seconds'] * 1e3:>9.2f}"
              f"{r['crossing_bytes'] / r['seconds'] / 2**20:>9.0f}")
    fits = {}
    for transport, tile_once in (("xla", True), ("object_store", True)):
        alpha, bandwidth = _fit([r for r in transfers if r["transport"] == transport and r["tile_once"] == tile_once])
        fits[transport] = {"alpha_s": alpha, "bandwidth_bytes_per_s": bandwidth}
        print(f"fit {transport}: latency {alpha * 1e3:.2f} ms, bandwidth {bandwidth / 1e6:.0f} MB/s")
    print("\n2-stage GPT (hidden 256, seq 64, 16 sequences, 4 microbatches; stage 1 on 1x4 on the other host):")
    print(f"{'transport':<14}{'tile-once':>10}{'crossing MB/step':>18}{'step ms':>10}")
    for r in steps:
        print(f"{r['transport']:<14}{str(r['tile_once']):>10}{r['crossing_bytes_per_step'] / 2**20:>18.2f}"
              f"{r['step_s'] * 1e3:>10.1f}")
    out = pathlib.Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "bench_transport.json").write_text(json.dumps({"transfers": transfers, "fits": fits, "steps": steps},
                                                         indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
