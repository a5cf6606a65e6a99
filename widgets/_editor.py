"""The ipywidgets plan editor: the shared editor view mapped onto notebook widgets.

Every control hands its event to the `EditorController`; the controller calls the session and presents a
fresh `EditorView`, which `render` writes back into the widgets. Only the tab in view is redrawn.
"""

from __future__ import annotations

from typing import Any, Callable

import ipywidgets as W
import plotly.graph_objects as go

from alpaviz.widgets import _html as H
from alpaviz.widgets import _view_model as vm
from alpaviz.widgets._editor_controller import EditorController, trace_path_for
from alpaviz.widgets._editor_view import GRAPH_LEVELS, EditorView, WhatIfFields
from alpaviz.widgets._session import PRESETS, SCHEDULE_CHOICES, WHATIF_FIELDS, EditorSession

SOLVER_CHOICE, TAB_TITLES = vm.SOLVER_CHOICE, vm.TAB_TITLES


def _replace_figure(widget: go.FigureWidget, fig: go.Figure) -> None:
    with widget.batch_update():
        widget.data = ()
        widget.add_traces(list(fig.data))
        widget.layout = fig.layout


class PlanEditor(W.VBox):
    """Operator graph, stage cuts, sharding, pipeline timeline and cost of a plan, with pins.

    Example:
        >>> ed = av.editor(train_step, params, batch, cluster=av.Cluster.a100_node(1))
        >>> ed   # in a notebook; ed.session.plan is the plan shown
    """

    def __init__(self, session: EditorSession, strategy_names: Callable[..., tuple[str, ...]] | None = None):
        self.session = session
        self.controller = EditorController(session, strategy_names)
        self.summary = W.HTML()
        self.headline = W.HTML()
        self.status = W.HTML()
        self.progress = W.IntProgress(value=0, min=0, max=1, description="solve", layout=W.Layout(width="240px"))
        # operator graph
        self.graph_level = W.ToggleButtons(options=list(GRAPH_LEVELS), value="layer")
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
        self.remat_dropdowns: dict[int, W.Dropdown] = {}
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
        self.plan_text = W.HTML()
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
        self.schedule = W.Dropdown(options=list(SCHEDULE_CHOICES), value=w.schedule, description="schedule")
        self.preset = W.Dropdown(options=[("(current)", "")] + [(k, k) for k in PRESETS], value="", description="cluster")
        self.hosts = W.BoundedIntText(value=w.cluster.num_hosts, min=1, max=512, description="hosts")
        self.intra_bw = W.BoundedFloatText(value=w.cluster.intra_host.bandwidth_bytes_per_s / 1e9, min=1e-3,
                                           max=1e5, description="intra GB/s")
        self.inter_bw = W.BoundedFloatText(value=w.cluster.inter_host.bandwidth_bytes_per_s / 1e9, min=1e-3,
                                           max=1e5, description="inter GB/s")
        super().__init__(self._layout())
        self._wire()
        self.controller.on_view(self.render)
        session.on_activity(self._on_activity)
        session.on_progress(self._on_progress)
        self.render()

    def _repr_mimebundle_(self, **kwargs: Any) -> dict:
        """The live widget, and a static snapshot (`text/html`) that a notebook exported to HTML shows."""
        data = super()._repr_mimebundle_(**kwargs)
        data["text/html"] = self.controller.snapshot_html()
        return data

    @property
    def selected_operator(self) -> str | None:
        """The operator the strategy picker is for, or None while the box holds no whole label."""
        return self.controller.selected_operator

    # ---- layout and wiring --------------------------------------------------
    def _layout(self) -> list[W.Widget]:
        """The header (figures, status, actions, what-if) always on top; the views in tabs under it."""
        section = lambda title: W.HTML(H.bold_html(title))  # noqa: E731
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
                    section("Why this plan"), self.compare_button, self.comparison, self.plan_text]),
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
        s, c = self.session, self.controller
        for name, act in c.button_handlers(self.resolve, lambda: self.launch_steps.value).items():
            getattr(self, name).on_click(lambda _, act=act: act())
        for name, handle in c.value_handlers().items():
            getattr(self, name).observe(lambda change, handle=handle: handle(change["new"]), "value")
        self.save_button.on_click(lambda _: s.save(self.path.value))
        self.trace_button.on_click(lambda _: s.save_trace(trace_path_for(self.path.value)))
        self.load_button.on_click(lambda _: s.load(self.path.value))
        self.tabs.observe(lambda change: c.select(tab=change["new"] or 0), "selected_index")
        for name in WHATIF_FIELDS:
            getattr(self, name).observe(self._on_whatif, "value")

    # ---- actions -------------------------------------------------------------
    def resolve(self) -> None:
        """Re-solve; the session reports its progress and keeps the old plan if it fails."""
        outcome = self.controller.resolve()
        self.progress.bar_style = "success" if outcome.ok else "danger"

    def controls(self) -> list[W.Widget]:
        """Every control that starts an action or edits a pin (disabled while the session is busy)."""
        return [self.resolve_button, self.reset_button, self.compare_button, self.search_button, self.launch_button,
                self.save_button, self.load_button, self.trace_button, self.launch_steps, self.microbatches,
                self.schedule, self.preset, self.hosts, self.intra_bw, self.inter_bw, self.strategy_select,
                *self.cut_buttons.values(), *self.submesh_dropdowns.values(), *self.remat_dropdowns.values()]

    def _on_activity(self, what: str) -> None:
        for control in self.controls():
            control.disabled = bool(what)
        if what:
            self.status.value = H.busy_html(what)
            self.progress.bar_style, self.progress.value, self.progress.description = "info", 0, what[:12]
        else:
            self.progress.value = self.progress.max

    def _on_progress(self, phase: str, done: int, total: int) -> None:
        self.progress.max = max(total, 1)
        self.progress.value = min(done, self.progress.max)
        self.progress.description = phase[:12]
        self.progress.tooltip = f"{phase}: {done} of {total}"

    def _on_whatif(self, change: dict[str, Any]) -> None:
        fields = WhatIfFields(*(getattr(self, name).value for name in WHATIF_FIELDS))
        self.controller.apply_whatif(fields, change["owner"] in (self.preset, self.hosts))

    def on_layer_click(self, indices: list[int]) -> None:
        """A click on a layer in a figure selects that layer in the operator table."""
        self.controller.click_layer(indices)

    def on_graph_click(self, indices: list[int]) -> None:
        """Clicking a layer node expands it to its operators; clicking an operator selects it."""
        self.controller.click_graph(indices)

    # ---- the view, mapped onto the widgets -------------------------------------------
    def render(self) -> None:
        """Let the controller show its view on these widgets and draw the stale parts of the tab in view."""
        self.controller.render(self)

    def show_markup(self, name: str, markup: str) -> None:
        """An HTML widget (headline, summary or status) takes markup as its value."""
        getattr(self, name).value = markup

    def show_control(self, name: str, options: tuple | None, value: Any) -> None:
        """A Dropdown, Combobox, ToggleButtons or Text box that shows the selection."""
        _show_choice(getattr(self, name), options, value)

    def show_tab(self, index: int) -> None:
        """ipywidgets' Tab calls the tab in view `selected_index`."""
        self.tabs.selected_index = index

    def show_whatif(self, name: str, value: Any, problem: str | None) -> None:
        """A what-if control's value, outlined red with the problem as its tooltip when it was refused."""
        control = getattr(self, name)
        control.value = value
        control.layout.border = f"2px solid {H.ERROR_COLOUR}" if problem else ""
        control.tooltip = problem or ""

    def show_cuts(self, view: EditorView) -> None:
        """The layer chips with a button in each gap."""
        children: list[W.Widget] = [W.HTML(H.layer_chip_html(0, view.chips[0].stage, view.chips[0].colour))]
        self.cut_buttons = {}
        for cut, chip in zip(view.cuts, view.chips[1:]):
            button = W.Button(description=cut.label, tooltip=cut.tooltip, button_style="danger" if cut.is_cut else "",
                              icon="thumb-tack" if cut.pinned else "", layout=W.Layout(width="auto"))
            button.on_click(lambda _, layer=cut.layer: self.controller.toggle_cut(layer))
            self.cut_buttons[cut.layer] = button
            children += [button, W.HTML(H.layer_chip_html(chip.layer, chip.stage, chip.colour))]
        self.cut_row.children = children

    def show_stages(self, view: EditorView) -> None:
        """One row per stage: its submesh and recomputation pickers and what it holds."""
        rows, self.submesh_dropdowns, self.remat_dropdowns = [], {}, {}
        for row in view.stages:
            submesh = W.Dropdown(options=row.submesh_labels, value=row.submesh, description=f"stage {row.index}")
            submesh.observe(lambda change, i=row.index: self.controller.pin_submesh(i, change["new"]), "value")
            remat = W.Dropdown(options=row.remat_labels, value=row.remat, layout=W.Layout(width="170px"))
            remat.observe(lambda change, i=row.index: self.controller.pin_remat(i, change["new"]), "value")
            self.submesh_dropdowns[row.index], self.remat_dropdowns[row.index] = submesh, remat
            rows.append(W.HBox([submesh, remat, W.HTML(H.stage_text_html(row.text))]))
        self.submesh_box.children = rows

    def draw(self, parts: dict[str, Any]) -> None:
        """Put the freshly built parts (figures and HTML by name) into their panes."""
        figures = {"cluster": self.cluster_figure, "layers": self.layer_figure, "graph": self.graph_figure,
                   "tensor": self.tensor_figure, "timeline": self.timeline_figure, "cost": self.cost_figure}
        html_panes = {"op_table": self.op_table, "mesh": self.mesh_picture, "diff": self.diff,
                      "comparison": self.comparison, "text": self.plan_text}
        for name, part in parts.items():
            if name in html_panes:
                html_panes[name].value = part
            elif part is not None:
                _replace_figure(figures[name], part)
        if "layers" in parts:  # the stacked bars: a click lists that layer's operators
            for bars in self.layer_figure.data[:3]:
                bars.on_click(lambda _trace, points, _sel: self.on_layer_click(points.point_inds))
        if "graph" in parts:
            self.graph_figure.data[1].on_click(lambda _trace, points, _sel: self.on_graph_click(points.point_inds))


def _show_choice(control: W.Widget, options: tuple | None, value: Any) -> None:
    """Give a control its value, and a choice control its options first (only when they changed: that
    resets it); a Combobox, or a list whose labels are its values, takes the labels alone."""
    if options is not None:
        plain = isinstance(control, W.Combobox) or all(label == v for label, v in options)
        wanted = [label for label, _ in options] if plain else list(options)
        if list(control.options) != wanted:
            control.options = wanted
    control.value = value
