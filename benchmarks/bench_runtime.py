"""Runtime overhead: a data-parallel plan through `av.parallelize` against plain `jax.jit`.

Prints, on 8 virtual CPU devices:
  * the step time of a pure data-parallel plan run by `av.parallelize`
    versus `jax.jit` of the same step with the same shardings (batch split
    on all devices, params replicated); target <= 1.15x;
  * the driver's overhead per instruction, from a 2-stage x 4-microbatch
    pipeline of a tiny MLP where compute is negligible: (step wall time -
    time inside RUN instructions) / number of instructions.

    .venv/bin/python benchmarks/bench_runtime.py [--layers 2 --hidden 256 --batch 64]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--json", action="store_true", help="print one JSON line instead of text")
    args = parser.parse_args(argv)
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    import alpaviz as av
    from alpaviz.core import Schedule, data_parallel_specs, manual_plan

    devices = jax.devices()
    step, params, batch = av.models.gpt(num_layers=args.layers, hidden=args.hidden, seq_len=args.seq,
                                        vocab=512, batch_size=args.batch)
    graph = av.trace(step, params, batch)
    plan = manual_plan(graph, av.Cluster.local(), partition_specs=data_parallel_specs(graph))

    mesh = Mesh(np.asarray(devices).reshape(len(devices), 1), ("x", "y"))
    replicated = NamedSharding(mesh, PartitionSpec())
    split = NamedSharding(mesh, PartitionSpec("x"))
    p_shard = jax.tree.map(lambda _: replicated, params)
    b_shard = jax.tree.map(lambda _: split, batch)
    plain = jax.jit(step, in_shardings=(p_shard, b_shard), out_shardings=(p_shard, replicated))
    p0, b0 = jax.device_put(params, p_shard), jax.device_put(batch, b_shard)

    state = {"p": p0}

    def run_plain():
        state["p"], loss = plain(state["p"], b0)
        jax.block_until_ready(loss)

    results = {"model": graph.name, "devices": len(devices)}
    runners = {"jit_s": run_plain}
    for record in (False, True):
        parallel = av.parallelize(step, plan, record_trace=record)
        holder = {"p": p0}

        def run_parallel(parallel=parallel, holder=holder):
            holder["p"], loss = parallel(holder["p"], b0)
            jax.block_until_ready((holder["p"], loss))

        runners[f"parallelize_s_trace_{record}"] = run_parallel
    # Interleave the three so load from other processes hits them alike.
    samples = {k: [] for k in runners}
    for fn in runners.values():
        fn()
        fn()
    for _ in range(args.repeats):
        for key, fn in runners.items():
            start = time.perf_counter()
            fn()
            samples[key].append(time.perf_counter() - start)
    for key, values in samples.items():
        results[key] = statistics.median(values)
    results["ratio_no_trace"] = results["parallelize_s_trace_False"] / results["jit_s"]
    results["ratio_trace"] = results["parallelize_s_trace_True"] / results["jit_s"]

    # Driver overhead: a tiny MLP pipeline, where nearly all time is the driver's.
    width = 8

    def loss_fn(p, b):
        x = b["x"]
        for i, w in enumerate(p):
            x = jnp.tanh(x @ w)
            if i < len(p) - 1:
                x = av.mark_layer(x)
        return jnp.mean(x**2)

    mlp_step = av.models.make_train_step(loss_fn, "tiny_mlp")
    mlp_params = [jnp.eye(width) * 0.5 for _ in range(2)]
    mlp_batch = {"x": jnp.ones((8, width))}
    mlp_graph = av.trace(mlp_step, mlp_params, mlp_batch)
    pipe_plan = manual_plan(mlp_graph, av.Cluster.local(), stage_cuts=(1,), schedule=Schedule("1f1b", 4))
    pipe = av.parallelize(mlp_step, pipe_plan, record_trace=True)
    for _ in range(3):
        out, _ = pipe(mlp_params, mlp_batch)
    walls, overheads = [], []
    count = sum(len(lst) for lst in pipe.instructions)
    for _ in range(args.repeats):
        start = time.perf_counter()
        out, loss = pipe(mlp_params, mlp_batch)
        jax.block_until_ready(loss)
        wall = time.perf_counter() - start
        inside = sum(e.duration_s for e in pipe.last_trace().events if e.kind in ("forward", "backward", "update"))
        walls.append(wall)
        overheads.append((wall - inside) / count)
    results["pipeline_instructions"] = count
    results["driver_overhead_per_instruction_s"] = statistics.median(overheads)
    results["pipeline_step_s"] = statistics.median(walls)

    if args.json:
        print(json.dumps(results))
        return 0
    print(f"bench_runtime on {len(devices)} {devices[0].platform} devices, {graph.name}, batch {args.batch}")
    print(f"  plain jax.jit (same shardings)       {results['jit_s'] * 1e3:9.3f} ms/step")
    print(f"  av.parallelize, record_trace=False   {results['parallelize_s_trace_False'] * 1e3:9.3f} ms/step"
          f"   ratio {results['ratio_no_trace']:.3f}x (target <= 1.15x)")
    print(f"  av.parallelize, record_trace=True    {results['parallelize_s_trace_True'] * 1e3:9.3f} ms/step"
          f"   ratio {results['ratio_trace']:.3f}x")
    print(f"  driver overhead per instruction      {results['driver_overhead_per_instruction_s'] * 1e6:9.1f} us"
          f"   ({count} instructions, 2-stage x 4-microbatch tiny MLP, "
          f"{results['pipeline_step_s'] * 1e3:.2f} ms/step)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
