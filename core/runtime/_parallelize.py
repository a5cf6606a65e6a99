"""`av.parallelize`: run a training step exactly as a plan says, pipeline and shardings included.

The step is traced once per microbatch shape; the plan's stages become
forward/backward/update tasks (`alpaviz.core.plan._dataflow`), each compiled with `jax.jit` on
its stage's `Mesh` with the plan's shardings as constraints
(`_stage_runner`); a per-mesh instruction list (`alpaviz.core.plan._instructions`) orders them.

Microbatching: the batch arguments are split along dim 0 into
`plan.schedule.num_microbatches` equal parts, and their results combine into
`jax.jit`'s numbers as the step's dataflow says (`combine_microbatches`:
partial sums added, whole-batch values made once, the loss's tail run once
per step, per-example results concatenated), or the step is refused.
"""


from __future__ import annotations

import dataclasses
from typing import Any, Callable, Literal, Sequence

import jax
import numpy as np

from alpaviz.core.graph import OpGraph, check_int, check_same_static, split_static
from alpaviz.core.plan import INTERLEAVED, build_instructions, interleave, Plan, Program, Timeline
from alpaviz.core.runtime._compile import CompiledStep, check_args, check_loss_reduction, compile_step
from alpaviz.core.runtime._local_engine import LocalEngine
from alpaviz.core.runtime._ray_engine import RayEngine
from alpaviz.core.runtime._transport import check_transport_name
from alpaviz.core.runtime._stage_runner import StageError

Engine = Literal["local", "ray"]


class ParallelStep:
    """A training step that runs a plan; call it like the original step.

    Returns what the step returns, as jax Arrays left sharded on their
    stages' meshes (pass them straight back in: nothing is gathered between
    steps).  `fetch` brings results to the host.  The user's input arrays
    are never donated or mutated unless `donate=True`.

    Example:
        >>> step = av.parallelize(train_step, plan, record_trace=10)  # time every 10th step
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
        batch_argnums: Sequence[int] | None = None,
        loss_reduction: str = "auto",
        donate: bool = False,
        engine: Engine = "local",
        record_trace: bool | int = False,
        ray_options: dict[str, Any] | None = None,
        compiler_options: dict[str, Any] | None = None,
        transport: str = "xla",
    ) -> None:
        if engine not in ("local", "ray"):
            raise ValueError(f"engine must be 'local' or 'ray', got {engine!r}")
        check_transport_name(transport)
        if not callable(train_step):
            raise TypeError(f"train_step must be the step function, got {type(train_step).__name__}")
        if not isinstance(plan, Plan):
            raise TypeError(f"plan must be an av.Plan (from av.solve or av.manual_plan), got {type(plan).__name__}")
        if batch_argnums is not None:
            batch_argnums = tuple(check_int("batch_argnums entry", i, minimum=0) for i in batch_argnums)
        self.train_step = train_step
        self.plan = plan
        self.batch_argnums = batch_argnums
        self.loss_reduction = check_loss_reduction(loss_reduction)
        self.donate = donate
        self.engine_kind = engine
        self.trace_every = trace_interval(record_trace)
        self.steps_run = 0
        self.ray_options = {"transport": transport, **(ray_options or {})}
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
        """Each stage's instruction list as text, one line per stage: what the runtime will run."""
        return "\n".join(
            f"stage {i}: " + "; ".join(str(ins) for ins in lst) for i, lst in enumerate(self.instructions)
        )

    def last_trace(self) -> Timeline:
        """The measured timeline of the last step (source="measured"), same shape as the predicted one."""
        if self._last_trace is None:
            raise ValueError("no step has been timed yet: record_trace=True times every step, record_trace=N "
                             "every Nth (the default, False, times none)")
        return self._last_trace

    @staticmethod
    def fetch(tree: Any) -> Any:
        """The results as numpy arrays on the host (gathers every shard; fetches Ray results)."""
        return jax.tree.map(lambda x: np.asarray(x) if _is_remote(x) else jax.device_get(x), tree)

    # ---- running -----------------------------------------------------------
    def _prepare(self, args: tuple[Any, ...]) -> None:
        self.compiled = compile_step(self.train_step, self.plan, args, self.batch_argnums, self._graph,
                                     self.loss_reduction)
        if self.engine_kind == "local":
            self._engine = LocalEngine(self.compiled.plan, self.compiled, self.donate, self.compiler_options)
        else:
            self._engine = RayEngine(self.plan, self.compiled, self.train_step, args, self.compiled.batch_argnums,
                                     self.donate, self.compiler_options, **self.ray_options)

    def with_schedule(self, kind: str) -> "ParallelStep":
        """The same step under another schedule kind ("gpipe"/"1f1b"/"zb-h1"), reusing the compiled stages.

        Tasks do not depend on the order they run in, so only the
        instruction lists change; handy to compare measured timelines.
        ZB-H1 has tasks of its own (each backward split in two), and
        interleaved 1F1B places several stages on each submesh, so a step
        moves to or from either by `av.parallelize` of the plan under it.
        """
        if self.compiled is None:
            raise ValueError("call the step once (or pass example_args) before switching its schedule")
        if (kind == "zb-h1") != (self.plan.schedule.kind == "zb-h1"):
            raise ValueError(
                f"this step was compiled for {self.plan.schedule.kind!r}, whose tasks differ from {kind!r}'s "
                f"(zb-h1 splits each backward into B and W); parallelize a plan made with schedule={kind!r}")
        if (kind == INTERLEAVED) != (self.plan.schedule.kind == INTERLEAVED):
            raise ValueError(
                f"this step was compiled for {self.plan.schedule.kind!r}; {kind!r} places the stages on other "
                f"devices (interleaved 1F1B runs several stages per submesh): parallelize a plan made with "
                f"schedule={kind!r}")
        plan = dataclasses.replace(self.plan, schedule=dataclasses.replace(self.plan.schedule, kind=kind))
        other = object.__new__(ParallelStep)
        other.__dict__.update(self.__dict__)
        other.plan = plan
        program = build_instructions(kind, plan.num_stages, self.compiled.num_microbatches, self.compiled.flow.edges,
                                     plan.schedule.chunks)
        other.compiled = dataclasses.replace(self.compiled, program=program, order=interleave(program))
        other._engine = self._engine.with_compiled(other.compiled)
        other._last_trace = None
        return other

    def __call__(self, *args: Any) -> Any:
        if self.compiled is None:
            self._prepare(args)
        graph = self.compiled.graph
        structure = jax.tree.structure(split_static(args)[0])
        if structure != graph.in_tree:
            raise ValueError(f"the step was compiled for arguments of structure {graph.in_tree}, got {structure}")
        if graph.static_inputs is not None:
            check_same_static(graph.static_inputs, args)
        leaves = graph.arguments(args)
        check_args(self.compiled, leaves)
        self.steps_run += 1
        timed = self.trace_every > 0 and self.steps_run % self.trace_every == 0
        outs, events = self._engine.step(leaves, timed)
        if timed:
            self._last_trace = Timeline(
                events=tuple(events),
                num_stages=self.plan.num_submeshes,
                num_microbatches=self.compiled.num_microbatches,
                schedule=self.plan.schedule.kind,
                source="measured",
                hardware=getattr(self._engine, "hardware", ""),
                chunks=self.plan.schedule.chunks,
            )
        return graph.results(outs)

    def close(self) -> None:
        """Release the engine's resources (Ray actors); the step cannot run afterwards."""
        if self._engine is not None and hasattr(self._engine, "close"):
            self._engine.close()
        self._engine = None
        self.compiled = None


def trace_interval(record_trace: bool | int) -> int:
    """Time every how many steps (0: never) for `record_trace`: False, True (every step) or N (every Nth)."""
    if isinstance(record_trace, bool):
        return int(record_trace)
    if isinstance(record_trace, int) and record_trace >= 1:
        return record_trace
    raise ValueError(f"record_trace must be False, True or a step interval N >= 1 (time every Nth step), "
                     f"got {record_trace!r}")


def _is_remote(x: Any) -> bool:
    return type(x).__name__ == "RemoteValue" and hasattr(x, "handle")


def parallelize(
    train_step: Callable[..., Any],
    plan: Plan,
    *,
    example_args: Sequence[Any] | None = None,
    graph: OpGraph | None = None,
    batch_argnums: Sequence[int] | None = None,
    loss_reduction: str = "auto",
    donate: bool = False,
    engine: Engine = "local",
    record_trace: bool | int = False,
    ray_options: dict[str, Any] | None = None,
    compiler_options: dict[str, Any] | None = None,
    transport: str = "xla",
) -> ParallelStep:
    """Make `train_step` run as `plan` says: stages on their meshes, shardings, pipeline schedule.

    `batch_argnums` are the arguments split into microbatches (dim 0); by
    default they are found from the step (see `av.trace`).  Microbatch
    results combine exactly as `jax.jit` computes them on the global batch
    (`loss_reduction="auto"`), or the step is refused with the operator and
    the line; "mean" or "sum" instead average or add each microbatch's own
    results (see `compile_step`).
    `engine="ray"` runs each host's stages in a Ray actor (see
    `av.Cluster.ray`/`ray_options`); `transport` moves tensors between hosts:
    "xla" (the actors form one JAX world; XLA's cross-host transfers, each
    byte once, the receiver completing its layout inside its mesh),
    "object_store" (numpy through Ray) or "nccl" (cupy, GPUs only).
    `record_trace` times steps for `step.last_trace()`: True every step, N
    every Nth (the Nth, 2Nth, ... call), False (the default) none.  A timed
    step blocks after every instruction and runs each task on its own, so it
    is slower than the untimed steps, which also fuse a mesh's back-to-back
    forward and backward (and, for one stage and one microbatch, the update)
    into one executable.
    `compiler_options` go to every stage's `jax.jit` (e.g.
    `{"xla_backend_optimization_level": 0}` to compile faster).

    Example:
        >>> step = av.parallelize(train_step, plan)
        >>> for _ in range(3):
        ...     params, loss = step(params, batch)
    """
    return ParallelStep(
        train_step, plan, example_args=example_args, graph=graph, batch_argnums=batch_argnums,
        loss_reduction=loss_reduction, donate=donate, engine=engine, record_trace=record_trace, ray_options=ray_options,
        compiler_options=compiler_options, transport=transport,
    )


__all__ = ["ParallelStep", "parallelize", "StageError"]
