"""Execute an `OpGraph` (or a subset of its nodes) by binding each primitive.

This is what lets the runtime and the sharding applier run *parts* of a
traced step (one stage, one microbatch) and constrain any intermediate
tensor by name, which the user's original function cannot offer.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Sequence

import jax

from alpaviz.core.graph._op_graph import OpGraph, OpNode

ShardFn = Callable[[str, Any], Any]


def evaluate(
    graph: OpGraph,
    values: Mapping[str, Any],
    nodes: Iterable[OpNode] | None = None,
    wanted: Sequence[str] | None = None,
    shard: ShardFn | None = None,
    apply: Callable[[OpNode, list[Any]], list[Any]] | None = None,
) -> dict[str, Any]:
    """Run `nodes` (default: all, in graph order) given the tensor `values` they need.

    `shard(name, value)` is applied to every produced tensor (e.g. a
    `with_sharding_constraint`); `apply(node, args)`, when given, computes a
    node's results in place of binding its primitive.  Returns the `wanted`
    tensors (default: every tensor computed or given).
    """
    env: dict[str, Any] = dict(values)
    constants = graph.constants or {}
    for node in graph.nodes if nodes is None else nodes:
        args = []
        for name in node.inputs:
            if name in env:
                args.append(env[name])
            elif name in constants:
                args.append(constants[name])
            else:
                raise KeyError(
                    f"operator {node.name} needs tensor {name!r}, which is neither given nor computed "
                    f"earlier in this sub-graph"
                )
        if apply is not None:
            outs = apply(node, args)
        else:
            outs = node.jax_primitive.bind(*args, **node.jax_params)
            if not node.jax_primitive.multiple_results:
                outs = [outs]
        for name, value in zip(node.outputs, outs):
            env[name] = shard(name, value) if shard is not None else value
    if wanted is None:
        return env
    missing = [name for name in wanted if name not in env and name not in constants]
    if missing:
        raise KeyError(f"tensors {missing} were not computed by this sub-graph")
    return {name: env[name] if name in env else constants[name] for name in wanted}


def step_outputs(graph: OpGraph, env: Mapping[str, Any]) -> list[Any]:
    """The step's flat outputs from computed values; a stacked output is its per-layer parts stacked again."""
    stacked = dict(graph.output_parts)
    constants = graph.constants or {}
    return [jax.numpy.stack([env[p] for p in stacked[name]]) if name in stacked
            else env[name] if name in env else constants[name] for name in graph.outputs]


def as_function(graph: OpGraph, shard: ShardFn | None = None) -> Callable[..., Any]:
    """The traced step as a Python function of the original pytree arguments."""

    def run(*args: Any) -> Any:
        env = evaluate(graph, graph.input_values(graph.arguments(args)), shard=shard)
        return graph.results(step_outputs(graph, env))

    return run
