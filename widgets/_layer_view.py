"""The layers as bars sized by their time, stages as bands, and the operators of a layer as a sorted, searchable
table: what the Graph tab shows instead of a force-drawn hairball of thousands of operators."""

from __future__ import annotations

import dataclasses
from typing import Sequence

from alpaviz.core import OpGraph, Plan
from alpaviz.widgets._view_model import format_seconds, operator_time


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

    @property
    def cells(self) -> tuple[str, ...]:
        return (self.scope or "-", self.name, self.primitive, self.strategy or "-", f"{self.flops:.3g}",
                f"{self.bytes:.3g}", format_seconds(self.time_s))


OPERATOR_COLUMNS = ("scope", "operator", "primitive", "strategy", "FLOPs", "bytes", "time per device")


def operator_rows(graph: OpGraph, plan: Plan, layer: int, search: str = "") -> tuple[OperatorRow, ...]:
    """The operators of `layer`, costliest first, those whose scope, name, primitive or strategy contain
    `search` (case-insensitive); a time is the roofline of the share of the work its strategy gives a device."""
    wanted = search.strip().lower()
    rows = []
    for name in plan.layers[layer].nodes:
        if name not in graph.node_by_name:
            continue
        node = graph.node(name)
        row = OperatorRow(name, node.scope, node.primitive, plan.strategies.get(name, ""), node.flops,
                          node.bytes_read + node.bytes_written, operator_time(graph, plan, name)[0])
        if wanted and not any(wanted in text.lower() for text in (row.scope, row.name, row.primitive, row.strategy)):
            continue
        rows.append(row)
    return tuple(sorted(rows, key=lambda r: -r.time_s))


def operator_table_html(rows: Sequence[OperatorRow], limit: int = 200) -> str:
    """The table as HTML (the `limit` costliest rows, and how many more there are)."""
    import html

    if not rows:
        return "<i>no operator matches</i>"
    head = "".join(f"<th>{c}</th>" for c in OPERATOR_COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r.cells) + "</tr>" for r in rows[:limit])
    more = f"<div><i>{len(rows) - limit} more: narrow the search</i></div>" if len(rows) > limit else ""
    return (f'<table style="border-collapse:collapse;font-size:12px"><tr>{head}</tr>{body}</table>{more}')
