"""Plan the Alpa paper's GPT, MoE and Wide-ResNet suites and compare with the baselines.

For each case: plan seconds, predicted step time, the ratio to the best
Megatron-style grid plan (DP x TP x PP, uniform stages) and to pure data
parallelism, all under the same stage profiles, and the chosen stages and
meshes.  A last line times a re-solve after one pin on GPT-1.3B (the plan
editor's click-to-plan path).

    python benchmarks/bench_plan.py                 # every case
    python benchmarks/bench_plan.py --suite gpt --cases 1.3B,39B
    python benchmarks/bench_plan.py --stage-cost analytic
    python benchmarks/bench_plan.py --suite gpt --search-microbatches   # B chosen per case

The schedule columns: the plan with the schedule searched too (`schedule="auto"`: GPipe, 1F1B,
ZB-H1, interleaved 1F1B, each priced by simulating its instruction lists), its step over the 1F1B plan's, and the
extra seconds that search took with the profiles already cached.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import jax.numpy as jnp

import alpaviz as av
from alpaviz.core.inter_op._stage_cost import analytic_stage_cost, default_stage_cost


@dataclasses.dataclass(frozen=True)
class Case:
    suite: str
    size: str
    gpus: int
    global_batch: int
    microbatch: int


# Weak scaling as in the paper: model size grows with the GPU count.
CASES = (
    [Case("gpt", s, g, 1024, 8) for s, g in [("1.3B", 4), ("2.6B", 8), ("6.7B", 16), ("15B", 32), ("39B", 64)]]
    + [Case("moe", s, g, 1024, 8) for s, g in [("380M", 1), ("690M", 2), ("1.3B", 4), ("2.4B", 8), ("10B", 16),
                                                ("27B", 32), ("70B", 64)]]
    + [Case("wresnet", s, g, 1536, 8) for s, g in [("250M", 1), ("500M", 2), ("1B", 4), ("2B", 8), ("4B", 16),
                                                     ("6.8B", 32), ("13B", 64)]]
)


def cluster_for(gpus: int) -> av.Cluster:
    """A100 hosts of 8 GPUs; fewer than 8 GPUs is one partial host."""
    if gpus < 8:
        return av.Cluster.a100_node(1, gpus)
    return av.Cluster.a100_node(gpus // 8)


def build(case: Case, microbatch: int | None = None, traced: bool = True):
    """The case's step traced at one microbatch, or (traced=False) the step and its abstract arguments."""
    maker = {"gpt": av.models.gpt, "moe": av.models.moe, "wresnet": av.models.wresnet}[case.suite]
    size = microbatch or case.microbatch
    step, params, batch = maker(case.size, batch_size=size, abstract=True, dtype=jnp.float16)
    return av.trace(step, params, batch) if traced else (step, params, batch)


def run_searched(case: Case, stage_cost, tolerance: float, workers: int) -> dict:
    """The case with the microbatch count searched over the divisors of the global batch, plan and grid alike."""
    step, params, batch = build(case, case.global_batch, traced=False)
    cluster = cluster_for(case.gpus)
    options = dict(cluster=cluster, num_microbatches="auto", global_batch_argnums=(1,), stage_cost=stage_cost,
                   cache=av.StageProfileCache())
    started = time.perf_counter()
    try:
        plan = av.solve(step, params, batch, progress=False, tolerance=tolerance, workers=workers, **options)
    except av.ModelTooLargeError as err:
        return {"case": case, "error": str(err)}
    row = {"case": case, "plan": plan, "seconds": time.perf_counter() - started,
           "layers": len(plan.layers), "B": plan.schedule.num_microbatches}
    try:
        row["grid"] = av.baselines.megatron_grid(step, params, batch, **options)
    except ValueError as err:
        row["grid_error"] = str(err)
    try:
        row["dp"] = av.baselines.data_parallel(step, params, batch, progress=False, **options)
    except ValueError as err:
        row["dp_error"] = str(err)[:160]
    return row


def describe(plan: av.Plan) -> str:
    return " | ".join(
        f"L{s.layer_start}-{s.layer_stop - 1} {s.submesh[0]}x{s.submesh[1]} as {s.logical_mesh[0]}x{s.logical_mesh[1]}"
        + (" remat" if s.remat else "")
        for s in plan.stages
    )


def run_case(case: Case, stage_cost, tolerance: float, workers: int) -> dict:
    graph = build(case)
    cluster = cluster_for(case.gpus)
    cache = av.StageProfileCache()
    B = case.global_batch // case.microbatch
    options = dict(cluster=cluster, num_microbatches=B, stage_cost=stage_cost, cache=cache)
    started = time.perf_counter()
    try:
        plan = av.solve(graph, progress=False, tolerance=tolerance, workers=workers, **options)
    except av.ModelTooLargeError as err:
        return {"case": case, "error": str(err)}
    seconds = time.perf_counter() - started
    row = {"case": case, "plan": plan, "seconds": seconds, "layers": graph.num_layers, "B": B}
    # The schedule searched too (GPipe, 1F1B, ZB-H1, interleaved 1F1B), from the same profiles: its winner and
    # gain over 1F1B.
    started = time.perf_counter()
    row["auto"] = av.solve(graph, progress=False, tolerance=tolerance, workers=workers, schedule="auto", **options)
    row["auto_seconds"] = time.perf_counter() - started
    try:
        row["grid"] = av.baselines.megatron_grid(graph, **options)
    except ValueError as err:
        row["grid_error"] = str(err)
    # Data parallelism needs a microbatch the devices divide: same global batch, bigger microbatches.
    dp_micro = case.microbatch if case.microbatch % case.gpus == 0 else case.gpus
    dp_graph = graph if dp_micro == case.microbatch else build(case, dp_micro)
    dp_options = dict(options, num_microbatches=max(1, case.global_batch // dp_micro))
    try:
        row["dp"] = av.baselines.data_parallel(dp_graph, progress=False, **dp_options)
    except ValueError as err:
        row["dp_error"] = str(err)[:160]
    return row


def ratio(plan: av.Plan, other: av.Plan | None) -> str:
    if other is None:
        return "   n/a"
    return f"{plan.predicted.step_time_s / other.predicted.step_time_s:6.3f}"


def bench_resolve(stage_cost) -> tuple[float, str]:
    """Seconds to re-solve GPT-1.3B on 4 GPUs after one pin (profiles cached), and which pin.

    Tries a cut near the middle first (outward until one fits in memory), then
    a different logical mesh for stage 0: the editor's two commonest clicks.
    """
    case = Case("gpt", "1.3B", 4, 1024, 8)
    graph = build(case)
    cache = av.StageProfileCache()
    options = dict(cluster=cluster_for(4), num_microbatches=128, stage_cost=stage_cost, cache=cache, progress=False)
    plan = av.solve(graph, **options)
    middle = graph.num_layers // 2
    cuts = sorted((c for c in range(1, graph.num_layers) if c not in plan.stage_cuts), key=lambda c: abs(c - middle))
    stage0 = plan.stages[0]
    views = [v for v in plan.cluster.logical_shapes(stage0.submesh) if v != stage0.logical_mesh]
    attempts = [(f"cut before layer {c}", plan.pins.with_cut(c)) for c in cuts[:3]]
    attempts += [(f"stage 0 as {v}", plan.pins.with_submesh(0, stage0.submesh, v)) for v in views]
    elapsed, what = 0.0, "none fits"
    for what, pins in attempts:
        started = time.perf_counter()
        try:
            av.resolve(plan.with_pins(pins), graph, stage_cost=stage_cost, cache=cache, progress=False)
        except ValueError:
            elapsed = time.perf_counter() - started
            continue
        return time.perf_counter() - started, what
    return elapsed, f"{what} (infeasible, answered with an error)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", choices=["gpt", "moe", "wresnet", "all"], default="all")
    parser.add_argument("--cases", default="", help="comma-separated sizes, e.g. 1.3B,39B")
    parser.add_argument("--stage-cost", choices=["default", "analytic"], default="default",
                        help="default: the intra-op ILP; analytic: the closed-form estimate the baselines use")
    parser.add_argument("--tolerance", type=float, default=0.0, help="optimality gap the stage DP may leave (0: exact)")
    parser.add_argument("--workers", type=int, default=2, help="processes that profile layers (2 cores: 2)")
    parser.add_argument("--no-resolve", action="store_true", help="skip the re-solve-after-a-pin line")
    parser.add_argument("--search-microbatches", action="store_true",
                        help="search the microbatch count over the divisors of the global batch (plan, grid "
                             "and data parallel alike) instead of fixing the microbatch at 8")
    args = parser.parse_args(argv)
    stage_cost = analytic_stage_cost if args.stage_cost == "analytic" else default_stage_cost()
    wanted = {s for s in args.cases.split(",") if s}
    cases = [c for c in CASES if (args.suite in ("all", c.suite)) and (not wanted or c.size in wanted)]
    print(f"stage cost: {getattr(stage_cost, '__name__', stage_cost)}; A100 preset; fp16; 1F1B (schedule: searched)")
    header = (f"{'case':<14}{'gpus':>5}{'L':>4}{'B':>5}{'plan s':>8}{'step ms':>11}{'/grid':>7}{'/dp':>7}"
              f"{'schedule':>10}{'/1f1b':>7}{'+s':>6}  stages (layers submesh as logical)")
    print(header)
    lost = []
    for case in cases:
        run = run_searched if args.search_microbatches else run_case
        row = run(case, stage_cost, args.tolerance, args.workers)
        name = f"{case.suite}-{case.size}"
        if "error" in row:
            print(f"{name:<14}{case.gpus:>5}  does not fit: {row['error'][:120]}")
            continue
        plan = row["plan"]
        grid, dp = row.get("grid"), row.get("dp")
        auto = row.get("auto")
        searched = (f"{auto.schedule.kind:>10}{ratio(auto, plan):>7}{row['auto_seconds']:>6.1f}" if auto
                    else f"{'n/a':>10}{'':>13}")
        print(f"{name:<14}{case.gpus:>5}{row['layers']:>4}{row['B']:>5}{row['seconds']:>8.1f}"
              f"{plan.predicted.step_time_s * 1e3:>11.1f}{ratio(plan, grid):>7}{ratio(plan, dp):>7}{searched}"
              f"  {describe(plan)}", flush=True)
        if grid is None:
            print(f"{'':<14}  grid: {row.get('grid_error', 'n/a')[:160]}")
        if dp is None:
            print(f"{'':<14}  data parallel: {row.get('dp_error', 'n/a')}")
        if grid is not None and plan.predicted.step_time_s > grid.predicted.step_time_s * (1 + 1e-9):
            lost.append(name)
    if not args.no_resolve:
        seconds, what = bench_resolve(stage_cost)
        print(f"re-solve after one pin ({what}), gpt-1.3B on 4 GPUs: {seconds:.3f} s")
    if lost:
        print(f"PLANNER LOST TO THE GRID on {lost}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
