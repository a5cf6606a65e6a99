"""Measured stage profiling (`solve(..., profile=True)`): time a layer on the local devices.

The wrapped stage-cost function still chooses the shardings; this one
compiles the layer's operators with those shardings on a mesh of the local
JAX devices, runs it a few times and replaces the predicted times with the
fastest measured run, split between forward, backward and update in the
proportions the wrapped function predicted.  Memory stays predicted.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import numpy as np

from alpaviz.core.cost import Cluster, CostModel, LogicalMesh
from alpaviz.core.graph import OpGraph, evaluate
from alpaviz.core.inter_op._stage_cost import StageCostFn
from alpaviz.core.plan import Pins, ShardingPlan, check_spec, to_partition_spec


def measured_stage_cost(base: StageCostFn, repeats: int = 3) -> StageCostFn:
    """A stage-cost function that times `base`'s sharding of each layer on the local devices."""

    def measure(
        graph: OpGraph, mesh: LogicalMesh, cluster: Cluster, cost_model: CostModel, pins: Pins = Pins(), *,
        nodes: Sequence[str], num_microbatches: int = 1,
    ) -> ShardingPlan:
        plan = base(graph, mesh, cluster, cost_model, pins, nodes=nodes, num_microbatches=num_microbatches)
        seconds = time_layer(graph, nodes, mesh.shape, dict(plan.partition_specs), repeats)
        c = plan.cost
        predicted = c.forward_s + c.backward_s + c.update_s
        share = (lambda x: x / predicted) if predicted > 0 else (lambda x: 1 / 3)
        cost = dataclasses.replace(
            c, forward_s=seconds * share(c.forward_s), backward_s=seconds * share(c.backward_s),
            update_s=seconds * share(c.update_s), compute_s=seconds, communication_s=0.0, resharding_s=0.0,
            step_communication_s=0.0, weight_grad_s=seconds * share(c.weight_grad_s),
        )
        objective = num_microbatches * (cost.forward_s + cost.backward_s) + cost.update_s
        return dataclasses.replace(plan, cost=cost, objective=objective,
                                   notes=plan.notes + (f"measured {seconds * 1e3:.3f} ms on local devices",))

    measure.cache_key = ("measured", base, repeats)  # type: ignore[attr-defined]
    measure.__name__ = f"measured({getattr(base, '__name__', 'stage cost')})"
    return measure


def time_layer(graph: OpGraph, nodes: Sequence[str], mesh_shape: tuple[int, int], specs: dict, repeats: int = 3) -> float:
    """Fastest wall-clock seconds of running `nodes` jitted on a local mesh of `mesh_shape`."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding


    count = mesh_shape[0] * mesh_shape[1]
    devices = jax.devices()
    if len(devices) < count:
        raise ValueError(
            f"profile=True needs {count} local devices for mesh {mesh_shape}, but JAX sees {len(devices)}; "
            f"plan for a smaller cluster or profile without measuring"
        )
    mesh = Mesh(np.array(devices[:count]).reshape(mesh_shape), ("x", "y"))
    ops = [graph.node(n) for n in nodes]
    inside = {t for op in ops for t in op.outputs}
    constants = graph.constants or {}
    inputs = list(dict.fromkeys(t for op in ops for t in op.inputs if t not in inside and t not in constants))
    outputs = [t for t in dict.fromkeys(t for op in ops for t in op.outputs)
               if t in graph.outputs or any(c not in set(nodes) for c in graph.consumers.get(t, ()))]

    def sharding(name: str) -> NamedSharding:
        info = graph.tensor(name)
        spec = specs.get(name, ((),) * len(info.shape))
        try:
            check_spec(info.shape, spec, mesh_shape)
        except ValueError:
            spec = ((),) * len(info.shape)
        return NamedSharding(mesh, to_partition_spec(spec))

    def shard(name: str, value):
        return jax.lax.with_sharding_constraint(value, sharding(name)) if name in specs else value

    def run(*values):
        env = evaluate(graph, dict(zip(inputs, values)), nodes=ops, wanted=outputs, shard=shard)
        return [env[t] for t in outputs]

    args = []
    for name in inputs:
        info = graph.tensor(name)
        fill = 0.5 if np.issubdtype(np.dtype(info.dtype), np.floating) else 0
        args.append(jax.device_put(jnp.full(info.shape, fill, info.dtype), sharding(name)))
    compiled = jax.jit(run).lower(*args).compile()
    jax.block_until_ready(compiled(*args))
    best = float("inf")
    for _ in range(max(1, repeats)):
        started = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        best = min(best, time.perf_counter() - started)
    return best
