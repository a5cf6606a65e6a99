"""The layers as bars sized by their time, stages as bands, and the operators of a layer as a sorted, searchable
table: what the Graph tab shows instead of a force-drawn hairball of thousands of operators."""

from __future__ import annotations

import dataclasses

from alpaviz.core import OpGraph, Plan
from alpaviz.widgets._view_model import format_seconds, operator_time, user_scope


@dataclasses.dataclass(frozen=True)
class LayerBar:
    """One layer: its stage, its time per microbatch split into compute, communication and resharding, its
    peak memory per device, and what is in it."""

    layer: int
    stage: int
    compute_s: float
    communication_s: float
    resharding_s: float
    memory_bytes: float
    operators: int
    note: str = ""

    @property
    def total_s(self) -> float:
        return self.compute_s + self.communication_s + self.resharding_s


def layer_bars(graph: OpGraph, plan: Plan) -> tuple[LayerBar, ...]:
    """A bar per layer of the plan; a layer holding a loop or a branch says it runs as one block."""
    stage_of = {layer: stage.index for stage in plan.stages for layer in stage.layers}
    bars = []
    for layer in plan.layers:
        loops = [graph.node(n) for n in layer.nodes
                 if n in graph.node_by_name and graph.node(n).primitive in ("scan", "while", "cond")]
        note = "; ".join(f"{n.primitive} {n.name}: one block ({n.note})" if n.note else f"{n.primitive} {n.name}: one block"
                         for n in loops)
        bars.append(LayerBar(layer.index, stage_of.get(layer.index, 0), layer.compute_s, layer.communication_s,
                             layer.resharding_s, layer.memory_bytes, len(layer.nodes), note))
    return tuple(bars)


@dataclasses.dataclass(frozen=True)
class OperatorRow:
    """One operator of a layer as the table lists it."""

    name: str
    scope: str
    primitive: str
    strategy: str
    flops: float
    bytes: float
    time_s: float
    reshard_in_s: float = 0.0  # converting its operands to the shardings its strategy reads
    reshard_out_s: float = 0.0  # converting its results for the operators that read them

    @property
    def cells(self) -> tuple[str, ...]:
        return (self.scope or "-", self.name, self.primitive, self.strategy or "-", f"{self.flops:.3g}",
                f"{self.bytes:.3g}", format_seconds(self.time_s), _seconds_or_dash(self.reshard_in_s),
                _seconds_or_dash(self.reshard_out_s))


OPERATOR_COLUMNS = ("scope", "operator", "primitive", "strategy", "FLOPs", "bytes", "time per device",
                    "reshard in", "reshard out")


def _seconds_or_dash(seconds: float) -> str:
    return format_seconds(seconds) if seconds > 0 else "-"


def operator_resharding(graph: OpGraph, plan: Plan) -> dict[str, tuple[float, float]]:
    """Operator -> (resharding in, resharding out) seconds per microbatch, from the plan's per-edge record:
    in is what its own operands cost to convert, out what the readers of its results pay for them."""
    producer = {t: node.name for node in graph.nodes for t in node.outputs}
    found: dict[str, list[float]] = {}
    for stage in plan.stages:
        for reader, tensor, seconds in stage.resharding_edges:
            found.setdefault(reader, [0.0, 0.0])[0] += seconds
            if tensor in producer:
                found.setdefault(producer[tensor], [0.0, 0.0])[1] += seconds
    return {name: (a, b) for name, (a, b) in found.items()}


def operator_rows(graph: OpGraph, plan: Plan, layer: int, search: str = "") -> tuple[OperatorRow, ...]:
    """The operators of `layer`, costliest first, those whose scope, name, primitive or strategy contain
    `search` (case-insensitive); a time is the roofline of the share of the work its strategy gives a device."""
    wanted = search.strip().lower()
    moved = operator_resharding(graph, plan)
    rows = []
    for name in plan.layers[layer].nodes:
        if name not in graph.node_by_name:
            continue
        node = graph.node(name)
        row = OperatorRow(name, user_scope(node), node.primitive, plan.strategies.get(name, ""), node.flops,
                          node.bytes_read + node.bytes_written, operator_time(graph, plan, name)[0],
                          *moved.get(name, (0.0, 0.0)))
        if wanted and not any(wanted in text.lower() for text in (row.scope, row.name, row.primitive, row.strategy)):
            continue
        rows.append(row)
    return tuple(sorted(rows, key=lambda r: -r.time_s))


