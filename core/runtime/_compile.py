"""Compile a training step for a plan: trace at microbatch size, cut into tasks, order them.

Nothing here touches devices: the result (`CompiledStep`) is what every
engine (local or Ray) runs.  A plan made from the global-batch graph is
rebased onto the microbatch graph, and specs that no longer divide a
microbatch are dropped with a warning.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Any, Callable, Sequence

import jax
import numpy as np

from alpaviz.core.graph import OpGraph, microbatch_args, trace
from alpaviz.core.plan import Plan, check_spec, graph_fingerprint
from alpaviz.core.runtime._dataflow import Dataflow, TensorEdge, analyze
from alpaviz.core.runtime._schedule import Instruction, Program, build_instructions, interleave


@dataclasses.dataclass(frozen=True)
class CompiledStep:
    """Everything about a parallel step that does not depend on devices: graph, tasks, lists."""

    graph: OpGraph  # traced at microbatch size
    plan: Plan  # the plan as run: in terms of `graph`'s operators, specs that fit a microbatch
    flow: Dataflow
    program: Program
    order: tuple[Instruction, ...]
    batch_inputs: tuple[str, ...]
    aliases: tuple[tuple[str, str], ...]
    num_microbatches: int

    @functools.cached_property
    def _edges(self) -> dict[tuple, TensorEdge]:
        return {(e.src_stage, e.src_role, e.dst_stage, e.dst_role): e for e in self.flow.edges}

    def edge(self, ins: Instruction) -> TensorEdge:
        """The data-flow edge a SEND or RECV carries."""
        return self._edges[ins.transfer_key[:4]]


def compile_step(
    train_step: Callable[..., Any],
    plan: Plan,
    example_args: Sequence[Any],
    batch_argnums: Sequence[int] = (1,),
    graph: OpGraph | None = None,
) -> CompiledStep:
    """Trace `train_step` at microbatch size and cut it into the plan's tasks and instruction lists."""
    args = tuple(example_args)
    m = plan.schedule.num_microbatches
    micro = microbatch_args(args, batch_argnums, m)
    abstract = microbatch_args(args, (), 1)
    name = getattr(train_step, "__name__", "step")
    full = graph if graph is not None else trace(train_step, *abstract, name=name)
    mb_graph = full if m == 1 else trace(train_step, *micro, name=name)
    if plan.graph_fingerprint not in (graph_fingerprint(full), graph_fingerprint(mb_graph)):
        raise ValueError(
            f"the plan was made for model {plan.model!r} with a different operator graph than "
            f"{name!r} traced with these arguments; re-solve the plan for this step and these shapes"
        )
    plan = _rebase_to_microbatch_graph(plan, full, mb_graph)
    plan = _fit_specs_to_microbatch(plan, full, mb_graph)
    counts = [len(jax.tree.leaves(a)) for a in args]
    starts = np.cumsum([0] + counts)
    batch_inputs = tuple(
        mb_graph.inputs[j] for i in batch_argnums for j in range(starts[i], starts[i + 1])
    )
    flow = analyze(mb_graph, plan, batch_inputs)
    program = build_instructions(plan.schedule.kind, plan.num_stages, m, flow.edges)
    return CompiledStep(
        graph=mb_graph,
        plan=plan,
        flow=flow,
        program=program,
        order=interleave(program),
        batch_inputs=batch_inputs,
        aliases=tuple(sorted(_aliases(mb_graph).items())),
        num_microbatches=m,
    )


def _same_structure(a: OpGraph, b: OpGraph) -> bool:
    return [(n.name, n.primitive, n.inputs, n.outputs) for n in a.nodes] == [
        (n.name, n.primitive, n.inputs, n.outputs) for n in b.nodes
    ]


def _rebase_to_microbatch_graph(plan: Plan, full: OpGraph, mb_graph: OpGraph) -> Plan:
    """The plan in terms of the microbatch graph's operators, when tracing at microbatch size changed them.

    Some steps trace to other operators at a smaller batch (an einsum that
    takes another contraction path, a dim of size 1 squeezed away).  That is
    safe when the plan's layers are the tracer's marker layers: layer i of
    the microbatch graph then goes where layer i went.  Only specs on graph
    inputs (named by argument path) carry over; intermediates are renamed,
    so their specs are dropped and left to XLA.
    """
    if full is mb_graph or plan.graph_fingerprint == graph_fingerprint(mb_graph) or _same_structure(full, mb_graph):
        return plan
    marker_layers = tuple(tuple(n.name for n in full.nodes if n.layer == i) for i in range(full.num_layers))
    if tuple(layer.nodes for layer in plan.layers) != marker_layers or mb_graph.num_layers != full.num_layers:
        raise ValueError(
            f"{full.name!r} traces to different operators at microbatch size and the plan's layers are not "
            f"the traced marker layers, so they cannot be mapped; solve the plan on the step traced with "
            f"one microbatch (batch / {plan.schedule.num_microbatches})"
        )
    layers = tuple(
        dataclasses.replace(layer, nodes=tuple(n.name for n in mb_graph.nodes if n.layer == layer.index))
        for layer in plan.layers
    )
    inputs = set(mb_graph.inputs)
    stages = tuple(
        dataclasses.replace(s, partition_specs=tuple((t, spec) for t, spec in s.partition_specs if t in inputs),
                            strategies=())
        for s in plan.stages
    )
    return dataclasses.replace(plan, layers=layers, stages=stages, graph_fingerprint=graph_fingerprint(mb_graph))


class SpecDroppedWarning(UserWarning):
    """A plan's spec fits the full batch but not one microbatch; that tensor is left to XLA."""


def _fit_specs_to_microbatch(plan: Plan, full: OpGraph, mb_graph: OpGraph) -> Plan:
    """Drop (with a warning) specs made for full-batch shapes that a microbatch cannot honour.

    A solver that shards the full batch 4 ways plans a split a 4-times
    smaller microbatch may not divide.  Numerics do not depend on sharding
    constraints, so the step still runs; the warning says which tensors
    lost their spec and how to avoid it (solve at microbatch size).
    Specs that fit neither shape stay, and the stage refuses them.
    """
    if full is mb_graph:
        return plan
    dropped: list[str] = []
    stages = []
    for stage in plan.stages:
        keep = []
        for name, spec in stage.partition_specs:
            fits_micro = _fits(mb_graph, name, spec, stage.logical_mesh)
            if not fits_micro and _fits(full, name, spec, stage.logical_mesh):
                dropped.append(f"stage {stage.index} (mesh {stage.logical_mesh[0]}x{stage.logical_mesh[1]}): "
                               f"{name} {mb_graph.tensor(name).shape} {spec}")
                continue
            keep.append((name, spec))
        stages.append(dataclasses.replace(stage, partition_specs=tuple(keep)))
    if not dropped:
        return plan
    warnings.warn(
        f"{len(dropped)} partition specs fit the full batch but not a microbatch of 1/"
        f"{plan.schedule.num_microbatches} of it and are left to XLA, e.g. {dropped[:3]}; "
        f"solve the plan on the step traced at microbatch size to keep them",
        SpecDroppedWarning,
        stacklevel=3,
    )
    return dataclasses.replace(plan, stages=tuple(stages))


def _fits(graph: OpGraph, name: str, spec, mesh: tuple[int, int]) -> bool:
    if name not in graph.tensor_by_name:
        return False
    try:
        check_spec(graph.tensor(name).shape, spec, mesh)
    except ValueError:
        return False
    return True


def _aliases(graph: OpGraph) -> dict[str, str]:
    """Graph output -> graph input it replaces, when the first output mirrors the first argument.

    `train_step(params, batch) -> (new_params, ...)`: the new params keep
    the old params' shardings, so the next step needs no resharding.
    """
    outs, ins = graph.out_tree, graph.in_tree
    if outs is None or ins is None or not outs.children() or not ins.children():
        return {}
    out0, in0 = outs.children()[0], ins.children()[0]
    if out0 != in0:
        return {}
    n = in0.num_leaves
    pairs = {}
    for o, i in zip(graph.outputs[:n], graph.inputs[:n]):
        a, b = graph.tensor(o), graph.tensor(i)
        if a.shape == b.shape and a.dtype == b.dtype and o not in graph.inputs:
            pairs[o] = i
    return pairs
