"""The local engine: every stage in this process, on meshes of `jax.devices()`."""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import jax

from alpaviz.core.graph import split_microbatch
from alpaviz.core.plan import fusable_runs, is_update, ONCE, Plan, timeline_kind, TimelineEvent
from alpaviz.core.runtime._compile import CompiledStep, named_inputs
from alpaviz.core.runtime._cross_mesh import move_local
from alpaviz.core.runtime._stage_runner import StageError, StageRunner


class LocalEngine:
    """Every stage in this process; meshes over `jax.devices()` picked by the plan's device ids."""

    def __init__(self, plan: Plan, compiled: CompiledStep, donate: bool,
                 compiler_options: dict[str, Any] | None = None) -> None:
        devices = jax.devices()
        self.hardware = f"this machine: {len(devices)} {devices[0].platform.upper()} devices"
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
        inputs = place_inputs(self.runners, c, leaves)
        events: list[TimelineEvent] = []
        pending: dict[tuple, dict[str, Any]] = {}
        t0 = time.perf_counter()
        absorbed: set[tuple[int, str, int]] = set()
        for ins in c.order:
            runner = self.runners[ins.stage]
            if record and ins.op == "run":
                runner.compile_for(ins.role, ins.microbatch)
            start = time.perf_counter()
            produced: list[Any] = []
            key = (ins.stage, ins.role, ins.microbatch)
            if ins.op == "run" and key in absorbed:
                continue
            if ins.op == "run" and not record and key in self.fused:
                # Untimed steps run back-to-back tasks as one executable (no residuals between).
                roles = self.fused[key]
                runner.run_group(roles, ins.microbatch)
                absorbed.update((ins.stage, r, ONCE if is_update(r) else ins.microbatch) for r in roles[1:])
                continue
            if ins.op == "run":
                produced = runner.run(ins.role, ins.microbatch)
            elif ins.op == "send":
                edge = c.edge(ins)
                dst = self.runners[ins.peer]
                values = runner.take(edge, ins.microbatch)
                moved = move_local(values, {t: dst.sharding(t) for t in values})
                runner.sent(edge.tensors, ins.microbatch)
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
                kind = timeline_kind(ins.role) if ins.op == "run" else ins.op
                events.append(TimelineEvent(c.plan.submesh_of(ins.stage), ins.microbatch, kind, start - t0,
                                            time.perf_counter() - t0, c.plan.chunk_of(ins.stage)))
        outs = collect_outputs(c, leaves, lambda stage, name: self.runners[stage].result(name), inputs)
        for r in self.runners:
            r.reset()
        return outs, events


def place_inputs(runners: Sequence[StageRunner], c: CompiledStep, leaves: Sequence[Any]) -> dict[str, Any]:
    """Put every graph input each stage reads on that stage's mesh; batch inputs per microbatch.

    Returns every input by name, with the values made once per step at the global batch.
    """
    values = named_inputs(c, leaves)
    batch = set(c.batch_inputs) | set(c.generated)
    m = c.num_microbatches
    slices: dict[str, list[Any]] = {}
    for runner in runners:
        runner.reset()
        for name in runner.needed_inputs:
            leaf = values[name]
            if name in batch and m > 1:
                if name not in slices:
                    slices[name] = [split_microbatch(leaf, m, k) for k in range(m)]
                for k, part in enumerate(slices[name]):
                    runner.put_input(name, part, k)
            elif name in batch:
                runner.put_input(name, leaf, 0)
            else:
                runner.put_input(name, leaf)
    return values


def collect_outputs(c: CompiledStep, leaves: Sequence[Any], result: Callable[[int, str], Any],
                    made_before: dict[str, Any] | None = None) -> list[Any]:
    """The step's flat outputs: from the stage that made each, values made before the step (a token count),
    or passed-through inputs and constants."""
    index = {name: i for i, name in enumerate(c.graph.inputs)}
    producer = c.flow.producer_map
    constants = c.graph.constants or {}
    stacked = dict(c.graph.output_parts)
    outs = []
    for name in c.graph.outputs:
        if name in stacked:  # updated layer parameters: each layer's slice from its stage, stacked again
            parts = [result(producer[p][0], p) for p in stacked[name]]
            home = parts[0].sharding
            outs.append(jax.numpy.stack([jax.device_put(p, home) for p in parts]))
        elif name in producer:
            outs.append(result(producer[name][0], name))
        elif made_before is not None and name in c.whole:
            outs.append(made_before[name])
        elif name in index:
            outs.append(leaves[index[name]])
        else:
            outs.append(constants[name])
    return outs
