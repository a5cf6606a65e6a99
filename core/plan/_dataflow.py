"""Which operators run where and when: a plan's stages split into per-microbatch and per-step tasks.

Every stage gets `forward` and `backward` tasks (run once per microbatch;
under ZB-H1 the backward splits into B and a `weight_grad` task, W) and
`update` tasks (run once per step), from the roles the trace found in
the step's dataflow.  When one stage's update reads another stage's update
(global-norm clipping sums every stage's gradients), the update runs in
levels (`update`, `update1`, ...), values crossing stages only from one level
to the next.  Nodes computed from constants only (zeros, iotas) are
recomputed inside each task that reads them rather than shipped between
meshes.

Everything here is plain data over node and tensor names; no JAX.
"""

from __future__ import annotations

import dataclasses
from typing import Collection, Literal, Mapping

from alpaviz.core.graph import (
    OpGraph, PartialSums, Role, constant_only_nodes, input_gradient_nodes, recompute_chain, stored_residuals,
    tensors_depending_on,
)
from alpaviz.core.plan._instructions import WEIGHT_GRAD, Edge, is_update, update_level, update_role

PER_MICROBATCH: tuple[Role, ...] = ("forward", "backward")
# How values made once per microbatch become one value for the step: averaged or summed (gradients,
# losses), concatenated along dim 0 (per-example outputs), or the last one (batch-independent values).
Reduction = Literal["mean", "sum", "concat", "last"]


@dataclasses.dataclass(frozen=True)
class Task:
    """The nodes of one stage and role, with the tensors that cross its boundary."""

    stage: int
    role: str  # forward, backward, or an update level (update, update1, ...)
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
    per step or returned (a gradient, the loss, per-example logits) becomes
    one value (see `Reduction`).  `update_levels` is how many update tasks
    each stage has.
    """

    num_stages: int
    tasks: tuple[Task, ...]
    edges: tuple[TensorEdge, ...]
    producer_task: tuple[tuple[str, tuple[int, str]], ...]
    reduction: tuple[tuple[str, Reduction], ...]
    update_levels: int = 1
    generated: tuple[str, ...] = ()  # made before the step and split like the batch (random draws)
    whole: tuple[str, ...] = ()  # made before the step at the global batch, read whole (a token count)
    # Partial sums over the batch whose reduction across devices can wait for the update (gradients).
    partial: PartialSums = PartialSums()

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


def analyze(
    graph: OpGraph,
    plan,
    batch_inputs: Collection[str] = (),
    *,
    per_example: Collection[str] = (),
    accumulate: Literal["mean", "sum"] = "mean",
    generated: Collection[str] = (),
    whole: Collection[str] = (),
    partial: PartialSums = PartialSums(),
) -> Dataflow:
    """Split the plan's stages into tasks and find the edges between them.

    `batch_inputs` are the graph inputs split into microbatches; a tensor
    depends on the batch when it is computed from one of them.
    `per_example` outputs are concatenated over microbatches; other
    batch-dependent values that leave the per-microbatch passes are
    combined by `accumulate`.  `generated` tensors are made before the
    step (random draws at the global batch) and read like batch inputs;
    `whole` ones are made before the step too and read like parameters.
    `partial` sums are recorded for the stages to reduce once per step.
    Raises a ValueError when data would flow against the pipeline, which no
    schedule can run.
    """
    stage_of = node_stages(graph, plan)
    constants = set(graph.constants or {})
    producer = {t: n.name for n in graph.nodes for t in n.outputs}
    outputs = set(graph.output_tensors)
    for t in (*generated, *whole):
        del producer[t]
    const_nodes = constant_only_nodes(graph, {*generated, *whole})  # no task runs them
    batch_dep = tensors_depending_on(graph.nodes, (*batch_inputs, *generated))

    exec_role = _task_roles(graph, stage_of, const_nodes, producer)
    levels = 1 + max((update_level(r) for r in exec_role.values() if is_update(r)), default=0)
    split = plan.schedule.kind == "zb-h1"
    per_microbatch = (*PER_MICROBATCH, WEIGHT_GRAD) if split else PER_MICROBATCH
    roles = (*per_microbatch, *(update_role(level) for level in range(levels)))
    task_of_tensor: dict[str, tuple[int, str]] = {}
    own: dict[tuple[int, str], list[str]] = {(s, r): [] for s in range(plan.num_stages) for r in roles}
    for node in graph.nodes:
        if node.name in const_nodes:
            continue
        key = (stage_of[node.name], exec_role[node.name])
        own[key].append(node.name)
        for t in node.outputs:
            task_of_tensor[t] = key
    members = _with_recomputation(graph, plan, own)
    if split:
        _split_weight_gradients(graph, plan, own, members, task_of_tensor)

    reads = {key: _external_reads(graph, names, constants, producer, const_nodes) for key, names in members.items()}
    readers_of: dict[str, set[tuple[int, str]]] = {}
    for key, ext in reads.items():
        for t in ext:
            readers_of.setdefault(t, set()).add(key)

    tasks = []
    position = {n.name: i for i, n in enumerate(graph.nodes)}
    for (stage, role), names in members.items():
        const_needed = _const_closure(graph, names, const_nodes, producer)
        ordered = tuple(sorted(set(names) | const_needed, key=position.__getitem__))
        outs = [
            t for n in own[(stage, role)] for t in graph.node(n).outputs
            if t in outputs or readers_of.get(t, set()) - {(stage, role)}
        ]
        tasks.append(Task(stage, role, ordered, tuple(reads[(stage, role)]), tuple(dict.fromkeys(outs))))

    reduction: dict[str, Reduction] = {}
    for t, (stage, role) in task_of_tensor.items():
        if is_update(role):
            continue
        once_readers = any(is_update(r) for _, r in readers_of.get(t, ()))
        if once_readers or t in outputs:
            if t not in batch_dep:
                reduction[t] = "last"
            else:
                reduction[t] = "concat" if t in per_example else accumulate

    return Dataflow(
        num_stages=plan.num_stages,
        tasks=tuple(tasks),
        edges=_stage_edges(graph, readers_of, task_of_tensor, producer),
        producer_task=tuple(sorted(task_of_tensor.items())),
        reduction=tuple(sorted(reduction.items())),
        update_levels=levels,
        generated=tuple(generated),
        whole=tuple(whole),
        partial=partial,
    )


def _with_recomputation(graph: OpGraph, plan, own: dict[tuple[int, str], list[str]]) -> dict[tuple[int, str], list[str]]:
    """Each task's nodes, a backward's with the forward nodes it reruns.

    A rematerialised stage's backward runs its forward again, so no forward residual waits in flight.
    Any other stage's backward reruns the cheap elementwise chains the memory model does not store.
    """
    members = {key: list(names) for key, names in own.items()}
    for stage in plan.stages:
        key = (stage.index, "backward")
        forward = own[(stage.index, "forward")]
        if stage.remat:
            members[key] = forward + own[key]
        else:
            chain = _cheap_recompute(graph, forward, own[key])
            members[key] = [n for n in forward if n in chain] + own[key]
    return members


def _split_weight_gradients(graph: OpGraph, plan, own: dict[tuple[int, str], list[str]],
                            members: dict[tuple[int, str], list[str]], task_of: dict[str, tuple[int, str]]) -> None:
    """Move what only weight gradients need from each stage's backward (B) into its W task, in place.

    B keeps every operator the stage before waits on (`input_gradient_nodes`), forward reruns included;
    W reads what it needs of B's results.  A recomputing stage keeps its backward whole: its W would hold
    the rerun activations the recomputation exists to drop.
    """
    for stage in plan.stages:
        b, w = (stage.index, "backward"), (stage.index, WEIGHT_GRAD)
        needed = set(members[b]) if stage.remat else input_gradient_nodes(graph, members[b])
        own[w] = [n for n in own[b] if n not in needed]
        own[b] = [n for n in own[b] if n in needed]
        members[w] = [n for n in members[b] if n not in needed]
        members[b] = [n for n in members[b] if n in needed]
        for name in own[w]:
            for t in graph.node(name).outputs:
                task_of[t] = w


def _external_reads(graph: OpGraph, names: list[str], constants: set[str], producer: dict[str, str],
                    const_nodes: set[str]) -> list[str]:
    """The tensors a task reads that it neither makes nor can recompute from constants, in first-read order."""
    produced = {t for n in names for t in graph.node(n).outputs}
    ext = []
    for n in names:
        for t in graph.node(n).inputs:
            if t not in produced and t not in constants and producer.get(t) not in const_nodes:
                ext.append(t)
    return list(dict.fromkeys(ext))


def _stage_edges(graph: OpGraph, readers_of: dict[str, set[tuple[int, str]]],
                 task_of_tensor: dict[str, tuple[int, str]], producer: dict[str, str]) -> tuple[TensorEdge, ...]:
    """The tensors that cross stages, grouped by (source task, destination task); refuses backward flow."""
    edge_tensors: dict[tuple[int, str, int, str], list[str]] = {}
    for t, dsts in readers_of.items():
        src = task_of_tensor.get(t)
        if src is None:
            continue  # a graph input
        for dst in sorted(dsts):
            if dst != src:
                _check_direction(graph, t, producer[t], src, dst)
                if src[0] != dst[0]:
                    edge_tensors.setdefault((*src, *dst), []).append(t)
    # A tensor a stage's forward (or, for a W, its B) already received stays in its per-microbatch buffers
    # until the last task of that microbatch has run, so a later task needs no second copy.
    for (s, sr, d, dr), ts in list(edge_tensors.items()):
        if is_update(sr) or dr not in ("backward", WEIGHT_GRAD):
            continue
        earlier = ("forward",) if dr == "backward" else ("forward", "backward")
        received = {t for r in earlier for t in edge_tensors.get((s, sr, d, r), ())}
        edge_tensors[(s, sr, d, dr)] = [t for t in ts if t not in received]
    return tuple(
        TensorEdge(s, sr, d, dr, float(sum(graph.tensor(t).nbytes for t in ts)), tuple(ts))
        for (s, sr, d, dr), ts in sorted(edge_tensors.items()) if ts
    )


def _cheap_recompute(graph: OpGraph, forward: list[str], backward: list[str]) -> frozenset[str]:
    """The forward operators a stage's backward reruns instead of reading their stored results.

    Only chains that stay inside the stage's forward; a residual whose chain
    leaves it is stored, as before.
    """
    mine, made_here = set(forward), {t for n in forward for t in graph.node(n).outputs}
    residuals = list(dict.fromkeys(t for n in backward for t in graph.node(n).inputs if t in made_here))
    stored = set(stored_residuals(graph, residuals))
    rerun: set[str] = set()
    for t in residuals:
        if t in stored:
            continue
        chain = set(recompute_chain(graph, [t], stored))
        if chain <= mine:
            rerun |= chain
        else:
            stored.add(t)
    return frozenset(rerun)


def _task_roles(graph: OpGraph, stage_of: Mapping[str, int], const_nodes: set[str],
                producer: Mapping[str, str]) -> dict[str, str]:
    """Each node's task: its role, with update nodes given the level their cross-stage reads need."""
    out: dict[str, str] = {}
    level: dict[str, int] = {}
    for node in graph.nodes:
        if node.name in const_nodes:
            continue
        if node.role != "update":
            out[node.name] = node.role
            continue
        lv = 0
        for t in node.inputs:
            p = producer.get(t)
            if p in level:
                lv = max(lv, level[p] + (stage_of[p] != stage_of[node.name]))
        level[node.name] = lv
        out[node.name] = update_role(lv)
    return out


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
    sr, dr = ("backward" if r == WEIGHT_GRAD else r for r in (sr, dr))  # a W is a part of its backward
    bad = (
        (sr == "forward" and dr == "forward" and s > d)
        or (sr == "backward" and dr == "backward" and s < d)
        or (sr == "backward" and dr == "forward")
        or (is_update(sr) and not is_update(dr))
    )
    if bad:
        raise ValueError(
            f"tensor {tensor!r} (made by {node}, {graph.node(node).source or 'unknown source'}) flows from "
            f"stage {s}'s {sr} to stage {d}'s {dr}: against the pipeline's order, so no schedule can run it. "
            f"The planner only offers cuts that follow the data flow; this plan's layers were edited or made "
            f"for another graph: re-solve it for this step"
        )

