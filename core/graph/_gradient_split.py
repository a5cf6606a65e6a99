"""Which backward operators the previous pipeline stage waits for, and which only make weight gradients.

Zero-bubble schedules split a stage's backward in two: the part that
computes the gradient the stage sends back (B), which the stage before it
waits on, and the part that only computes parameter gradients (W), which can
wait and fill the pipeline's idle time.  The split comes from the dataflow:
an operator belongs to B when a backward operator outside the group needs
its result, directly or through other operators of the group.
"""

from __future__ import annotations

from typing import Collection

from alpaviz.core.graph._op_graph import OpGraph


def input_gradient_nodes(graph: OpGraph, nodes: Collection[str]) -> frozenset[str]:
    """The operators of `nodes` that a backward operator outside `nodes` depends on, transitively.

    Seeds are the backward operators of `nodes` with a result read by a
    backward operator outside; every operator of `nodes` they depend on
    joins them (including forward operators a backward reruns).  The
    backward operators of `nodes` not returned feed only weight gradients,
    other W operators, the update and the step's results.
    """
    inside = set(nodes)
    readers = graph.consumers
    producer = {t: name for name in inside for t in graph.node(name).outputs}
    stack = [
        n for n in inside if graph.node(n).role == "backward" and any(
            r not in inside and graph.node(r).role == "backward"
            for t in graph.node(n).outputs for r in readers.get(t, ())
        )
    ]
    needed: set[str] = set()
    while stack:
        name = stack.pop()
        if name in needed:
            continue
        needed.add(name)
        stack.extend(p for t in graph.node(name).inputs if (p := producer.get(t)) is not None and p not in needed)
    return frozenset(needed)


def weight_gradient_nodes(graph: OpGraph, nodes: Collection[str]) -> frozenset[str]:
    """The backward operators of `nodes` that no backward operator outside them waits for (the W part)."""
    needed = input_gradient_nodes(graph, nodes)
    return frozenset(n for n in nodes if graph.node(n).role == "backward" and n not in needed)
