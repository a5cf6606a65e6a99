"""The Ray engine: one actor per host owns that host's stage meshes; the driver only sends instructions.

The driver ships the step function and `jax.ShapeDtypeStruct`s; every actor
(`_host_actor`) re-traces the step itself (jaxprs do not pickle) and checks
that it got the same graph.  Tensors cross hosts through the chosen
transport (`_transport`: XLA inside one JAX world by default).  The driver
submits every instruction in the schedule's one global order; Ray runs each
actor's calls in the order submitted, so the two halves of every transfer
meet and no schedule deadlocks.  Results stay in the actors between steps:
the step returns `RemoteValue` handles, which the next call accepts as
inputs without moving them, and `ParallelStep.fetch` brings to the host.

Ray starts only when a user builds a step with `engine="ray"`.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

import jax
import numpy as np

from alpaviz.core.graph import split_microbatch
from alpaviz.core.plan import graph_fingerprint, ONCE, Plan, timeline_kind, TimelineEvent
from alpaviz.core.runtime._cross_mesh import boundary_bytes
from alpaviz.core.runtime._host_actor import HostActor
from alpaviz.core.runtime._stage_runner import StageError, entering_spec
from alpaviz.core.runtime._transport import Transfer, check_transport_name, expecting_hosts


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


def actor_platform(actor_options: dict[str, Any] | None) -> str:
    """"gpu" when the host actors ask Ray for GPUs (`num_gpus`, or `JAX_PLATFORMS` cuda/gpu in their
    runtime_env), else "cpu" (virtual CPU devices, gloo)."""
    options = actor_options or {}
    env = (options.get("runtime_env") or {}).get("env_vars") or {}
    wants = env.get("JAX_PLATFORMS", "").split(",")[0].strip().lower()
    if wants in ("cuda", "gpu", "rocm") or (options.get("num_gpus") or 0) > 0:
        if wants == "cpu":
            raise ValueError("actor_options ask Ray for GPUs but set JAX_PLATFORMS=cpu in the actors' runtime_env; "
                             "drop one of the two")
        return "gpu"
    return "cpu"


class RayEngine:
    """Drives one `HostActor` per host of the plan's cluster through the instruction order.

    `transport` moves tensors between hosts (`_transport`); `tile_once=False`
    sends each receiving device its own tile instead (to measure what
    tile-once saves); `actor_options` go to each host actor (`ray.remote`).
    A transfer that does not arrive within
    `transfer_timeout_s`, or a step that does not finish within
    `step_timeout_s`, raises `StageError` saying what was waited for.
    """

    def __init__(self, plan: Plan, compiled, train_step, args, batch_argnums, donate, compiler_options=None,
                 *, address: str | None = None, transport: str = "xla", tile_once: bool = True,
                 transfer_timeout_s: int = 120, step_timeout_s: float = 600.0,
                 init_kwargs: dict[str, Any] | None = None, actor_options: dict[str, Any] | None = None) -> None:
        self.transport = check_transport_name(transport)  # the hosts check what their backend needs (NCCL: cupy, a GPU)
        if compiled.graph.input_parts or compiled.graph.output_parts:
            raise ValueError(
                f"the step scans over stacked layer parameters ({compiled.graph.input_parts[0][0]}, ...), which the "
                f"Ray engine cannot yet cut into per-stage slices; use engine='local'"
            )
        if compiled.generated or compiled.whole:
            made = compiled.generated or compiled.whole
            raise ValueError(
                f"the step needs values made once per step at the global batch ({', '.join(made[:3])}: batch-shaped "
                f"random draws, or sums over the batch such as a token count) that the Ray engine cannot yet make; "
                f"use engine='local', or num_microbatches=1"
            )
        try:
            import ray  # lazy: Ray is heavy and starts only for engine="ray"
        except ImportError:
            raise ValueError("engine='ray' needs Ray (pip install ray); or use engine='local'") from None
        self.ray = ray
        self.plan = plan
        self.compiled = compiled
        self.tile_once = tile_once
        self.step_timeout_s = step_timeout_s
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
        hosts = sorted(set(self.host_of))
        self.listen: list[str] = []  # where each host's cross-host transfer socket listens ("xla")
        self._transfers: dict[tuple, Transfer] = {}  # per cross-host edge (a transfer key less its microbatch)
        # e.g. actor_options={"num_gpus": 1}: each host actor gets its GPUs (Ray hides GPUs not asked for)
        actor_cls = ray.remote(**{"num_cpus": 1, "max_restarts": 0, **(actor_options or {})})(HostActor)
        self.platform = actor_platform(actor_options)
        self.actors = {h: actor_cls.remote(h, per_host, self.platform) for h in hosts}
        # Plan device id -> index in the JAX world's device list (processes in host order, each its devices).
        rank = {h: i for i, h in enumerate(hosts)}
        self._world = {d: rank[d // per_host] * per_host + d % per_host
                       for s in plan.stages for d in s.device_ids}
        try:
            self._start(plan, compiled, train_step, args, batch_argnums, donate, compiler_options, hosts, rank,
                        transfer_timeout_s)
        except BaseException:
            self.close()  # no actor outlives a failed start
            raise

    def _start(self, plan, compiled, train_step, args, batch_argnums, donate, compiler_options, hosts, rank,
               transfer_timeout_s) -> None:
        """Join the actors' JAX world (transport "xla"), set up each host's stages, and NCCL if chosen."""
        ray, per_host = self.ray, plan.cluster.devices_per_host
        if self.transport == "xla":
            coordinator = ray.get(self.actors[hosts[0]].coordinator_address.remote())
            self.listen = self._gather([self.actors[h].join.remote(coordinator, len(hosts), rank[h], transfer_timeout_s)
                                        for h in hosts], timeout=120)
        options: dict[int, dict] = {h: {} for h in hosts}
        if self.transport == "nccl":
            nccl_id = self._gather([self.actors[hosts[0]].nccl_unique_id.remote()], timeout=120)[0]
            options = {h: {"nccl_id": nccl_id, "world_size": len(hosts) * per_host, "first_rank": rank[h] * per_host}
                       for h in hosts}
        self.hardware = (f"Ray: {len(hosts)} host actors x {per_host} {self.platform.upper()} devices, "
                         f"transport {self.transport}")
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), jax.numpy.result_type(x)), tuple(args))
        expected = graph_fingerprint(compiled.graph)
        self._gather([
            actor.setup.remote(train_step, plan.to_json(), abstract, tuple(batch_argnums), donate,
                               compiler_options, [s.index for s in plan.stages if self.host_of[s.index] == h],
                               expected, compiled.loss_reduction, self.transport, options[h])
            for h, actor in self.actors.items()
        ], timeout=self.step_timeout_s)
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

    # ---- what crosses hosts ----------------------------------------------------------
    def transfer(self, key: tuple, tensors: Sequence[str]) -> Transfer:
        """What a cross-host SEND along `key` moves, in the terms every actor computes its layout from
        (worked out once per edge; each microbatch only changes the key)."""
        edge = self._transfers.get(key[:4])
        if edge is None:
            src, dst = self.plan.stages[key[0]], self.plan.stages[key[2]]
            graph, aliases, specs = self.compiled.graph, dict(self.compiled.aliases), dict(dst.partition_specs)
            infos = [graph.tensor(t) for t in tensors]
            edge = self._transfers[key[:4]] = Transfer(
                key=key, tensors=tuple(tensors), shapes=tuple(tuple(i.shape) for i in infos),
                dtypes=tuple(str(i.dtype) for i in infos),
                src_devices=tuple(self._world[d] for d in src.device_ids),
                dst_devices=tuple(self._world[d] for d in dst.device_ids),
                dst_mesh_shape=tuple(dst.logical_mesh),
                dst_specs=tuple(entering_spec(specs, t, aliases) for t in tensors), tile_once=self.tile_once,
            )
        return edge if edge.key == key else dataclasses.replace(edge, key=key)

    def crossing_bytes(self, tile_once: bool | None = None) -> int:
        """Bytes that cross a host boundary in one step: each tensor once (tile-once, and the object store,
        which gathers it whole), or once per receiving device that holds its tile (`tile_once=False`)."""
        tile_once = self.tile_once if tile_once is None else tile_once
        if self.transport == "object_store":
            tile_once = True
        c, total = self.compiled, 0
        for ins in c.order:
            if ins.op == "send" and self.host_of[ins.peer] != self.host_of[ins.stage]:
                t = self.transfer(ins.transfer_key, c.edge(ins).tensors)
                for name, spec in zip(t.tensors, t.dst_specs):
                    total += boundary_bytes(c.graph.tensor(name).nbytes, spec, t.dst_mesh_shape,
                                            tile_once or not t.direct)
        return total

    # ---- running -------------------------------------------------------------------------
    def _gather(self, refs: Sequence[Any], timeout: float) -> list[Any]:
        """Results of `refs`, failing on the first error (not after the slowest), within `timeout`."""
        ray = self.ray
        pending, deadline = list(refs), time.monotonic() + timeout
        while pending:
            left = deadline - time.monotonic()
            ready, pending = ray.wait(pending, num_returns=1, timeout=max(left, 0))
            if not ready:
                raise StageError(
                    f"the step did not finish within {timeout:.0f} s ({len(pending)} instructions still "
                    f"waiting); a host actor may be stuck in a transfer: raise step_timeout_s in ray_options, "
                    f"or use transport='object_store'"
                )
            try:
                ray.get(ready)
            except ray.exceptions.RayTaskError as err:
                raise _stage_error(err) from err
            except ray.exceptions.RayActorError as err:
                raise self._actor_died(err) from err
        return ray.get(list(refs))

    def _actor_died(self, err: Exception) -> StageError:
        dead = [h for h, a in self.actors.items() if _is_dead(self.ray, a)]
        which = ", ".join(f"host {h} (stages {[s for s, x in enumerate(self.host_of) if x == h]})" for h in dead)
        self.close()
        return StageError(
            f"the Ray actor of {which or 'a host'} died during step {self.step_id}: {str(err).splitlines()[0]}. "
            f"The parameters you passed are untouched (the driver holds them); build the step again with "
            f"av.parallelize(..., engine='ray') and rerun it"
        )

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
        self._gather(refs, self.step_timeout_s)

    def step(self, leaves: Sequence[Any], record: bool) -> tuple[list[Any], list[TimelineEvent]]:
        if not self.actors:
            raise StageError("this Ray step was closed (or lost an actor); build it again with av.parallelize")
        c = self.compiled
        self._place(leaves)
        t0 = time.time()
        timings: list[tuple[Any, Any]] = []
        pending: dict[tuple, tuple[Transfer | None, Any]] = {}
        for ins in c.order:
            actor = self.actors[self.host_of[ins.stage]]
            if ins.op == "run":
                timings.append((ins, actor.run.remote(ins.stage, ins.role, ins.microbatch, record)))
            elif ins.op == "send":
                key, tensors = ins.transfer_key, c.edge(ins).tensors
                if self.host_of[ins.peer] == self.host_of[ins.stage]:
                    timings.append((ins, actor.send_local.remote(key, tensors, record)))
                    pending[key] = (None, None)
                    continue
                transfer = self.transfer(key, tensors)
                payload, timing = actor.send.options(num_returns=2).remote(transfer, record)
                timings.append((ins, timing))
                pending[key] = (transfer, payload)
                for h in expecting_hosts(self.transport, self.host_of[ins.stage], self.host_of[ins.peer], self.actors):
                    self.actors[h].expect.remote(transfer)
            elif ins.op == "recv":
                transfer, payload = pending.pop(ins.transfer_key)
                timings.append((ins, actor.recv.remote(ins.transfer_key, transfer, payload, record)))
            else:
                actor.free.remote(ins.stage, ins.microbatch)
        results = self._gather([ref for _, ref in timings], self.step_timeout_s)
        producer = c.flow.producer_map
        mine: dict[int, list[tuple[int, str]]] = {h: [] for h in self.actors}
        for name in c.graph.outputs:
            if name in producer:
                stage = producer[name][0]
                mine[self.host_of[stage]].append((stage, name))
        self._gather([a.finish.remote(mine[h]) for h, a in self.actors.items()], self.step_timeout_s)
        self.step_id += 1
        events = []
        if record:
            for (ins, _), result in zip(timings, results):
                start, end = result
                kind = timeline_kind(ins.role) if ins.op == "run" else ins.op
                events.append(TimelineEvent(c.plan.submesh_of(ins.stage), ins.microbatch, kind, start - t0, end - t0,
                                            c.plan.chunk_of(ins.stage)))
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
        return self._gather([self.actors[value.actor].export.remote([value.name])], self.step_timeout_s)[0][value.name]

    def close(self) -> None:
        for actor in self.actors.values():
            self.ray.kill(actor)
        self.actors = {}


def _is_dead(ray: Any, actor: Any) -> bool:
    try:
        ray.get(actor.num_devices.remote(), timeout=5)
        return False
    except Exception:
        return True


def _stage_error(err: Exception) -> Exception:
    cause = getattr(err, "cause", None)
    if isinstance(cause, StageError):
        return StageError(str(cause))
    if cause is not None:
        return StageError(f"a Ray host actor failed: {type(cause).__name__}: {cause}")
    return StageError(f"a Ray host actor failed: {err}")
