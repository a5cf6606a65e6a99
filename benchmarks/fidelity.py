"""Fidelity of the cost model: predicted vs measured step time of many plans on the local devices.

On the 8 virtual CPU devices, with the cluster calibrated on this machine
(`av.Cluster.local(calibrate=True)`, priced at 100% of the measured rates),
a small GPT is planned seventeen ways: data parallelism, tensor parallelism,
a mixed 2-D mesh, 2- and 4-stage pipelines at 1 to 32 microbatches, with and
without recomputation, under 1F1B, ZB-H1 and interleaved 1F1B, and the solver's own plans (at the default count
and with the count searched).  Each plan is launched with `av.parallelize`'s
defaults, as a user runs it, and timed (median of `--repeats` steps after
two warm-up steps) in each of `--passes` passes over all the plans; its
figure is the mean of its passes.  Prints, per plan, predicted and measured
ms and their ratio; then Spearman's rank correlation, how the solver's plans compare with
the fastest measured, and the noise floor: how far a plan's passes differ.
A noise floor above 10 % means the machine was busy: run again.

    .venv/bin/python benchmarks/fidelity.py [--layers 4 --hidden 256 --seq 32 --batch 64 --microbatches 2]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).parent))  # bench_plan, beside this script


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation: Pearson's correlation of the ranks (timings have no ties)."""
    import numpy as np

    rx, ry = np.argsort(np.argsort(xs)), np.argsort(np.argsort(ys))
    return float(np.corrcoef(rx, ry)[0, 1])


def candidate_pins(av, num_devices: int, microbatches: int) -> dict[str, object]:
    """The plans to compare, as pins (the ILP fills in whatever a pin leaves open)."""
    half, quarter = num_devices // 2, num_devices // 4

    def stages(n, size, logical=None, remat=False, count=microbatches, schedule=None):
        return av.Pins(num_stages=n, num_microbatches=count,
                       stage_submeshes=tuple((i, (1, size)) for i in range(n)),
                       stage_logical_meshes=tuple((i, logical) for i in range(n)) if logical else (),
                       stage_remat=tuple((i, True) for i in range(n)) if remat else (), schedule=schedule)

    return {
        "tensor parallel: 1 stage, 1x8 as 1x8": stages(1, num_devices, (1, num_devices)),
        "mixed: 1 stage, 1x8 as 2x4": stages(1, num_devices, (2, half)),
        "2 stages 1x4 as 4x1": stages(2, half, (half, 1)),
        "2 stages 1x4 as 2x2": stages(2, half, (2, 2)),
        "4 stages 1x2 as 2x1": stages(4, quarter, (quarter, 1)),
        "2 stages 1x4 as 4x1, 1 microbatch": stages(2, half, (half, 1), count=1),
        "2 stages 1x4 as 4x1, 8 microbatches": stages(2, half, (half, 1), count=8),
        "4 stages 1x2 as 2x1, 8 microbatches": stages(4, quarter, (quarter, 1), count=8),
        "2 stages 1x4 (ILP), 32 microbatches": stages(2, half, count=32),
        "2 stages 1x4 as 4x1, recomputing": stages(2, half, (half, 1), remat=True),
        "4 stages 1x2 as 2x1, 8 microbatches, recomputing": stages(4, quarter, (quarter, 1), remat=True, count=8),
        "2 stages 1x4 as 4x1, 8 microbatches, zb-h1": stages(2, half, (half, 1), count=8, schedule="zb-h1"),
        "4 stages 1x2 as 2x1, 8 microbatches, zb-h1": stages(4, quarter, (quarter, 1), count=8, schedule="zb-h1"),
        # interleaved 1F1B: 4 stages as 2 submeshes of 1x4 with 2 chunks each (stage j on submesh j mod 2)
        "2 submeshes 1x4 as 4x1 x 2 chunks, 8 microbatches, interleaved":
            stages(4, half, (half, 1), count=8, schedule="interleaved-1f1b"),
    }


def measure(av, jax, step, plan, params, batch, repeats: int) -> float:
    """Median seconds per step of `plan` launched with `av.parallelize`'s defaults."""
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
    return statistics.median(times)


def make_plans(av, step, params, batch, cluster, microbatches: int) -> dict[str, object]:
    """Every plan of the table, each solved for the step traced at its own microbatch size."""
    from alpaviz.core.graph import microbatch_args

    cost_model = av.CostModel(compute_efficiency=1.0, memory_efficiency=1.0)
    cache = av.StageProfileCache()
    graphs: dict[int, object] = {}

    def graph_at(count):
        if count not in graphs:  # plans are of the step at microbatch size; the launch takes the global batch
            graphs[count] = av.trace(step, *microbatch_args((params, batch), (1,), count))
        return graphs[count]

    options = dict(cluster=cluster, cost_model=cost_model, progress=False, cache=cache)
    plans = {"data parallel 8x1": av.baselines.data_parallel(graph_at(microbatches), num_microbatches=microbatches,
                                                               **options)}
    for name, pins in candidate_pins(av, cluster.num_devices, microbatches).items():
        plans[name] = av.solve(graph_at(pins.num_microbatches), pins=pins, **options)
    plans[f"solver (free), {microbatches} microbatches"] = av.solve(graph_at(microbatches),
                                                                    num_microbatches=microbatches, **options)
    plans["solver (free), microbatch count searched"] = av.solve(
        step, params, batch, num_microbatches="auto", global_batch_argnums=(1,), **options)
    return plans


def report(rows, spread: dict[str, float]) -> None:
    """The table and the summary lines; `spread` is each plan's largest over smallest pass, less 1."""
    from bench_plan import describe  # imports jax: only once main has set XLA_FLAGS
    print("| plan | stages | microbatches | predicted ms | measured ms | measured / predicted |")
    print("|" + " --- |" * 6)
    for name, plan, measured in rows:
        p = plan.predicted.step_time_s
        print(f"| {name} | {plan.num_stages} | {plan.schedule.num_microbatches} | {p * 1e3:.1f} | "
              f"{measured * 1e3:.1f} | {measured / p:.2f} |")
    print()
    predicted = [plan.predicted.step_time_s for _, plan, _ in rows]
    measured = [m for _, _, m in rows]
    ratios = [m / p for m, p in zip(measured, predicted)]
    fastest = min(range(len(rows)), key=lambda i: measured[i])
    print(f"measured / predicted: {min(ratios):.2f} to {max(ratios):.2f}; "
          f"Spearman(predicted, measured) = {spearman(predicted, measured):.2f}")
    print(f"fastest measured: {rows[fastest][0]} ({measured[fastest] * 1e3:.1f} ms)")
    for name, plan, m in rows:
        if name.startswith("solver"):
            print(f"{name}: {m / measured[fastest]:.2f}x the fastest ({describe(plan)})")
    worst = max(spread, key=spread.get)
    print(f"noise floor: a plan's passes differ by {statistics.median(spread.values()):.1%} (median over the "
          f"plans), at most {spread[worst]:.1%} ({worst})"
          + ("  (above 10 %: the machine was busy, run again)" if spread[worst] > 0.10 else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--batch", type=int, default=64, help="global batch (32 microbatches of at least 2)")
    parser.add_argument("--microbatches", type=int, default=2, help="for the plans that do not name a count")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--passes", type=int, default=2, help="times every plan is measured, in turn")
    args = parser.parse_args(argv)
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

    import jax

    import alpaviz as av

    step, params, batch = av.models.gpt(num_layers=args.layers, hidden=args.hidden, seq_len=args.seq,
                                        vocab=512, batch_size=args.batch)
    cluster = av.Cluster.local(calibrate=True)
    plans = make_plans(av, step, params, batch, cluster, args.microbatches)
    # Every plan timed in each pass, the passes one after another: a plan's two figures minutes apart
    # show the machine's own drift, which timing one plan twice in a row hides.
    passes = [{name: measure(av, jax, step, plan, params, batch, args.repeats) for name, plan in plans.items()}
              for _ in range(args.passes)]
    rows = [(name, plan, statistics.mean(p[name] for p in passes)) for name, plan in plans.items()]
    spread = {name: max(p[name] for p in passes) / min(p[name] for p in passes) - 1 for name in plans}

    print(f"fidelity on {cluster.num_devices} local {jax.devices()[0].platform} devices ({cluster.name}): "
          f"GPT {args.layers} layers, hidden {args.hidden}, seq {args.seq}, global batch {args.batch}; "
          f"median of {args.repeats} steps")
    print(f"device: {cluster.device.peak_flops / 1e9:.1f} GFLOP/s matmul, "
          f"{cluster.device.memory_bandwidth / 1e9:.2f} GB/s memory, launch {cluster.device.launch_s * 1e6:.0f} us; "
          f"busy-device speedup {', '.join(f'{s:.2f}' for s in cluster.busy_speedup)}; link alpha "
          f"{cluster.intra_host.alpha_s * 1e6:.0f} us, {cluster.intra_host.bandwidth_bytes_per_s / 1e9:.2f} GB/s; "
          f"rate by matmul size {', '.join(f'{f / 1e6:.3g} MFLOP {r:.2f}' for f, r in cluster.device.rate_curve)}")
    print()
    report(rows, spread)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
