"""What XLA says each stage of a plan needs per device: the check on the planner's memory model.

Each stage's whole step for one microbatch (forward, backward, update, with
the replaced state donated) is compiled as one program on the stage's
devices and read with `compiled.memory_analysis()`; nothing is allocated or
run.  Its peak is what the plan's `stage.cost.memory` predicts with one
microbatch in flight.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax

from alpaviz.core.plan import Plan
from alpaviz.core.runtime._compile import compile_step
from alpaviz.core.runtime._stage_runner import StageRunner


@dataclasses.dataclass(frozen=True)
class CompiledMemory:
    """XLA's per-device byte counts for one stage's program (`peak` = arguments + outputs - aliased + temporaries)."""

    stage: int
    argument_bytes: float
    output_bytes: float
    alias_bytes: float
    temp_bytes: float

    @property
    def peak(self) -> float:
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes


def compiled_stage_memory(
    train_step: Callable[..., Any],
    plan: Plan,
    example_args: Sequence[Any],
    batch_argnums: Sequence[int] | None = None,
) -> tuple[CompiledMemory, ...]:
    """Compile every stage of `plan` for one microbatch and return XLA's memory analysis of each.

    `example_args` are the step's arguments at the global batch (arrays or
    `jax.ShapeDtypeStruct`s).  Needs the plan's devices in this process.

    Example:
        >>> for stage, measured in zip(plan.stages, compiled_stage_memory(step, plan, (params, batch))):
        ...     print(stage.cost.memory.with_in_flight(1).peak, measured.peak)
    """
    compiled = compile_step(train_step, plan, example_args, batch_argnums)
    devices = jax.devices()
    needed = max(d for s in compiled.plan.stages for d in s.device_ids) + 1
    if needed > len(devices):
        raise ValueError(f"the plan uses {needed} devices but this process has {len(devices)}; on CPU set "
                         f"XLA_FLAGS=--xla_force_host_platform_device_count={needed} before importing jax")
    out = []
    for stage in compiled.plan.stages:
        runner = StageRunner(compiled.graph, compiled.flow, stage, [devices[d] for d in stage.device_ids],
                             compiled.num_microbatches, compiled.batch_inputs, dict(compiled.aliases))
        stats = runner.whole_step_memory()
        out.append(CompiledMemory(stage.index, float(stats.argument_size_in_bytes),
                                  float(stats.output_size_in_bytes), float(stats.alias_size_in_bytes),
                                  float(stats.temp_size_in_bytes)))
    return tuple(out)
