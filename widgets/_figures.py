"""Plotly figures and small HTML pictures drawn from the view model (no state, no widgets)."""

from __future__ import annotations

import html
from typing import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from alpaviz.widgets._view_model import MEMORY_PARTS, CostView, GraphView, byte_unit, node_size
from alpaviz.widgets._cluster_map import ClusterMap
from alpaviz.widgets._layer_view import LayerBar
from alpaviz.widgets._tensor_picture import TensorPicture
from alpaviz.widgets._timeline_view import GanttBar, TimelinePanel, idle_gaps

PALETTE = ("#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#EECA3B", "#B279A2", "#FF9DA6")
KIND_COLOURS = {"forward": "#4C78A8", "backward": "#F58518", "weight_grad": "#EECA3B", "update": "#54A24B",
                "send": "#B279A2", "recv": "#9D755D"}  # weight_grad: ZB-H1's W, drawn apart from its B


def stage_colour(stage: int) -> str:
    return PALETTE[stage % len(PALETTE)]


def _layout(fig: go.Figure, title: str, height: int) -> go.Figure:
    fig.update_layout(title=title, height=height, margin=dict(l=40, r=10, t=40, b=30), showlegend=False,
                      plot_bgcolor="white")
    return fig


def graph_figure(view: GraphView) -> go.Figure:
    """Nodes coloured by stage and sized by FLOPs; hover shows shapes, strategy and cost."""
    xs: list[float | None] = []
    ys: list[float | None] = []
    for a, b in view.edges:
        na, nb = view.nodes[a], view.nodes[b]
        xs += [na.x, nb.x, None]
        ys += [na.y, nb.y, None]
    biggest = max((n.flops for n in view.nodes), default=0.0)
    edge_trace = go.Scatter(x=xs, y=ys, mode="lines", line=dict(width=0.6, color="#BBBBBB"), hoverinfo="skip")
    node_trace = go.Scatter(
        x=[n.x for n in view.nodes], y=[n.y for n in view.nodes],
        mode="markers+text" if view.level == "layer" else "markers",
        text=[n.label for n in view.nodes], textposition="top center",
        hovertext=[n.hover for n in view.nodes], hoverinfo="text",
        customdata=[n.key for n in view.nodes],
        marker=dict(size=[node_size(n.flops, biggest) for n in view.nodes],
                    color=[stage_colour(n.stage) for n in view.nodes], line=dict(width=0.5, color="#333")),
    )
    fig = go.Figure([edge_trace, node_trace])
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    title = "operator graph (layers)" if view.level == "layer" else "operator graph (operators)"
    if view.truncated:
        title += f": {view.truncated} smallest operators hidden"
    return _layout(fig, title, 320)


def _lane(bar: GanttBar, row: str = "stage") -> str:
    return f"{row} {bar.stage}" + (" transfers" if bar.kind in ("send", "recv") else "")


def _row_word(bars: Sequence[GanttBar]) -> str:
    """What a row is: a stage, or under interleaved 1F1B a submesh running several (bars labelled F3·1:
    microbatch 3's forward through the submesh's chunk 1)."""
    return "submesh" if any(b.chunk is not None for b in bars) else "stage"


def _where(bar: GanttBar) -> str:
    return f"stage {bar.stage}" if bar.chunk is None else f"submesh {bar.stage} chunk {bar.chunk}"


def _gantt_traces(bars: Sequence[GanttBar], row: str = "stage") -> list[go.Bar]:
    traces = []
    for kind, colour in KIND_COLOURS.items():
        chosen = [b for b in bars if b.kind == kind]
        if not chosen:
            continue
        traces.append(go.Bar(
            orientation="h", name=kind, marker_color=colour,
            base=[b.start_s * 1e3 for b in chosen], x=[(b.end_s - b.start_s) * 1e3 for b in chosen],
            y=[_lane(b, row) for b in chosen], text=[b.label for b in chosen], textposition="inside",
            hovertext=[f"{_where(b)} {b.kind} microbatch {b.microbatch}: {b.start_s * 1e3:.4g}-"
                       f"{b.end_s * 1e3:.4g} ms" for b in chosen], hoverinfo="text",
        ))
    return traces


def gantt_figure(*panels: TimelinePanel) -> go.Figure:
    """Forward/backward per microbatch per stage, a transfer lane under each stage that sends or receives,
    idle stretches shaded as the bubble; one panel per timeline (`timeline_panels`), each on its own time
    axis titled with its hardware, length and bubble."""
    panels = panels or (TimelinePanel("predicted", "", (), (), 0.0, None),)
    fig = make_subplots(rows=1, cols=len(panels), shared_yaxes=True, subplot_titles=[p.title for p in panels])
    stages = sorted({b.stage for p in panels for b in p.bars + p.transfers})
    moving = {b.stage for p in panels for b in p.transfers}
    row = _row_word([b for p in panels for b in p.bars])
    lanes = [lane for s in stages for lane in ([f"{row} {s}"] + ([f"{row} {s} transfers"] if s in moving else []))]
    in_legend: set[str] = set()  # each kind once, from the first panel that draws it (W only under ZB-H1)
    for col, panel in enumerate(panels, start=1):
        gaps = idle_gaps(panel.bars)
        if gaps:
            fig.add_trace(go.Bar(
                orientation="h", name="idle (bubble)", marker_color="#E8E8E8", showlegend=col == 1,
                base=[s * 1e3 for _, s, _ in gaps], x=[(e - s) * 1e3 for _, s, e in gaps],
                y=[f"{row} {stage}" for stage, _, _ in gaps], hoverinfo="skip",
            ), row=1, col=col)
        for trace in _gantt_traces(panel.bars + panel.transfers, row):
            trace.showlegend = trace.name not in in_legend
            in_legend.add(trace.name)
            fig.add_trace(trace, row=1, col=col)
        fig.update_xaxes(title_text=f"ms on {panel.hardware}" if panel.hardware else "ms", row=1, col=col)
    fig.update_yaxes(categoryorder="array", categoryarray=lanes, autorange="reversed")
    _layout(fig, "pipeline timeline", 250 + 28 * len(lanes))
    # room above the plots for the title and each panel's three-line heading
    fig.update_layout(barmode="overlay", showlegend=True, margin=dict(l=40, r=10, t=150, b=40),
                      title=dict(y=0.98, yanchor="top"))
    return fig


def cost_figure(cost: CostView) -> go.Figure:
    """Step-time breakdown, and each stage's memory split by what it holds, against the device limit.

    The memory axis is in the unit that fits the largest stage; a limit far
    above every stage is written in the title instead of stretching the axis.
    """
    fig = make_subplots(rows=1, cols=2, subplot_titles=("step time (ms)", "memory per device"))
    names = [n for n, _ in cost.breakdown]
    fig.add_trace(go.Bar(x=names, y=[v * 1e3 for _, v in cost.breakdown], marker_color=PALETTE[:len(names)],
                         showlegend=False), row=1, col=1)
    largest = max((m for _, m in cost.memory_per_stage), default=0.0)
    unit, size = byte_unit(max(largest, 1.0))
    stages = [f"stage {s}" for s, _ in cost.memory_per_stage]
    parts = dict(cost.memory_parts)
    for k, part in enumerate(MEMORY_PARTS):
        values = [dict(parts.get(s, ())).get(part, 0.0) / size for s, _ in cost.memory_per_stage]
        fig.add_trace(go.Bar(x=stages, y=values, name=part, marker_color=PALETTE[(k + 4) % len(PALETTE)],
                             hovertemplate=f"%{{x}}: {part} %{{y:.3g}} {unit}<extra></extra>"), row=1, col=2)
    fig.add_trace(go.Scatter(
        x=stages, y=[m / size for _, m in cost.memory_per_stage], mode="text", showlegend=False,
        text=[f"{m / size:.3g} {unit}" + (" over!" if m > cost.memory_limit_bytes else "")
              for _, m in cost.memory_per_stage], textposition="top center"), row=1, col=2)
    limit = cost.memory_limit_bytes
    if limit <= 2 * largest:
        fig.add_hline(y=limit / size, line_dash="dash", line_color="#E45756", row=1, col=2)
    fig.update_yaxes(title_text=unit, row=1, col=2)
    limit_unit, limit_size = byte_unit(limit)
    fig.layout.annotations[1].text = f"memory per device (limit {limit / limit_size:.3g} {limit_unit})"
    _layout(fig, cost.headline, 300)
    fig.update_layout(barmode="stack", margin=dict(l=40, r=10, t=70, b=30), showlegend=True,
                      legend=dict(orientation="h", y=-0.25))
    return fig


def layer_bars_figure(bars: Sequence[LayerBar]) -> go.Figure:
    """One bar per layer, its time per microbatch stacked as compute, communication and resharding, over a
    band per stage; memory per device as a line on the right axis.  Clicking a bar lists its operators."""
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    x = [f"L{b.layer}" for b in bars]
    for part, colour in (("compute_s", PALETTE[0]), ("communication_s", PALETTE[1]), ("resharding_s", PALETTE[3])):
        fig.add_trace(go.Bar(x=x, y=[getattr(b, part) * 1e3 for b in bars], name=part[:-2], marker_color=colour,
                             customdata=[b.layer for b in bars],
                             hovertext=[f"layer {b.layer} (stage {b.stage}), {b.operators} operators"
                                        + (f"<br>{b.note}" if b.note else "") for b in bars],
                             hovertemplate="%{hovertext}<br>" + part[:-2] + " %{y:.4g} ms<extra></extra>"),
                      secondary_y=False)
    largest = max((b.memory_bytes for b in bars), default=0.0)
    unit, size = byte_unit(max(largest, 1.0))
    fig.add_trace(go.Scatter(x=x, y=[b.memory_bytes / size for b in bars], name=f"memory ({unit})", mode="lines+markers",
                             line=dict(color="#333", dash="dot")), secondary_y=True)
    for stage in sorted({b.stage for b in bars}):
        members = [i for i, b in enumerate(bars) if b.stage == stage]
        fig.add_vrect(x0=members[0] - 0.5, x1=members[-1] + 0.5, fillcolor=stage_colour(stage), opacity=0.12,
                      line_width=0, annotation_text=f"stage {stage}", annotation_position="top left")
    fig.update_yaxes(title_text="ms per microbatch", secondary_y=False)
    fig.update_yaxes(title_text=unit, secondary_y=True, showgrid=False)
    _layout(fig, "layers: time per microbatch by part, stages as bands (click a bar for its operators)", 320)
    fig.update_layout(barmode="stack", showlegend=True, legend=dict(orientation="h", y=-0.2))
    return fig


def tensor_figure(picture: TensorPicture) -> go.Figure:
    """The tensor as a rectangle split into the regions each device holds, the axes saying how each dim is split."""
    fig = go.Figure()
    for k, region in enumerate(picture.regions):
        (r0, r1), (c0, c1) = region.rows, region.cols
        fig.add_shape(type="rect", x0=c0, x1=c1, y0=r0, y1=r1, fillcolor=PALETTE[k % len(PALETTE)],
                      line=dict(color="white", width=2), layer="below")
    fig.add_trace(go.Scatter(
        x=[(r.cols[0] + r.cols[1]) / 2 for r in picture.regions], y=[(r.rows[0] + r.rows[1]) / 2 for r in picture.regions],
        mode="text", text=[r.label for r in picture.regions], textfont=dict(color="white", size=12),
        hovertext=[f"rows {r.rows[0]}:{r.rows[1]}, cols {r.cols[0]}:{r.cols[1]} on devices {list(r.devices)}"
                   for r in picture.regions], hoverinfo="text", showlegend=False,
    ))
    fig.update_xaxes(range=[0, picture.width], title_text=picture.col_label, side="top", showgrid=False)
    fig.update_yaxes(range=[picture.height, 0], title_text=picture.row_label, showgrid=False)
    title = picture.title + (f"<br><sup>{html.escape(picture.note)}</sup>" if picture.note else "")
    _layout(fig, title, 340)
    fig.update_layout(margin=dict(l=60, r=10, t=110, b=20))
    return fig


def cluster_map_figure(view: ClusterMap) -> go.Figure:
    """Hosts as rows, devices as squares coloured by stage (with the device's logical coordinate);
    arrows for what each stage sends the next, red when it crosses hosts."""
    fig = go.Figure()
    centre: dict[int, list[tuple[float, float]]] = {}
    for cell in view.cells:
        x, y = cell.slot, -cell.host
        colour = "#DDDDDD" if cell.stage is None else stage_colour(cell.stage)
        fig.add_shape(type="rect", x0=x - 0.45, x1=x + 0.45, y0=y - 0.4, y1=y + 0.4, fillcolor=colour,
                      line=dict(color="white", width=2), layer="below")
        if cell.stage is not None:
            centre.setdefault(cell.stage, []).append((x, y))
    fig.add_trace(go.Scatter(
        x=[c.slot for c in view.cells], y=[-c.host for c in view.cells], mode="text",
        text=[c.label for c in view.cells], textfont=dict(color="white", size=11),
        hovertext=[c.label.replace("<br>", " ") for c in view.cells], hoverinfo="text",
    ))
    middle = {s: (sum(x for x, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)) for s, pts in centre.items()}
    offsets = {"forward": 0.18, "backward": -0.18, "update": 0.0}
    for t in view.transfers:
        if t.src not in middle or t.dst not in middle:
            continue
        (x0, y0), (x1, y1) = middle[t.src], middle[t.dst]
        dy = offsets.get(t.kind, 0.0)
        fig.add_annotation(
            x=x1, y=y1 + dy, ax=x0, ay=y0 + dy, xref="x", yref="y", axref="x", ayref="y", showarrow=True,
            arrowhead=3, arrowwidth=2, arrowcolor="#B00020" if t.inter_host else KIND_COLOURS.get(t.kind, "#333"),
            text="", hovertext=t.label,
        )
    crossing = [t for t in view.transfers if t.kind == "forward"]
    summary = "; ".join(t.label for t in crossing[:4]) or "one stage: nothing crosses a stage boundary"
    fig.update_xaxes(visible=False, range=[-0.6, view.devices_per_host - 0.4])
    fig.update_yaxes(range=[-view.num_hosts + 0.4, 0.6], scaleanchor="x", scaleratio=1, showgrid=False,
                     zeroline=False, tickvals=[-h for h in range(view.num_hosts)],
                     ticktext=[f"host {h}" for h in range(view.num_hosts)])
    _layout(fig, "where each stage runs (hosts x devices; S = stage, (row, col) on its logical mesh)",
            120 + 70 * view.num_hosts)
    fig.add_annotation(text=summary, xref="paper", yref="paper", x=0, y=-0.02, showarrow=False,
                       xanchor="left", yanchor="top", font=dict(size=11))
    fig.update_layout(margin=dict(l=10, r=10, t=40, b=40))
    return fig
