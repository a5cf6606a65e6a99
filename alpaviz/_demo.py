"""The `make demo` job.

1. Plan GPT-1.3B on a simulated 2 x 8 A100 cluster and compare it with the
   data-parallel and Megatron-grid baselines under the same cost model.
2. Plan a tiny GPT for the 8 local (virtual CPU) devices, launch it for a
   few steps, check it against the single-device step, and record the
   measured pipeline timeline.
3. Write both plans, their timelines and costs into one offline HTML report.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

import alpaviz as av
from alpaviz.widgets import ReportSection, write_report


def _paper_plan(progress: bool):
    microbatch, num_microbatches = 16, 64  # global batch 1024, as in Alpa's GPT runs
    step, params, batch = av.models.gpt("1.3B", batch_size=microbatch, abstract=True, dtype=jnp.float16)
    graph = av.trace(step, params, batch)
    cluster = av.Cluster.a100_node(num_hosts=2)
    cache = av.StageProfileCache()
    options = dict(cluster=cluster, num_microbatches=num_microbatches, cache=cache)
    started = time.perf_counter()
    plan = av.solve(graph, progress=progress, **options)
    seconds = time.perf_counter() - started
    comparison = [("alpaviz", plan.predicted.step_time_s)]
    for name, baseline in (("Megatron grid", av.baselines.megatron_grid), ("data parallel", av.baselines.data_parallel)):
        try:
            comparison.append((name, baseline(graph, **options).predicted.step_time_s))
        except ValueError as err:  # e.g. the replicas do not fit in memory
            print(f"  {name}: no plan ({str(err).splitlines()[0]})")
    return graph, plan, seconds, comparison


def _local_launch(progress: bool, steps: int = 3):
    num_microbatches = 4
    train_step, params, batch = av.models.gpt(num_layers=4, hidden=64, heads=4, seq_len=32, vocab=256, batch_size=16)
    microbatch = jax.tree.map(lambda x: x[: x.shape[0] // num_microbatches], batch)
    graph = av.trace(train_step, params, microbatch)
    # Priced for this machine as measured (a few seconds, cached), so prediction and measurement share a time base.
    cluster = av.Cluster.local(calibrate=True)
    plan = av.solve(graph, cluster=cluster, cost_model=av.CostModel(compute_efficiency=1.0, memory_efficiency=1.0),
                    num_microbatches=num_microbatches, progress=progress)
    parallel = av.parallelize(train_step, plan, record_trace=steps)  # the last step is timed per instruction
    reference = jax.jit(train_step)
    ours, theirs = params, params
    for i in range(steps):
        started = time.perf_counter()
        ours, loss = parallel(ours, batch)
        elapsed = time.perf_counter() - started
        theirs, ref_loss = reference(theirs, batch)
        print(f"  step {i}: loss {float(loss):.6f} (single device {float(ref_loss):.6f}), {elapsed:.3f} s")
    worst = max(  # per parameter: largest difference relative to the parameter's largest entry
        float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / (np.max(np.abs(np.asarray(b))) + 1e-12))
        for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs))
    )
    print(f"  params after {steps} steps match the single-device run: max relative difference {worst:.2e}")
    measured = parallel.last_trace()
    print(f"  predicted step on {cluster.name}: {plan.predicted.step_time_s * 1e3:.1f} ms; measured (last step, "
          f"timed per instruction): {measured.total_s * 1e3:.1f} ms")
    return graph, plan, measured, worst


def run_demo(devices: int = 8, report_path: str = "demo_report.html", progress: bool = True) -> int:
    print(f"JAX {jax.__version__}, {len(jax.devices())} {jax.devices()[0].platform} devices")
    if len(jax.devices()) < devices:
        print(f"  note: asked for {devices} devices but JAX already started with {len(jax.devices())}")

    print("\n== GPT-1.3B on a simulated 2 x 8 A100 cluster ==")
    big_graph, big_plan, seconds, comparison = _paper_plan(progress)
    print(big_plan.summary())
    print(f"  planned in {seconds:.1f} s")
    for name, step_s in comparison:
        print(f"  {name:<14} predicted step {step_s * 1e3:10.1f} ms  ({step_s / comparison[0][1]:.2f}x alpaviz)")

    print(f"\n== tiny GPT on the {len(jax.devices())} local devices: plan and launch ==")
    graph, plan, measured, worst = _local_launch(progress)
    print(plan.summary())

    sections = [
        ReportSection("GPT-1.3B on 2 x 8 A100 (simulated)", big_graph, big_plan, comparison=tuple(comparison),
                      text=f"Planned in {seconds:.1f} s under the analytic cost model."),
        ReportSection("Tiny GPT launched on local devices", graph, plan, measured=measured,
                      text=f"Measured timeline of the last step; parameters match the single-device "
                           f"step to {worst:.1e} relative."),
    ]
    write_report(report_path, sections, title="alpaviz demo")
    print(f"\nwrote {report_path}")
    return 0 if worst < 1e-4 else 1
