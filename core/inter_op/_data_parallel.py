"""Pure data parallelism as pins: the baseline, and a candidate the solver always profiles."""

from __future__ import annotations

from alpaviz.core.cost import Cluster
from alpaviz.core.graph import OpGraph, state_inputs
from alpaviz.core.plan import Pins, replicated


def data_parallel_pins(graph: OpGraph, cluster: Cluster, replicate_state: bool = True) -> Pins:
    """Pins for pure data parallelism: one stage, mesh (N, 1), state replicated, batch split."""
    n = cluster.num_devices
    pins = Pins(num_stages=1).with_submesh(0, cluster.whole_submesh, (n, 1))
    if n == 1:  # nothing to replicate or split
        return pins
    state = state_inputs(graph)
    for name in graph.inputs:
        shape = graph.tensor(name).shape
        if name in state:
            if replicate_state:
                pins = pins.with_partition_spec(name, replicated(len(shape)))
        elif shape and shape[0] % n == 0:
            pins = pins.with_partition_spec(name, (("x",),) + ((),) * (len(shape) - 1))
    return pins
