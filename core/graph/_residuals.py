"""Which forward values the backward needs stored, and which it can recompute cheaply from those.

The backward of an elementwise chain (GELU's `x * x`, `tanh`, ...) reads
every intermediate, but each is one cheap operator away from another: XLA
recomputes such chains inside the backward's fusions when forward and
backward are one program, and the runtime does the same across a stage's
forward and backward executables (it keeps the stored values and reruns the
chain in the backward).  The memory model counts only the stored ones.
"""

from __future__ import annotations

from typing import Collection

from alpaviz.core.graph._flops import DATA_MOVEMENT, ELEMENTWISE
from alpaviz.core.graph._op_graph import OpGraph

# Recomputed rather than stored: elementwise operators and views with one non-constant operand.
RECOMPUTABLE = ELEMENTWISE | (DATA_MOVEMENT & frozenset(
    ("broadcast_in_dim", "reshape", "transpose", "squeeze", "expand_dims", "convert_element_type",
     "layer_boundary")))


def _free(graph: OpGraph, tensor: str) -> bool:
    info = graph.tensor(tensor)
    return info.kind == "constant" or not info.shape


def stored_residuals(graph: OpGraph, residuals: Collection[str]) -> frozenset[str]:
    """The residuals (forward values a backward reads) that must be stored; the rest are recomputed.

    A residual is recomputed when a chain of one-operand cheap forward
    operators leads to it from a stored residual or a step input.
    """
    wanted = set(residuals)
    stored: set[str] = set()
    available: dict[str, bool] = {}

    def backward_has(t: str, depth: int = 0) -> bool:
        if t not in available:
            info = graph.tensor(t)
            if info.producer is None or _free(graph, t):
                available[t] = True
                return True
            node = graph.node(info.producer)
            operands = {i for i in node.inputs if not _free(graph, i)}
            recomputed = (node.role == "forward" and node.primitive in RECOMPUTABLE and len(operands) <= 1
                          and depth < 16 and all(backward_has(i, depth + 1) for i in operands))
            if t in wanted and not recomputed:
                stored.add(t)
            available[t] = recomputed or t in wanted
        return available[t]

    for t in residuals:
        backward_has(t)
    return frozenset(t for t in residuals if t in stored or graph.tensor(t).producer is None)


def recompute_chain(graph: OpGraph, residuals: Collection[str], stored: Collection[str]) -> tuple[str, ...]:
    """The forward operators that rebuild the unstored residuals from the stored ones, in graph order."""
    keep = set(stored)
    needed: set[str] = set()
    stack = [t for t in residuals if t not in keep]
    while stack:
        t = stack.pop()
        producer = graph.tensor(t).producer
        if producer is None or producer in needed or t in keep:
            continue
        needed.add(producer)
        stack.extend(i for i in graph.node(producer).inputs if not _free(graph, i))
    return tuple(sorted(needed, key=graph.node_position.__getitem__))
