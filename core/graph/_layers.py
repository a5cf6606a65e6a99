"""Layer facts of an operator graph: which layer a backward or update operator serves, what crosses a cut.

Both are properties of the graph alone, used by the trace (to place
backward and update operators), by layer clustering and by stage profiling.
"""

from __future__ import annotations

from typing import Collection

import numpy as np

from alpaviz.core.graph._op_graph import OpGraph


def assign_backward_layers(graph: OpGraph, forward_layer: dict[str, int]) -> dict[str, int]:
    """Give backward and update operators the layer of the forward operators they serve.

    * A backward operator reading forward tensors belongs to the earliest
      forward layer among the last forward readers of those tensors: the
      gradient of layer l's matmul reads l's input, whose last forward reader
      is layer l even though layer l-1 produced it.
    * One reading only gradients takes the smallest layer among its producers
      (gradients flow from the last layer to the first); a seed with no
      producer goes to the last layer.
    * An update operator takes the layer of the parameter's first forward
      reader, else that of the gradient (or updated value) it reads.  One
      that reads neither, only optimizer state or constants (Adam's
      `b1 * mu`), takes the layer of the update operators that read its
      result, so a layer's moments stay with its gradients.
    """
    last = max(forward_layer.values(), default=0)
    last_reader: dict[str, int] = {}
    first_reader: dict[str, int] = {}
    for node in graph.nodes:
        if node.name not in forward_layer:
            continue
        layer = forward_layer[node.name]
        for t in node.outputs:
            last_reader[t] = max(last_reader.get(t, layer), layer)
        for t in node.inputs:
            if graph.tensor(t).producer is None:
                first_reader.setdefault(t, layer)
            elif t in last_reader:
                last_reader[t] = max(last_reader[t], layer)
    result = dict(forward_layer)
    for node in graph.nodes:
        if node.name in result:
            continue
        producers = [graph.tensor(t).producer for t in node.inputs]
        if node.role == "backward":
            from_forward = [last_reader[t] for t, p in zip(node.inputs, producers) if p in forward_layer]
            from_backward = [result[p] for p in producers if p is not None and p in result and p not in forward_layer]
            if from_forward:
                result[node.name] = min(from_forward)
            elif from_backward:
                result[node.name] = min(from_backward)
            else:
                result[node.name] = last
        else:
            from_params = [first_reader[t] for t in node.inputs if t in first_reader]
            from_nodes = [result[p] for p in producers if p is not None and p in result]
            if from_params or from_nodes:
                result[node.name] = min(from_params or from_nodes)
    for node in reversed(graph.nodes):  # updates of optimizer state alone: the layer of their readers
        if node.name not in result:
            readers = [result[c] for t in node.outputs for c in graph.consumers.get(t, ()) if c in result]
            result[node.name] = min(readers, default=0)
    return follow_dataflow(graph, result)


def follow_dataflow(graph: OpGraph, layer_of: dict[str, int]) -> dict[str, int]:
    """Move operators so that no cut between layers has data flowing against the pipeline.

    A forward operator sits no earlier than the forward operators it reads
    from, a backward operator no later than the backward operators it reads
    from; then every cut the planner may choose is one the runtime can run.
    """
    out = dict(layer_of)
    producer = {t: n for n in graph.nodes for t in n.outputs}
    for node in graph.nodes:
        same_role = [out[producer[t].name] for t in node.inputs
                     if t in producer and producer[t].role == node.role and producer[t].name in out]
        if not same_role or node.name not in out:
            continue
        if node.role == "forward":
            out[node.name] = max(out[node.name], *same_role)
        elif node.role == "backward":
            out[node.name] = min(out[node.name], *same_role)
    return out


def constant_only_nodes(graph: OpGraph, made_before: Collection[str] = ()) -> set[str]:
    """Nodes no stage's task runs: those computed from the step's constants alone (an iota, a causal
    mask broadcast to its full shape), which every stage recomputes where it reads them, and those that
    make the tensors in `made_before` (produced before the step, then read like inputs).

    A node that makes a step output is run by a task, and so is all that depends on it."""
    constants, outputs, before = set(graph.constants or {}), set(graph.output_tensors), set(made_before)
    producer = {t: n.name for n in graph.nodes for t in n.outputs if t not in before}
    out: set[str] = set()
    for node in graph.nodes:  # graph order: a node's producers come first
        if not before.isdisjoint(node.outputs) or (
            outputs.isdisjoint(node.outputs) and all(t in constants or producer.get(t) in out for t in node.inputs)
        ):
            out.add(node.name)
    return out


def cut_bytes(graph: OpGraph) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Bytes of forward activations and of backward gradients that cross each layer cut (what is made
    from constants alone is recomputed on each side instead)."""
    num_layers = graph.num_layers
    forward = np.zeros(num_layers + 2)
    backward = np.zeros(num_layers + 2)
    recomputed = constant_only_nodes(graph)
    for tensor in graph.tensors:
        if tensor.producer is None or tensor.producer in recomputed:
            continue
        producer = graph.node(tensor.producer)
        readers = [graph.node(c) for c in graph.consumers.get(tensor.name, ())]
        if producer.role == "forward":
            far = max((r.layer for r in readers if r.role == "forward"), default=producer.layer)
            if far > producer.layer:  # crosses cuts producer.layer+1 .. far
                forward[producer.layer + 1] += tensor.nbytes
                forward[far + 1] -= tensor.nbytes
        elif producer.role == "backward":
            near = min((r.layer for r in readers if r.role == "backward"), default=producer.layer)
            if near < producer.layer:  # crosses cuts near+1 .. producer.layer
                backward[near + 1] += tensor.nbytes
                backward[producer.layer + 1] -= tensor.nbytes
    forward_cut = np.cumsum(forward)[: num_layers + 1]
    backward_cut = np.cumsum(backward)[: num_layers + 1]
    forward_cut[0] = backward_cut[0] = 0.0
    return tuple(float(x) for x in forward_cut), tuple(float(x) for x in backward_cut)


def step_transfer_bytes(graph: OpGraph) -> np.ndarray:
    """[reader layer, producer layer] bytes the update of one layer reads from another, once per step.

    A tied weight's gradient summed on the embedding's layer, or a global
    norm every layer's update reads: when the two layers sit on different
    stages the tensor is sent once per step, after the last microbatch.
    """
    matrix = np.zeros((graph.num_layers, graph.num_layers))
    for tensor in graph.tensors:
        if tensor.producer is None:
            continue
        producer = graph.node(tensor.producer)
        if producer.role == "forward":
            continue
        readers = {graph.node(c).layer for c in graph.consumers.get(tensor.name, ())
                   if graph.node(c).role == "update"}
        for layer in readers - {producer.layer}:
            matrix[layer, producer.layer] += tensor.nbytes
    return matrix
