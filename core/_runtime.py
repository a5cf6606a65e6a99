"""`av.parallelize`: run a training step exactly as a plan says, pipeline and shardings included.

The step is traced once per microbatch shape; the plan's stages become
forward/backward/update tasks (`_dataflow`), each compiled with `jax.jit` on
its stage's `Mesh` with the plan's shardings as constraints
(`_stage_runner`); a per-mesh instruction list (`_schedule`) orders them.

Microbatching assumption: the batch arguments are split along dim 0 into
`plan.schedule.num_microbatches` equal parts; every batch-dependent float
result that leaves the per-microbatch passes (gradients into the update,
the loss) is *averaged* over microbatches.  That is exact for losses that
are means over the batch (the zoo's are); a sum-reduced loss would come out
divided by the microbatch count.
"""

from __future__ import annotations

import dataclasses
import functools
import time
import warnings
from typing import Any, Callable, Literal, Sequence

import jax
import numpy as np

from alpaviz.core._cross_mesh import move_local
from alpaviz.core._dataflow import Dataflow, TensorEdge, analyze
from alpaviz.core._graph import OpGraph
from alpaviz.core._microbatch import microbatch_args
from alpaviz.core._plan import Plan, graph_fingerprint
from alpaviz.core._spec import check_spec
from alpaviz.core._schedule import ONCE, Instruction, Program, build_instructions, fusable_runs, interleave
from alpaviz.core._stage_runner import StageError, StageRunner
from alpaviz.core._timeline import Timeline, TimelineEvent
from alpaviz.core._trace import trace

Engine = Literal["local", "ray"]


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


class ParallelStep:
    """A training step that runs a plan; call it like the original step.

    Returns what the step returns, as jax Arrays left sharded on their
    stages' meshes (pass them straight back in: nothing is gathered between
    steps).  `fetch` brings results to the host.  The user's input arrays
    are never donated or mutated unless `donate=True`.

    Example:
        >>> step = av.parallelize(train_step, plan)
        >>> params, loss = step(params, batch)
        >>> print(step.last_trace().to_chrome_trace()[:80])
    """

    def __init__(
        self,
        train_step: Callable[..., Any],
        plan: Plan,
        *,
        example_args: Sequence[Any] | None = None,
        graph: OpGraph | None = None,
        batch_argnums: Sequence[int] = (1,),
        donate: bool = False,
        engine: Engine = "local",
        record_trace: bool = True,
        ray_options: dict[str, Any] | None = None,
        compiler_options: dict[str, Any] | None = None,
    ) -> None:
        if engine not in ("local", "ray"):
            raise ValueError(f"engine must be 'local' or 'ray', got {engine!r}")
        self.train_step = train_step
        self.plan = plan
        self.batch_argnums = tuple(batch_argnums)
        self.donate = donate
        self.engine_kind = engine
        self.record_trace = record_trace
        self.ray_options = dict(ray_options or {})
        self.compiler_options = dict(compiler_options or {})
        self._graph = graph
        self.compiled: CompiledStep | None = None
        self._engine: Any = None
        self._last_trace: Timeline | None = None
        if example_args is not None:
            self._prepare(tuple(example_args))

    # ---- views -----------------------------------------------------------
    @property
    def instructions(self) -> Program:
        """The per-mesh instruction lists (RUN / SEND / RECV / FREE), one tuple per stage."""
        if self.compiled is None:
            raise ValueError("the step is compiled on its first call; call it once or pass example_args")
        return self.compiled.program

    def describe_instructions(self) -> str:
        return "\n".join(
            f"stage {i}: " + "; ".join(str(ins) for ins in lst) for i, lst in enumerate(self.instructions)
        )

    def last_trace(self) -> Timeline:
        """The measured timeline of the last step (source="measured"), same shape as the predicted one."""
        if self._last_trace is None:
            raise ValueError("no step has run with record_trace=True yet")
        return self._last_trace

    @staticmethod
    def fetch(tree: Any) -> Any:
        """The results as numpy arrays on the host (gathers every shard; fetches Ray results)."""
        return jax.tree.map(lambda x: np.asarray(x) if _is_remote(x) else jax.device_get(x), tree)

    # ---- running -----------------------------------------------------------
    def _prepare(self, args: tuple[Any, ...]) -> None:
        self.compiled = compile_step(self.train_step, self.plan, args, self.batch_argnums, self._graph)
        if self.engine_kind == "local":
            self._engine = LocalEngine(self.compiled.plan, self.compiled, self.donate, self.compiler_options)
        else:
            from alpaviz.core._ray_runtime import RayEngine

            self._engine = RayEngine(self.plan, self.compiled, self.train_step, args, self.batch_argnums,
                                     self.donate, self.compiler_options, **self.ray_options)

    def with_schedule(self, kind: str) -> "ParallelStep":
        """The same step under another schedule kind ("gpipe"/"1f1b"), reusing the compiled stages.

        Tasks do not depend on the order they run in, so only the
        instruction lists change; handy to compare measured timelines.
        """
        if self.compiled is None:
            raise ValueError("call the step once (or pass example_args) before switching its schedule")
        plan = dataclasses.replace(self.plan, schedule=dataclasses.replace(self.plan.schedule, kind=kind))
        other = object.__new__(ParallelStep)
        other.__dict__.update(self.__dict__)
        other.plan = plan
        program = build_instructions(kind, plan.num_stages, self.compiled.num_microbatches, self.compiled.flow.edges)
        other.compiled = dataclasses.replace(self.compiled, program=program, order=interleave(program))
        other._engine = self._engine.with_compiled(other.compiled)
        other._last_trace = None
        return other

    def __call__(self, *args: Any) -> Any:
        if self.compiled is None:
            self._prepare(args)
        graph = self.compiled.graph
        if jax.tree.structure(args) != graph.in_tree:
            raise ValueError(
                f"the step was compiled for arguments of structure {graph.in_tree}, got {jax.tree.structure(args)}"
            )
        leaves = jax.tree.leaves(args)
        outs, events = self._engine.step(leaves, self.record_trace)
        if self.record_trace:
            self._last_trace = Timeline(
                events=tuple(events),
                num_stages=self.plan.num_stages,
                num_microbatches=self.compiled.num_microbatches,
                schedule=self.plan.schedule.kind,
                source="measured",
            )
        return jax.tree.unflatten(graph.out_tree, outs)

    def close(self) -> None:
        """Release the engine's resources (Ray actors); the step cannot run afterwards."""
        if self._engine is not None and hasattr(self._engine, "close"):
            self._engine.close()
        self._engine = None
        self.compiled = None


def _is_remote(x: Any) -> bool:
    return type(x).__name__ == "RemoteValue" and hasattr(x, "handle")


def parallelize(
    train_step: Callable[..., Any],
    plan: Plan,
    *,
    example_args: Sequence[Any] | None = None,
    graph: OpGraph | None = None,
    batch_argnums: Sequence[int] = (1,),
    donate: bool = False,
    engine: Engine = "local",
    record_trace: bool = True,
    ray_options: dict[str, Any] | None = None,
    compiler_options: dict[str, Any] | None = None,
) -> ParallelStep:
    """Make `train_step` run as `plan` says: stages on their meshes, shardings, pipeline schedule.

    `batch_argnums` are the arguments split into microbatches (dim 0).
    `engine="ray"` runs each host's stages in a Ray actor (see
    `av.Cluster.ray`/`ray_options`).  `record_trace` blocks after every
    instruction to time it (`step.last_trace()`); turn it off for speed:
    untimed local steps also fuse a mesh's back-to-back forward and backward
    (and, for one stage and one microbatch, the update) into one executable.
    `compiler_options` go to every stage's `jax.jit` (e.g.
    `{"xla_backend_optimization_level": 0}` to compile faster).

    Example:
        >>> step = av.parallelize(train_step, plan)
        >>> for _ in range(3):
        ...     params, loss = step(params, batch)
    """
    return ParallelStep(
        train_step, plan, example_args=example_args, graph=graph, batch_argnums=batch_argnums,
        donate=donate, engine=engine, record_trace=record_trace, ray_options=ray_options,
        compiler_options=compiler_options,
    )


def split_microbatch(value: Any, m: int, k: int) -> Any:
    """Microbatch k of m of a batch leaf (numpy stays numpy; no copy to a device)."""
    size = np.shape(value)[0] // m
    return value[k * size:(k + 1) * size]


class LocalEngine:
    """Every stage in this process; meshes over `jax.devices()` picked by the plan's device ids."""

    def __init__(self, plan: Plan, compiled: CompiledStep, donate: bool,
                 compiler_options: dict[str, Any] | None = None) -> None:
        devices = jax.devices()
        needed = max(d for s in plan.stages for d in s.device_ids) + 1
        if needed > len(devices):
            raise ValueError(
                f"the plan uses device ids up to {needed - 1} but this process has {len(devices)} JAX "
                f"devices; on CPU set XLA_FLAGS=--xla_force_host_platform_device_count={needed} before "
                f"importing jax, or use a plan for {len(devices)} devices"
            )
        self.compiled = compiled
        self.fused = fusable_runs(compiled.program)
        self.runners = [
            StageRunner(compiled.graph, compiled.flow, s, [devices[d] for d in s.device_ids],
                        compiled.num_microbatches, compiled.batch_inputs, dict(compiled.aliases), donate,
                        compiler_options)
            for s in plan.stages
        ]

    def with_compiled(self, compiled: CompiledStep) -> "LocalEngine":
        """The same runners (and compiled tasks) driven by other instruction lists."""
        other = object.__new__(LocalEngine)
        other.compiled = compiled
        other.fused = fusable_runs(compiled.program)
        other.runners = self.runners
        return other

    def step(self, leaves: Sequence[Any], record: bool) -> tuple[list[Any], list[TimelineEvent]]:
        c = self.compiled
        place_inputs(self.runners, c, leaves)
        events: list[TimelineEvent] = []
        pending: dict[tuple, dict[str, Any]] = {}
        t0 = time.perf_counter()
        absorbed: set[tuple[int, str, int]] = set()
        for ins in c.order:
            start = time.perf_counter()
            runner = self.runners[ins.stage]
            produced: list[Any] = []
            key = (ins.stage, ins.role, ins.microbatch)
            if ins.op == "run" and key in absorbed:
                continue
            if ins.op == "run" and not record and key in self.fused:
                # Untimed steps run back-to-back tasks as one executable (no residuals between).
                roles = self.fused[key]
                runner.run_group(roles, ins.microbatch)
                absorbed.update((ins.stage, r, ONCE if r == "update" else ins.microbatch) for r in roles[1:])
                continue
            if ins.op == "run":
                produced = runner.run(ins.role, ins.microbatch)
            elif ins.op == "send":
                edge = c.edge(ins)
                dst = self.runners[ins.peer]
                values = runner.take(edge, ins.microbatch)
                moved = move_local(values, {t: dst.sharding(t) for t in values})
                pending[ins.transfer_key] = moved
                produced = list(moved.values())
            elif ins.op == "recv":
                runner.give(pending.pop(ins.transfer_key), ins.microbatch, placed=True)
            else:
                runner.free(ins.microbatch)
                continue
            if record:
                try:
                    jax.block_until_ready(produced)
                except Exception as err:
                    raise StageError(f"{runner.describe()}, {ins}: {err}") from err
                kind = ins.role if ins.op == "run" else ins.op
                events.append(TimelineEvent(ins.stage, ins.microbatch, kind, start - t0, time.perf_counter() - t0))
        outs = collect_outputs(c, leaves, lambda stage, name: self.runners[stage].result(name))
        for r in self.runners:
            r.reset()
        return outs, events


def place_inputs(runners: Sequence[StageRunner], c: CompiledStep, leaves: Sequence[Any]) -> None:
    """Put every graph input each stage reads on that stage's mesh; batch inputs per microbatch."""
    index = {name: i for i, name in enumerate(c.graph.inputs)}
    batch = set(c.batch_inputs)
    m = c.num_microbatches
    slices: dict[str, list[Any]] = {}
    for runner in runners:
        runner.reset()
        for name in runner.needed_inputs:
            leaf = leaves[index[name]]
            if name in batch and m > 1:
                if name not in slices:
                    slices[name] = [split_microbatch(leaf, m, k) for k in range(m)]
                for k, part in enumerate(slices[name]):
                    runner.put_input(name, part, k)
            elif name in batch:
                runner.put_input(name, leaf, 0)
            else:
                runner.put_input(name, leaf)


def collect_outputs(c: CompiledStep, leaves: Sequence[Any], result: Callable[[int, str], Any]) -> list[Any]:
    """The step's flat outputs: from the stage that made each, or passed-through inputs and constants."""
    index = {name: i for i, name in enumerate(c.graph.inputs)}
    producer = c.flow.producer_map
    constants = c.graph.constants or {}
    outs = []
    for name in c.graph.outputs:
        if name in producer:
            outs.append(result(producer[name][0], name))
        elif name in index:
            outs.append(leaves[index[name]])
        else:
            outs.append(constants[name])
    return outs


__all__ = ["ParallelStep", "parallelize", "StageError", "ONCE"]
