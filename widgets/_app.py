"""The plan editor as a panel web app: the shared editor view mapped onto panel widgets.

Serve it with `alpaviz serve` / `python -m alpaviz serve`, or
`panel serve widgets/_app_server.py` (the default GPT model on the default cluster).
The notebook editor (`_editor.py`) maps the same `EditorView` and hands its events to the same
`EditorController`; only the widgets differ.
"""

from __future__ import annotations

import io
from typing import Any

import panel as pn
import plotly.graph_objects as go

from alpaviz.widgets import _html as H
from alpaviz.widgets import _view_model as vm
from alpaviz.widgets._editor_controller import EditorController
from alpaviz.widgets._editor_view import GRAPH_LEVELS, EditorView, WhatIfFields
from alpaviz.widgets._session import PRESETS, SCHEDULE_CHOICES, WHATIF_FIELDS, EditorSession

TAB_TITLES = vm.TAB_TITLES
CURRENT_PRESET = {"(current)": ""}


class PanelEditor:
    """Panel widgets mapping the shared `EditorView`; `.layout` is the servable page."""

    def __init__(self, session: EditorSession) -> None:
        self.session = session
        self.controller = EditorController(session)
        self.summary = pn.pane.HTML(sizing_mode="stretch_width")
        self.headline = pn.pane.HTML(sizing_mode="stretch_width")
        self.status = pn.pane.HTML(sizing_mode="stretch_width")
        self.progress = pn.indicators.Progress(value=100, max=100, width=200, bar_color="success")
        self.spinner = pn.indicators.LoadingSpinner(value=False, size=24, name="")
        self.cut_row = pn.FlexBox()
        self._cut_gaps: tuple[int, ...] = ()  # the gaps the cut row's buttons stand for
        self._cut_buttons: list[pn.widgets.Button] = []
        self._chip_panes: list[pn.pane.HTML] = []
        self.submesh_column = pn.Column()
        self.graph_level = pn.widgets.RadioButtonGroup(options=dict(GRAPH_LEVELS), value="layer")
        self.graph_layer = pn.widgets.Select(name="layer (operators view)", options={"all": -1}, value=-1, width=160)
        self.graph_pane = _plot_pane(height=320, sizing_mode="stretch_width")
        self.layer_pane = _plot_pane(height=320, sizing_mode="stretch_width")
        self.table_layer = pn.widgets.Select(name="operators of", options={"L0": 0}, value=0, width=120)
        self.op_search = pn.widgets.TextInput(name="search", placeholder="scope, name, primitive or strategy",
                                              width=320)
        self.op_table = pn.pane.HTML(sizing_mode="stretch_width")
        self.op_select = pn.widgets.AutocompleteInput(
            name="operator (type to search: scope in your code, primitive or name)", search_strategy="includes",
            case_sensitive=False, min_characters=1, restrict=True, width=420)
        self.strategy_select = pn.widgets.Select(name="strategy", width=420)
        self.tensor_select = pn.widgets.AutocompleteInput(
            name="tensor (type to search any tensor)", search_strategy="includes", case_sensitive=False,
            min_characters=1, restrict=True, width=420)
        self.tensor_pane = _plot_pane(height=340, sizing_mode="stretch_width")
        self.mesh_pane = pn.pane.HTML()
        self.timeline_pane = _plot_pane(height=260, sizing_mode="stretch_width")
        self.cost_pane = _plot_pane(height=260, sizing_mode="stretch_width")
        self.cluster_pane = _plot_pane(sizing_mode="stretch_width")
        self.diff_pane = pn.pane.HTML()
        self.compare_button = pn.widgets.Button(name="Compare")
        self.comparison_pane = pn.pane.HTML()
        self.plan_text = pn.pane.HTML()
        self.resolve_button = pn.widgets.Button(name="Re-solve", button_type="primary")
        self.reset_button = pn.widgets.Button(name="Reset pins")
        self.launch_steps = pn.widgets.IntInput(name="steps", value=3, start=1, end=1000, width=80)
        self.launch_button = pn.widgets.Button(name="Launch", button_type="success")
        self.download = pn.widgets.FileDownload(callback=self._plan_json, filename="plan.json", label="Save plan")
        self.trace_download = pn.widgets.FileDownload(callback=self._trace_json, filename="trace.json",
                                                      label="Perfetto trace")
        self.upload = pn.widgets.FileInput(accept=".json", name="Load plan")
        w = session.whatif
        self.microbatches = pn.widgets.IntInput(name="microbatches", value=w.num_microbatches, start=1, width=120)
        self.search_button = pn.widgets.Button(name="Search count", description=(
            "try every microbatch count that divides the global batch (example batch x microbatches)"))
        self.schedule = pn.widgets.Select(name="schedule", options=list(SCHEDULE_CHOICES), value=w.schedule, width=100)
        self.preset = pn.widgets.Select(name="cluster", options=CURRENT_PRESET | {k: k for k in PRESETS}, value="",
                                        width=110)
        self.hosts = pn.widgets.IntInput(name="hosts", value=w.cluster.num_hosts, start=1, width=90)
        self.intra_bw = pn.widgets.FloatInput(name="intra GB/s", value=1.0, width=110)
        self.inter_bw = pn.widgets.FloatInput(name="inter GB/s", value=1.0, width=110)
        self.layout = self._layout()
        self._wire()
        self.controller.on_view(self.render)
        session.on_activity(self._on_activity)
        session.on_progress(self._on_progress)
        self.render()

    @property
    def selected_operator(self) -> str | None:
        """The operator the strategy picker is for."""
        return self.controller.selected_operator

    def _layout(self) -> pn.Column:
        """The header (figures, status, actions, what-if) always on top; the views in tabs under it."""
        views = (
            pn.Column(pn.pane.Markdown("### Stage cuts (click a gap: pin cut, pin no-cut, free)"), self.cut_row,
                      self.submesh_column, pn.pane.Markdown("### Where the stages run"), self.cluster_pane,
                      sizing_mode="stretch_width"),
            pn.Column(self.layer_pane, pn.Row(self.table_layer, self.op_search), self.op_table,
                      pn.Row(self.graph_level, self.graph_layer), self.graph_pane, sizing_mode="stretch_width"),
            pn.Column(self.tensor_select, self.tensor_pane, self.mesh_pane, pn.Row(self.op_select, self.strategy_select),
                      sizing_mode="stretch_width"),
            pn.Column(self.timeline_pane, sizing_mode="stretch_width"),
            pn.Column(self.cost_pane, sizing_mode="stretch_width"),
            pn.Column(pn.pane.Markdown("### What the last re-solve changed"), self.diff_pane,
                      pn.pane.Markdown("### Why this plan"), self.compare_button, self.comparison_pane, self.plan_text),
        )
        self.tabs = pn.Tabs(*zip(TAB_TITLES, views), dynamic=False, sizing_mode="stretch_width")
        return pn.Column(
            pn.pane.Markdown("## alpaviz plan editor"), self.summary, self.headline,
            pn.Row(self.spinner, self.status, self.progress),
            pn.Row(self.resolve_button, self.reset_button, self.launch_steps, self.launch_button, self.download,
                   self.upload, self.trace_download),
            pn.Row(self.microbatches, self.search_button, self.schedule, self.preset, self.hosts, self.intra_bw,
                   self.inter_bw),
            self.tabs,
            sizing_mode="stretch_width",
        )

    def _wire(self) -> None:
        c = self.controller
        for name, act in c.button_handlers(self.resolve, lambda: self.launch_steps.value).items():
            getattr(self, name).on_click(lambda _, act=act: act())
        for name, handle in c.value_handlers().items():
            getattr(self, name).param.watch(lambda event, handle=handle: handle(event.new), "value")
        self.upload.param.watch(self._on_upload, "value")
        self.tabs.param.watch(lambda e: c.select(tab=e.new), "active")
        self.layer_pane.param.watch(self._on_layer_click, "click_data")
        self.graph_pane.param.watch(self._on_graph_click, "click_data")
        for name in WHATIF_FIELDS:
            getattr(self, name).param.watch(self._on_whatif, "value")

    # ---- actions ---------------------------------------------------------------
    def resolve(self) -> None:
        """Re-solve; the session reports its progress and keeps the old plan if it fails."""
        outcome = self.controller.resolve()
        self.progress.value, self.progress.bar_color = 100, "success" if outcome.ok else "danger"

    def controls(self) -> list[Any]:
        """Every control that starts an action or edits a pin (disabled while the session is busy)."""
        pins = [w for row in self.submesh_column.objects for w in row.objects if isinstance(w, pn.widgets.Widget)]
        cuts = [w for w in self.cut_row.objects if isinstance(w, pn.widgets.Button)]
        return [self.resolve_button, self.reset_button, self.compare_button, self.search_button, self.launch_button,
                self.download, self.upload, self.trace_download, self.launch_steps, self.microbatches, self.schedule,
                self.preset, self.hosts, self.intra_bw, self.inter_bw, self.strategy_select, *cuts, *pins]

    def _on_activity(self, what: str) -> None:
        for control in self.controls():
            control.disabled = bool(what)
        self.spinner.value = bool(what)
        if what:
            self.status.object = H.busy_html(what)
            self.progress.value, self.progress.bar_color = -1, "info"  # indeterminate until a phase reports
        else:
            self.progress.value = 100

    def _on_progress(self, phase: str, done: int, total: int) -> None:
        self.progress.value = int(100 * done / total) if total else -1
        self.progress.name = f"{phase}: {done} of {total}"

    def _plan_json(self) -> io.StringIO:
        return io.StringIO(self.session.plan.with_pins(self.session.pins).to_json(indent=1))

    def _trace_json(self) -> io.StringIO:
        return io.StringIO(self.session.trace_json())

    def _on_upload(self, event: Any) -> None:
        """The uploaded bytes alone are parsed; nothing the browser sends is taken as a server path."""
        if event.new:
            self.session.load_text(event.new if isinstance(event.new, bytes) else str(event.new).encode())

    def _on_whatif(self, event: Any) -> None:
        fields = WhatIfFields(*(getattr(self, name).value for name in WHATIF_FIELDS))
        self.controller.apply_whatif(fields, event.obj in (self.preset, self.hosts))

    def _on_layer_click(self, event: Any) -> None:
        points = (event.new or {}).get("points") or []
        if points and "customdata" in points[0]:
            self.controller.click_layer([int(points[0]["customdata"])])

    def _on_graph_click(self, event: Any) -> None:
        points = (event.new or {}).get("points") or []
        if points and points[0].get("curveNumber") == 1:  # the node trace
            self.controller.click_graph([int(points[0]["pointIndex"])])

    # ---- the view, mapped onto the widgets -----------------------------------------
    def render(self) -> None:
        """Hand this app to the controller, which shows the view on it (panel pushes each change to the page)."""
        self.controller.render(self)

    def show_whatif(self, name: str, value: Any, problem: str | None) -> None:
        """A what-if input's value; a refused one gets a red border and the problem as its description."""
        control = getattr(self, name)
        control.value = value
        control.styles = {"border": f"2px solid {H.ERROR_COLOUR}", "border-radius": "4px"} if problem else {}
        control.description = problem

    def show_tab(self, index: int) -> None:
        """panel's Tabs call the tab in view `active`."""
        self.tabs.active = index

    def show_markup(self, name: str, markup: str) -> None:
        """A pn.pane.HTML (headline, summary or status) takes markup as its object."""
        getattr(self, name).object = markup

    def show_control(self, name: str, options: tuple | None, value: Any) -> None:
        """A Select, AutocompleteInput, RadioButtonGroup or TextInput that shows the selection."""
        _show_choice(getattr(self, name), options, value)

    def show_cuts(self, view: EditorView) -> None:
        """The layer chips with a button in each gap. The same gaps keep their buttons and chips, only restyled:
        a button rebuilt under the pointer would drop a second click that reaches the page before the new one."""
        gaps = tuple(cut.layer for cut in view.cuts)
        if gaps != self._cut_gaps:
            self._cut_gaps = gaps
            self._cut_buttons = [pn.widgets.Button(margin=(2, 2)) for _ in gaps]
            for button, layer in zip(self._cut_buttons, gaps):
                button.on_click(lambda _, layer=layer: self.controller.toggle_cut(layer))
            self._chip_panes = [pn.pane.HTML(margin=2) for _ in view.chips]
            self.cut_row.objects = [self._chip_panes[0]] + [
                part for pair in zip(self._cut_buttons, self._chip_panes[1:]) for part in pair]
        for button, cut in zip(self._cut_buttons, view.cuts):
            button.param.update(name=f"gap {cut.label}", description=cut.tooltip,
                                button_type="danger" if cut.is_cut else "default",
                                button_style="solid" if cut.pinned else "outline")
        for pane, chip in zip(self._chip_panes, view.chips):
            pane.object = H.layer_chip_html(chip.layer, chip.stage, chip.colour)

    def show_stages(self, view: EditorView) -> None:
        """One row per stage: its submesh and recomputation pickers and what it holds."""
        rows = []
        for row in view.stages:
            submesh = pn.widgets.Select(name=f"stage {row.index} submesh", options=list(row.submesh_labels),
                                        value=row.submesh, width=200)
            submesh.param.watch(lambda e, i=row.index: self.controller.pin_submesh(i, e.new), "value")
            remat = pn.widgets.Select(name=f"stage {row.index} remat", options=list(row.remat_labels), value=row.remat,
                                      width=170)
            remat.param.watch(lambda e, i=row.index: self.controller.pin_remat(i, e.new), "value")
            rows.append(pn.Row(submesh, remat, pn.pane.HTML(H.stage_text_html(row.text))))
        self.submesh_column.objects = rows

    def draw(self, parts: dict[str, Any]) -> None:
        """Put the freshly built parts (figures and HTML by name) into their panes."""
        panes = {"cluster": self.cluster_pane, "layers": self.layer_pane, "graph": self.graph_pane,
                 "tensor": self.tensor_pane, "timeline": self.timeline_pane, "cost": self.cost_pane,
                 "op_table": self.op_table, "mesh": self.mesh_pane, "diff": self.diff_pane,
                 "comparison": self.comparison_pane, "text": self.plan_text}
        if parts.get("timeline") is not None:  # the pane's size first, so plotly relayouts the old figure
            self.timeline_pane.height = parts["timeline"].layout.height
        for name, part in parts.items():
            if part is not None:
                panes[name].object = part


def _plot_pane(**options: Any) -> pn.pane.Plotly:
    """A plotly pane that holds an empty figure until its tab is first shown: plotly.js must have drawn
    into a div before the browser resizes or updates it (else "reading '_guiEditing'" under load)."""
    return pn.pane.Plotly(go.Figure(), **options)


def _show_choice(control: Any, options: tuple | None, value: Any) -> None:
    """Give a control its value, and a choice control its options first (only when they changed); an
    AutocompleteInput or a list whose labels are its values takes the labels, others a label -> value map."""
    if options is not None:
        plain = isinstance(control, pn.widgets.AutocompleteInput) or all(label == v for label, v in options)
        wanted = [label for label, _ in options] if plain else dict(options)
        if control.options != wanted:
            control.options = wanted
    control.value = value
