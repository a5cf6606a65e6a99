"""Stage profiles: the cost of every layer on every mesh choice, cached by structure.

Profiling is the expensive part of planning (one intra-op ILP per layer and
mesh), so results are kept in an explicit `StageProfileCache` keyed by the
*structure* of a layer's sub-graph (primitives, shapes and wiring, not node
names), the logical mesh and its links, the device, the cost model, the
stage-cost function and the intra-op pins that touch the layer.  The middle
blocks of a GPT are then profiled once per mesh, and re-solving after a pin
reuses everything the pin does not touch.

Approximation: a stage's cost is the sum of its layers' costs on the stage's
mesh plus the transfers that cross its boundaries (`send_recv` of the
activations in, and of the gradients coming back); resharding between two
layers of the same stage is not counted.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Callable, Sequence

import numpy as np

from alpaviz.core.cost import Cluster, CostModel, Link
from alpaviz.core.graph import OpGraph, cut_bytes, state_inputs, step_transfer_bytes
from alpaviz.core.inter_op._profile_cache import StageProfileCache
from alpaviz.core.inter_op._profile_workers import ProfileWorkers
from alpaviz.core.inter_op._stage_cost import StageCostFn
from alpaviz.core.inter_op._stage_dp import MeshChoice, StageCostTable
from alpaviz.core.plan import MemoryBreakdown, Pins, ShardingPlan, Spec

ProgressFn = Callable[[int, int], None]


def mesh_choices(cluster: Cluster, submeshes: Sequence[tuple[int, int]] | None = None) -> tuple[MeshChoice, ...]:
    """Every (submesh, logical shape) pair the DP may pick: Alpa's submesh shapes by default."""
    shapes = cluster.submesh_shapes() if submeshes is None else tuple(submeshes)
    return tuple(MeshChoice(s, shape) for s in shapes for shape in cluster.logical_shapes(s))


@dataclasses.dataclass(frozen=True)
class LayerView:
    """One layer's operators and tensors in a canonical order, and its structural signature."""

    index: int
    nodes: tuple[str, ...]
    tensors: tuple[str, ...]
    signature: str
    flops: float


def layer_views(graph: OpGraph) -> tuple[LayerView, ...]:
    """The layers of `graph`, each with a name-independent signature of its sub-graph."""
    members: list[list[str]] = [[] for _ in range(graph.num_layers)]
    for node in graph.nodes:
        members[node.layer].append(node.name)
    return tuple(_view(graph, i, tuple(names)) for i, names in enumerate(members))


def _view(graph: OpGraph, index: int, names: tuple[str, ...]) -> LayerView:
    inside = set(names)
    position: dict[str, int] = {}
    entries = []
    outputs = set(graph.outputs)
    for name in names:
        node = graph.node(name)
        refs = []
        for t in node.inputs:
            if t not in position:
                position[t] = len(position)
                info = graph.tensor(t)
                entries.append(("in", info.shape, info.dtype, info.kind))
            refs.append(position[t])
        for t in node.outputs:
            position[t] = len(position)
            info = graph.tensor(t)
            leaves = t in outputs or any(c not in inside for c in graph.consumers.get(t, ()))
            entries.append(("out", info.shape, info.dtype, leaves))
        params = node.params
        if node.primitive == "layer_boundary":  # the marker's name differs per layer
            params = tuple(p for p in params if p[0] != "name")
        entries.append((node.role, node.primitive, params, tuple(refs)))
    signature = hashlib.sha256(repr(entries).encode()).hexdigest()[:20]
    flops = float(sum(graph.node(n).flops for n in names))
    return LayerView(index, names, tuple(position), signature, flops)


@dataclasses.dataclass(frozen=True)
class LayerProfile:
    """Cost of one layer on one logical mesh, with its shardings by position in the layer.

    Times are per microbatch (`update_s` per step); `memory` per device,
    with one microbatch in flight.  `step_communication_s` is the part of
    `communication_s` (and of `update_s`) paid once per step.
    """

    forward_s: float
    backward_s: float
    update_s: float
    compute_s: float
    communication_s: float
    resharding_s: float
    memory: MemoryBreakdown
    strategies: tuple[tuple[int, str], ...] = ()
    partition_specs: tuple[tuple[int, Spec], ...] = ()
    resharding_edges: tuple[tuple[int, int, float], ...] = ()  # (node position, tensor position, seconds)
    status: str = "optimal"
    feasible: bool = True
    reason: str = ""
    step_communication_s: float = 0.0
    weight_grad_s: float = 0.0  # the part of `backward_s` zero-bubble schedules may defer (W)

    @property
    def time_s(self) -> float:
        return self.forward_s + self.backward_s

    @property
    def state_bytes(self) -> float:
        return self.memory.state

    @property
    def activation_bytes(self) -> float:
        return self.memory.activations

    @property
    def temp_bytes(self) -> float:
        return self.memory.temporaries

    @classmethod
    def infeasible(cls, reason: str) -> "LayerProfile":
        inf = float("inf")
        return cls(inf, inf, inf, inf, inf, inf, MemoryBreakdown(inf, inf, inf, inf, inf), feasible=False,
                   status="heuristic", reason=reason)

    @classmethod
    def from_sharding(cls, plan: ShardingPlan, view: LayerView) -> "LayerProfile":
        node_pos = {n: i for i, n in enumerate(view.nodes)}
        tensor_pos = {t: i for i, t in enumerate(view.tensors)}
        c = plan.cost
        return cls(
            forward_s=c.forward_s, backward_s=c.backward_s, update_s=c.update_s,
            compute_s=c.compute_s, communication_s=c.communication_s, resharding_s=c.resharding_s,
            memory=c.memory, step_communication_s=c.step_communication_s, weight_grad_s=c.weight_grad_s,
            strategies=tuple((node_pos[n], s) for n, s in plan.strategies if n in node_pos),
            partition_specs=tuple((tensor_pos[t], s) for t, s in plan.partition_specs if t in tensor_pos),
            resharding_edges=tuple((node_pos[n], tensor_pos[t], sec) for n, t, sec in plan.resharding_edges
                                   if n in node_pos and t in tensor_pos),
            status=plan.status,
        )

    def named_strategies(self, view: LayerView) -> tuple[tuple[str, str], ...]:
        return tuple((view.nodes[i], s) for i, s in self.strategies)

    def named_specs(self, view: LayerView) -> tuple[tuple[str, Spec], ...]:
        return tuple((view.tensors[i], s) for i, s in self.partition_specs)

    def named_resharding(self, view: LayerView) -> tuple[tuple[str, str, float], ...]:
        return tuple((view.nodes[n], view.tensors[t], sec) for n, t, sec in self.resharding_edges)


def _layer_pins(pins: Pins, view: LayerView) -> tuple[tuple, Pins]:
    """The intra-op pins touching `view`, positionally (for the key) and by name (for the solver)."""
    nodes = {n: i for i, n in enumerate(view.nodes)}
    tensors = {t: i for i, t in enumerate(view.tensors)}
    strategies = tuple((n, s) for n, s in pins.strategies if n in nodes)
    specs = tuple((t, s) for t, s in pins.partition_specs if t in tensors)
    key = (tuple((nodes[n], s) for n, s in strategies), tuple((tensors[t], s) for t, s in specs))
    return key, Pins(strategies=strategies, partition_specs=specs)


@dataclasses.dataclass(frozen=True)
class ProfileTable:
    """Every layer's profile on every mesh choice, and the bytes crossing each layer boundary."""

    layers: tuple[LayerView, ...]
    meshes: tuple[MeshChoice, ...]
    profiles: tuple[tuple[LayerProfile, ...], ...]  # [layer][mesh]
    forward_cut_bytes: tuple[float, ...]  # [cut] activations sent forward across cut
    backward_cut_bytes: tuple[float, ...]  # [cut] gradients sent back across cut
    step_bytes: np.ndarray  # [reader layer, producer layer] update reads, once per step
    profiled: int = 0  # cost-function calls made (cache misses)
    batch_bytes: float = 0.0  # the step's batch inputs: what a rematerialised first stage keeps per microbatch

    def step_recv_bytes(self, start: int, stop: int) -> float:
        """Bytes the update of layers [start, stop) receives once per step from other stages."""
        inside = self.step_bytes[start:stop]
        return float(inside.sum() - inside[:, start:stop].sum())


def profile_layers(
    graph: OpGraph,
    cluster: Cluster,
    cost_model: CostModel,
    pins: Pins,
    meshes: Sequence[MeshChoice],
    cost_fn: StageCostFn,
    cache: StageProfileCache,
    on_profile: ProgressFn | None = None,
    workers: int | ProfileWorkers = 1,
    num_microbatches: int = 1,
) -> ProfileTable:
    """Profile each distinct (layer structure, intra-op pins) on each mesh for a step of `num_microbatches`.

    The cost function weighs a step's once-per-step terms (update, gradient
    sync) against `num_microbatches` forward and backward passes, so the
    count is part of the cache key.  `workers` > 1 runs the cost function in
    that many spawned processes (worth it when there are dozens of ILPs to
    solve, e.g. GPT-39B); a running `ProfileWorkers` pool is worth it for a few.
    """
    views = layer_views(graph)
    keys, jobs, items = _missing_profiles(views, cluster, cost_model, pins, meshes, cost_fn, cache, num_microbatches)
    context = (cluster, cost_model, cost_fn)
    if isinstance(workers, ProfileWorkers) and (len(items) >= _WORTH_WORKERS * workers.count
                                                or workers.has_pending(jobs)):
        results = workers.profile(graph, _profile_one, context, items, on_profile, keys=list(jobs))
    elif isinstance(workers, int) and workers > 1 and len(items) >= _WORTH_FRESH_WORKERS * workers:
        with ProfileWorkers(workers) as fresh:
            results = fresh.profile(graph, _profile_one, context, items, on_profile)
    else:
        results = []
        for done, item in enumerate(items, start=1):
            results.append(_profile_one(graph, cluster, cost_model, cost_fn, *item))
            if on_profile is not None:
                on_profile(done, len(items))
    for (key, (view, _, _)), plan_or_error in zip(jobs.items(), results):
        cache.put(key, _as_profile(plan_or_error, view))
    profiles = tuple(tuple(cache[key] for key in row) for row in keys)
    forward, backward = cut_bytes(graph)
    state = state_inputs(graph)
    batch = float(sum(graph.tensor(t).nbytes for t in graph.inputs
                      if t not in state and graph.tensor(t).shape))
    return ProfileTable(views, tuple(meshes), profiles, forward, backward, step_transfer_bytes(graph), len(jobs),
                        batch)


def prefetch_profiles(graph: OpGraph, cluster: Cluster, cost_model: CostModel, pins: Pins,
                      meshes: Sequence[MeshChoice], cost_fn: StageCostFn, cache: StageProfileCache,
                      workers: ProfileWorkers, num_microbatches: int = 1) -> int:
    """Start profiling, on `workers` and in the background, what `profile_layers` would profile with these
    arguments; each profile lands in `cache` as it finishes.  Returns how many runs were started."""
    views = layer_views(graph)
    _, jobs, items = _missing_profiles(views, cluster, cost_model, pins, meshes, cost_fn, cache, num_microbatches)

    def store(key: tuple, plan_or_error) -> None:
        cache.put(key, _as_profile(plan_or_error, jobs[key][0]))

    workers.prefetch(graph, _profile_one, (cluster, cost_model, cost_fn), items, list(jobs), store)
    return len(items)


def _missing_profiles(views, cluster, cost_model, pins, meshes, cost_fn, cache, num_microbatches):
    """Every (layer, mesh)'s cache key ([layer][mesh]); the distinct keys the cache lacks, each with its
    layer, intra-op pins and mesh; and, in the same order, the arguments `_profile_one` takes after the context."""
    fn_key = getattr(cost_fn, "cache_key", cost_fn)
    jobs: dict[tuple, tuple[LayerView, Pins, MeshChoice]] = {}
    keys: list[list[tuple]] = []
    for view in views:
        pin_key, layer_pins = _layer_pins(pins, view)
        row = []
        for choice in meshes:
            mesh = cluster.logical_mesh(choice.submesh, choice.logical_shape)
            key = (view.signature, pin_key, choice.logical_shape, mesh.axis_links, mesh.num_hosts, cluster.device,
                   cost_model, fn_key, num_microbatches)
            row.append(key)
            if key not in jobs and cache.get(key) is None:
                jobs[key] = (view, layer_pins, choice)
        keys.append(row)
    items = [(view.nodes, layer_pins, choice, num_microbatches) for view, layer_pins, choice in jobs.values()]
    return keys, jobs, items


def _as_profile(plan_or_error: ShardingPlan | str, view: LayerView) -> LayerProfile:
    if isinstance(plan_or_error, str):
        return LayerProfile.infeasible(plan_or_error)
    return LayerProfile.from_sharding(plan_or_error, view)


# Jobs per process below which profiling in the calling process is faster: a fresh pool pays its
# start-up (~1.5 s a process), a running one only the graph's trip (~0.1 s at GPT-1.3B).
_WORTH_FRESH_WORKERS = 4
_WORTH_WORKERS = 2


def _profile_one(graph, cluster, cost_model, cost_fn, nodes, layer_pins, choice,
                 num_microbatches) -> ShardingPlan | str:
    """One cost-function call; a ValueError (cannot run there) comes back as its message."""
    mesh = cluster.logical_mesh(choice.submesh, choice.logical_shape)
    try:
        return cost_fn(graph, mesh, cluster, cost_model, layer_pins, nodes=nodes, num_microbatches=num_microbatches)
    except ValueError as err:
        return str(err)


def step_link(cluster: Cluster) -> Link:
    """The link once-per-step transfers between stages use (a tied weight's gradient goes from the last
    stage to the first, which sit on different hosts whenever there are several)."""
    return cluster.inter_host if cluster.num_hosts > 1 else cluster.intra_host


def local_gather_s(nbytes: float, mesh: MeshChoice, cluster: Cluster, cost_model: CostModel) -> float:
    """What a receiving mesh spends completing a tensor that crossed hosts once, one slab per device (the
    runtime's boundary layout): it keeps the batch split over its logical x axis, so each device
    all-gathers its x-row's share over y, inside the mesh."""
    rows, cols = mesh.logical_shape
    if cols == 1 or nbytes <= 0:
        return 0.0
    logical = cluster.logical_mesh(mesh.submesh, mesh.logical_shape)
    return cost_model.all_gather(nbytes / rows, logical, 1)


def cut_transfer_times(cut_bytes: Sequence[float], meshes: Sequence[MeshChoice], cluster: Cluster,
                       cost_model: CostModel) -> np.ndarray:
    """[link, cut, receiving mesh]: receiving a cut's tensors inside a host (one device_put to the
    receiver's layout), or across hosts (each byte over the inter-host link once, then the local
    all-gather on the receiving mesh)."""
    out = np.zeros((2, len(cut_bytes), len(meshes)))
    for k, nbytes in enumerate(cut_bytes):
        if nbytes <= 0:
            continue
        out[0, k, :] = cost_model.send_recv(nbytes, cluster.intra_host)
        across = cost_model.send_recv(nbytes, cluster.inter_host)
        out[1, k, :] = [across + local_gather_s(nbytes, m, cluster, cost_model) for m in meshes]
    return out


def profiled_mesh(profiles: ProfileTable, table_mesh: int) -> int:
    """The profile column of a stage cost table's mesh choice: the table lists every mesh twice (keeping
    activations, then recomputing), and both share the mesh's layer profiles."""
    return table_mesh % len(profiles.meshes)


def stage_cost_table(table: ProfileTable, cluster: Cluster, cost_model: CostModel) -> StageCostTable:
    """Sum layer profiles over every layer range; price each cut's transfers on both links."""
    num_layers, num_meshes = len(table.layers), len(table.meshes)

    def grid(field: str) -> np.ndarray:
        values = np.zeros((num_layers, num_meshes))
        for l, row in enumerate(table.profiles):
            for m, p in enumerate(row):
                values[l, m] = getattr(p, field) if p.feasible else 0.0
        return values

    bad = np.array([[not p.feasible for p in row] for row in table.profiles], float).reshape(num_layers, num_meshes)

    def range_sums(values: np.ndarray) -> np.ndarray:
        prefix = np.concatenate([np.zeros((1, num_meshes)), np.cumsum(values, axis=0)])
        return prefix[None, :, :] - prefix[:, None, :]  # [k, j, m] = sum over [k, j)

    def range_maxima(values: np.ndarray) -> np.ndarray:
        out = np.zeros((num_layers + 1, num_layers + 1, num_meshes))
        for k in range(num_layers):
            out[k, k + 1:] = np.maximum.accumulate(values[k:], axis=0)
        return out  # [k, j, m] = max over [k, j)

    blocked = range_sums(bad) > 0
    valid = np.triu(np.ones((num_layers + 1, num_layers + 1), bool), k=1)[:, :, None] & ~blocked
    meshes = table.meshes + tuple(dataclasses.replace(m, remat=True) for m in table.meshes)
    # a recomputing stage receives like the same mesh keeping its activations: price each mesh once
    cut_in = np.tile(cut_transfer_times(table.forward_cut_bytes, table.meshes, cluster, cost_model), (1, 1, 2))
    cut_back = np.tile(cut_transfer_times(table.backward_cut_bytes, table.meshes, cluster, cost_model), (1, 1, 2))
    cut_in[:, 0] = cut_back[:, num_layers] = 0.0
    inf = np.inf

    def finish(values: np.ndarray) -> np.ndarray:
        return np.where(valid, values, inf)

    step_recv = np.zeros((num_layers + 1, num_layers + 1, 1))
    if table.step_bytes.any():
        link = step_link(cluster)
        for k in range(num_layers):
            for j in range(k + 1, num_layers + 1):
                nbytes = table.step_recv_bytes(k, j)
                step_recv[k, j, 0] = cost_model.send_recv(nbytes, link) if nbytes else 0.0
    time = grid("forward_s") + grid("backward_s")
    work = np.where(bad > 0, inf, time * np.array([m.num_devices for m in table.meshes])[None, :]).min(axis=1)
    kept = range_sums(time), range_sums(grid("activation_bytes")), range_maxima(grid("temp_bytes"))
    # Rematerialised: the backward runs the forward again; per microbatch in flight only the stage's
    # input activations stay (split over the data-parallel axis), and one microbatch's activations
    # live while its backward runs.
    entering_bytes = (table.batch_bytes, *table.forward_cut_bytes[1:])
    entering = np.array([[b / m.logical_shape[0] for m in table.meshes] for b in entering_bytes])
    again = (kept[0] + range_sums(grid("forward_s")), np.broadcast_to(entering[:, None, :], kept[1].shape),
             kept[2] + kept[1])
    both = lambda a, b: finish(np.concatenate([a, b], axis=2))  # noqa: E731
    twice = lambda a: both(a, a)  # noqa: E731
    valid = np.concatenate([valid, valid], axis=2)
    return StageCostTable(
        meshes=meshes,
        time_s=both(kept[0], again[0]),
        update_s=twice(range_sums(grid("update_s")) + step_recv),
        state_bytes=twice(range_sums(grid("state_bytes"))),
        activation_bytes=both(kept[1], again[1]),
        temp_bytes=both(kept[2], again[2]),
        layer_work_s=np.where(np.isfinite(work), work, 0.0),
        cut_in_s=cut_in,
        cut_back_s=cut_back,
        devices_per_host=cluster.devices_per_host if cluster.num_hosts > 1 else None,  # one host: no host edge
    )

