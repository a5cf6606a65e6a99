"""The plan editor as a panel web app: the same session and views as the notebook editor.

Serve it with `alpaviz serve` / `python -m alpaviz serve`, or
`panel serve widgets/_app.py` (the default GPT model on the default cluster).
"""

from __future__ import annotations

import html
from typing import Any

import panel as pn

from alpaviz.core import Cluster, trace
from alpaviz.core.models import gpt
from alpaviz.widgets import _figures as F
from alpaviz.widgets import _cluster_map as cmap
from alpaviz.widgets import _plan_compare as compare
from alpaviz.widgets import _timeline_view as tv
from alpaviz.widgets import _view_model as vm
from alpaviz.widgets._layer_view import layer_bars, operator_rows, operator_table_html
from alpaviz.widgets._pickers import OperatorPicker
from alpaviz.widgets._tensor_picture import tensor_picture
from alpaviz.widgets._session import PRESETS, EditorSession, WhatIf, WhatIfControls

SOLVER_CHOICE, TAB_TITLES = vm.SOLVER_CHOICE, vm.TAB_TITLES


class PanelEditor(WhatIfControls, OperatorPicker):
    """Panel widgets wired to an `EditorSession`; `.layout` is the servable page."""

    def __init__(self, session: EditorSession) -> None:
        self.session = session
        self.summary = pn.pane.HTML(sizing_mode="stretch_width")
        self.headline = pn.pane.HTML(sizing_mode="stretch_width")
        self.status = pn.pane.HTML(sizing_mode="stretch_width")
        self.progress = pn.indicators.Progress(value=100, max=100, width=200, bar_color="success")
        self.cut_row = pn.FlexBox()
        self.submesh_column = pn.Column()
        self.graph_level = pn.widgets.RadioButtonGroup(options={"layers": "layer", "operators": "op"}, value="layer")
        self.graph_layer = pn.widgets.Select(name="layer (operators view)", options={"all": -1}, value=-1, width=160)
        self.graph_pane = pn.pane.Plotly(height=320, sizing_mode="stretch_width")
        self.layer_pane = pn.pane.Plotly(height=320, sizing_mode="stretch_width")
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
        self.tensor_pane = pn.pane.Plotly(height=340, sizing_mode="stretch_width")
        self.mesh_pane = pn.pane.HTML()
        self.timeline_pane = pn.pane.Plotly(height=260, sizing_mode="stretch_width")
        self.cost_pane = pn.pane.Plotly(height=260, sizing_mode="stretch_width")
        self.cluster_pane = pn.pane.Plotly(sizing_mode="stretch_width")
        self.diff_pane = pn.pane.HTML()
        self.compare_button = pn.widgets.Button(name="Compare")
        self.comparison_pane = pn.pane.HTML()
        self.resolve_button = pn.widgets.Button(name="Re-solve", button_type="primary")
        self.reset_button = pn.widgets.Button(name="Reset pins")
        self.launch_button = pn.widgets.Button(name="Launch", button_type="success")
        self.download = pn.widgets.FileDownload(callback=self._plan_json, filename="plan.json", label="Save plan")
        self.trace_download = pn.widgets.FileDownload(callback=self._trace_json, filename="trace.json",
                                                      label="Perfetto trace")
        self.upload = pn.widgets.FileInput(accept=".json", name="Load plan")
        w = session.whatif
        self.microbatches = pn.widgets.IntInput(name="microbatches", value=w.num_microbatches, start=1, width=120)
        self.search_button = pn.widgets.Button(name="Search count", description=(
            "try every microbatch count that divides the global batch (example batch x microbatches)"))
        self.schedule = pn.widgets.Select(name="schedule", options=["1f1b", "gpipe"], value=w.schedule, width=100)
        self.preset = pn.widgets.Select(name="cluster", options=["(current)", *PRESETS], value="(current)", width=110)
        self.hosts = pn.widgets.IntInput(name="hosts", value=w.cluster.num_hosts, start=1, width=90)
        self.intra_bw = pn.widgets.FloatInput(name="intra GB/s", value=w.cluster.intra_host.bandwidth_bytes_per_s / 1e9, width=110)
        self.inter_bw = pn.widgets.FloatInput(name="inter GB/s", value=w.cluster.inter_host.bandwidth_bytes_per_s / 1e9, width=110)
        self._syncing = False
        self._wire()
        self.spinner = pn.indicators.LoadingSpinner(value=False, size=24, name="")
        self.layout = self._layout()
        session.on_change(self.refresh)
        session.on_activity(self._on_activity)
        session.on_progress(self._on_progress)
        self.refresh()

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
                      pn.pane.Markdown("### Why this plan"), self.compare_button, self.comparison_pane),
        )
        self.tabs = pn.Tabs(*zip(TAB_TITLES, views), dynamic=False, sizing_mode="stretch_width")
        return pn.Column(
            pn.pane.Markdown("## alpaviz plan editor"), self.summary, self.headline,
            pn.Row(self.spinner, self.status, self.progress),
            pn.Row(self.resolve_button, self.reset_button, self.launch_button, self.download, self.upload,
                   self.trace_download),
            pn.Row(self.microbatches, self.search_button, self.schedule, self.preset, self.hosts, self.intra_bw,
                   self.inter_bw),
            self.tabs,
            sizing_mode="stretch_width",
        )

    def _wire(self) -> None:
        s = self.session
        self.resolve_button.on_click(lambda _: self.resolve())
        self.reset_button.on_click(lambda _: s.reset_pins())
        self.compare_button.on_click(lambda _: s.compare())
        self.search_button.on_click(lambda _: s.search_microbatches())
        self.launch_button.on_click(lambda _: s.launch())
        self.upload.param.watch(self._on_upload, "value")
        self.graph_level.param.watch(lambda _: self._draw_graph(), "value")
        self.graph_layer.param.watch(lambda _: self._draw_graph(), "value")
        self.table_layer.param.watch(lambda _: self._fill_operator_table(), "value")
        self.op_search.param.watch(lambda _: self._fill_operator_table(), "value")
        self.layer_pane.param.watch(self._on_layer_click, "click_data")
        self.op_select.param.watch(lambda _: self._fill_strategies(), "value")
        self.strategy_select.param.watch(self._on_strategy, "value")
        self.tensor_select.param.watch(lambda _: self._draw_mesh(), "value")
        for control in (self.microbatches, self.schedule, self.preset, self.hosts, self.intra_bw, self.inter_bw):
            control.param.watch(self._on_whatif, "value")

    # ---- actions ---------------------------------------------------------------
    def resolve(self) -> None:
        outcome = self.session.resolve()
        self.progress.value, self.progress.bar_color = 100, "success" if outcome.ok else "danger"

    def controls(self) -> list[Any]:
        """Every control that starts an action or edits a pin (disabled while the session is busy)."""
        pins = [w for row in self.submesh_column.objects for w in row.objects if isinstance(w, pn.widgets.Widget)]
        cuts = [w for w in self.cut_row.objects if isinstance(w, pn.widgets.Button)]
        return [self.resolve_button, self.reset_button, self.compare_button, self.search_button, self.launch_button,
                self.download, self.upload, self.trace_download, self.microbatches, self.schedule, self.preset, self.hosts, self.intra_bw,
                self.inter_bw, self.strategy_select, *cuts, *pins]

    def _on_activity(self, what: str) -> None:
        for control in self.controls():
            control.disabled = bool(what)
        self.spinner.value = bool(what)
        if what:
            self.status.object = f'<span style="color:#4C78A8"><b>{html.escape(what)}...</b></span>'
            self.progress.value, self.progress.bar_color = -1, "info"  # indeterminate until a phase reports
        else:
            self.progress.value = 100

    def _on_progress(self, phase: str, done: int, total: int) -> None:
        self.progress.value = int(100 * done / total) if total else -1
        self.progress.name = f"{phase}: {done} of {total}"

    def _mark(self, control: Any, problem: str | None) -> None:
        control.styles = {"border": "2px solid #b00020", "border-radius": "4px"} if problem else {}
        control.description = problem

    def _plan_json(self):
        import io

        return io.StringIO(self.session.plan.with_pins(self.session.pins).to_json(indent=1))

    def _trace_json(self):
        import io

        return io.StringIO(self.session.trace_json())

    def _on_upload(self, event: Any) -> None:
        """The uploaded bytes alone are parsed; nothing the browser sends is taken as a server path."""
        if event.new:
            self.session.load_text(event.new if isinstance(event.new, bytes) else str(event.new).encode())

    def _on_whatif(self, event: Any) -> None:
        if not self._syncing:
            self._apply_whatif(event.obj in (self.preset, self.hosts))

    def _show_error(self, text: str) -> None:
        self.status.object = _message(False, text)

    # ---- drawing -----------------------------------------------------------------
    def refresh(self) -> None:
        s = self.session
        self._syncing = True
        try:
            self.headline.object = f"<b>{html.escape(vm.plan_headline(s.plan))}</b>"
            self.microbatches.value = s.whatif.num_microbatches
            self.status.object = _message(s.ok, s.message)
            self._draw_cuts()
            self._draw_submeshes()
            self.comparison_pane.object = compare.comparison_html(compare.comparison_rows(s.comparison))
            rows = {f"stage {r.stage}: {r.tensor}": r for r in vm.sharding_rows(s.graph, s.plan, s.pins)}
            self._rows = rows
            keep = self.tensor_select.value
            self.tensor_select.options = list(rows)
            self.tensor_select.value = keep if keep in rows else self._first_tensor_key()
            self._draw_mesh()
            self._strategies = {r.node: r for r in vm.strategy_rows(s.graph, s.plan, s.pins)}
            self._offer_operators(s.graph, list(self._strategies.values()))
            self._fill_strategies()
            if getattr(self, "_drawn", None) != (s.plan, s.measured):  # pin edits leave the plan's figures
                self._draw_layers()
                self._draw_graph()
                try:
                    predicted = s.predicted_timeline()
                except Exception:  # a simulator failure must not hide the rest of the page
                    predicted = None
                self._bubble = None if predicted is None else predicted.bubble_fraction
                figure = F.gantt_figure(*tv.timeline_panels(s.plan, predicted, s.measured, s.measured_prediction))
                self.timeline_pane.object, self.timeline_pane.height = figure, figure.layout.height
                self.cost_pane.object = F.cost_figure(vm.cost_view(s.plan, s.previous))
                self.cluster_pane.object = F.cluster_map_figure(cmap.cluster_map(s.graph, s.plan))
                self.diff_pane.object = ("" if s.previous is None
                                         else compare.plan_diff_html(compare.plan_diff(s.previous, s.plan)))
                self._drawn = (s.plan, s.measured)
            self.summary.object = vm.header_html(vm.header_items(s.graph, s.plan, getattr(self, "_bubble", None)))
        finally:
            self._syncing = False

    def _draw_cuts(self) -> None:
        plan, pins = self.session.plan, self.session.pins
        stage_of = {layer: st.index for st in plan.stages for layer in st.layers}
        slots = vm.cut_slots(plan, pins)
        items: list[Any] = []
        for layer in range(len(plan.layers)):
            if layer:
                slot = slots[layer - 1]
                button = pn.widgets.Button(
                    name=f"gap {slot.label}", button_type="danger" if slot.is_cut else "default",
                    button_style="solid" if slot.pinned else "outline", margin=(2, 2),
                )
                button.on_click(lambda _, l=layer: self.session.toggle_cut(l))
                items.append(button)
            colour = F.stage_colour(stage_of.get(layer, 0))
            items.append(pn.pane.HTML(
                f'<div style="background:{colour};color:white;padding:6px 10px;border-radius:3px">'
                f'L{layer} (stage {stage_of.get(layer, 0)})</div>', margin=(2, 2)))
        self.cut_row.objects = items

    def _draw_submeshes(self) -> None:
        rows = []
        for band in vm.stage_bands(self.session.plan, self.session.pins):
            # string values: a None value would show as an empty select in the browser
            choices = {vm.submesh_option_label(*o): o for o in band.submesh_options}
            pinned = (band.pinned_submesh, self.session.pins.logical_mesh_map.get(band.index))
            current = next((label for label, o in choices.items() if o == pinned), SOLVER_CHOICE)
            select = pn.widgets.Select(name=f"stage {band.index} submesh", options=[SOLVER_CHOICE, *choices],
                                       value=current, width=200)
            select.param.watch(
                lambda e, i=band.index, c=choices: None if self._syncing else self.session.pin_submesh(i, c.get(e.new)),
                "value")
            remat_label = next(label for label, v in vm.REMAT_CHOICES.items() if v == band.pinned_remat)
            remat = pn.widgets.Select(name=f"stage {band.index} remat", options=list(vm.REMAT_CHOICES),
                                      value=remat_label, width=170)
            remat.param.watch(
                lambda e, i=band.index: None if self._syncing else self.session.pin_remat(i, vm.REMAT_CHOICES[e.new]),
                "value")
            rows.append(pn.Row(select, remat, pn.pane.HTML(html.escape(band.label))))
        self.submesh_column.objects = rows


    def _fill_strategies(self) -> None:
        row = getattr(self, "_strategies", {}).get(self.selected_operator)
        syncing, self._syncing = self._syncing, True
        try:
            if row is None:
                self.strategy_select.options, self.strategy_select.value = [SOLVER_CHOICE], SOLVER_CHOICE
                return
            self.strategy_select.options = dict(self.session.strategy_choices(row))
            self.strategy_select.value = row.pinned or SOLVER_CHOICE
        finally:
            self._syncing = syncing

    def _on_strategy(self, event: Any) -> None:
        if self._syncing or self.selected_operator is None:
            return
        self.session.pin_strategy(self.selected_operator, None if event.new == SOLVER_CHOICE else event.new)

    def _draw_layers(self) -> None:
        s = self.session
        self.layer_pane.object = F.layer_bars_figure(layer_bars(s.graph, s.plan))
        options = {f"L{i}": i for i in range(len(s.plan.layers))}
        if self.table_layer.options != options:
            keep = self.table_layer.value
            self.table_layer.options = options
            self.table_layer.value = keep if keep in options.values() else 0
        self._fill_operator_table()

    def _on_layer_click(self, event: Any) -> None:
        points = (event.new or {}).get("points") or []
        if points and "customdata" in points[0]:
            self.table_layer.value = int(points[0]["customdata"])

    def _fill_operator_table(self) -> None:
        s = self.session
        layer = self.table_layer.value or 0
        if layer < len(s.plan.layers):
            self.op_table.object = operator_table_html(operator_rows(s.graph, s.plan, layer, self.op_search.value))

    def _draw_graph(self) -> None:
        s = self.session
        options = {"all": -1} | {f"L{i}": i for i in range(s.graph.num_layers)}
        if self.graph_layer.options != options:
            self.graph_layer.options = options
        layer = self.graph_layer.value
        view = (vm.layer_graph_view(s.graph, s.plan) if self.graph_level.value == "layer"
                else vm.op_graph_view(s.graph, s.plan, None if layer in (-1, None) else [layer], max_nodes=300))
        self.graph_pane.object = F.graph_figure(view)

    def _first_tensor_key(self) -> str:
        first = vm.first_tensor(list(self._rows.values()))
        return "" if first is None else f"stage {first.stage}: {first.tensor}"

    def _draw_mesh(self) -> None:
        row = getattr(self, "_rows", {}).get(self.tensor_select.value)
        picture = None if row is None else tensor_picture(row)
        if picture is not None and getattr(self, "_pictured", None) != picture:
            self.tensor_pane.object = F.tensor_figure(picture)
            self._pictured = picture
        self.mesh_pane.object = F.mesh_html(row) if row is not None and row.blocks else "<i>no sharding</i>"


def _message(ok: bool, text: str) -> str:
    colour = "#2a7a2a" if ok else "#b00020"
    return f'<span style="color:{colour}"><b>{html.escape(text)}</b></span>'


def default_session(num_layers: int = 4, solver=None, cache: Any = None) -> EditorSession:
    """The default GPT (with `num_layers` blocks) on one 8-GPU A100 host, solved with av.solve."""
    step, params, batch = gpt(num_layers=num_layers)
    graph = trace(step, params, batch)
    return EditorSession(graph, whatif=WhatIf(4, "1f1b", Cluster.a100_node(1)), solver=solver,
                         solve_options={"cache": cache} if cache is not None else None,
                         step_fn=step, example_args=(params, batch))


def _page(make_session) -> pn.Column:
    pn.extension("plotly")
    try:
        return PanelEditor(make_session()).layout
    except ValueError as err:  # e.g. no solver in this alpaviz yet: say so on the page
        return pn.Column(pn.pane.Markdown("## alpaviz plan editor"), pn.pane.HTML(_message(False, str(err))))


def create_app(num_layers: int = 4, solver=None, cache: Any = None) -> pn.Column:
    """A fresh page with its own session (solves the default model when the page opens)."""
    return _page(lambda: default_session(num_layers, solver, cache))


def serve(port: int = 5006, address: str = "127.0.0.1", num_layers: int = 4, solver=None, show: bool = False) -> Any:
    """Start the panel server on `address:port` (blocking).

    The default model is traced and solved once here; each browser tab then
    starts from that plan with its own session and a shared stage-profile cache.
    """
    try:
        first = default_session(num_layers, solver)
    except ValueError as err:  # no first plan: every page says why
        reason = str(err)

        def fresh() -> EditorSession:
            raise ValueError(reason)
    else:
        def fresh() -> EditorSession:
            return EditorSession(first.graph, first.plan, whatif=first.whatif, solver=first.solver,
                                 solve_options={"cache": first.cache}, step_fn=first.step_fn,
                                 example_args=first.example_args)

    return pn.serve(lambda: _page(fresh), port=port, address=address, show=show,
                    websocket_origin=[f"{address}:{port}", f"localhost:{port}"], title="alpaviz plan editor")


if __name__.startswith("bokeh"):  # `panel serve widgets/_app.py`
    create_app().servable()
