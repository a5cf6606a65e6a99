"""Size and speed of the intra-op sharding ILP on one GPT layer of growing hidden size.

One transformer block (forward, backward and SGD update: the middle layer
of a 3-layer GPT, the unit the inter-op pass prices) on each logical mesh
of an 8-GPU A100 host.  Columns: operators before merging, decision groups
after, strategies over all groups, ILP variables, solve seconds, status.

    python benchmarks/bench_ilp.py
    python benchmarks/bench_ilp.py --hidden 1024,4096 --meshes 1x8,2x4
"""

from __future__ import annotations

import argparse
import time

import alpaviz as av
from alpaviz.core.intra_op._solve_sharding import solve_sharding
from alpaviz.core.intra_op._simplify import simplify


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", default="768,1024,2048,4096")
    parser.add_argument("--meshes", default="1x8,2x4,4x2")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--time-limit", type=float, default=60.0)
    args = parser.parse_args()
    cluster = av.Cluster.a100_node()
    meshes = [tuple(int(v) for v in m.split("x")) for m in args.meshes.split(",")]
    header = f"{'hidden':>6} {'mesh':>5} {'nodes':>6} {'groups':>6} {'strategies':>10} {'variables':>9} " \
             f"{'solve s':>8} {'status':>12} {'objective ms':>12}"
    print(header)
    print("-" * len(header))
    for hidden in (int(h) for h in args.hidden.split(",")):
        step, params, batch = av.models.gpt(num_layers=3, hidden=hidden, heads=max(1, hidden // 64),
                                            seq_len=1024, vocab=51200, batch_size=args.batch, abstract=True)
        graph = av.trace(step, params, batch)
        nodes = [n.name for n in graph.nodes if n.layer == 1]
        for shape in meshes:
            mesh = cluster.logical_mesh((1, shape[0] * shape[1]), shape)
            simp = simplify(graph, nodes, mesh, av.CostModel(), cluster.device)
            start = time.perf_counter()
            plan = solve_sharding(graph, mesh, cluster, nodes=nodes, time_limit_s=args.time_limit)
            seconds = time.perf_counter() - start
            options = sum(g.num_options for g in simp.groups)
            print(f"{hidden:>6} {shape[0]}x{shape[1]:<3} {len(nodes):>6} {len(simp.groups):>6} {options:>10} "
                  f"{plan.num_variables:>9} {seconds:>8.2f} {plan.status:>12} {plan.objective * 1e3:>12.3f}",
                  flush=True)


if __name__ == "__main__":
    main()
