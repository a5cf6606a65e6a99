"""The editor's view model: frozen plain data derived from a plan and its graph.

Nothing here imports a widget or plotting library, so every view can be
unit-tested as data; `_figures.py` draws it and `_editor.py` / `_app.py`
wire it to widgets.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Iterable, Literal, Sequence

from alpaviz.core import MemoryBreakdown, OpGraph, Pins, Plan, Spec, shard_shape, spec_name
from alpaviz.core.graph import user_scope
from alpaviz.core.plan import format_bytes

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


def format_seconds(seconds: float) -> str:
    """A duration in the unit that fits: 59.5 ns, 1.23 us, 4.5 ms, 2.1 s."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def split_ways(strategy: str, logical_mesh: tuple[int, int]) -> int:
    """Into how many parts a strategy in Alpa's notation splits an operator's work: the product of the mesh
    axes its `S` dims name (`S0R` on a 4x2 mesh: 4; `S01` or `S0S1`: 8; `RR`: 1, every device does it all)."""
    axes = {int(a) for token in re.findall(r"S(\d+)", strategy) for a in token if int(a) < len(logical_mesh)}
    return math.prod(logical_mesh[a] for a in axes)


def operator_time(graph: OpGraph, plan: Plan, name: str) -> tuple[float, int]:
    """An operator's roofline time per device on its stage, and into how many ways its strategy splits the
    work (a replicated operator does all of it on every device)."""
    node = graph.node(name)
    strategy = plan.strategies.get(name)
    stage = plan.stage_of_layer(node.layer) if plan.stages else None
    ways = split_ways(strategy, stage.logical_mesh) if strategy and stage is not None else 1
    seconds = plan.cost_model.op_time(node.primitive, node.flops / ways, (node.bytes_read + node.bytes_written) / ways,
                                      plan.cluster.device, graph.operand_dtype(node))
    return seconds, ways


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
    strategy = plan.strategies.get(name)
    seconds, ways = operator_time(graph, plan, name)
    split = f"split {ways} ways" if ways > 1 else "whole on every device of its stage"
    return (
        f"{name} [{node.primitive}, {node.role}]<br>in: {shapes(node.inputs)}<br>out: {shapes(node.outputs)}"
        f"<br>strategy: {strategy or '(none recorded)'} ({split})<br>{_fmt_flops(node.flops)}, "
        f"~{format_seconds(seconds)} of compute per device"
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

    @property
    def tooltip(self) -> str:
        """What the gap's button says on hover."""
        return f"gap before layer {self.layer}"


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


def first_tensor(rows: Sequence[ShardingRow]) -> ShardingRow | None:
    """The tensor the sharding view opens on: the largest one that is split, else the largest."""
    return max(rows, key=lambda r: (any(r.spec), math.prod(r.shape)), default=None)


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


def operator_labels(graph: OpGraph, rows: Sequence[StrategyRow]) -> dict[str, str]:
    """Label -> operator for the pin picker, searchable by where it comes from in the user's code, its
    primitive or its name: `LinenLM/_Block_0/Dense_0 · dot_general · n97 (stage 1)`."""
    labels = {}
    for r in rows:
        scope = user_scope(graph.node(r.node)) if r.node in graph.node_by_name else ""
        labels[" · ".join(p for p in (scope, r.primitive, r.node) if p) + f" (stage {r.stage})"] = r.node
    return labels


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


SOLVER_CHOICE = "(solver's choice)"
TAB_TITLES = ("Stages", "Graph", "Sharding", "Timeline", "Cost", "Why this plan")


# ---- header -----------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class HeaderItem:
    """One figure of the always-visible header: a label, its value and a line of detail."""

    label: str
    value: str
    detail: str = ""


def matmul_dtype(graph: OpGraph) -> str | None:
    """The dtype that carries most of the graph's FLOPs (the peak the throughput is a share of)."""
    flops: dict[str | None, float] = {}
    for node in graph.nodes:
        dtype = graph.operand_dtype(node)
        flops[dtype] = flops.get(dtype, 0.0) + node.flops
    return max(flops, key=flops.get, default=None)


def header_items(graph: OpGraph, plan: Plan, bubble: float | None = None) -> tuple[HeaderItem, ...]:
    """Step time, throughput (per device and as a share of peak), bubble, peak memory against the limit, solver.

    `bubble` is the predicted timeline's idle share (what the timeline tab writes); without it, the plan's
    fill-and-drain share of the step.
    """
    p = plan.predicted
    step = p.step_time_s
    dtype = matmul_dtype(graph)
    peak = plan.cluster.device.peak_flops_for(dtype)
    per_device = graph.total_flops * plan.schedule.num_microbatches / step / plan.cluster.num_devices if step else 0.0
    limit = p.memory_limit_bytes
    memory_share = p.max_memory_bytes / limit if limit and math.isfinite(limit) else None
    return (
        HeaderItem("step time", f"{step * 1e3:.4g} ms", f"{plan.schedule.num_microbatches} microbatches, "
                   f"{plan.schedule.kind}, on {plan.cluster.name}{plan.schedule.statistics_note}"),
        HeaderItem("throughput", f"{per_device / 1e12:.3g} TFLOP/s", f"per device, {per_device / peak:.0%} of the "
                   f"{dtype or 'default'} peak"),
        HeaderItem("bubble", f"{(p.bubble_s / step if bubble is None else bubble):.0%}" if step else "n/a",
                   f"{plan.num_stages} stages, " + ("idle share of the timeline" if bubble is not None
                                                    else "fill and drain")),
        HeaderItem("peak memory", format_bytes(p.max_memory_bytes),
                   f"{memory_share:.0%} of the limit" if memory_share is not None else "no limit"),
        HeaderItem("solver", plan.solver.status, f"{plan.solver.seconds:.2f} s"),
    )


