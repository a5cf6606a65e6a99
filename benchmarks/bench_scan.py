"""GPT written as a loop over its blocks and as one `lax.scan` over stacked blocks, planned side by side.

The trace unrolls a scan over stacked layer parameters into its iterations
(`alpaviz.core.graph._scan`), so both forms should get the same stages and
nearly the same predicted step; the scanned form adds the slices of the
stacked parameters and the stacking of their gradients.

    python benchmarks/bench_scan.py                    # GPT-1.3B on 2 x 8 A100 (simulated)
    python benchmarks/bench_scan.py --size 2.6B --hosts 2
"""

from __future__ import annotations

import argparse
import time

import jax.numpy as jnp

import alpaviz as av


def plan_one(size: str, scan: bool, hosts: int, microbatch: int, microbatches: int) -> dict:
    started = time.perf_counter()
    step, params, batch = av.models.gpt(size, batch_size=microbatch, abstract=True, dtype=jnp.float16,
                                        scan_layers=scan)
    graph = av.trace(step, params, batch)
    traced = time.perf_counter() - started
    plan = av.solve(graph, cluster=av.Cluster.a100_node(hosts), num_microbatches=microbatches, progress=False)
    return dict(
        form="scan" if scan else "loop", layers=graph.num_layers, operators=len(graph.nodes),
        trace_s=traced, plan_s=time.perf_counter() - started - traced, step_s=plan.predicted.step_time_s,
        stages=" ".join(f"{s.layer_start}-{s.layer_stop - 1}@{s.logical_mesh[0]}x{s.logical_mesh[1]}"
                        for s in plan.stages),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="1.3B")
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--microbatch", type=int, default=16)
    parser.add_argument("--microbatches", type=int, default=64)
    args = parser.parse_args()
    rows = [plan_one(args.size, scan, args.hosts, args.microbatch, args.microbatches) for scan in (False, True)]
    print(f"GPT-{args.size} on {args.hosts} x 8 A100 (simulated), microbatch {args.microbatch} x {args.microbatches}")
    print(f"{'form':<6}{'layers':>7}{'operators':>10}{'trace s':>9}{'plan s':>8}{'step s':>9}{'vs loop':>9}  stages")
    for row in rows:
        ratio = row["step_s"] / rows[0]["step_s"]
        print(f"{row['form']:<6}{row['layers']:>7}{row['operators']:>10}{row['trace_s']:>9.1f}{row['plan_s']:>8.1f}"
              f"{row['step_s']:>9.3f}{ratio:>9.3f}  {row['stages']}")


if __name__ == "__main__":
    main()
