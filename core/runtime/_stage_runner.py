"""One pipeline stage on its mesh: compiled tasks and the buffers they pass around.

A `StageRunner` is the same object whether the driver holds every stage (one
host) or a Ray actor holds the stages of its host: it places inputs on its
mesh, runs a task for one microbatch, hands out what a SEND needs and takes
what a RECV brings.  How bytes move between meshes is the caller's business
(`_cross_mesh`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from alpaviz.core.cost import AXIS_NAMES
from alpaviz.core.graph import OpGraph, evaluate, is_float_dtype
from alpaviz.core.plan import check_spec, Dataflow, is_update, ONCE, Stage, TensorEdge, to_partition_spec
from alpaviz.core.runtime._device_parts import PartEvaluator, device_parts, held_sharding, reduce_parts


class StageError(RuntimeError):
    """A stage failed to compile or run; the message names the stage, its task and its mesh."""


class StageRunner:
    """Compiled forward/backward/update tasks of one stage and its per-step buffers.

    `aliases` maps a graph output to the graph input it replaces (a new
    param to its old value): the output is given the input's sharding so a
    next step finds its params where they already are.
    """

    def __init__(
        self,
        graph: OpGraph,
        flow: Dataflow,
        stage: Stage,
        devices: Sequence[Any],
        num_microbatches: int,
        batch_inputs: Sequence[str],
        aliases: Mapping[str, str],
        donate: bool = False,
        compiler_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.graph = graph
        self.compiler_options = dict(compiler_options or {})
        self.stage = stage
        self.index = stage.index
        self.num_microbatches = num_microbatches
        self.mesh = Mesh(np.asarray(devices, dtype=object).reshape(stage.logical_mesh), AXIS_NAMES)
        self.specs = dict(stage.partition_specs)
        for name, spec in self.specs.items():
            if name in graph.tensor_by_name:
                try:
                    check_spec(graph.tensor(name).shape, spec, stage.logical_mesh, what=f"tensor {name!r}")
                except ValueError as err:
                    raise ValueError(f"{self.describe()}: {err} (shapes are per microbatch)") from None
        self.tasks = {task.role: task for task in flow.tasks if task.stage == stage.index}
        self.reduction = flow.reduction_map
        self.batch_inputs = frozenset(batch_inputs) | frozenset(flow.generated)
        self.graph_inputs = frozenset(graph.inputs) | frozenset(flow.generated) | frozenset(flow.whole)
        self.aliases = dict(aliases)
        self.donate = donate
        self._producer = flow.producer_map
        # Who reads a tensor per microbatch (keep it in the per-microbatch buffers) on any stage.
        self._read_per_mb = {
            t for task in flow.tasks if not is_update(task.role) for t in task.inputs
        }
        # What this stage's own per-microbatch tasks read, and how many edges send each tensor from here:
        # a value only sent on is dropped once its last send is done.
        self._local_reads = {t for task in self.tasks.values() if not is_update(task.role) for t in task.inputs}
        self._sends: dict[str, int] = {}
        for edge in flow.edges:
            if edge.src_stage == stage.index and edge.per_microbatch:
                for t in edge.tensors:
                    self._sends[t] = self._sends.get(t, 0) + 1
        self._readers: dict[str, set[tuple[int, str]]] = {}
        for task in flow.tasks:
            for t in task.inputs:
                self._readers.setdefault(t, set()).add((task.stage, task.role))
        self._graph_outputs = graph.output_tensors
        self._init_device_parts(flow)
        self._groups: dict[tuple[str, ...], _Group] = {}
        self._fns: dict[tuple[str, ...], Any] = {}
        self._compiled: set[tuple[str, ...]] = set()  # run or compiled at least once
        self._first_args: dict[tuple[str, ...], Any] = {}
        self._zeros: dict[str, Any] = {}
        self._concat_parts: dict[str, dict[int, Any]] = {}
        self.reset()

    def _init_device_parts(self, flow: Dataflow) -> None:
        """Which partial sums each per-microbatch task keeps per device, reduced once in the update
        (`_device_parts`)."""
        per_mb = {r: t for r, t in self.tasks.items() if not is_update(r)}
        nodes = [n for t in per_mb.values() for n in t.nodes]
        self.parts = (device_parts(self.graph, flow.partial, self.specs, self.stage.logical_mesh, AXIS_NAMES, nodes)
                      if self.num_microbatches > 1 else None)
        self._held = {r: self.parts.held([self.graph.node(n) for n in t.nodes]) if self.parts else frozenset()
                      for r, t in per_mb.items()}
        self.held_accumulators = frozenset(
            t for r in per_mb for t in self.tasks[r].outputs
            if t in self._held[r] and self.reduction.get(t) in ("mean", "sum")
        )
        self._reducers: dict[str, Any] = {}

    def _held_sharding(self, tensor: str) -> NamedSharding:
        return held_sharding(self.parts, self.mesh, self.specs.get(tensor))

    def _reduced(self, tensor: str, value: Any) -> Any:
        """A held accumulator summed over its device parts, outside any task (a result, a send)."""
        if tensor not in self.held_accumulators:
            return value
        if tensor not in self._reducers:
            target = self.sharding(tensor)
            self._reducers[tensor] = jax.jit(lambda v: reduce_parts(v, target))
        return self._reducers[tensor](value)

    # ---- placement -------------------------------------------------------
    def describe(self) -> str:
        r, c = self.stage.logical_mesh
        return f"stage {self.index} (mesh {r}x{c} on devices {list(self.stage.device_ids)})"

    def sharding(self, tensor: str) -> NamedSharding:
        """Where a tensor entering this stage lives: its spec if the plan gives one, else replicated."""
        return NamedSharding(self.mesh, partition_spec(entering_spec(self.specs, tensor, self.aliases)))

    @property
    def needed_inputs(self) -> tuple[str, ...]:
        """Graph inputs any task of this stage reads."""
        return tuple(dict.fromkeys(
            t for task in self.tasks.values() for t in task.inputs if t in self.graph_inputs
        ))

    def reset(self) -> None:
        """Forget the last step's buffers (compiled tasks are kept)."""
        self.mb_values: dict[tuple[str, int], Any] = {}
        self.step_values: dict[str, Any] = {}
        self._concat_parts = {}
        self._sent: dict[tuple[str, int], int] = {}

    def put_input(self, name: str, value: Any, microbatch: int = ONCE) -> None:
        placed = jax.device_put(value, self.sharding(name))
        if microbatch == ONCE:
            self.step_values[name] = placed
        else:
            self.mb_values[(name, microbatch)] = placed

    def take(self, edge: TensorEdge, microbatch: int) -> dict[str, Any]:
        """The values a SEND along `edge` carries."""
        return self.values(edge.tensors, microbatch)

    def values(self, tensors: Sequence[str], microbatch: int) -> dict[str, Any]:
        """`tensors` as this stage holds them for `microbatch` (ONCE: the step's)."""
        if microbatch == ONCE:
            return {t: self._reduced(t, self.step_values[t]) for t in tensors}
        return {t: self.mb_values[(t, microbatch)] for t in tensors}

    def give(self, values: Mapping[str, Any], microbatch: int, placed: bool = False) -> None:
        """Store what a RECV brought; `placed` values are already on this mesh."""
        for t, v in values.items():
            v = v if placed else jax.device_put(v, self.sharding(t))
            if microbatch == ONCE:
                self.step_values[t] = v
            else:
                self.mb_values[(t, microbatch)] = v

    def sent(self, tensors: Sequence[str], microbatch: int) -> None:
        """A SEND of `tensors` is done: drop each one no task here reads once every send of it is done."""
        if microbatch == ONCE:
            return
        for t in tensors:
            key = (t, microbatch)
            self._sent[key] = self._sent.get(key, 0) + 1
            if self._sent[key] >= self._sends.get(t, 0) and t not in self._local_reads:
                self.mb_values.pop(key, None)

    def free(self, microbatch: int) -> None:
        for key in [k for k in self.mb_values if k[1] == microbatch]:
            del self.mb_values[key]

    def result(self, name: str) -> Any:
        return self._reduced(name, self.step_values[name])

    # ---- execution -------------------------------------------------------
    def _group(self, roles: tuple[str, ...]) -> "_Group":
        """Nodes, inputs and outputs of one or more of this stage's tasks run as one executable.

        An output is kept when a task outside the group, the step's result or
        a microbatch reduction needs it; what only the group itself reads
        (e.g. forward residuals inside a fused forward+backward) stays inside.
        """
        if roles in self._groups:
            return self._groups[roles]
        nodes, inputs, outputs = self._select(roles, keep_reductions=True)
        accumulated = tuple(t for r in roles for t in self._accumulated(r))
        donated = self._donated_names(roles, inputs, outputs)
        held = frozenset().union(*(self._held.get(r, frozenset()) for r in roles))
        reduced = tuple(t for t in inputs if t in self.held_accumulators) if any(map(is_update, roles)) else ()
        group = _Group(roles, nodes, inputs, outputs, accumulated, donated, held, reduced)
        self._groups[roles] = group
        return group

    def _select(self, roles: tuple[str, ...], keep_reductions: bool) -> tuple[tuple, tuple[str, ...], tuple[str, ...]]:
        """The nodes of these tasks in graph order, what they read from outside, and the results that leave.

        A result leaves when a task outside them or the step's result needs
        it, and, with `keep_reductions`, when a microbatch reduction does.
        """
        tasks = [self.tasks[r] for r in roles]
        members = {(self.index, r) for r in roles}
        names = {n for task in tasks for n in task.nodes}
        nodes = tuple(node for node in self.graph.nodes if node.name in names)
        produced = {t for node in nodes for t in node.outputs}
        inputs = tuple(dict.fromkeys(t for task in tasks for t in task.inputs if t not in produced))
        outputs = tuple(dict.fromkeys(
            t for task in tasks for t in task.outputs
            if t in self._graph_outputs or (keep_reductions and t in self.reduction)
            or self._readers.get(t, set()) - members
        ))
        return nodes, inputs, outputs

    def _accumulated(self, role: str) -> tuple[str, ...]:
        if self.num_microbatches == 1 or is_update(role):
            return ()
        out = []
        for t in self.tasks[role].outputs:
            how = self.reduction.get(t)
            if how in ("mean", "sum"):
                self._check_combinable(t, how)
                out.append(t)
        return tuple(out)

    def _check_combinable(self, tensor: str, how: str) -> None:
        """Integers add up exactly; a mean of integers, or a sum of booleans, does not."""
        dtype = self.graph.tensor(tensor).dtype
        if is_float_dtype(dtype) or (how == "sum" and dtype != "bool"):
            return
        path = self.graph.output_paths.get(tensor)
        what = f"output {path}" if path else f"value {tensor!r}, which an update reads,"
        raise ValueError(
            f"{self.describe()}: {what} ({dtype}) depends on the batch, and its microbatch values cannot be "
            f"combined by {how}; return it as a float or an integer count, per example (leading dim = batch), "
            f"or use num_microbatches=1"
        )

    def _donated_names(self, roles, inputs, outputs) -> tuple[str, ...]:
        """Old params the update may overwrite in place; only when the user asked for donation."""
        if not self.donate or not any(is_update(r) for r in roles):
            return ()
        replaced = {self.aliases[t] for t in outputs if t in self.aliases}
        return tuple(t for t in inputs if t in replaced)

    def _build(self, group: "_Group") -> Any:
        scales = [1.0 / self.num_microbatches if self.reduction[t] == "mean" else 1.0 for t in group.accumulated]
        constrain = {
            t: self.sharding(t) for t in self.graph.tensor_by_name if t in self.specs or t in self.aliases
        }
        donated = set(group.donated)
        names = group.donated + tuple(t for t in group.inputs if t not in donated)

        def shard(name: str, value: Any) -> Any:
            s = constrain.get(name)
            return value if s is None else jax.lax.with_sharding_constraint(value, s)

        held = group.held
        parts = PartEvaluator(self.parts, held, self.mesh, self.sharding, self.specs.get) if held else None
        accumulated = set(group.accumulated)
        # A held accumulator leaves only as its accumulator, unless another task reads it per microbatch.
        dropped = {t for t in group.outputs if t in held and t in accumulated and not any(
            not is_update(r) and r not in group.roles for _, r in self._readers.get(t, ()))}

        def placed(t: str) -> NamedSharding:
            return self._held_sharding(t) if t in held else self.sharding(t)

        def leaving(t: str, value: Any) -> Any:
            if t in dropped:
                return None
            return parts.reduce(t, value) if t in held else value

        def fn(donated_args: tuple, kept_args: tuple, accs: tuple) -> tuple[tuple, tuple]:
            values = dict(zip(names, donated_args + kept_args))
            for t in group.reduced_inputs:  # the once-per-step reduction of each held gradient
                values[t] = reduce_parts(values[t], self.sharding(t))
            env = evaluate(self.graph, values, group.nodes, group.outputs,
                           shard if parts is None else lambda t, v: v if t in held else shard(t, v),
                           apply=None if parts is None else parts.apply)
            new_accs = tuple(
                jax.lax.with_sharding_constraint(acc + env[t] * jnp_scale(env[t], scale), placed(t))
                for t, acc, scale in zip(group.accumulated, accs, scales)
            )
            return tuple(leaving(t, env[t]) for t in group.outputs), new_accs

        return jax.jit(
            fn,
            donate_argnums=(0,) if group.donated else (),
            compiler_options=self.compiler_options or None,
        )

    def _zeros_for(self, tensor: str) -> Any:
        if tensor not in self._zeros:
            info = self.graph.tensor(tensor)
            if tensor in self.held_accumulators:  # one partial sum per device along the batch axes
                zeros, where = np.zeros((self.parts.parts, *info.shape), info.dtype), self._held_sharding(tensor)
            else:
                zeros, where = np.zeros(info.shape, info.dtype), self.sharding(tensor)
            self._zeros[tensor] = jax.device_put(zeros, where)
        return self._zeros[tensor]

    def _lookup(self, tensor: str, microbatch: int) -> Any:
        if microbatch != ONCE and (tensor, microbatch) in self.mb_values:
            return self.mb_values[(tensor, microbatch)]
        if tensor in self.step_values:
            return self.step_values[tensor]
        raise StageError(
            f"{self.describe()}: tensor {tensor!r} was neither received nor computed before it was needed "
            f"(microbatch {microbatch}); the instruction list is out of order"
        )

    def whole_step_memory(self) -> Any:
        """XLA's memory analysis of this stage's whole step for one microbatch, compiled as one program.

        Every task of the stage in one executable, its outputs only what
        leaves the stage (the step's results, values other stages read), the
        replaced state donated; nothing is allocated or run.
        """
        roles = tuple(self.tasks)
        nodes, inputs, outputs = self._select(roles, keep_reductions=False)
        replaced = {self.aliases[t] for t in outputs if t in self.aliases}
        donated = tuple(t for t in inputs if t in replaced)
        group = _Group(roles, nodes, inputs, outputs, (), donated, frozenset(), ())
        fn = self._build(group)

        def abstract(t: str) -> jax.ShapeDtypeStruct:
            info = self.graph.tensor(t)
            return jax.ShapeDtypeStruct(info.shape, np.dtype(info.dtype), sharding=self.sharding(t))

        kept = tuple(abstract(t) for t in inputs if t not in replaced)
        return fn.lower(tuple(abstract(t) for t in donated), kept, ()).compile().memory_analysis()

    def compiled_text(self, roles: tuple[str, ...] | str) -> str:
        """The optimized HLO of a task (or fused group) that has run, e.g. to count its collectives."""
        roles = (roles,) if isinstance(roles, str) else tuple(roles)
        if self._first_args.get(roles) is None:
            raise ValueError(f"{self.describe()}: task {roles} has not run yet; run a step first")
        return self._fns[roles].lower(*self._first_args[roles]).compile().as_text()

    def run(self, role: str, microbatch: int) -> list[Any]:
        """Run one task; returns its fresh outputs (for the caller to block on when timing)."""
        return self.run_group((role,), microbatch)

    def compile_for(self, role: str, microbatch: int) -> None:
        """Compile the task's executable now if it is new, so that a timed run measures running, not compiling."""
        group = self._group((role,))
        if group.nodes and group.roles not in self._compiled:
            args = self._arguments(group, microbatch)
            try:
                self._fns[group.roles].lower(*args).compile()  # jax.jit's call reuses this compilation
            except Exception as err:
                raise StageError(f"{self.describe()}, {role} task, microbatch {microbatch}: {err}") from err
            self._compiled.add(group.roles)

    def _arguments(self, group: "_Group", microbatch: int) -> tuple[tuple, tuple, tuple]:
        """(donated, kept, accumulators) for one run of `group`; builds its function on first use."""
        if group.roles not in self._fns:
            self._fns[group.roles] = self._build(group)
            self._first_args[group.roles] = None
        donated_set = set(group.donated)
        donated = tuple(self._lookup(t, microbatch) for t in group.donated)
        kept = tuple(self._lookup(t, microbatch) for t in group.inputs if t not in donated_set)
        first = microbatch in (0, ONCE)
        accs = tuple(self._zeros_for(t) if first else self.step_values[t] for t in group.accumulated)
        if self._first_args.get(group.roles, 0) is None:
            self._first_args[group.roles] = jax.tree.map(
                lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), (donated, kept, accs)
            )
        return donated, kept, accs

    def run_group(self, roles: tuple[str, ...], microbatch: int) -> list[Any]:
        """Run tasks of this stage back to back as one executable (e.g. forward+backward of a microbatch)."""
        group = self._group(tuple(roles))
        if not group.nodes:
            return []
        donated, kept, accs = self._arguments(group, microbatch)
        self._compiled.add(group.roles)
        try:
            outs, new_accs = self._fns[group.roles](donated, kept, accs)
        except Exception as err:  # compile or runtime failure inside the stage
            what = "+".join(roles)
            raise StageError(f"{self.describe()}, {what} task, microbatch {microbatch}: {err}") from err
        summed = set(group.accumulated)
        for t, v in zip(group.outputs, outs):
            role = self._producer[t][1]
            if self.reduction.get(t) == "concat" and self.num_microbatches > 1:
                self._gather_part(t, microbatch, v)
            elif is_update(role) or (t in self.reduction and t not in summed):
                self.step_values[t] = v  # once-per-step values, or the "last"/single-microbatch ones
            if not is_update(role) and t in self._read_per_mb:
                self.mb_values[(t, 0 if microbatch == ONCE else microbatch)] = v
        for t, v in zip(group.accumulated, new_accs):
            self.step_values[t] = v
        return list(outs) + list(new_accs)


    def _gather_part(self, tensor: str, microbatch: int, value: Any) -> None:
        """Keep one microbatch's rows of a per-example output; the last part concatenates them."""
        parts = self._concat_parts.setdefault(tensor, {})
        parts[microbatch] = value
        if len(parts) == self.num_microbatches:
            self.step_values[tensor] = jax.numpy.concatenate([parts[k] for k in sorted(parts)], axis=0)
            del self._concat_parts[tensor]


@dataclasses.dataclass(frozen=True)
class _Group:
    roles: tuple[str, ...]
    nodes: tuple[Any, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    accumulated: tuple[str, ...]
    donated: tuple[str, ...]
    held: frozenset[str]  # kept as per-device partial sums (`_device_parts`)
    reduced_inputs: tuple[str, ...]  # held accumulators this (update) group reduces first


def entering_spec(specs: Mapping[str, Any], tensor: str, aliases: Mapping[str, str]) -> Any:
    """A stage's spec (from its `partition_specs`) of a tensor entering it, a new param taking its old
    value's; None: replicated."""
    spec = specs.get(tensor)
    if spec is None and tensor in aliases:
        spec = specs.get(aliases[tensor])
    return spec


def partition_spec(spec: Any) -> PartitionSpec:
    """A plan spec (None: replicated) as the PartitionSpec jit gives its outputs."""
    return _canonical(to_partition_spec(spec)) if spec is not None else PartitionSpec()


def _canonical(pspec: PartitionSpec) -> PartitionSpec:
    """Without trailing replicated dims, the form jit gives its outputs (so shardings compare equal)."""
    entries = list(pspec)
    while entries and entries[-1] is None:
        entries.pop()
    return PartitionSpec(*entries)


def jnp_scale(value: Any, scale: float) -> Any:
    """`scale` as a scalar of the value's dtype, so accumulation never upcasts."""
    return np.asarray(scale, dtype=value.dtype)
