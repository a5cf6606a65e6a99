"""A self-contained HTML report of plans: the editor's figures, frozen into one offline page."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import plotly.graph_objects as go
import plotly.io as pio

from alpaviz.core import OpGraph, Plan, Timeline, predicted_timeline
from alpaviz.widgets import _figures as F
from alpaviz.widgets import _html as H
from alpaviz.widgets import _cluster_map as cmap
from alpaviz.widgets import _timeline_view as tv
from alpaviz.widgets import _view_model as vm


@dataclasses.dataclass(frozen=True)
class ReportSection:
    """One plan in the report, with an optional measured timeline and a comparison table."""

    title: str
    graph: OpGraph
    plan: Plan
    measured: Timeline | None = None
    comparison: tuple[tuple[str, float], ...] = ()  # (plan name, predicted step seconds)
    text: str = ""


def _figure_div(fig: go.Figure, first: bool) -> str:
    # The first figure carries plotly.js inline so the page opens offline.
    return pio.to_html(fig, full_html=False, include_plotlyjs="inline" if first else False)


def section_html(section: ReportSection, first: bool) -> str:
    """The plan summary, comparison, layer graph, pipeline timeline and cost figures of one plan."""
    plan, graph = section.plan, section.graph
    predicted = predicted_timeline(plan, graph)
    figures = [
        F.cluster_map_figure(cmap.cluster_map(graph, plan)),
        F.graph_figure(vm.layer_graph_view(graph, plan)),
        F.gantt_figure(*tv.timeline_panels(plan, predicted, section.measured)),
        F.cost_figure(vm.cost_view(plan)),
    ]
    divs = [_figure_div(fig, first and i == 0) for i, fig in enumerate(figures)]
    return H.report_section_html(section.title, section.text, plan.summary(), section.comparison, divs)


def report_html(sections: Sequence[ReportSection], title: str = "alpaviz plan report") -> str:
    """A whole page; plotly.js is embedded once, so the file opens without a network."""
    return H.report_page_html(title, "".join(section_html(s, first=i == 0) for i, s in enumerate(sections)))


def write_report(path: str, sections: Sequence[ReportSection], title: str = "alpaviz plan report") -> str:
    """Write `report_html(sections)` to `path` and return the path."""
    with open(path, "w", encoding="utf-8") as out:
        out.write(report_html(sections, title))
    return path
