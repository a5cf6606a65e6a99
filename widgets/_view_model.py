"""The editor's view model: frozen plain data derived from a plan and its graph.

Nothing here imports a widget or plotting library, so every view can be
unit-tested as data; `_figures.py` draws it and `_editor.py` / `_app.py`
wire it to widgets.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterable, Literal, Sequence

from alpaviz.core import MemoryBreakdown, OpGraph, Pins, Plan, Spec, Timeline, shard_shape, spec_name

CutPin = Literal["cut", "no_cut"] | None
GraphLevel = Literal["layer", "op"]


# ---- operator graph -------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class GraphNodeView:
    """One drawn node: a layer (layer level) or an operator (op level)."""

    key: str
    label: str
    stage: int
    flops: float
    x: float
    y: float
    hover: str


@dataclasses.dataclass(frozen=True)
class GraphView:
    """A laid-out DAG; `edges` index into `nodes`."""

    level: GraphLevel
    nodes: tuple[GraphNodeView, ...]
    edges: tuple[tuple[int, int], ...]
    truncated: int = 0  # operators left out to keep the figure readable


def _fmt_flops(flops: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if flops >= scale:
            return f"{flops / scale:.3g} {unit}FLOP"
    return f"{flops:.3g} FLOP"


def _stage_of_layer(plan: Plan) -> dict[int, int]:
    return {layer: stage.index for stage in plan.stages for layer in stage.layers}


def layer_graph_view(graph: OpGraph, plan: Plan) -> GraphView:
    """Layers as nodes in a row, an edge wherever a tensor crosses between two layers."""
    stage_of = _stage_of_layer(plan)
    producer_layer = {t: node.layer for node in graph.nodes for t in node.outputs}
    counts = [0] * graph.num_layers
    for node in graph.nodes:
        counts[node.layer] += 1
    flops = graph.layer_flops()
    # Loops that stay one operator (a scan over time, a while loop) are shown with the reason.
    blocks: dict[int, list[str]] = {}
    for node in graph.nodes:
        if node.primitive in ("scan", "while", "cond") and node.note:
            blocks.setdefault(node.layer, []).append(f"{node.name}: {node.note}")
    nodes = tuple(
        GraphNodeView(
            key=f"layer{i}", label=f"L{i}", stage=stage_of.get(i, 0), flops=flops[i], x=float(i), y=0.0,
            hover=(f"layer {i} (stage {stage_of.get(i, 0)})<br>{counts[i]} operators<br>{_fmt_flops(flops[i])}"
                   + "".join(f"<br>one block: {b}" for b in blocks.get(i, ()))),
        )
        for i in range(graph.num_layers)
    )
    edges = sorted({
        (producer_layer[t], node.layer)
        for node in graph.nodes for t in node.inputs
        if t in producer_layer and producer_layer[t] != node.layer
    })
    return GraphView("layer", nodes, tuple(edges))


def _op_hover(graph: OpGraph, plan: Plan, name: str) -> str:
    node = graph.node(name)
    shapes = lambda names: ", ".join(  # noqa: E731
        f"{graph.tensor(t).shape}" for t in names if t in graph.tensor_by_name
    )
    strategy = plan.strategies.get(name, "(solver default)")
    stage = plan.stage_of_layer(node.layer) if plan.stages else None
    device = plan.cluster.device
    seconds = plan.cost_model.op_time(node.primitive, node.flops, node.bytes_read + node.bytes_written, device,
                                      graph.operand_dtype(node))
    if stage is not None:
        seconds /= len(stage.device_ids)
    return (
        f"{name} [{node.primitive}, {node.role}]<br>in: {shapes(node.inputs)}<br>out: {shapes(node.outputs)}"
        f"<br>strategy: {strategy}<br>{_fmt_flops(node.flops)}, ~{seconds * 1e6:.3g} us compute per device"
        + (f"<br>{node.note}" if node.note else "")
    )


def op_graph_view(
    graph: OpGraph, plan: Plan, layers: Iterable[int] | None = None, max_nodes: int = 400
) -> GraphView:
    """Operators of `layers` (all when None) in a layered layout by topological generation.

    A GPT has thousands of operators, so at most `max_nodes` (the costliest
    first, kept in program order) are drawn and `truncated` says how many not.
    """
    import networkx as nx

    wanted = set(range(graph.num_layers) if layers is None else layers)
    chosen = [n for n in graph.nodes if n.layer in wanted]
    truncated = max(0, len(chosen) - max_nodes)
    if truncated:
        keep = {n.name for n in sorted(chosen, key=lambda n: -n.flops)[:max_nodes]}
        chosen = [n for n in chosen if n.name in keep]
    names = [n.name for n in chosen]
    index = {name: i for i, name in enumerate(names)}
    producer = {t: n.name for n in chosen for t in n.outputs}
    edges = sorted({
        (index[producer[t]], index[n.name]) for n in chosen for t in n.inputs if t in producer
    })
    dag = nx.DiGraph()
    dag.add_nodes_from(range(len(names)))
    dag.add_edges_from(edges)
    for depth, generation in enumerate(nx.topological_generations(dag)):
        for i in generation:
            dag.nodes[i]["depth"] = depth
    positions = nx.multipartite_layout(dag, subset_key="depth") if names else {}
    stage_of = _stage_of_layer(plan)
    nodes = tuple(
        GraphNodeView(
            key=n.name, label=n.primitive, stage=stage_of.get(n.layer, 0), flops=n.flops,
            x=float(positions[i][0]), y=float(positions[i][1]), hover=_op_hover(graph, plan, n.name),
        )
        for i, n in enumerate(chosen)
    )
    return GraphView("op", nodes, tuple(edges), truncated)


def node_size(flops: float, max_flops: float, smallest: float = 6.0, largest: float = 40.0) -> float:
    """Marker size growing with the square root of FLOPs, so area tracks work."""
    if max_flops <= 0:
        return smallest
    return smallest + (largest - smallest) * math.sqrt(max(flops, 0.0) / max_flops)


# ---- stage cuts and submeshes --------------------------------------------
@dataclasses.dataclass(frozen=True)
class CutSlot:
    """The gap before `layer`: whether the plan cuts there and how it is pinned."""

    layer: int
    is_cut: bool
    pinned: CutPin

    @property
    def label(self) -> str:
        mark = {"cut": "pinned cut", "no_cut": "no cut"}.get(self.pinned or "", "cut" if self.is_cut else "·")
        return f"{self.layer - 1}|{self.layer} {mark}"


@dataclasses.dataclass(frozen=True)
class StageBand:
    """One stage as drawn in the stage row, with the submesh choices it offers."""

    index: int
    layer_start: int
    layer_stop: int
    submesh: tuple[int, int]
    logical_mesh: tuple[int, int]
    device_ids: tuple[int, ...]
    pinned_submesh: tuple[int, int] | None
    submesh_options: tuple[tuple[tuple[int, int], tuple[int, int]], ...]
    remat: bool = False
    pinned_remat: bool | None = None

    @property
    def label(self) -> str:
        return (
            f"stage {self.index}: layers {self.layer_start}-{self.layer_stop - 1} on "
            f"{self.submesh[0]}x{self.submesh[1]} (logical {self.logical_mesh[0]}x{self.logical_mesh[1]})"
            + (", forward recomputed in the backward" if self.remat else "")
        )


def cut_slots(plan: Plan, pins: Pins) -> tuple[CutSlot, ...]:
    cuts, pinned, forbidden = set(plan.stage_cuts), set(pins.stage_cuts), set(pins.forbidden_cuts)
    return tuple(
        CutSlot(layer, layer in cuts, "cut" if layer in pinned else "no_cut" if layer in forbidden else None)
        for layer in range(1, len(plan.layers))
    )


def stage_bands(plan: Plan, pins: Pins) -> tuple[StageBand, ...]:
    cluster = plan.cluster
    options = tuple(
        (submesh, logical) for submesh in cluster.submesh_shapes() for logical in cluster.logical_shapes(submesh)
    )
    return tuple(
        StageBand(
            s.index, s.layer_start, s.layer_stop, s.submesh, s.logical_mesh, s.device_ids,
            pins.submesh_map.get(s.index), options, s.remat, pins.remat_map.get(s.index),
        )
        for s in plan.stages
    )


# The remat control's choices: label -> pinned value (None: the solver decides).
REMAT_CHOICES = {"(solver's choice)": None, "recompute forward": True, "keep activations": False}


def submesh_option_label(submesh: tuple[int, int], logical: tuple[int, int]) -> str:
    return f"{submesh[0]}x{submesh[1]} as {logical[0]}x{logical[1]}"


# ---- sharding -------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class DeviceBlock:
    """Which block of a tensor one device holds: its mesh coordinate and a slice per dim."""

    device_id: int
    coord: tuple[int, int]
    slices: tuple[tuple[int, int], ...]

    @property
    def label(self) -> str:
        body = ", ".join(f"{a}:{b}" for a, b in self.slices)
        return f"dev {self.device_id} [{body}]"


@dataclasses.dataclass(frozen=True)
class ShardingRow:
    """One tensor's spec in one stage; the per-device blocks are worked out only when drawn."""

    tensor: str
    stage: int
    shape: tuple[int, ...]
    spec: Spec
    name: str
    mesh_shape: tuple[int, int]
    device_ids: tuple[int, ...]
    pinned: bool

    @property
    def partition_spec(self) -> str:
        """The spec as `jax.sharding.PartitionSpec` prints it, e.g. "P('x', None)"."""
        dims = ["None" if not axes else repr(axes[0]) if len(axes) == 1 else repr(tuple(axes)) for axes in self.spec]
        return f"P({', '.join(dims)})"

    @property
    def shard_shape(self) -> tuple[int, ...]:
        """The per-device block shape, () when the spec does not divide the tensor."""
        try:
            return shard_shape(self.shape, self.spec, self.mesh_shape)
        except ValueError:
            return ()

    @property
    def blocks(self) -> tuple[DeviceBlock, ...]:
        try:
            return device_blocks(self.shape, self.spec, self.mesh_shape, self.device_ids)
        except ValueError:
            return ()


@dataclasses.dataclass(frozen=True)
class StrategyRow:
    """One operator's chosen strategy, the alternatives and whether it is pinned."""

    node: str
    primitive: str
    stage: int
    strategy: str
    options: tuple[str, ...]
    pinned: str | None  # the pinned strategy (the plan shows it only after a re-solve)


def device_blocks(
    shape: Sequence[int], spec: Spec, mesh_shape: tuple[int, int], device_ids: Sequence[int],
    axis_names: Sequence[str] = ("x", "y"),
) -> tuple[DeviceBlock, ...]:
    """The block of `shape` each device of a row-major logical mesh holds under `spec`."""
    block = shard_shape(shape, spec, mesh_shape, axis_names)
    sizes = dict(zip(axis_names, mesh_shape))
    out = []
    for flat, device in enumerate(device_ids):
        coord = (flat // mesh_shape[1], flat % mesh_shape[1])
        where = dict(zip(axis_names, coord))
        slices = []
        for dim_block, axes in zip(block, spec):
            k = 0
            for axis in axes:  # mixed radix: the first axis is the most significant
                k = k * sizes[axis] + where[axis]
            slices.append((k * dim_block, (k + 1) * dim_block))
        out.append(DeviceBlock(device, coord, tuple(slices)))
    return tuple(out)


def sharding_rows(graph: OpGraph, plan: Plan, pins: Pins, inputs_only: bool = False) -> tuple[ShardingRow, ...]:
    """A row per (stage, tensor) with a partition spec in the plan, parameters first.

    `inputs_only` keeps the graph inputs (parameters, batch): a GPT's plan
    specs thousands of intermediates, too many for one dropdown.
    """
    rows = []
    pinned = pins.spec_map
    inputs = set(graph.inputs)
    for stage in plan.stages:
        for tensor, spec in stage.partition_specs:
            if inputs_only and tensor not in inputs and tensor not in pinned:
                continue
            shape = graph.tensor(tensor).shape if tensor in graph.tensor_by_name else ()
            rows.append(ShardingRow(tensor, stage.index, tuple(shape), spec, spec_name(spec), stage.logical_mesh,
                                    stage.device_ids, tensor in pinned))
    return tuple(sorted(rows, key=lambda r: (not r.tensor.startswith("params."), r.stage, r.tensor)))


def strategy_rows(graph: OpGraph, plan: Plan, pins: Pins, options_for=None) -> tuple[StrategyRow, ...]:
    """A row per operator with a strategy in the plan; `options_for(node, stage)` lists alternatives."""
    rows = []
    pinned = pins.strategy_map
    for stage in plan.stages:
        for node, strategy in stage.strategies:
            options = tuple(options_for(node, stage)) if options_for else ()
            for extra in (strategy, pinned.get(node)):
                if extra is not None and extra not in options:
                    options = (extra,) + options
            primitive = graph.node(node).primitive if node in graph.node_by_name else "?"
            rows.append(StrategyRow(node, primitive, stage.index, strategy, options, pinned.get(node)))
    order = {n.name: n.index for n in graph.nodes}
    return tuple(sorted(rows, key=lambda r: (r.stage, order.get(r.node, -1))))  # program order


def costliest_operator(graph: OpGraph, rows: Sequence[StrategyRow]) -> str | None:
    """The operator the sharding view opens on: the one with the most FLOPs."""
    known = [r.node for r in rows if r.node in graph.node_by_name]
    return max(known, key=lambda n: graph.node(n).flops, default=None)


# ---- pipeline timeline ----------------------------------------------------
@dataclasses.dataclass(frozen=True)
class GanttBar:
    """One bar of the pipeline chart."""

    stage: int
    microbatch: int
    kind: str
    start_s: float
    end_s: float
    source: str

    @property
    def label(self) -> str:
        return self.kind[0].upper() + (str(self.microbatch) if self.microbatch >= 0 else "")


def gantt_bars(timeline: Timeline | None) -> tuple[GanttBar, ...]:
    if timeline is None:
        return ()
    return tuple(
        GanttBar(e.stage, e.microbatch, e.kind, e.start_s, e.end_s, timeline.source)
        for e in sorted(timeline.events, key=lambda e: (e.stage, e.start_s))
        if e.kind in ("forward", "backward", "update")
    )


# ---- cost panel -----------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class CostView:
    """Step time, its breakdown, memory per device against the limit, and the change."""

    step_time_s: float
    breakdown: tuple[tuple[str, float], ...]
    memory_per_stage: tuple[tuple[int, float], ...]
    memory_limit_bytes: float
    previous_step_time_s: float | None
    solver_status: str
    # per stage: (part, bytes per device) for parameters, optimizer state, gradients, activations, temporaries
    memory_parts: tuple[tuple[int, tuple[tuple[str, float], ...]], ...] = ()

    @property
    def delta_s(self) -> float | None:
        return None if self.previous_step_time_s is None else self.step_time_s - self.previous_step_time_s

    @property
    def headline(self) -> str:
        text = f"step {self.step_time_s * 1e3:.3f} ms"
        if self.delta_s is not None and self.previous_step_time_s:
            pct = 100 * self.delta_s / self.previous_step_time_s
            text += f" ({self.delta_s * 1e3:+.3f} ms, {pct:+.1f}% vs previous plan)"
        return text

    @property
    def over_memory(self) -> tuple[int, ...]:
        return tuple(s for s, m in self.memory_per_stage if m > self.memory_limit_bytes)


def cost_view(plan: Plan, previous: Plan | None = None) -> CostView:
    p = plan.predicted
    breakdown = (
        ("compute", p.compute_s), ("communication", p.communication_s + p.cross_stage_s),
        ("resharding", p.resharding_s), ("bubble", p.bubble_s),
    )
    return CostView(
        p.step_time_s, breakdown, tuple((s.index, s.cost.memory_bytes) for s in plan.stages),
        p.memory_limit_bytes, None if previous is None else previous.predicted.step_time_s, plan.solver.status,
        tuple((s.index, memory_parts(s.cost.memory)) for s in plan.stages),
    )


MEMORY_PARTS = ("parameters", "optimizer state", "gradients", "activations in flight", "temporaries")


def memory_parts(memory: MemoryBreakdown) -> tuple[tuple[str, float], ...]:
    """A stage's peak split as the memory chart stacks it (activations times the microbatches in flight)."""
    values = (memory.params, memory.optimizer_state, memory.gradients, memory.in_flight * memory.activations,
              memory.temporaries)
    return tuple(zip(MEMORY_PARTS, values))


def byte_unit(largest: float) -> tuple[str, float]:
    """The binary unit in which `largest` reads as a number from 1 to 1023 (B, KiB, MiB, GiB, TiB)."""
    for name, size in (("TiB", 2.0**40), ("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10)):
        if largest >= size:
            return name, size
    return "B", 1.0


def plan_headline(plan: Plan) -> str:
    """One line naming the stages and cuts: what the browser test reads back."""
    cuts = ", ".join(map(str, plan.stage_cuts)) or "none"
    meshes = "; ".join(f"{s.submesh[0]}x{s.submesh[1]}" for s in plan.stages)
    return f"{plan.num_stages} stages, cuts at layers: {cuts} (submeshes {meshes})"


# ---- cluster map -------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class DeviceCell:
    """One device of the cluster: where it sits, which stage runs on it and where on that stage's mesh."""

    device: int
    host: int
    slot: int
    stage: int | None
    coordinate: tuple[int, int] | None  # (row, column) on the stage's logical mesh

    @property
    def label(self) -> str:
        if self.stage is None:
            return f"d{self.device}<br>idle"
        r, c = self.coordinate or (0, 0)
        return f"d{self.device}<br>S{self.stage} ({r},{c})"


@dataclasses.dataclass(frozen=True)
class StageTransfer:
    """What one stage sends another per microbatch (forward activations, backward gradients) or per step."""

    src: int
    dst: int
    kind: str  # "forward", "backward" or "update"
    nbytes: float
    seconds: float
    inter_host: bool

    @property
    def label(self) -> str:
        unit, size = byte_unit(max(self.nbytes, 1.0))
        where = "across hosts" if self.inter_host else "inside a host"
        each = "per step" if self.kind == "update" else "per microbatch"
        return (f"S{self.src}→S{self.dst} {self.kind}: {self.nbytes / size:.3g} {unit} {each}, "
                f"{self.seconds * 1e3:.3g} ms {where}")


@dataclasses.dataclass(frozen=True)
class ClusterMap:
    """Hosts x devices coloured by stage, and the transfers between stages."""

    num_hosts: int
    devices_per_host: int
    cells: tuple[DeviceCell, ...]
    transfers: tuple[StageTransfer, ...]


def cluster_map(graph: OpGraph, plan: Plan) -> ClusterMap:
    """Which device runs which stage (and at which logical coordinate), and what crosses each boundary."""
    cluster = plan.cluster
    per_host = cluster.devices_per_host
    placed: dict[int, tuple[int, tuple[int, int]]] = {}
    for stage in plan.stages:
        rows, cols = stage.logical_mesh
        for i, device in enumerate(stage.device_ids):
            placed[device] = (stage.index, (i // cols, i % cols))
    cells = tuple(
        DeviceCell(d, d // per_host, d % per_host, *(placed.get(d, (None, None))))
        for d in range(cluster.num_devices)
    )
    stage_of_layer = {layer: s.index for s in plan.stages for layer in s.layers}
    stage_of = {n: stage_of_layer[layer.index] for layer in plan.layers for n in layer.nodes}
    moved: dict[tuple[int, int, str], float] = {}
    for tensor in graph.tensors:
        producer = tensor.producer
        if producer is None or producer not in stage_of:
            continue
        src, role = stage_of[producer], graph.node(producer).role
        targets = {(stage_of[c], graph.node(c).role) for c in graph.consumers.get(tensor.name, ()) if c in stage_of}
        for dst, reader in targets:
            if dst == src:
                continue
            kind = "update" if "update" in (role, reader) else role
            moved[(src, dst, kind)] = moved.get((src, dst, kind), 0.0) + tensor.nbytes
    hosts = {s.index: {d // per_host for d in s.device_ids} for s in plan.stages}
    transfers = []
    for (src, dst, kind), nbytes in sorted(moved.items()):
        inter = hosts[src] != hosts[dst] or len(hosts[src]) > 1
        link = cluster.inter_host if inter and cluster.num_hosts > 1 else cluster.intra_host
        transfers.append(StageTransfer(src, dst, kind, nbytes, plan.cost_model.send_recv(nbytes, link),
                                       inter and cluster.num_hosts > 1))
    return ClusterMap(cluster.num_hosts, per_host, cells, tuple(transfers))


# ---- what changed after a re-solve --------------------------------------------
@dataclasses.dataclass(frozen=True)
class PlanChange:
    """One line of a plan diff: what, before, after."""

    what: str
    before: str
    after: str


def _stage_text(stage) -> str:
    text = (f"layers {stage.layer_start}-{stage.layer_stop - 1} on {stage.submesh[0]}x{stage.submesh[1]} "
            f"as {stage.logical_mesh[0]}x{stage.logical_mesh[1]}")
    return text + (", recomputes" if stage.remat else "")


def _bytes_text(nbytes: float) -> str:
    unit, size = byte_unit(max(nbytes, 1.0))
    return f"{nbytes / size:.3g} {unit}"


def plan_diff(before: Plan, after: Plan) -> tuple[PlanChange, ...]:
    """What a re-solve changed: step time, memory, microbatches, stages and meshes, strategies."""
    changes = []
    b, a = before.predicted, after.predicted
    if b.step_time_s != a.step_time_s:
        pct = 100 * (a.step_time_s - b.step_time_s) / b.step_time_s if b.step_time_s else 0.0
        changes.append(PlanChange("step time", f"{b.step_time_s * 1e3:.4g} ms",
                                  f"{a.step_time_s * 1e3:.4g} ms ({pct:+.1f}%)"))
    if b.max_memory_bytes != a.max_memory_bytes:
        changes.append(PlanChange("peak memory per device", _bytes_text(b.max_memory_bytes),
                                  _bytes_text(a.max_memory_bytes)))
    if before.schedule != after.schedule:
        changes.append(PlanChange("schedule", f"{before.schedule.kind} x {before.schedule.num_microbatches}",
                                  f"{after.schedule.kind} x {after.schedule.num_microbatches}"))
    if before.stage_cuts != after.stage_cuts:
        changes.append(PlanChange("cuts before layers", ", ".join(map(str, before.stage_cuts)) or "none",
                                  ", ".join(map(str, after.stage_cuts)) or "none"))
    for i in range(max(before.num_stages, after.num_stages)):
        old = _stage_text(before.stages[i]) if i < before.num_stages else "-"
        new = _stage_text(after.stages[i]) if i < after.num_stages else "-"
        if old != new:
            changes.append(PlanChange(f"stage {i}", old, new))
    old_strategies = {n: s for stage in before.stages for n, s in stage.strategies}
    new_strategies = {n: s for stage in after.stages for n, s in stage.strategies}
    moved = sorted(n for n in old_strategies.keys() & new_strategies.keys() if old_strategies[n] != new_strategies[n])
    if moved:
        shown = ", ".join(f"{n}: {old_strategies[n]} -> {new_strategies[n]}" for n in moved[:3])
        more = f" and {len(moved) - 3} more" if len(moved) > 3 else ""
        changes.append(PlanChange("operator strategies", f"{len(moved)} changed", shown + more))
    return tuple(changes)


def plan_diff_html(changes: Sequence[PlanChange]) -> str:
    """The diff as a small table (or a sentence when nothing changed)."""
    import html

    if not changes:
        return "<i>the re-solve kept the same plan</i>"
    rows = "".join(f"<tr><td>{html.escape(c.what)}</td><td>{html.escape(c.before)}</td>"
                   f"<td>{html.escape(c.after)}</td></tr>" for c in changes)
    return ("<table style='border-collapse:collapse'><tr><th align=left>changed</th><th align=left>before</th>"
            f"<th align=left>after</th></tr>{rows}</table>")


# ---- why this plan: the alternatives side by side -------------------------------
@dataclasses.dataclass(frozen=True)
class ComparisonRow:
    """One plan's step split the same way as the others', or why it has none."""

    name: str
    step_s: float | None
    parts: tuple[tuple[str, float], ...] = ()
    peak_memory_bytes: float = 0.0
    stages: str = ""
    reason: str = ""


def comparison_rows(entries: Sequence[tuple[str, Plan | str]]) -> tuple[ComparisonRow, ...]:
    rows = []
    for name, plan in entries:
        if isinstance(plan, str):
            rows.append(ComparisonRow(name, None, reason=plan))
            continue
        p = plan.predicted
        parts = (("compute", p.compute_s), ("communication", p.communication_s), ("resharding", p.resharding_s),
                 ("cross-stage", p.cross_stage_s), ("bubble", p.bubble_s))
        stages = "; ".join(_stage_text(s) for s in plan.stages)
        rows.append(ComparisonRow(name, p.step_time_s, parts, p.max_memory_bytes, stages))
    return tuple(rows)


def comparison_html(rows: Sequence[ComparisonRow]) -> str:
    """A table: step time and its parts in ms, peak memory, the ratio to the fastest, the stages."""
    import html

    if not rows:
        return "<i>press Compare to price the Megatron grid and data parallelism beside this plan</i>"
    best = min((r.step_s for r in rows if r.step_s is not None), default=None)
    names = [n for n, _ in next((r.parts for r in rows if r.parts), ())]
    head = "".join(f"<th>{html.escape(n)} ms</th>" for n in names)
    body = ""
    for r in rows:
        if r.step_s is None:
            body += (f"<tr><td>{html.escape(r.name)}</td><td colspan={len(names) + 4}>"
                     f"{html.escape(r.reason)}</td></tr>")
            continue
        cells = "".join(f"<td>{v * 1e3:.4g}</td>" for _, v in r.parts)
        body += (f"<tr><td>{html.escape(r.name)}</td><td>{r.step_s * 1e3:.4g}</td><td>{r.step_s / best:.3f}</td>"
                 f"{cells}<td>{html.escape(_bytes_text(r.peak_memory_bytes))}</td>"
                 f"<td>{html.escape(r.stages)}</td></tr>")
    return ("<table style='border-collapse:collapse'><tr><th>plan</th><th>step ms</th><th>vs fastest</th>"
            f"{head}<th>peak memory</th><th>stages</th></tr>{body}</table>")
