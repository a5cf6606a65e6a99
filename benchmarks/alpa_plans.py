"""Alpa's published GPT plans priced under our model, beside the plan our solver finds for the same step.

Alpa's benchmark suite (alpa-projects/alpa, benchmark/alpa/paper_auto_gpt_suite.py) lists the stage
layouts its search chose or that its authors ran by hand, for a global batch of 1024 with
rematerialisation on every stage.  This script pins each layout (stages, submeshes, logical meshes,
remat, microbatch count) and prices it from the same stage profiles as our own plans, then prints:

* Alpa's plan at its microbatch count, and the same layout without rematerialisation;
* our plan at the same layer count and microbatch count (the search Alpa ran);
* our plan with the microbatch count searched too (over the counts Alpa's suite tried);
* the ratio of ours to Alpa's (below 1: ours is predicted faster).

    python benchmarks/alpa_plans.py            # both cases, about 5 minutes on 2 cores
    python benchmarks/alpa_plans.py --cases 15B
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import alpaviz as av  # noqa: E402
from alpaviz.core.inter_op._stage_cost import default_stage_cost  # noqa: E402
from bench_plan import Case, build, cluster_for, describe  # noqa: E402


@dataclasses.dataclass(frozen=True)
class AlpaPlan:
    """One published layout: layers per stage, each stage's submesh and logical mesh, the microbatch count."""

    size: str
    gpus: int
    source: str
    layers_per_stage: tuple[int, ...]
    submeshes: tuple[tuple[int, int], ...]
    logical_meshes: tuple[tuple[int, int], ...]
    num_microbatches: int
    global_batch: int = 1024

    @property
    def num_layers(self) -> int:
        return sum(self.layers_per_stage)

    def pins(self, remat: bool = True) -> av.Pins:
        cuts, at = [], 0
        for count in self.layers_per_stage[:-1]:
            at += count
            cuts.append(at)
        pins = av.Pins(stage_cuts=tuple(cuts), num_stages=len(self.layers_per_stage),
                       num_microbatches=self.num_microbatches)
        for stage, (submesh, logical) in enumerate(zip(self.submeshes, self.logical_meshes)):
            pins = pins.with_submesh(stage, submesh, logical).with_remat(stage, remat)
        return pins


PLANS = (
    # result_auto_gpt_suite: the plan Alpa's search found for GPT-15B on 32 GPUs.
    AlpaPlan("15B", 32, "Alpa's search result", (2,) * 8, ((1, 4),) * 8,
             ((4, 1), (4, 1), (4, 1), (4, 1), (1, 4), (4, 1), (1, 4), (1, 4)), 256),
    # test_auto_gpt_suite: the hand layout Alpa's authors ran for GPT-39B on 64 GPUs.
    AlpaPlan("39B", 64, "Alpa's hand layout", (1,) * 8, ((1, 8),) * 8, ((1, 8),) * 8, 256),
)


SEARCHED_COUNTS = (128, 256, 512, 1024)


def tflops(plan: av.Plan, graph: av.OpGraph) -> float:
    return graph.total_flops * plan.schedule.num_microbatches / plan.predicted.step_time_s / plan.cluster.num_devices / 1e12


def run(alpa: AlpaPlan, stage_cost) -> list[tuple[str, av.Plan | str, av.OpGraph | None, float]]:
    cluster = cluster_for(alpa.gpus)
    micro = alpa.global_batch // alpa.num_microbatches
    case = Case("gpt", alpa.size, alpa.gpus, alpa.global_batch, micro)
    graph = build(case)
    cache = av.StageProfileCache()
    options = dict(cluster=cluster, num_layers=alpa.num_layers, stage_cost=stage_cost, cache=cache, progress=False,
                   workers=2)
    rows: list[tuple[str, av.Plan | str, av.OpGraph | None, float]] = []
    started = time.perf_counter()
    try:
        rows.append((alpa.source, av.solve(graph, pins=alpa.pins(), **options), graph, time.perf_counter() - started))
    except ValueError as err:
        rows.append((alpa.source, str(err).splitlines()[0][:160], None, time.perf_counter() - started))
    started = time.perf_counter()
    try:
        rows.append(("the same without remat", av.solve(graph, pins=alpa.pins(remat=False), **options), graph,
                     time.perf_counter() - started))
    except ValueError as err:
        rows.append(("the same without remat", str(err).splitlines()[0][:160], None, time.perf_counter() - started))
    started = time.perf_counter()
    ours = av.solve(graph, num_microbatches=alpa.num_microbatches, **options)
    rows.append((f"ours, B={alpa.num_microbatches}", ours, graph, time.perf_counter() - started))
    # The counts Alpa's suite tried (each count is a new microbatch size, profiled afresh).
    started = time.perf_counter()
    tried = []
    for count in SEARCHED_COUNTS:
        micro_graph = build(Case("gpt", alpa.size, alpa.gpus, alpa.global_batch, alpa.global_batch // count))
        try:
            tried.append((av.solve(micro_graph, num_microbatches=count, **options), micro_graph))
        except ValueError:
            continue
    best, best_graph = min(tried, key=lambda item: item[0].predicted.step_time_s)
    rows.append((f"ours, B in {SEARCHED_COUNTS}", best, best_graph, time.perf_counter() - started))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="", help="comma-separated sizes, e.g. 15B")
    args = parser.parse_args(argv)
    wanted = {s for s in args.cases.split(",") if s}
    stage_cost = default_stage_cost()
    print(f"stage cost: {stage_cost.__name__}; A100 preset; fp16; 1F1B; global batch 1024")
    print(f"{'case':<10}{'plan':<34}{'L':>4}{'B':>5}{'solve s':>9}{'step ms':>11}{'TFLOP/s':>9}{'/Alpa':>7}  stages")
    for alpa in PLANS:
        if wanted and alpa.size not in wanted:
            continue
        rows = run(alpa, stage_cost)
        reference = rows[0][1] if isinstance(rows[0][1], av.Plan) else None
        for name, plan, graph, seconds in rows:
            if isinstance(plan, str):
                print(f"gpt-{alpa.size:<6}{name:<34}  does not fit or cannot hold: {plan}")
                continue
            ratio = f"{plan.predicted.step_time_s / reference.predicted.step_time_s:7.3f}" if reference else "    n/a"
            print(f"gpt-{alpa.size:<6}{name:<34}{len(plan.layers):>4}{plan.schedule.num_microbatches:>5}"
                  f"{seconds:>9.1f}{plan.predicted.step_time_s * 1e3:>11.1f}{tflops(plan, graph):>9.1f}{ratio}  "
                  f"{describe(plan)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
