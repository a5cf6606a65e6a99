"""Fidelity of the cost model: predicted vs measured step time of several plans on the local devices.

On the 8 virtual CPU devices, with the cluster calibrated on this machine
(`av.Cluster.local(calibrate=True)`, priced at 100% of the measured rates),
a small GPT is planned several ways: data parallelism, one-stage meshes
1x8 and 2x4 (sharded by the ILP), 2- and 4-stage pipelines, a mixed plan
and the solver's free plan.  Each plan is launched with `av.parallelize`
and timed (median of several steps after warm-up).  Prints, per plan,
predicted and measured ms and their ratio, then Spearman's rank
correlation and whether the solver's plan is the fastest measured.

The runtime's per-instruction dispatch (about 0.1-0.3 ms per RUN/SEND/RECV
on this machine, `bench_runtime.py`) is not in the model; the table's
`dispatch ms` column estimates it from the instruction count, and
`+dispatch` is the ratio with it added to the prediction.

    .venv/bin/python benchmarks/fidelity.py [--layers 4 --hidden 256 --batch 32 --microbatches 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation: Pearson's correlation of the ranks (timings have no ties)."""
    import numpy as np

    rx, ry = np.argsort(np.argsort(xs)), np.argsort(np.argsort(ys))
    return float(np.corrcoef(rx, ry)[0, 1])


def candidate_pins(av, num_devices: int) -> dict[str, object]:
    """The plans to compare, as pins (the ILP fills in whatever a pin leaves open)."""
    half, quarter = num_devices // 2, num_devices // 4
    return {
        "one stage 1x8 as 1x8": av.Pins(num_stages=1, stage_logical_meshes=((0, (1, num_devices)),)),
        "one stage 1x8 as 2x4": av.Pins(num_stages=1, stage_logical_meshes=((0, (2, half)),)),
        "2 stages 1x4 as 4x1": av.Pins(num_stages=2, stage_submeshes=((0, (1, half)), (1, (1, half))),
                                       stage_logical_meshes=((0, (half, 1)), (1, (half, 1)))),
        "2 stages 1x4 as 2x2": av.Pins(num_stages=2, stage_submeshes=((0, (1, half)), (1, (1, half))),
                                       stage_logical_meshes=((0, (2, 2)), (1, (2, 2)))),
        "4 stages 1x2 as 2x1": av.Pins(num_stages=4,
                                       stage_submeshes=tuple((i, (1, quarter)) for i in range(4)),
                                       stage_logical_meshes=tuple((i, (quarter, 1)) for i in range(4))),
    }


def measure(av, jax, step, plan, params, batch, repeats: int) -> tuple[float, int]:
    """Median seconds per step of `plan` launched, and its instruction count."""
    parallel = av.parallelize(step, plan)
    state = {"p": params}

    def once():
        state["p"], loss = parallel(state["p"], batch)
        jax.block_until_ready((state["p"], loss))

    once()
    once()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        once()
        times.append(time.perf_counter() - start)
    return statistics.median(times), sum(len(lst) for lst in parallel.instructions)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32, help="global batch")
    parser.add_argument("--microbatches", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dispatch-us", type=float, default=None,
                        help="runtime overhead per instruction (default: measured by bench_runtime's method)")
    args = parser.parse_args(argv)
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

    import jax

    import alpaviz as av
    from alpaviz.core.graph import microbatch_args

    step, params, batch = av.models.gpt(num_layers=args.layers, hidden=args.hidden, seq_len=args.seq,
                                        vocab=512, batch_size=args.batch)
    cluster = av.Cluster.local(calibrate=True)
    cost_model = av.CostModel(compute_efficiency=1.0, memory_efficiency=1.0)
    options = dict(cluster=cluster, cost_model=cost_model, num_microbatches=args.microbatches,
                   progress=False, cache=av.StageProfileCache())
    # The plans are of the step at microbatch size; the launched step takes the global batch.
    graph = av.trace(step, *microbatch_args((params, batch), (1,), args.microbatches))
    plans = {"data parallel 8x1": av.baselines.data_parallel(graph, **options)}
    for name, pins in candidate_pins(av, cluster.num_devices).items():
        plans[name] = av.solve(graph, pins=pins, **options)
    plans["solver (free)"] = av.solve(graph, **options)
    dispatch_s = (args.dispatch_us or 0.0) * 1e-6

    rows = []
    for name, plan in plans.items():
        measured, instructions = measure(av, jax, step, plan, params, batch, args.repeats)
        rows.append((name, plan, measured, instructions))
    if args.dispatch_us is None:
        # Least-squares overhead per instruction over the plans (what the model does not price).
        gaps = [(m - p.predicted.step_time_s, n) for _, p, m, n in rows]
        dispatch_s = max(sum(g * n for g, n in gaps) / sum(n * n for _, n in gaps), 0.0)

    print(f"fidelity on {cluster.num_devices} local {jax.devices()[0].platform} devices ({cluster.name}): "
          f"GPT {args.layers} layers, hidden {args.hidden}, seq {args.seq}, global batch {args.batch}, "
          f"{args.microbatches} microbatches")
    print(f"device: {cluster.device.peak_flops / 1e9:.1f} GFLOP/s matmul, "
          f"{cluster.device.memory_bandwidth / 1e9:.1f} GB/s memory; link alpha "
          f"{cluster.intra_host.alpha_s * 1e6:.1f} us, {cluster.intra_host.bandwidth_bytes_per_s / 1e9:.2f} GB/s")
    print()
    header = ("| plan | stages | predicted ms | measured ms | measured/predicted | instructions | "
              "dispatch ms | measured/(predicted+dispatch) |")
    print(header)
    print("|" + " --- |" * 8)
    predicted, measured_all, with_dispatch = [], [], []
    for name, plan, measured, instructions in rows:
        p = plan.predicted.step_time_s
        d = dispatch_s * instructions
        predicted.append(p)
        measured_all.append(measured)
        with_dispatch.append(p + d)
        print(f"| {name} | {plan.num_stages} | {p * 1e3:.2f} | {measured * 1e3:.2f} | {measured / p:.2f} | "
              f"{instructions} | {d * 1e3:.2f} | {measured / (p + d):.2f} |")
    print()
    fastest = min(range(len(rows)), key=lambda i: measured_all[i])
    solver = len(rows) - 1
    print(f"Spearman(predicted, measured) = {spearman(predicted, measured_all):.2f}; "
          f"with dispatch = {spearman(with_dispatch, measured_all):.2f}")
    print(f"dispatch per instruction: {dispatch_s * 1e6:.0f} us "
          f"({'given' if args.dispatch_us is not None else 'least squares over the plans'})")
    print(f"fastest measured: {rows[fastest][0]}; the solver's plan is "
          f"{measured_all[solver] / measured_all[fastest]:.2f}x the fastest")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
