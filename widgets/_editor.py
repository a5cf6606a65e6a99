"""The ipywidgets plan editor: linked views of one `EditorSession`.

Every control calls a session action; the session notifies and all views
are redrawn from a fresh view model, so no view holds state of its own.
"""

from __future__ import annotations

import html
from typing import Any, Callable

import ipywidgets as W
import plotly.graph_objects as go

from alpaviz.core import Cluster, OpGraph, Plan, trace
from alpaviz.widgets import _figures as F
from alpaviz.widgets import _cluster_map as cmap
from alpaviz.widgets import _plan_compare as compare
from alpaviz.widgets import _timeline_view as tv
from alpaviz.widgets import _view_model as vm
from alpaviz.widgets._layer_view import layer_bars, operator_rows, operator_table_html
from alpaviz.widgets._pickers import OperatorPicker
from alpaviz.widgets._report import ReportSection, section_html
from alpaviz.widgets._tensor_picture import tensor_picture
from alpaviz.widgets._session import PRESETS, EditorSession, WhatIf, WhatIfControls

SOLVER_CHOICE, TAB_TITLES = vm.SOLVER_CHOICE, vm.TAB_TITLES


def _replace_figure(widget: go.FigureWidget, fig: go.Figure) -> None:
    with widget.batch_update():
        widget.data = ()
        widget.add_traces(list(fig.data))
        widget.layout = fig.layout


class PlanEditor(WhatIfControls, OperatorPicker, W.VBox):
    """Operator graph, stage cuts, sharding, pipeline timeline and cost of a plan, with pins.

    Example:
        >>> ed = av.editor(train_step, params, batch, cluster=av.Cluster.a100_node(1))
        >>> ed   # in a notebook; ed.session.plan is the plan shown
    """

    def __init__(self, session: EditorSession, strategy_names: Callable[..., tuple[str, ...]] | None = None):
        self.session = session
        self._strategy_names = strategy_names
        self._syncing = False
        self.summary = W.HTML()
        self.headline = W.HTML()
        self.status = W.HTML()
        self.progress = W.IntProgress(value=0, min=0, max=1, description="solve", layout=W.Layout(width="240px"))
        # operator graph
        self.graph_level = W.ToggleButtons(options=[("layers", "layer"), ("operators", "op")], value="layer")
        self.graph_layer = W.Dropdown(description="layer", options=[("all", -1)], value=-1)
        self.graph_figure = go.FigureWidget()
        self.layer_figure = go.FigureWidget()
        self.table_layer = W.Dropdown(description="operators of", options=[("L0", 0)], value=0)
        self.op_search = W.Text(placeholder="search: scope, name, primitive or strategy", layout=W.Layout(width="360px"))
        self.op_table = W.HTML()
        # stage cuts and submeshes
        self.cut_row = W.HBox(layout=W.Layout(flex_flow="row wrap"))
        self.cut_buttons: dict[int, W.Button] = {}
        self.submesh_box = W.VBox()
        self.submesh_dropdowns: dict[int, W.Dropdown] = {}
        # sharding
        self.tensor_select = W.Combobox(description="tensor", placeholder="type to search any tensor", ensure_option=True,
                                        layout=W.Layout(width="480px"))
        self.tensor_figure = go.FigureWidget()
        self.mesh_picture = W.HTML()
        self.op_select = W.Combobox(description="operator", ensure_option=True, layout=W.Layout(width="480px"),
                                    placeholder="type to search: scope in your code, primitive or name")
        self.strategy_select = W.Dropdown(description="strategy", layout=W.Layout(width="480px"))
        # timeline and cost
        self.timeline_figure = go.FigureWidget()
        self.cost_figure = go.FigureWidget()
        self.cluster_figure = go.FigureWidget()
        self.diff = W.HTML()
        self.compare_button = W.Button(description="Compare", tooltip="price the Megatron grid and data parallelism")
        self.comparison = W.HTML()
        # buttons
        self.resolve_button = W.Button(description="Re-solve", button_style="primary", icon="refresh")
        self.reset_button = W.Button(description="Reset pins")
        self.launch_steps = W.BoundedIntText(value=3, min=1, max=1000, description="steps", layout=W.Layout(width="140px"))
        self.launch_button = W.Button(description="Launch", button_style="success")
        self.path = W.Text(value="plan.json", description="file", layout=W.Layout(width="260px"))
        self.save_button = W.Button(description="Save plan")
        self.trace_button = W.Button(description="Save trace", tooltip="the timeline as a Perfetto / Chrome trace, "
                                     "next to the plan file (its name with .trace.json)")
        self.load_button = W.Button(description="Load plan")
        # what-if
        w = session.whatif
        self.microbatches = W.BoundedIntText(value=w.num_microbatches, min=1, max=4096, description="microbatches")
        self.search_button = W.Button(description="Search count", tooltip=(
            "try every microbatch count that divides the global batch (example batch x microbatches)"))
        self.schedule = W.Dropdown(options=["1f1b", "gpipe"], value=w.schedule, description="schedule")
        self.preset = W.Dropdown(options=[("(current)", "")] + [(k, k) for k in PRESETS], value="", description="cluster")
        self.hosts = W.BoundedIntText(value=w.cluster.num_hosts, min=1, max=512, description="hosts")
        self.intra_bw = W.BoundedFloatText(value=w.cluster.intra_host.bandwidth_bytes_per_s / 1e9, min=1e-3,
                                           max=1e5, description="intra GB/s")
        self.inter_bw = W.BoundedFloatText(value=w.cluster.inter_host.bandwidth_bytes_per_s / 1e9, min=1e-3,
                                           max=1e5, description="inter GB/s")
        self._wire()
        super().__init__(self._layout())
        self.tabs.observe(lambda change: self._draw_tab(change["new"]), "selected_index")
        session.on_change(self.refresh)
        session.on_activity(self._on_activity)
        session.on_progress(self._on_progress)
        self.refresh()

    def _repr_mimebundle_(self, **kwargs: Any) -> dict:
        """The live widget, and a static snapshot (`text/html`) that a notebook exported to HTML shows."""
        data = super()._repr_mimebundle_(**kwargs)
        data["text/html"] = self.snapshot_html()
        return data

    def snapshot_html(self) -> str:
        """The header and the plan's figures as static HTML (plotly.js is expected on the page, as the
        notebook renderer puts it there)."""
        s = self.session
        header = vm.header_html(vm.header_items(s.graph, s.plan, getattr(self, "_bubble", None)))
        section = ReportSection("plan editor (a static snapshot: run the notebook to edit)", s.graph, s.plan,
                                s.measured)
        return f"<div>{header}{section_html(section, first=False)}</div>"

    # ---- layout and wiring --------------------------------------------------
    def _layout(self) -> list[W.Widget]:
        """The header (figures, status, actions, what-if) always on top; the views in tabs under it."""
        section = lambda title: W.HTML(f"<b>{title}</b>")  # noqa: E731
        self.tabs = W.Tab(children=[
            W.VBox([section("Stage cuts (click a gap: pin cut / pin no-cut / free)"), self.cut_row, self.submesh_box,
                    section("Where the stages run"), self.cluster_figure]),
            W.VBox([self.layer_figure, W.HBox([self.table_layer, self.op_search]), self.op_table,
                    W.HBox([self.graph_level, self.graph_layer]), self.graph_figure]),
            W.VBox([W.HBox([self.tensor_select]), self.tensor_figure, self.mesh_picture,
                    W.HBox([self.op_select, self.strategy_select])]),
            W.VBox([self.timeline_figure]),
            W.VBox([self.cost_figure]),
            W.VBox([section("What the last re-solve changed"), self.diff,
                    section("Why this plan"), self.compare_button, self.comparison]),
        ])
        for index, title in enumerate(TAB_TITLES):
            self.tabs.set_title(index, title)
        return [
            self.summary, W.HBox([self.headline]), W.HBox([self.status, self.progress]),
            W.HBox([self.resolve_button, self.reset_button, self.launch_steps, self.launch_button,
                    self.path, self.save_button, self.load_button, self.trace_button]),
            W.HBox([self.microbatches, self.search_button, self.schedule, self.preset]),
            W.HBox([self.hosts, self.intra_bw, self.inter_bw]),
            self.tabs,
        ]

    def _wire(self) -> None:
        s = self.session
        self.resolve_button.on_click(lambda _: self.resolve())
        self.reset_button.on_click(lambda _: s.reset_pins())
        self.compare_button.on_click(lambda _: s.compare())
        self.search_button.on_click(lambda _: s.search_microbatches())
        self.launch_button.on_click(lambda _: s.launch(self.launch_steps.value))
        self.save_button.on_click(lambda _: s.save(self.path.value))
        self.trace_button.on_click(lambda _: s.save_trace(trace_path(self.path.value)))
        self.load_button.on_click(lambda _: s.load(self.path.value))
        self.graph_level.observe(lambda _: self._draw_graph(), "value")
        self.graph_layer.observe(lambda _: self._draw_graph(), "value")
        self.table_layer.observe(lambda _: self._fill_operator_table(), "value")
        self.op_search.observe(lambda _: self._fill_operator_table(), "value")
        self.tensor_select.observe(lambda _: self._draw_mesh(), "value")
        self.op_select.observe(lambda _: self._fill_strategies(), "value")
        self.strategy_select.observe(self._on_strategy, "value")
        for control in (self.microbatches, self.schedule, self.preset, self.hosts, self.intra_bw, self.inter_bw):
            control.observe(self._on_whatif, "value")

    # ---- actions -------------------------------------------------------------
    def resolve(self) -> None:
        """Re-solve; the session reports its progress and keeps the old plan if it fails."""
        outcome = self.session.resolve()
        self.progress.bar_style = "success" if outcome.ok else "danger"

    def controls(self) -> list[W.Widget]:
        """Every control that starts an action or edits a pin (disabled while the session is busy)."""
        return [self.resolve_button, self.reset_button, self.compare_button, self.search_button, self.launch_button,
                self.save_button, self.load_button, self.trace_button, self.launch_steps, self.microbatches, self.schedule, self.preset,
                self.hosts, self.intra_bw, self.inter_bw, self.strategy_select, *self.cut_buttons.values(),
                *self.submesh_dropdowns.values(), *self.remat_dropdowns.values()]

    def _on_activity(self, what: str) -> None:
        for control in self.controls():
            control.disabled = bool(what)
        if what:
            self.status.value = f'<span style="color:#4C78A8"><b>&#x23F3; {what}...</b></span>'
            self.progress.bar_style, self.progress.value, self.progress.description = "info", 0, what[:12]
        else:
            self.progress.value = self.progress.max

    def _on_progress(self, phase: str, done: int, total: int) -> None:
        self.progress.max = max(total, 1)
        self.progress.value = min(done, self.progress.max)
        self.progress.description = phase[:12]
        self.progress.tooltip = f"{phase}: {done} of {total}"

    def _mark(self, control: W.Widget, problem: str | None) -> None:
        control.layout.border = "2px solid #b00020" if problem else ""
        control.tooltip = problem or ""

    def _on_cut(self, layer: int) -> None:
        self.session.toggle_cut(layer)

    def _on_submesh(self, stage: int, change: dict[str, Any]) -> None:
        if not self._syncing:
            self.session.pin_submesh(stage, change["new"])

    def _on_strategy(self, change: dict[str, Any]) -> None:
        if self._syncing or self.selected_operator is None:
            return
        value = change["new"]
        self.session.pin_strategy(self.selected_operator, None if value == SOLVER_CHOICE else value)

    def _on_whatif(self, change: dict[str, Any]) -> None:
        if not self._syncing:
            self._apply_whatif(change["owner"] in (self.preset, self.hosts))

    def _show_error(self, text: str) -> None:
        self.status.value = self._message(False, text)

    # ---- drawing -------------------------------------------------------------
    @staticmethod
    def _message(ok: bool, text: str) -> str:
        import html

        colour = "#2a7a2a" if ok else "#b00020"
        style = "" if ok else ' style="color:#b00020"'
        return f'<span style="color:{colour}"><b{style}>{html.escape(text)}</b></span>'

    def refresh(self) -> None:
        """Redraw the views from the session; the plan's figures only when the plan (or its timeline) changed."""
        s = self.session
        self._syncing = True
        try:
            self.headline.value = f"<b>{html.escape(vm.plan_headline(s.plan))}</b>"
            self.microbatches.value = s.whatif.num_microbatches
            self.status.value = self._message(s.ok, s.message)
            self._draw_cuts()
            self._draw_submeshes()
            self._fill_sharding()
            self.comparison.value = compare.comparison_html(compare.comparison_rows(s.comparison))
            drawn = (s.plan, s.measured)
            if getattr(self, "_drawn", None) != drawn:
                self._predict()
                self._stale = set(self._tab_drawers)  # each tab's figures are drawn when it is shown
                self._drawn = drawn
            self._draw_tab(self.tabs.selected_index or 0)
            self.summary.value = vm.header_html(vm.header_items(s.graph, s.plan, getattr(self, "_bubble", None)))
        finally:
            self._syncing = False

    @property
    def _tab_drawers(self) -> dict[int, Callable[[], None]]:
        """The figures behind each tab (by TAB_TITLES index), the plan's dearest views."""
        s = self.session
        return {
            0: lambda: _replace_figure(self.cluster_figure, F.cluster_map_figure(cmap.cluster_map(s.graph, s.plan))),
            1: lambda: (self._draw_layers(), self._draw_graph()),
            3: self._draw_timeline,
            4: lambda: _replace_figure(self.cost_figure, F.cost_figure(vm.cost_view(s.plan, s.previous))),
            5: lambda: setattr(self.diff, "value", "" if s.previous is None
                               else compare.plan_diff_html(compare.plan_diff(s.previous, s.plan))),
        }

    def _draw_tab(self, index: int) -> None:
        """Draw tab `index` if the plan changed since it was last drawn (a re-solve redraws what is seen)."""
        if index in getattr(self, "_stale", set()):
            self._stale.discard(index)
            self._tab_drawers[index]()

    def _draw_cuts(self) -> None:
        plan, pins = self.session.plan, self.session.pins
        stage_of = {layer: st.index for st in plan.stages for layer in st.layers}
        children: list[W.Widget] = []
        self.cut_buttons = {}
        slots = vm.cut_slots(plan, pins)
        for layer in range(len(plan.layers)):
            if layer:
                slot = slots[layer - 1]
                button = W.Button(
                    description=slot.label, tooltip=f"gap before layer {layer}",
                    button_style="danger" if slot.is_cut else "", icon="thumb-tack" if slot.pinned else "",
                    layout=W.Layout(width="auto"),
                )
                button.on_click(lambda _, l=layer: self._on_cut(l))
                self.cut_buttons[layer] = button
                children.append(button)
            children.append(W.HTML(
                f'<div style="background:{F.stage_colour(stage_of.get(layer, 0))};color:white;padding:4px 8px;'
                f'border-radius:3px">L{layer}</div>'))
        self.cut_row.children = children

    def _draw_submeshes(self) -> None:
        rows, self.submesh_dropdowns, self.remat_dropdowns = [], {}, {}
        for band in vm.stage_bands(self.session.plan, self.session.pins):
            options = [(SOLVER_CHOICE, None)] + [(vm.submesh_option_label(*o), o) for o in band.submesh_options]
            pinned = (band.pinned_submesh, self.session.pins.logical_mesh_map.get(band.index))
            value = pinned if pinned in [o for _, o in options] else None
            dropdown = W.Dropdown(options=options, value=value, description=f"stage {band.index}")
            dropdown.observe(lambda change, i=band.index: self._on_submesh(i, change), "value")
            self.submesh_dropdowns[band.index] = dropdown
            remat = W.Dropdown(options=list(vm.REMAT_CHOICES.items()), value=band.pinned_remat,
                               layout=W.Layout(width="170px"))
            remat.observe(lambda change, i=band.index: None if self._syncing else self.session.pin_remat(
                i, change["new"]), "value")
            self.remat_dropdowns[band.index] = remat
            rows.append(W.HBox([dropdown, remat, W.HTML(html.escape(band.label))]))
        self.submesh_box.children = rows

    def _draw_graph(self) -> None:
        s = self.session
        options = [("all", -1)] + [(f"L{i}", i) for i in range(s.graph.num_layers)]
        if list(self.graph_layer.options) != options:
            self.graph_layer.options = options
        if self.graph_level.value == "layer":
            view = vm.layer_graph_view(s.graph, s.plan)
        else:
            layer = self.graph_layer.value
            view = vm.op_graph_view(s.graph, s.plan, None if layer in (-1, None) else [layer])
        _replace_figure(self.graph_figure, F.graph_figure(view))
        self._graph_view = view
        self.graph_figure.data[1].on_click(lambda _trace, points, _sel: self.on_graph_click(points.point_inds))

    def _draw_layers(self) -> None:
        s = self.session
        _replace_figure(self.layer_figure, F.layer_bars_figure(layer_bars(s.graph, s.plan)))
        for bars in self.layer_figure.data[:3]:  # the stacked bars: a click lists that layer's operators
            bars.on_click(lambda tr, points, _sel: self.on_layer_click(points.point_inds))
        options = [(f"L{i}", i) for i in range(len(s.plan.layers))]
        if list(self.table_layer.options) != options:
            keep = self.table_layer.value
            self.table_layer.options = options
            self.table_layer.value = keep if keep in dict(options).values() else 0
        self._fill_operator_table()

    def on_layer_click(self, indices: list[int]) -> None:
        """A click on a layer in a figure selects that layer in the tensor table."""
        if indices:
            self.table_layer.value = int(indices[0])

    def _fill_operator_table(self) -> None:
        s = self.session
        layer = self.table_layer.value if self.table_layer.value is not None else 0
        if layer < len(s.plan.layers):
            self.op_table.value = operator_table_html(operator_rows(s.graph, s.plan, layer, self.op_search.value))

    def on_graph_click(self, indices: list[int]) -> None:
        """Clicking a layer node expands it to its operators; clicking an operator selects it."""
        if not indices:
            return
        node = self._graph_view.nodes[indices[0]]
        if self._graph_view.level == "layer":
            self.graph_layer.value = int(node.key.removeprefix("layer"))
            self.graph_level.value = "op"
        elif node.key in self._strategies:
            self.select_operator(node.key)

    def _fill_sharding(self) -> None:
        s = self.session
        self._rows = {f"stage {r.stage}: {r.tensor}": r for r in vm.sharding_rows(s.graph, s.plan, s.pins)}
        keep = self.tensor_select.value
        self.tensor_select.options = list(self._rows)
        self.tensor_select.value = keep if keep in self._rows else self._first_tensor_key()
        self._draw_mesh()
        self._strategies = {r.node: r for r in vm.strategy_rows(s.graph, s.plan, s.pins)}
        self._offer_operators(s.graph, list(self._strategies.values()))
        self._fill_strategies()


    def _first_tensor_key(self) -> str:
        first = vm.first_tensor(list(self._rows.values()))
        return "" if first is None else f"stage {first.stage}: {first.tensor}"

    def _draw_mesh(self) -> None:
        row = self._rows.get(self.tensor_select.value) if hasattr(self, "_rows") else None
        picture = None if row is None else tensor_picture(row)
        if picture is not None and getattr(self, "_pictured", None) != picture:
            _replace_figure(self.tensor_figure, F.tensor_figure(picture))
            self._pictured = picture
        self.mesh_picture.value = F.mesh_html(row) if row is not None and row.blocks else "<i>no sharding</i>"

    def _fill_strategies(self) -> None:
        row = self._strategies.get(self.selected_operator) if hasattr(self, "_strategies") else None
        syncing, self._syncing = self._syncing, True
        try:
            if row is None:
                self.strategy_select.options, self.strategy_select.value = [SOLVER_CHOICE], SOLVER_CHOICE
                return
            self.strategy_select.options = self.session.strategy_choices(row, self._strategy_names)
            self.strategy_select.value = row.pinned or SOLVER_CHOICE
        finally:
            self._syncing = syncing

    def _predict(self) -> None:
        """The plan's simulated timeline: the header's bubble, and the Timeline tab."""
        try:
            self._predicted = self.session.predicted_timeline()
        except Exception:  # a simulator failure must not hide the rest of the editor
            self._predicted = None
        self._bubble = None if self._predicted is None else self._predicted.bubble_fraction

    def _draw_timeline(self) -> None:
        s = self.session
        panels = tv.timeline_panels(s.plan, self._predicted, s.measured, s.measured_prediction)
        _replace_figure(self.timeline_figure, F.gantt_figure(*panels))


def trace_path(plan_path: str) -> str:
    """Where the editor saves the timeline: the plan file's name with .trace.json."""
    stem = plan_path[:-5] if plan_path.endswith(".json") else plan_path
    return stem + ".trace.json"


def editor(fn_or_plan: Callable[..., Any] | Plan, *args: Any, cluster=None, graph: OpGraph | None = None,
           solver=None, **solve_options: Any) -> PlanEditor:
    """Open the visual plan editor on a training step (solved here) or on an existing plan.

    Example:
        >>> ed = av.editor(train_step, params, batch, cluster=av.Cluster.a100_node(1), num_microbatches=4)
        >>> ed = av.editor(plan, graph=graph)
    """
    step_fn = None
    if isinstance(fn_or_plan, Plan):
        plan = fn_or_plan
        if graph is None:
            if not args:
                raise ValueError("av.editor(plan) needs the graph: pass graph=... or the training step and its "
                                 "arguments, av.editor(plan, train_step, params, batch)")
            step_fn, args = args[0], args[1:]
            graph = trace(step_fn, *args)
    else:
        plan, step_fn = None, fn_or_plan
        graph = graph or trace(fn_or_plan, *args)
    whatif = None
    if plan is None:
        whatif = WhatIf(solve_options.pop("num_microbatches", 4), solve_options.pop("schedule", "1f1b"),
                        cluster or Cluster.a100_node(1))
    session = EditorSession(graph, plan, whatif=whatif, solver=solver, solve_options=solve_options,
                            step_fn=step_fn, example_args=args)
    return PlanEditor(session)
