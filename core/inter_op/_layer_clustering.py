"""Layer clustering: group operators into layers, the units the stage DP slices.

With `av.mark_layer` markers the user's layers are kept (optionally merged
into fewer).  Without them, Alpa's clustering DP cuts the forward operator
sequence into L layers: each layer's FLOPs stay under `(1 + eps) * total / L`
and the bytes crossing the cuts are minimised, with a small tie-break towards
equal FLOPs.  Backward and update operators then follow their forward layer
(`assign_backward_layers`).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from alpaviz.core.graph import OpGraph, assign_backward_layers, check_int, check_number, cut_bytes

_BALANCE_WEIGHT = 1e-2  # tie-break: relative weight of the FLOP imbalance against the cut bytes


def cluster_layers(graph: OpGraph, num_layers: int | None = None, *, eps: float = 0.5) -> OpGraph:
    """The graph re-layered into at most `num_layers` layers.

    Marked graphs keep their layers, merged into `num_layers` balanced groups
    when that is fewer; unmarked graphs are clustered by Alpa's DP into
    `num_layers` (default 8) layers.

    Example:
        >>> graph = av.cluster_layers(av.trace(step, params, batch), num_layers=4)
    """
    if num_layers is not None:
        check_int("num_layers", num_layers, minimum=1)
    check_number("eps (the FLOP balance slack)", eps, minimum=0)
    if graph.num_layers > 1:
        if num_layers is None or num_layers >= graph.num_layers:
            return graph
        return merge_layers(graph, num_layers, eps=eps)
    forward = [n for n in graph.nodes if n.role == "forward"]
    target = min(num_layers or 8, len(forward))
    if target <= 1:
        return graph.with_layers({n.name: 0 for n in graph.nodes})
    position = {n.name: i for i, n in enumerate(forward)}
    flops = np.array([n.flops for n in forward])
    crossing = np.zeros(len(forward) + 1)
    for i, node in enumerate(forward):
        for t in node.outputs:
            readers = [position[c] for c in graph.consumers.get(t, ()) if c in position]
            if readers and max(readers) > i:
                crossing[i + 1] += graph.tensor(t).nbytes
                crossing[max(readers) + 1] -= graph.tensor(t).nbytes
    cuts = partition_sequence(flops, np.cumsum(crossing)[:-1], target, eps)
    starts = np.array(cuts)
    layer_of = {n.name: int(np.searchsorted(starts, position[n.name], side="right")) - 1 for n in forward}
    return graph.with_layers(assign_backward_layers(graph, layer_of))


def merge_layers(graph: OpGraph, num_layers: int, *, eps: float = 0.5) -> OpGraph:
    """Merge the graph's consecutive layers into `num_layers` groups (balanced FLOPs, light cuts)."""
    flops = np.array(graph.layer_flops())
    cuts = partition_sequence(flops, np.array(cut_bytes(graph)[0][:-1]), num_layers, eps)
    group = np.searchsorted(np.array(cuts), np.arange(graph.num_layers), side="right") - 1
    return graph.with_layers({n.name: int(group[n.layer]) for n in graph.nodes})


def partition_sequence(flops: Sequence[float], cut_cost: Sequence[float], parts: int, eps: float = 0.5) -> list[int]:
    """Cut a sequence of units into `parts` contiguous non-empty segments; return their starts.

    `cut_cost[p]` is the price of a cut before unit p.  Minimises the sum of
    cut prices (plus a small FLOP-imbalance term) with each segment's FLOPs
    at most `(1 + eps) * total / parts`; the bound is relaxed when single
    units already exceed it.
    """
    flops = np.asarray(flops, float)
    cut_cost = np.asarray(cut_cost, float)
    n = len(flops)
    if not 1 <= parts <= n:
        raise ValueError(f"cannot cut {n} units into {parts} non-empty parts")
    total = float(flops.sum())
    mean = total / parts if total > 0 else 1.0
    bound = max((1 + eps) * mean, float(flops.max(initial=0.0)))
    prefix = np.concatenate([[0.0], np.cumsum(flops)])
    scale = float(cut_cost.max(initial=0.0)) or 1.0
    price = cut_cost / scale
    best = np.full((parts + 1, n + 1), math.inf)
    back = np.zeros((parts + 1, n + 1), np.int64)
    best[0, 0] = 0.0
    for p in range(1, n + 1):
        q = np.arange(p)
        seg = prefix[p] - prefix[q]
        ok = seg <= bound * (1 + 1e-12)
        if not ok.any():
            continue
        q, seg = q[ok], seg[ok]
        step = _BALANCE_WEIGHT * ((seg - mean) / mean) ** 2 + np.where(q > 0, price[q], 0.0)
        options = best[:-1, q] + step[None, :]
        choice = options.argmin(axis=1)
        best[1:, p] = options[np.arange(parts), choice]
        back[1:, p] = q[choice]
    if not math.isfinite(best[parts, n]):
        raise ValueError(
            f"cannot cut {n} units into {parts} layers with at most {bound:.3g} FLOPs each; "
            f"raise eps (now {eps}) or ask for more layers"
        )
    starts, p = [], n
    for r in range(parts, 0, -1):
        p = int(back[r, p])
        starts.append(p)
    return starts[::-1]


