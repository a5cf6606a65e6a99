"""Which operators run where and when: a plan's stages split into per-microbatch and per-step tasks.

Every stage gets three tasks: `forward` and `backward` (run once per
microbatch) and `update` (run once per step).  The tracer's roles are a
starting point, refined here for execution:

* an "update" node whose result feeds a forward/backward node is really part
  of the backward pass (e.g. an `add_any` of two cotangents outside AD's
  name scope), so it runs per microbatch;
* a forward node that does not depend on the batch and feeds only the
  update (an optimizer's step counter, Adam's moment decay) runs once per
  step instead of once per microbatch;
* nodes computed from constants only (zeros, iotas) are recomputed inside
  each task that reads them rather than shipped between meshes.

Everything here is plain data over node and tensor names; no JAX.
"""

from __future__ import annotations

import dataclasses
from typing import Collection, Literal, Mapping

import numpy as np

from alpaviz.core.graph import OpGraph, Role
from alpaviz.core.runtime._schedule import Edge

PER_MICROBATCH: tuple[Role, ...] = ("forward", "backward")
Reduction = Literal["mean", "last"]


@dataclasses.dataclass(frozen=True)
class Task:
    """The nodes of one stage and role, with the tensors that cross its boundary."""

    stage: int
    role: Role
    nodes: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class TensorEdge(Edge):
    """An `Edge` with the names of the tensors it carries."""

    tensors: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Dataflow:
    """Tasks per stage, the edges between them and how per-microbatch results combine.

    `reduction[t]` says how a tensor made once per microbatch but read once
    per step (a gradient, the loss, a step counter) becomes one value:
    "mean" over microbatches for batch-dependent values, "last" for values
    that do not depend on the batch.
    """

    num_stages: int
    tasks: tuple[Task, ...]
    edges: tuple[TensorEdge, ...]
    producer_task: tuple[tuple[str, tuple[int, str]], ...]
    reduction: tuple[tuple[str, Reduction], ...]
    update_order: tuple[int, ...]

    def task(self, stage: int, role: str) -> Task:
        for t in self.tasks:
            if t.stage == stage and t.role == role:
                return t
        raise KeyError(f"no task ({stage}, {role})")

    @property
    def reduction_map(self) -> Mapping[str, Reduction]:
        return dict(self.reduction)

    @property
    def producer_map(self) -> Mapping[str, tuple[int, str]]:
        return dict(self.producer_task)


def node_stages(graph: OpGraph, plan) -> dict[str, int]:
    """Node name -> stage index, from the plan's layers; raises if the plan misses a node."""
    stage_of_layer = {}
    for stage in plan.stages:
        for layer in stage.layers:
            stage_of_layer[layer] = stage.index
    out = {}
    for layer in plan.layers:
        for name in layer.nodes:
            out[name] = stage_of_layer[layer.index]
    missing = [n.name for n in graph.nodes if n.name not in out]
    if missing:
        raise ValueError(
            f"the plan's layers do not place {len(missing)} operators of graph {graph.name!r} "
            f"(e.g. {missing[:3]}); the plan was made for another graph, re-solve it for this one"
        )
    return out


def analyze(graph: OpGraph, plan, batch_inputs: Collection[str] = ()) -> Dataflow:
    """Split the plan's stages into tasks and find the edges between them.

    `batch_inputs` are the graph inputs split into microbatches; a tensor
    depends on the batch when it is computed from one of them.  Raises a
    ValueError when data would flow against the pipeline (a later stage's
    forward feeding an earlier stage's forward, or a backward feeding a
    forward), which no schedule can run.
    """
    stage_of = node_stages(graph, plan)
    constants = set(graph.constants or {})
    producer = {t: n.name for n in graph.nodes for t in n.outputs}
    outputs = set(graph.outputs)

    const_nodes: set[str] = set()
    for node in graph.nodes:
        if all(t in constants or producer.get(t) in const_nodes for t in node.inputs) and not (
            set(node.outputs) & outputs
        ):
            const_nodes.add(node.name)

    batch_dep: set[str] = set(batch_inputs)
    for node in graph.nodes:
        if any(t in batch_dep for t in node.inputs):
            batch_dep.update(node.outputs)

    exec_role: dict[str, Role] = {}
    for node in reversed(graph.nodes):
        if node.name in const_nodes:
            continue
        readers = {exec_role[c] for t in node.outputs for c in graph.consumers[t] if c in exec_role}
        feeds_microbatch = bool(readers & set(PER_MICROBATCH))
        if node.role == "update":
            exec_role[node.name] = "backward" if feeds_microbatch else "update"
        elif node.role == "forward":
            depends = any(t in batch_dep for t in node.outputs)
            exec_role[node.name] = "forward" if depends or feeds_microbatch else "update"
        else:
            exec_role[node.name] = "backward"

    task_of_tensor: dict[str, tuple[int, Role]] = {}
    members: dict[tuple[int, Role], list[str]] = {
        (s, r): [] for s in range(plan.num_stages) for r in ("forward", "backward", "update")
    }
    for node in graph.nodes:
        if node.name in const_nodes:
            continue
        key = (stage_of[node.name], exec_role[node.name])
        members[key].append(node.name)
        for t in node.outputs:
            task_of_tensor[t] = key

    reads: dict[tuple[int, Role], list[str]] = {}
    for key, names in members.items():
        produced = {t for n in names for t in graph.node(n).outputs}
        ext = []
        for n in names:
            for t in graph.node(n).inputs:
                if t not in produced and t not in constants and producer.get(t) not in const_nodes:
                    ext.append(t)
        reads[key] = list(dict.fromkeys(ext))

    readers_of: dict[str, set[tuple[int, Role]]] = {}
    for key, ext in reads.items():
        for t in ext:
            readers_of.setdefault(t, set()).add(key)

    tasks = []
    for (stage, role), names in members.items():
        const_needed = _const_closure(graph, names, const_nodes, producer)
        node_set = set(names) | const_needed
        ordered = tuple(n.name for n in graph.nodes if n.name in node_set)
        outs = [
            t for n in names for t in graph.node(n).outputs
            if t in outputs or readers_of.get(t, set()) - {(stage, role)}
        ]
        tasks.append(Task(stage, role, ordered, tuple(reads[(stage, role)]), tuple(dict.fromkeys(outs))))

    edge_tensors: dict[tuple[int, Role, int, Role], list[str]] = {}
    for t, dsts in readers_of.items():
        src = task_of_tensor.get(t)
        if src is None:
            continue  # a graph input
        for dst in sorted(dsts):
            if dst != src:
                _check_direction(graph, t, producer[t], src, dst)
                if src[0] != dst[0]:
                    edge_tensors.setdefault((*src, *dst), []).append(t)
    # A tensor a stage's forward already received stays in its per-microbatch buffers until the
    # backward of that microbatch has run, so the backward needs no second copy.
    for (s, sr, d, dr), ts in list(edge_tensors.items()):
        if sr != "update" and dr == "backward" and (s, sr, d, "forward") in edge_tensors:
            forward_copy = set(edge_tensors[(s, sr, d, "forward")])
            edge_tensors[(s, sr, d, dr)] = [t for t in ts if t not in forward_copy]
    edges = tuple(
        TensorEdge(s, sr, d, dr, float(sum(graph.tensor(t).nbytes for t in ts)), tuple(ts))
        for (s, sr, d, dr), ts in sorted(edge_tensors.items()) if ts
    )

    reduction: dict[str, Reduction] = {}
    for t, (stage, role) in task_of_tensor.items():
        if role == "update":
            continue
        once_readers = any(r == "update" for _, r in readers_of.get(t, ()))
        if once_readers or t in outputs:
            reduction[t] = "mean" if t in batch_dep else "last"

    return Dataflow(
        num_stages=plan.num_stages,
        tasks=tuple(tasks),
        edges=edges,
        producer_task=tuple(sorted(task_of_tensor.items())),
        reduction=tuple(sorted(reduction.items())),
        update_order=_update_order(plan.num_stages, edges),
    )


def _const_closure(graph: OpGraph, names, const_nodes: set[str], producer: Mapping[str, str]) -> set[str]:
    """The constant-only nodes that `names` need, transitively."""
    needed: set[str] = set()
    stack = [t for n in names for t in graph.node(n).inputs]
    while stack:
        p = producer.get(stack.pop())
        if p in const_nodes and p not in needed:
            needed.add(p)
            stack.extend(graph.node(p).inputs)
    return needed


def _check_direction(graph: OpGraph, tensor: str, node: str, src: tuple[int, str], dst: tuple[int, str]) -> None:
    (s, sr), (d, dr) = src, dst
    bad = (
        (sr == "forward" and dr == "forward" and s > d)
        or (sr == "backward" and dr == "backward" and s < d)
        or (sr == "backward" and dr == "forward")
        or (sr == "update" and dr != "update")
    )
    if bad:
        raise ValueError(
            f"tensor {tensor!r} (made by {node}) flows from stage {s}'s {sr} to stage {d}'s {dr}: "
            f"against the pipeline's order, so no schedule can run it; move the stage cut so that "
            f"{node} and its readers land in stages that follow the data flow"
        )


def _update_order(num_stages: int, edges) -> tuple[int, ...]:
    """Stages in an order where every update task runs after the update tasks it reads from."""
    deps = {s: {e.src_stage for e in edges if e.src_role == "update" and e.dst_stage == s} for s in range(num_stages)}
    order: list[int] = []
    while len(order) < num_stages:
        ready = [s for s in sorted(deps, reverse=True) if s not in order and deps[s] <= set(order)]
        if not ready:
            raise ValueError(f"the update tasks of the stages read each other in a cycle: {deps}")
        order.append(ready[0])
    return tuple(order)


def is_float(dtype: str) -> bool:
    return bool(np.issubdtype(np.dtype(dtype), np.inexact))
