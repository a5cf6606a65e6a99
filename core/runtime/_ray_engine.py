"""The Ray engine: one actor per host owns that host's stage meshes; the driver only sends instructions.

Each actor is its own JAX process with its own devices (for tests: K
virtual CPU devices, set through `XLA_FLAGS` in the actor before JAX
starts).  The driver ships the step function and `jax.ShapeDtypeStruct`s;
every actor re-traces the step itself (jaxprs do not pickle) and checks
that it got the same graph.  Tensors cross hosts as numpy through Ray's
object store.  Results stay in the actors between steps: the step returns
`RemoteValue` handles, which the next call accepts as inputs without moving
them, and `ParallelStep.fetch` brings to the host.

Ray starts only when a user builds a step with `engine="ray"`.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Sequence

import jax
import numpy as np

from alpaviz.core.graph import split_microbatch
from alpaviz.core.plan import Plan, graph_fingerprint
from alpaviz.core.runtime._compile import compile_step
from alpaviz.core.runtime._cross_mesh import check_transport, move_local, to_host
from alpaviz.core.runtime._schedule import ONCE, timeline_kind
from alpaviz.core.runtime._stage_runner import StageError, StageRunner
from alpaviz.core.runtime._timeline import TimelineEvent


@dataclasses.dataclass(frozen=True)
class RemoteValue:
    """A step result living in a Ray actor: pass it back to the step, or `np.asarray` it to fetch."""

    actor: int
    name: str
    shape: tuple[int, ...]
    dtype: str
    step: int
    handle: Any = dataclasses.field(default=None, compare=False, repr=False)

    def __array__(self, dtype=None, copy=None):
        value = self.handle.fetch(self)
        return value if dtype is None else value.astype(dtype)


class HostActor:
    """Owns the stages of one host.  Created through `ray.remote`; methods run in the actor."""

    def __init__(self, host: int, devices_per_host: int) -> None:
        flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "host_platform_device_count" not in f]
        flags.append(f"--xla_force_host_platform_device_count={devices_per_host}")
        os.environ["XLA_FLAGS"] = " ".join(flags)
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        # Importing JAX is not enough to fix its devices: the backend reads XLA_FLAGS when it first
        # starts, which is after this point (the first jax.devices() below).
        self.host = host
        self.devices_per_host = devices_per_host
        self.runners: dict[int, Any] = {}
        self.kept: dict[str, Any] = {}
        self.outbox: dict[tuple, dict[str, Any]] = {}

    def num_devices(self) -> int:
        return len(jax.devices())

    def setup(self, train_step, plan_json: str, abstract_args, batch_argnums, donate, compiler_options,
              stages: Sequence[int], expected_fingerprint: str, loss_reduction: str = "auto") -> str:
        plan = Plan.from_json(plan_json)
        compiled = compile_step(train_step, plan, abstract_args, batch_argnums, loss_reduction=loss_reduction)
        fingerprint = graph_fingerprint(compiled.graph)
        if fingerprint != expected_fingerprint:
            raise ValueError(
                f"host {self.host} traced a different graph ({fingerprint}) than the driver "
                f"({expected_fingerprint}); use the same JAX and model code on every host"
            )
        devices = jax.devices()
        base = self.host * self.devices_per_host
        self.compiled = compiled
        self.runners = {
            s: StageRunner(compiled.graph, compiled.flow, plan.stages[s],
                           [devices[d - base] for d in plan.stages[s].device_ids],
                           compiled.num_microbatches, compiled.batch_inputs, dict(compiled.aliases),
                           donate, compiler_options)
            for s in stages
        }
        return fingerprint

    def place(self, entries, *imported: dict) -> None:
        """Put graph inputs on this host's stages: arrays, or results this actor (or another) kept."""
        pool = {k: v for d in imported for k, v in d.items()}
        for runner in self.runners.values():
            runner.reset()
        for stage, name, microbatch, payload in entries:
            if isinstance(payload, tuple) and payload[0] == "kept":
                payload = self.kept[payload[1]] if payload[1] in self.kept else pool[payload[1]]
            self.runners[stage].put_input(name, payload, microbatch)

    def run(self, stage: int, role: str, microbatch: int, record: bool) -> tuple[float, float]:
        start = time.time()
        produced = self.runners[stage].run(role, microbatch)
        if record:
            jax.block_until_ready(produced)
        return start, time.time()

    def send(self, key: tuple, tensors: Sequence[str], record: bool) -> tuple[dict, tuple[float, float]]:
        """The sender's half across hosts: this edge's values as numpy (and the send's timing)."""
        start = time.time()
        src, _, _, _, microbatch = key
        runner = self.runners[src]
        values = {t: (runner.step_values[t] if microbatch == ONCE else runner.mb_values[(t, microbatch)])
                  for t in tensors}
        host = to_host(values)
        runner.sent(tensors, microbatch)
        return host, (start, time.time())

    def send_local(self, key: tuple, tensors: Sequence[str], record: bool) -> tuple[float, float]:
        """A move between two stages of this host: one device_put each."""
        start = time.time()
        src, _, dst, _, microbatch = key
        runner, target = self.runners[src], self.runners[dst]
        values = {t: (runner.step_values[t] if microbatch == ONCE else runner.mb_values[(t, microbatch)])
                  for t in tensors}
        moved = move_local(values, {t: target.sharding(t) for t in values})
        runner.sent(tensors, microbatch)
        if record:
            jax.block_until_ready(list(moved.values()))
        self.outbox[key] = moved
        return start, time.time()

    def recv(self, key: tuple, payload: Any, record: bool) -> tuple[float, float]:
        start = time.time()
        dst, microbatch = key[2], key[4]
        if payload is None:  # a local move, already placed
            self.runners[dst].give(self.outbox.pop(key), microbatch, placed=True)
        else:
            self.runners[dst].give(payload, microbatch)
            if record:
                jax.block_until_ready([self.runners[dst]._lookup(t, microbatch) for t in payload])
        return start, time.time()

    def free(self, stage: int, microbatch: int) -> None:
        self.runners[stage].free(microbatch)

    def finish(self, names: Sequence[tuple[int, str]]) -> None:
        """Keep this host's results for the next step and drop the step's buffers."""
        self.kept = {name: self.runners[stage].result(name) for stage, name in names}
        for runner in self.runners.values():
            runner.reset()

    def export(self, names: Sequence[str]) -> dict[str, np.ndarray]:
        return {n: np.asarray(self.kept[n]) for n in names}


class RayEngine:
    """Drives one `HostActor` per host of the plan's cluster through the instruction order."""

    def __init__(self, plan: Plan, compiled, train_step, args, batch_argnums, donate, compiler_options=None,
                 *, address: str | None = None, transport: str = "object_store",
                 init_kwargs: dict[str, Any] | None = None) -> None:
        check_transport(transport)
        if compiled.graph.input_parts or compiled.graph.output_parts:
            raise ValueError(
                f"the step scans over stacked layer parameters ({compiled.graph.input_parts[0][0]}, ...), which the "
                f"Ray engine cannot yet cut into per-stage slices; use engine='local'"
            )
        if compiled.generated:
            raise ValueError(
                f"the step draws batch-shaped random values ({', '.join(compiled.generated[:3])}) that the Ray "
                f"engine cannot yet draw once per step at the global batch; use engine='local', or "
                f"num_microbatches=1"
            )
        try:
            import ray  # lazy: Ray is heavy and starts only for engine="ray"
        except ImportError:
            raise ValueError("engine='ray' needs Ray (pip install ray); or use engine='local'") from None
        self.ray = ray
        self.plan = plan
        self.compiled = compiled
        per_host = plan.cluster.devices_per_host
        self.host_of = [s.device_ids[0] // per_host for s in plan.stages]
        for s in plan.stages:
            if len({d // per_host for d in s.device_ids}) > 1:
                raise ValueError(
                    f"stage {s.index} spans hosts (devices {s.device_ids}, {per_host} per host); the Ray "
                    f"engine runs a stage inside one host's actor"
                )
        if not ray.is_initialized():
            kwargs = {"include_dashboard": False, "num_cpus": max(2, plan.cluster.num_hosts)}
            if address is not None:
                kwargs = {"address": address}
            kwargs.update(init_kwargs or {})
            ray.init(**kwargs)
        self._started_ray = True
        hosts = sorted(set(self.host_of))
        actor_cls = ray.remote(num_cpus=1)(HostActor)
        self.actors = {h: actor_cls.remote(h, per_host) for h in hosts}
        self.hardware = f"Ray: {len(hosts)} host actors x {per_host} devices"
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), jax.numpy.result_type(x)), tuple(args))
        expected = graph_fingerprint(compiled.graph)
        ray.get([
            actor.setup.remote(train_step, plan.to_json(), abstract, tuple(batch_argnums), donate,
                               compiler_options, [s.index for s in plan.stages if self.host_of[s.index] == h],
                               expected, compiled.accumulate)
            for h, actor in self.actors.items()
        ])
        self.step_id = 0
        self._needed = {
            s.index: tuple(dict.fromkeys(
                t for task in compiled.flow.tasks if task.stage == s.index for t in task.inputs
                if t in set(compiled.graph.inputs)
            ))
            for s in plan.stages
        }

    def with_compiled(self, compiled) -> "RayEngine":
        other = object.__new__(RayEngine)
        other.__dict__.update(self.__dict__)
        other.compiled = compiled
        return other

    def _place(self, leaves: Sequence[Any]) -> None:
        c = self.compiled
        index = {name: i for i, name in enumerate(c.graph.inputs)}
        batch, m = set(c.batch_inputs), c.num_microbatches
        entries: dict[int, list] = {h: [] for h in self.actors}
        imports: dict[int, dict[int, list[str]]] = {h: {} for h in self.actors}
        for stage, names in self._needed.items():
            h = self.host_of[stage]
            for name in names:
                leaf = leaves[index[name]]
                if isinstance(leaf, RemoteValue):
                    if leaf.step != self.step_id:
                        raise ValueError(
                            f"input {name!r} is a result of step {leaf.step}, but this step's actors only keep "
                            f"the results of step {self.step_id}; pass the latest results or fetch them first"
                        )
                    if leaf.actor != h:
                        imports[h].setdefault(leaf.actor, []).append(leaf.name)
                    entries[h].append((stage, name, ONCE, ("kept", leaf.name)))
                elif name in batch:
                    host = np.asarray(leaf)
                    for k in range(m):
                        entries[h].append((stage, name, k, split_microbatch(host, m, k)))
                else:
                    entries[h].append((stage, name, ONCE, np.asarray(leaf)))
        refs = []
        for h, actor in self.actors.items():
            exported = [self.actors[src].export.remote(names) for src, names in imports[h].items()]
            refs.append(actor.place.remote(entries[h], *exported))
        self.ray.get(refs)

    def step(self, leaves: Sequence[Any], record: bool) -> tuple[list[Any], list[TimelineEvent]]:
        c = self.compiled
        self._place(leaves)
        t0 = time.time()
        timings: list[tuple[Any, Any]] = []
        pending: dict[tuple, Any] = {}
        for ins in c.order:
            actor = self.actors[self.host_of[ins.stage]]
            if ins.op == "run":
                timings.append((ins, actor.run.remote(ins.stage, ins.role, ins.microbatch, record)))
            elif ins.op == "send":
                key, tensors = ins.transfer_key, c.edge(ins).tensors
                if self.host_of[ins.peer] == self.host_of[ins.stage]:
                    timings.append((ins, actor.send_local.remote(key, tensors, record)))
                    pending[key] = None
                else:
                    data, timing = actor.send.options(num_returns=2).remote(key, tensors, record)
                    pending[key] = data
                    timings.append((ins, timing))
            elif ins.op == "recv":
                ref = pending.pop(ins.transfer_key)
                timings.append((ins, actor.recv.remote(ins.transfer_key, ref, record)))
            else:
                actor.free.remote(ins.stage, ins.microbatch)
        producer = c.flow.producer_map
        mine: dict[int, list[tuple[int, str]]] = {h: [] for h in self.actors}
        for name in c.graph.outputs:
            if name in producer:
                stage = producer[name][0]
                mine[self.host_of[stage]].append((stage, name))
        try:
            self.ray.get([a.finish.remote(mine[h]) for h, a in self.actors.items()])
            results = self.ray.get([ref for _, ref in timings])
        except self.ray.exceptions.RayTaskError as err:
            raise _stage_error(err) from err
        self.step_id += 1
        events = []
        if record:
            for (ins, _), result in zip(timings, results):
                start, end = result
                kind = timeline_kind(ins.role) if ins.op == "run" else ins.op
                events.append(TimelineEvent(ins.stage, ins.microbatch, kind, start - t0, end - t0))
        outs = []
        index = {name: i for i, name in enumerate(c.graph.inputs)}
        for name in c.graph.outputs:
            if name in producer:
                info = c.graph.tensor(name)
                outs.append(RemoteValue(self.host_of[producer[name][0]], name, info.shape, info.dtype,
                                        self.step_id, self))
            elif name in index:
                outs.append(leaves[index[name]])
            else:
                outs.append(c.graph.constants[name])
        return outs, events

    def fetch(self, value: RemoteValue) -> np.ndarray:
        if value.step != self.step_id:
            raise ValueError(f"{value.name!r} is from step {value.step}; the actors keep step {self.step_id} only")
        return self.ray.get(self.actors[value.actor].export.remote([value.name]))[value.name]

    def close(self) -> None:
        for actor in self.actors.values():
            self.ray.kill(actor)
        self.actors = {}


def _stage_error(err: Exception) -> Exception:
    cause = getattr(err, "cause", None)
    if isinstance(cause, StageError):
        return StageError(str(cause))
    return StageError(f"a Ray host actor failed: {err}")
