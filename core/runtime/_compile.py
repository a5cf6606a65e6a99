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
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from alpaviz.core.graph import (
    MicrobatchCombination, OpGraph, batch_shaped_draws, combine_microbatches, dtype_name, evaluate, microbatch_args,
    trace,
)
from alpaviz.core.intra_op import validate_plan
from alpaviz.core.plan import (
    analyze, build_instructions, check_spec, Dataflow, graph_fingerprint, Instruction, interleave, Plan,
    Program, TensorEdge,
)


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
    batch_argnums: tuple[int, ...] = ()
    # (input name, shape, dtype) of every argument leaf at the global batch: each call is checked against it
    arg_specs: tuple[tuple[str, tuple[int, ...], str], ...] = ()
    accumulate: str = "sum"
    loss_reduction: str = "auto"  # as asked: every host of the Ray engine compiles the step the same way
    # Batch-shaped values the step makes without reading the batch (dropout masks drawn from a key): made
    # once per step at the global batch by `generator`, then split into microbatches like the batch.
    generated: tuple[str, ...] = ()
    # Values of the batch alone that stand for all of it (a token count `sum(mask)`): made once per step at
    # the global batch by `generator` and read whole by every microbatch.
    whole: tuple[str, ...] = ()
    generator: Any = dataclasses.field(default=None, compare=False, repr=False)

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
    batch_argnums: Sequence[int] | None = None,
    graph: OpGraph | None = None,
    loss_reduction: str = "auto",
) -> CompiledStep:
    """Trace `train_step` at microbatch size and cut it into the plan's tasks and instruction lists.

    `batch_argnums=None` takes the batch arguments the trace found.
    `loss_reduction="auto"` derives from the dataflow how microbatch results
    combine into `jax.jit`'s numbers, or refuses the step
    (`combine_microbatches`); "mean" or "sum" instead average or add each
    microbatch's own gradients and scalar outputs, as does a plan whose
    schedule keeps batch statistics per microbatch.
    """
    args = tuple(example_args)
    m = plan.schedule.num_microbatches
    abstract = microbatch_args(args, (), 1)
    name = getattr(train_step, "__name__", "step")
    full = graph if graph is not None else trace(train_step, *abstract, name=name, batch_argnums=batch_argnums)
    nums = tuple(batch_argnums) if batch_argnums is not None else full.batch_argnums
    if m > 1 and not nums:
        raise ValueError(f"cannot split {name!r} into {m} microbatches: {full.batch_note}")
    micro = microbatch_args(args, nums, m)
    mb_graph = full if m == 1 else trace(train_step, *micro, name=name, batch_argnums=nums)
    if plan.graph_fingerprint not in (graph_fingerprint(full), graph_fingerprint(mb_graph)):
        raise ValueError(
            f"the plan was made for model {plan.model!r} with a different operator graph than "
            f"{name!r} traced with these arguments ({_signature(full)}); re-solve the plan for this step "
            f"and these shapes and dtypes"
        )
    planned = full if plan.graph_fingerprint == graph_fingerprint(full) else mb_graph
    validate_plan(plan, planned)
    _warn_host_callbacks(planned, plan)
    plan = _rebase_to_microbatch_graph(plan, full, mb_graph)
    plan = _fit_specs_to_microbatch(plan, full, mb_graph)
    counts = [len(mb_graph.arguments((a,))) for a in args]
    starts = np.cumsum([0] + counts)
    batch_inputs = tuple(mb_graph.inputs[j] for i in nums for j in range(starts[i], starts[i + 1]))
    if m > 1 and check_loss_reduction(loss_reduction) == "auto" and plan.schedule.batch_statistics == "global":
        how = combine_microbatches(full, mb_graph, batch_inputs, m)
        mb_graph = _with_global_values(mb_graph, how)
        accumulate = "sum"
    else:  # an explicit override, or per-microbatch statistics: each microbatch's results combine as asked
        how = MicrobatchCombination(drawn=batch_shaped_draws(full, mb_graph, batch_inputs))
        accumulate = _accumulation(full, mb_graph, m, loss_reduction, name)
    flow = analyze(mb_graph, plan, batch_inputs, per_example=_per_example_outputs(full, mb_graph, m),
                   accumulate=accumulate, generated=how.drawn, whole=how.whole, partial=how.partial)
    program = build_instructions(plan.schedule.kind, plan.num_stages, m, flow.edges, plan.schedule.chunks)
    return CompiledStep(
        graph=mb_graph,
        plan=plan,
        flow=flow,
        program=program,
        order=interleave(program),
        batch_inputs=batch_inputs,
        aliases=tuple(sorted(_aliases(mb_graph).items())),
        num_microbatches=m,
        batch_argnums=nums,
        arg_specs=tuple((t, full.tensor(t).shape, full.tensor(t).dtype) for t in full.leaf_inputs),
        accumulate=accumulate,
        loss_reduction=loss_reduction,
        generated=how.drawn,
        whole=how.whole,
        generator=_generator(full, how.drawn + how.whole) if how.drawn or how.whole else None,
    )


class HostCallbackWarning(UserWarning):
    """A host callback runs inside a stage of several devices: if it raises, XLA aborts the process."""


_CALLBACKS = frozenset({"pure_callback", "io_callback", "debug_callback", "callback"})


def _warn_host_callbacks(graph: OpGraph, plan: Plan) -> None:
    """Say before launch what a failing callback would do: a collective waits forever, then XLA aborts."""
    stage_of_layer = {layer: s for s in plan.stages for layer in s.layers}
    for layer in plan.layers:
        stage = stage_of_layer[layer.index]
        if len(stage.device_ids) < 2:
            continue
        for name in layer.nodes:
            node = graph.node(name)
            if node.primitive in _CALLBACKS:
                warnings.warn(
                    f"{node.name} ({node.source or 'a host callback'}) runs on the {len(stage.device_ids)} "
                    f"devices of stage {stage.index}: if the callback raises, the other devices wait in a "
                    f"collective and XLA aborts the whole process (as plain jax.jit does); in a notebook the "
                    f"kernel dies. Keep callbacks that can fail out of sharded stages, or test them with "
                    f"num_microbatches=1 on one device first",
                    HostCallbackWarning,
                    stacklevel=3,
                )
                return


def _signature(graph: OpGraph) -> str:
    """The traced inputs (the batch first), shapes and dtypes, to name what differs from the plan's graph."""
    first = [*graph.batch_inputs, *(t for t in graph.inputs if t not in set(graph.batch_inputs))]
    shown = [f"{t}: {graph.tensor(t).dtype}{list(graph.tensor(t).shape)}" for t in first]
    return ", ".join(shown[:6]) + (f", ... ({len(shown)} inputs)" if len(shown) > 6 else "")


def named_inputs(compiled: CompiledStep, leaves: Sequence[Any]) -> dict[str, Any]:
    """The step's input leaves by graph input name, the per-layer slices of stacked ones, and this step's draws."""
    values = compiled.graph.input_values(leaves)
    if compiled.generator is not None:
        values.update(compiled.generator(values))
    return values


def check_args(compiled: CompiledStep, leaves: Sequence[Any]) -> None:
    """Every call must bring the shapes and dtypes the step was compiled for (checked on each call)."""
    for leaf, (name, shape, dtype) in zip(leaves, compiled.arg_specs):
        got_shape = tuple(np.shape(leaf)) if not hasattr(leaf, "shape") else tuple(leaf.shape)
        dtype_seen = getattr(leaf, "dtype", None)
        got_dtype = dtype_name(dtype_seen if dtype_seen is not None else jax.numpy.result_type(leaf))
        if got_shape != shape or got_dtype != dtype:
            m = compiled.num_microbatches
            hint = (f" (the batch: {shape[0]} rows, {m} microbatches of {shape[0] // m})"
                    if name in compiled.batch_inputs and shape else "")
            raise ValueError(
                f"argument {name!r} is {got_dtype}{list(got_shape)}, but the step was compiled for "
                f"{dtype}{list(shape)}{hint}; call it with the shapes of the first call, or build a new step "
                f"with av.parallelize for the new shapes"
            )


def _with_global_values(graph: OpGraph, how: MicrobatchCombination) -> OpGraph:
    """The microbatch graph with the global batch's constants, and its loss tail run once per step."""
    nodes = tuple(dataclasses.replace(n, role="update") if n.name in how.per_step else n for n in graph.nodes)
    return dataclasses.replace(graph, nodes=nodes, constants={**(graph.constants or {}), **how.constants})


def _generator(full: OpGraph, generated: Sequence[str]) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    """A jitted function: the step's inputs (by name) -> the generated values at the global batch."""
    producer = {t: n for n in full.nodes for t in n.outputs}
    needed: dict[str, Any] = {}
    stack = [producer[t] for t in generated]
    while stack:
        node = stack.pop()
        if node.name in needed:
            continue
        needed[node.name] = node
        stack.extend(producer[t] for t in node.inputs if t in producer)
    nodes = [n for n in full.nodes if n.name in needed]
    made = {t for n in nodes for t in n.outputs}
    inputs = tuple(dict.fromkeys(t for n in nodes for t in n.inputs if t in full.inputs and t not in made))

    @jax.jit
    def draw(values: tuple) -> dict[str, Any]:
        return evaluate(full, dict(zip(inputs, values)), nodes, tuple(generated))

    def generate(leaves_by_name: Mapping[str, Any]) -> dict[str, Any]:
        return draw(tuple(leaves_by_name[t] for t in inputs))

    return generate


def _per_example_outputs(full: OpGraph, mb_graph: OpGraph, m: int) -> frozenset[str]:
    """Outputs whose rows are examples: their leading dim grows with the batch (concatenated)."""
    out = set()
    for a, b in zip(full.outputs, mb_graph.outputs):
        big, small = full.tensor(a).shape, mb_graph.tensor(b).shape
        if big == small:
            continue
        if not small or big[0] != m * small[0] or big[1:] != small[1:]:
            raise ValueError(
                f"output {b!r} has shape {list(big)} for the whole batch but {list(small)} for one microbatch "
                f"of {m}; only outputs whose leading dim is the batch can be reassembled from microbatches"
            )
        out.add(b)
    return frozenset(out)


def check_loss_reduction(loss_reduction: str) -> str:
    if loss_reduction not in ("auto", "mean", "sum"):
        raise ValueError(f"loss_reduction must be 'auto', 'mean' or 'sum', got {loss_reduction!r}")
    return loss_reduction


def _accumulation(full: OpGraph, mb_graph: OpGraph, m: int, loss_reduction: str, name: str) -> str:
    """How each microbatch's own gradients and scalar outputs combine, when the user says so or statistics are
    per microbatch: "mean" or "sum" (see `compile_step`)."""
    if check_loss_reduction(loss_reduction) != "auto":
        return loss_reduction
    if m == 1:
        return "mean"
    ratios = set()
    for key, big in (full.constants or {}).items():
        small = (mb_graph.constants or {}).get(key)
        if small is None or np.ndim(big) or np.ndim(small) or not np.isfinite(big) or not small:
            continue
        if float(big) != float(small):
            ratios.add(float(big) / float(small))
    if not ratios:
        return "sum"
    if all(np.isclose(r, m) or np.isclose(r, 1 / m) for r in ratios):
        return "mean"
    raise ValueError(
        f"cannot tell whether {name!r}'s loss is a mean or a sum over the batch (constants change by "
        f"{sorted(ratios)} between the batch and a microbatch of 1/{m}); pass loss_reduction='mean' or 'sum'"
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
