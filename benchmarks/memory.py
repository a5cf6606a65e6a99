"""Fidelity of the memory model: each stage's predicted peak vs XLA's `memory_analysis()` of its program.

For several zoo models with Adam on the 8 local devices, each plan (data
parallel, one-stage 1x8 and 2x4, 2- and 4-stage pipelines, the solver's own)
is compiled stage by stage for one microbatch
(`alpaviz.core.runtime.compiled_stage_memory`: every task of the stage in
one program, the replaced state donated) and XLA's per-device peak
(arguments + outputs - aliased + temporaries) is set beside the plan's
prediction with one microbatch in flight.  Nothing is allocated.  Prints a
Markdown table and how many stages are within 15%.

    .venv/bin/python benchmarks/memory.py [--models gpt,mlp,moe,wresnet]
"""

from __future__ import annotations

import argparse
import os
import time


def models(av, names: list[str]) -> dict[str, tuple]:
    """(train_step, params, batch) of each model, Adam, sized to compile in seconds."""
    build = {
        "gpt": lambda: av.models.gpt(num_layers=4, hidden=256, seq_len=64, vocab=512, batch_size=16,
                                     optimizer="adam"),
        "mlp": lambda: av.models.mlp((512, 1024, 1024, 1024, 512), batch_size=64, optimizer="adam"),
        "moe": lambda: av.models.moe(num_layers=4, hidden=128, seq_len=64, vocab=512, num_experts=8,
                                     expert_group_size=64, batch_size=16, optimizer="adam"),
        "wresnet": lambda: av.models.wresnet(image_size=32, depth=10, base_channels=16, width_factor=2,
                                             batch_size=16, optimizer="adam"),
    }
    return {n: build[n]() for n in names}


def plans(av, graph, options: dict) -> dict[str, object]:
    n = options["cluster"].num_devices
    half, quarter = n // 2, n // 4
    out = {"data parallel": av.baselines.data_parallel(graph, **options)}
    pins = {
        "1 stage, 1x8": av.Pins(num_stages=1, stage_logical_meshes=((0, (1, n)),)),
        "1 stage, 2x4": av.Pins(num_stages=1, stage_logical_meshes=((0, (2, half)),)),
        "2 stages of 1x4": av.Pins(num_stages=2, stage_submeshes=((0, (1, half)), (1, (1, half)))),
        "4 stages of 1x2": av.Pins(num_stages=4, stage_submeshes=tuple((i, (1, quarter)) for i in range(4))),
    }
    for name, p in pins.items():
        try:
            out[name] = av.solve(graph, pins=p, **options)
        except (av.InfeasiblePinsError, ValueError) as err:
            print(f"  ({name}: {err})")
    out["solver"] = av.solve(graph, **options)
    return out


def mb(x: float) -> str:
    return f"{x / 2**20:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt,mlp,moe,wresnet")
    parser.add_argument("--tolerance", type=float, default=0.15)
    args = parser.parse_args(argv)
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

    import alpaviz as av
    from alpaviz.core.runtime import compiled_stage_memory

    cluster = av.Cluster.local()
    options = dict(cluster=cluster, num_microbatches=1, progress=False, cache=av.StageProfileCache())
    print(f"memory model vs XLA on {cluster.num_devices} local devices; MiB per device, one microbatch in flight")
    print()
    print("| model | plan | stage | mesh | params | optimizer | gradients | activations | temporaries "
          "| predicted | XLA | predicted/XLA |")
    print("|" + " --- |" * 12)
    ratios = []
    started = time.perf_counter()
    for model, (step, params, batch) in models(av, args.models.split(",")).items():
        graph = av.trace(step, params, batch)
        options["cache"] = av.StageProfileCache()
        for name, plan in plans(av, graph, options).items():
            measured = compiled_stage_memory(step, plan, (params, batch))
            for stage, m in zip(plan.stages, measured):
                p = stage.cost.memory.with_in_flight(1)
                ratios.append(p.peak / m.peak)
                print(f"| {model} | {name} | {stage.index} | {stage.logical_mesh[0]}x{stage.logical_mesh[1]} "
                      f"| {mb(p.params)} | {mb(p.optimizer_state)} | {mb(p.gradients)} | {mb(p.activations)} "
                      f"| {mb(p.temporaries)} | {mb(p.peak)} | {mb(m.peak)} | {p.peak / m.peak:.2f} |")
    within = sum(abs(r - 1) <= args.tolerance for r in ratios)
    print()
    print(f"{within} of {len(ratios)} stages within {args.tolerance:.0%}; predicted/XLA from {min(ratios):.2f} "
          f"to {max(ratios):.2f}; {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
