"""Runtime overhead: plans run by `av.parallelize` as users run them, against `jax.jit` of the same step.

Prints, on the local devices (8 virtual CPU devices here), one row per plan of
a small GPT: data parallel at 1, 4 and 32 microbatches, and a 2- and a
4-stage pipeline.  Columns: the step time as users run it (default arguments:
untimed), the same step with `record_trace=True` (every instruction timed),
and `jax.jit` of the same step on all the devices, batch split over them,
accumulating gradients over the same microbatches with a `lax.scan`.  Target
for data-parallel plans: <= 1.05x jit.  Median of `--repeats` steps after two
warm-up steps, the three runs of a row interleaved so load hits them alike.

    .venv/bin/python benchmarks/bench_runtime.py [--layers 4 --hidden 64 --batch 256 --repeats 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time


def _accumulating_jit(jax, loss_fn, learning_rate, devices, m):
    """`jax.jit` of SGD on the mean of `m` microbatch losses, gradients summed by a `lax.scan`,
    the batch (shaped (m, b/m, ...)) split over every device."""
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.asarray(devices), ("x",))
    replicated, split = NamedSharding(mesh, PartitionSpec()), NamedSharding(mesh, PartitionSpec(None, "x"))

    def step(params, microbatches):
        def one(total, mb):
            loss, grads = jax.value_and_grad(loss_fn)(params, mb)
            return jax.tree.map(lambda a, b: a + b, total, (loss, grads)), None

        zeros = (jax.numpy.zeros(()), jax.tree.map(jax.numpy.zeros_like, params))
        (loss, grads), _ = jax.lax.scan(one, zeros, microbatches)
        new = jax.tree.map(lambda p, g: p - learning_rate * g / m, params, grads)
        return new, loss / m

    def place(params, batch):
        shaped = jax.tree.map(lambda x: x.reshape(m, x.shape[0] // m, *x.shape[1:]), batch)
        return jax.device_put(params, replicated), jax.device_put(shaped, split)

    return jax.jit(step, out_shardings=(replicated, replicated)), place


def _median_times(runs: dict, repeats: int) -> dict:
    for fn in runs.values():
        fn()
        fn()
    samples = {k: [] for k in runs}
    for _ in range(repeats):
        for key, fn in runs.items():
            start = time.perf_counter()
            fn()
            samples[key].append(time.perf_counter() - start)
    return {k: statistics.median(v) for k, v in samples.items()}


def _stepper(jax, fn, state, batch):
    holder = {"s": state}

    def run():
        holder["s"], loss = fn(holder["s"], batch)
        jax.block_until_ready((holder["s"], loss))

    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print one JSON line per row instead of text")
    args = parser.parse_args(argv)
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

    import jax

    import alpaviz as av
    from alpaviz.core import Schedule, data_parallel_specs, manual_plan
    from alpaviz.core.models._gpt import GPTConfig, gpt_loss

    devices = jax.devices()
    n = len(devices)
    shape = dict(num_layers=args.layers, hidden=args.hidden, seq_len=args.seq, vocab=256)
    learning_rate = 1e-2
    step, params, batch = av.models.gpt(batch_size=args.batch, learning_rate=learning_rate, **shape)
    cfg = dataclasses.replace(GPTConfig(), **shape)
    graph = av.trace(step, params, batch)
    specs = data_parallel_specs(graph)
    layouts = [
        ("data parallel", {}, 1), ("data parallel", {}, 4), ("data parallel", {}, 32),
        ("2 stages", {"stage_cuts": (args.layers // 2,), "logical_meshes": (n // 2, 1)}, 8),
        ("4 stages", {"stage_cuts": tuple(range(1, 4)), "logical_meshes": (n // 4, 1)}, 8),
    ]
    rows = []
    for label, layout, m in layouts:
        plan = manual_plan(graph, av.Cluster.local(), partition_specs=specs, schedule=Schedule("1f1b", m), **layout)
        as_run = av.parallelize(step, plan)
        traced = av.parallelize(step, plan, record_trace=True)
        reference, place = _accumulating_jit(jax, lambda p, b: gpt_loss(p, b, cfg), learning_rate, devices, m)
        ref_params, ref_batch = place(params, batch)
        times = _median_times({
            "as_run_s": _stepper(jax, as_run, params, batch),
            "traced_s": _stepper(jax, traced, params, batch),
            "jit_scan_s": _stepper(jax, reference, ref_params, ref_batch),
        }, args.repeats)
        rows.append({"plan": label, "stages": plan.num_stages, "microbatches": m, **times,
                     "as_run_over_jit": times["as_run_s"] / times["jit_scan_s"],
                     "traced_over_as_run": times["traced_s"] / times["as_run_s"]})
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    print(f"bench_runtime on {n} {devices[0].platform} devices, {graph.name} (seq {args.seq}), "
          f"global batch {args.batch}, median of {args.repeats}")
    print("| plan | microbatches | as run ms | record_trace=True ms | jit + scan ms | as run / jit |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['plan']} | {r['microbatches']} | {r['as_run_s'] * 1e3:.1f} | {r['traced_s'] * 1e3:.1f} | "
              f"{r['jit_scan_s'] * 1e3:.1f} | {r['as_run_over_jit']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
