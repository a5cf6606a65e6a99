"""Run a training step under `jax.jit` so that XLA realises a `ShardingPlan`.

The step executes through the graph interpreter, so every intermediate the
ILP decided can be pinned by name with `with_sharding_constraint`; the
inputs and results get the plan's `in_shardings` / `out_shardings`.  The
plan changes only layouts and collectives, never the numbers.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from alpaviz.core.cost import CostModel, Link, LogicalMesh
from alpaviz.core.graph import OpGraph, evaluate, step_outputs
from alpaviz.core.intra_op._strategies import NAMING_DEVICE, enumerate_strategies
from alpaviz.core.plan import ShardingPlan, replicated, to_partition_spec


def plan_mesh(plan: ShardingPlan, devices: Sequence[Any] | None = None,
              axis_names: tuple[str, str] = ("x", "y")) -> Mesh:
    """The `jax.sharding.Mesh` of the plan's logical shape over the first r*c devices."""
    devices = list(jax.devices() if devices is None else devices)
    r, c = plan.mesh_shape
    if len(devices) < r * c:
        raise ValueError(
            f"the plan's mesh {plan.mesh_shape} needs {r * c} devices but {len(devices)} are available; "
            f"set XLA_FLAGS=--xla_force_host_platform_device_count={r * c} before importing jax, "
            f"or solve for a smaller mesh"
        )
    return Mesh(np.array(devices[: r * c]).reshape(r, c), axis_names)


def shard_step(
    train_step_or_graph: Callable[..., Any] | OpGraph,
    graph: OpGraph | None,
    sharding_plan: ShardingPlan,
    devices: Sequence[Any] | None = None,
) -> Callable[..., Any]:
    """A jitted step on the plan's mesh: plan shardings on inputs, results and intermediates.

    `train_step_or_graph` only names what is run; execution always goes
    through `graph` (traced from it) so intermediates are reachable.

    Example:
        >>> plan = av.solve_sharding(step, params, batch, mesh_shape=(2, 2))
        >>> sharded = av.shard_step(step, graph, plan)
        >>> new_params, loss = sharded(params, batch)
    """
    if graph is None:
        if not isinstance(train_step_or_graph, OpGraph):
            raise ValueError("shard_step needs the traced OpGraph: shard_step(step, av.trace(step, *args), plan)")
        graph = train_step_or_graph
    mesh = plan_mesh(sharding_plan, devices)
    specs = sharding_plan.spec_map
    missing = [name for name in graph.inputs + graph.outputs if name not in specs and name not in
               (graph.constants or {})]
    if missing:
        raise ValueError(
            f"the sharding plan has no spec for {missing[:5]}: it was solved for a different graph or for a "
            f"subset of its nodes; solve it for this graph"
        )

    def sharding(name: str) -> NamedSharding:
        spec = specs.get(name)
        if spec is None:
            spec = replicated(len(graph.tensor(name).shape))
        return NamedSharding(mesh, to_partition_spec(spec))

    needs = _operand_specs(graph, sharding_plan)
    inputs = set(graph.inputs)
    constrained = {name for name in specs if name not in inputs}

    def constrain(name: str, value: Any) -> Any:
        if name in constrained and getattr(value, "ndim", 0) > 0:
            return jax.lax.with_sharding_constraint(value, sharding(name))
        return value

    def run(*args: Any) -> Any:
        env = graph.input_values(graph.arguments(args))
        for node in graph.nodes:
            local = {t: env[t] for t in node.inputs if t in env}
            for tensor, spec in needs.get(node.name, ()):
                # The strategy reads this operand in another layout: reshard explicitly, as the ILP priced it.
                local[tensor] = jax.lax.with_sharding_constraint(local[tensor], NamedSharding(mesh, to_partition_spec(spec)))
            env.update(evaluate(graph, local, nodes=[node], wanted=node.outputs, shard=constrain))
        return graph.results(step_outputs(graph, env))

    in_shardings = jax.tree.unflatten(graph.in_tree, [sharding(n) for n in graph.leaf_inputs])
    out_shardings = jax.tree.unflatten(graph.out_tree, [sharding(n) for n in graph.outputs])
    return jax.jit(run, in_shardings=tuple(in_shardings), out_shardings=out_shardings)


def _operand_specs(graph: OpGraph, plan: ShardingPlan) -> dict[str, tuple[tuple[str, Any], ...]]:
    """Per operator, the operands whose required spec differs from the spec they were produced in."""

    r, c = plan.mesh_shape
    link = Link(alpha_s=0.0, bandwidth_bytes_per_s=1.0)
    mesh = LogicalMesh((r, c), tuple(range(r * c)), (link, link))
    specs = plan.spec_map
    out: dict[str, tuple[tuple[str, Any], ...]] = {}
    for name, chosen in plan.strategies:
        node = graph.node(name)
        options = enumerate_strategies(graph, node, mesh, CostModel(), NAMING_DEVICE)
        strategy = next((s for s in options if s.name == chosen), None)
        if strategy is None:
            raise ValueError(f"the plan's strategy {chosen!r} for {name} is not one of its strategies on {plan.mesh_shape}")
        moves = tuple(
            (t, need) for t, need in zip(node.inputs, strategy.in_specs)
            if need is not None and t in specs and specs[t] != need and graph.tensor(t).shape
        )
        if moves:
            out[name] = moves
    return out
