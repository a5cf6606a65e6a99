"""The cost and memory model checked on this machine's first device, in one command (made for one GPU).

Prints four Markdown tables:
1. the device as measured: f32 and bf16 matmul rate, memory bandwidth, the cost of one launch, and
   `alpaviz.core.cost.calibrate()`'s figures, which `Cluster.local(calibrate=True)` prices with;
2. one GPT block's forward and backward at fp32 and bf16: the time the cost model predicts on the
   calibrated device (the intra-op ILP on a 1x1 mesh) against the block run under `jax.jit`;
3. a one-stage plan's memory per device: predicted, XLA's `memory_analysis()` of its program, and the
   device's own peak after a step (`memory_stats()`, where the backend keeps one; CPUs do not);
4. the plan's step under `av.parallelize` (its defaults, as users run it) against `jax.jit` of the step.

On a GPU host:

    .venv/bin/python benchmarks/gpu_check.py            # GPT block of hidden 2048, seq 1024, batch 8

On CPU it runs too (the tests run it with tiny sizes), but the figures describe a CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from typing import Any, Callable


def median_time(fn: Callable[[], Any], repeats: int) -> float:
    """Median seconds of `fn()` (results waited for) after one warm-up call that compiles it."""
    import jax

    jax.block_until_ready(fn())
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def device_rates(size: int, repeats: int) -> dict[str, float]:
    """Matmul FLOP/s at f32 and bf16 on `size` x `size`, and one tiny launch's seconds."""
    import jax
    import jax.numpy as jnp

    device = jax.devices()[0]
    out = {}
    for name, dtype in (("f32", jnp.float32), ("bf16", jnp.bfloat16)):
        a = jax.device_put(jnp.ones((size, size), dtype), device)
        matmul = jax.jit(lambda x: x @ x)
        out[f"matmul {name} TFLOP/s"] = 2 * size**3 / median_time(lambda: matmul(a), repeats) / 1e12
    scalar = jax.device_put(jnp.zeros(()), device)
    bump = jax.jit(lambda x: x + 1)
    out["launch us"] = median_time(lambda: bump(scalar), max(repeats, 20)) * 1e6
    return out


def single_device_cluster():
    """The calibrated local cluster cut to its first device: the figures `Cluster.local` measures."""
    import alpaviz as av

    local = av.Cluster.local(calibrate=True)
    one_busy = local.busy_speedup[:1]  # the curve's one-busy-device point, if it has one
    by_size = tuple((flops, row[:1]) for flops, row in local.busy_speedup_by_size)
    return dataclasses.replace(local, num_hosts=1, devices_per_host=1, busy_speedup=one_busy,
                               busy_speedup_by_size=by_size, name=f"{local.name}, one device")


def block_times(cluster, hidden: int, heads: int, seq: int, batch: int, dtype, repeats: int) -> dict[str, float]:
    """One GPT block's forward and backward seconds: predicted on `cluster`'s device and run under jit."""
    import jax
    import jax.numpy as jnp

    import alpaviz as av
    from alpaviz.core.intra_op import solve_sharding
    from alpaviz.core.models._gpt import _init_block, block

    step, params, data = av.models.gpt(num_layers=3, hidden=hidden, heads=heads, seq_len=seq, vocab=1024,
                                       batch_size=batch, dtype=dtype, abstract=True)
    graph = av.trace(step, params, data)
    nodes = [n.name for n in graph.nodes if n.layer == 1]  # the middle block, as the inter-op pass prices it
    mesh = cluster.logical_mesh((1, 1), (1, 1))
    priced = solve_sharding(graph, mesh, cluster, av.CostModel(compute_efficiency=1.0, memory_efficiency=1.0),
                            nodes=nodes).cost
    p = _init_block(jax.random.key(0), hidden, dtype)
    x = jnp.ones((batch, seq, hidden), dtype)
    forward = jax.jit(lambda x, p: block(x, p, heads))
    both = jax.jit(jax.grad(lambda x, p: block(x, p, heads).astype(jnp.float32).sum(), argnums=(0, 1)))
    forward_s = median_time(lambda: forward(x, p), repeats)
    backward_s = max(median_time(lambda: both(x, p), repeats) - forward_s, 0.0)
    return {"predicted forward": priced.forward_s, "measured forward": forward_s,
            "predicted backward": priced.backward_s, "measured backward": backward_s}


def step_checks(cluster, hidden: int, heads: int, seq: int, batch: int, layers: int, repeats: int) -> dict:
    """A one-stage plan of a bf16 GPT: memory predicted / compiled / peak, and its step against jax.jit."""
    import jax
    import jax.numpy as jnp

    import alpaviz as av
    from alpaviz.core.runtime import compiled_stage_memory

    step, params, data = av.models.gpt(num_layers=layers, hidden=hidden, heads=heads, seq_len=seq, vocab=1024,
                                       batch_size=batch, dtype=jnp.bfloat16)
    plan = av.solve(step, params, data, cluster=cluster, num_microbatches=1, progress=False,
                    cost_model=av.CostModel(compute_efficiency=1.0, memory_efficiency=1.0))
    predicted = plan.stages[0].cost.memory.with_in_flight(1).peak
    compiled = compiled_stage_memory(step, plan, (params, data))[0].peak
    parallel = av.parallelize(step, plan)
    jitted = jax.jit(step)
    state = {"parallel": params, "jit": params}

    def run(name, fn):
        def once():
            state[name], loss = fn(state[name], data)
            return state[name], loss
        return once

    parallel_s = median_time(run("parallel", parallel), repeats)
    jit_s = median_time(run("jit", jitted), repeats)
    stats = jax.devices()[0].memory_stats() or {}
    return {"plan": plan, "predicted bytes": predicted, "compiled bytes": compiled,
            "device peak bytes": stats.get("peak_bytes_in_use"), "parallelize s": parallel_s, "jit s": jit_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--layers", type=int, default=4, help="GPT blocks in the step of tables 3 and 4")
    parser.add_argument("--matmul", type=int, default=8192, help="matrix side for the matmul rate")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)

    import jax
    import jax.numpy as jnp

    from alpaviz.core.cost import calibrate

    device = jax.devices()[0]
    print(f"gpu_check on {device.platform} ({device.device_kind}), jax {jax.__version__}; median of {args.repeats}")
    cal = calibrate()
    rates = device_rates(args.matmul, args.repeats)
    print("\n| figure | value |\n| --- | --- |")
    for name, value in rates.items():
        print(f"| {name} | {value:.3g} |")
    print(f"| calibrate(): matmul f32 TFLOP/s | {cal.matmul_flops / 1e12:.3g} |")
    print(f"| calibrate(): memory GB/s | {cal.memory_bandwidth / 1e9:.3g} |")
    if cal.num_devices > 1:
        print(f"| calibrate(): all-reduce over {cal.num_devices} devices, alpha us / GB/s | "
              f"{cal.collective_alpha_s * 1e6:.3g} / {cal.collective_bandwidth / 1e9:.3g} |")

    cluster = single_device_cluster()
    shape = dict(hidden=args.hidden, heads=args.heads, seq=args.seq, batch=args.batch)
    print(f"\nOne GPT block (hidden {args.hidden}, seq {args.seq}, batch {args.batch}), ms:")
    print("| dtype | pass | predicted | measured | measured / predicted |\n| --- | --- | --- | --- | --- |")
    for name, dtype in (("fp32", jnp.float32), ("bf16", jnp.bfloat16)):
        times = block_times(cluster, **shape, dtype=dtype, repeats=args.repeats)
        for part in ("forward", "backward"):
            p, m = times[f"predicted {part}"], times[f"measured {part}"]
            print(f"| {name} | {part} | {p * 1e3:.3f} | {m * 1e3:.3f} | {m / p if p else float('nan'):.2f} |")

    checks = step_checks(cluster, **shape, layers=args.layers, repeats=args.repeats)
    peak = checks["device peak bytes"]
    print(f"\nOne-stage plan of a {args.layers}-block bf16 GPT, memory per device, MiB:")
    print("| predicted | XLA memory_analysis | compiled / predicted | device peak |\n| --- | --- | --- | --- |")
    print(f"| {checks['predicted bytes'] / 2**20:.1f} | {checks['compiled bytes'] / 2**20:.1f} | "
          f"{checks['compiled bytes'] / checks['predicted bytes']:.2f} | "
          f"{'n/a (the backend keeps no peak)' if peak is None else f'{peak / 2**20:.1f}'} |")
    predicted_s = checks["plan"].predicted.step_time_s
    print("\nIts step, ms:\n| predicted | av.parallelize | jax.jit | parallelize / jit |\n| --- | --- | --- | --- |")
    print(f"| {predicted_s * 1e3:.2f} | {checks['parallelize s'] * 1e3:.2f} | {checks['jit s'] * 1e3:.2f} | "
          f"{checks['parallelize s'] / checks['jit s']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
