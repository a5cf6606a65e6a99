"""The editor's controller: turns both front ends' events into session calls and selection changes.

It owns what the user selected, the view it presents (`_editor_view.EditorView`) and which of a tab's
parts (figures and tables) are stale, so each front end only maps the view onto its widgets, redraws the
tab in view, and hands its events back here.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Iterator, Protocol

from alpaviz.widgets import _cluster_map as cmap
from alpaviz.widgets import _figures as F
from alpaviz.widgets import _html as H
from alpaviz.widgets import _timeline_view as tv
from alpaviz.widgets import _view_model as vm
from alpaviz.widgets._editor_view import (ALL_LAYERS, OPERATOR_GRAPH_LIMIT, SOLVER_CHOICE, EditorView, PlanRows,
                                          Selection, WhatIfFields, editor_view, plan_rows, submesh_pin, view_text,
                                          whatif_fields)
from alpaviz.widgets._layer_view import layer_bars, operator_rows
from alpaviz.widgets._report import ReportSection, section_html
from alpaviz.widgets._session import WHATIF_FIELDS, EditorSession, Outcome, whatif_from_controls
from alpaviz.widgets._tensor_picture import tensor_picture

# The parts of each tab (by TAB_TITLES index) that are drawn only when the tab is shown.
TAB_PARTS = {"cluster": 0, "layers": 1, "op_table": 1, "graph": 1, "tensor": 2, "mesh": 2, "timeline": 3,
             "cost": 4, "diff": 5, "comparison": 5, "text": 5}
_SELECTION_PARTS = {"graph_level": ("graph",), "graph_layer": ("graph",), "table_layer": ("op_table",),
                    "op_search": ("op_table",), "tensor": ("tensor", "mesh")}


class FrontEnd(Protocol):
    """What a front end does with the view: the controller says what to show and when, the front end how."""

    def show_markup(self, name: str, markup: str) -> None: ...
    def show_whatif(self, name: str, value: Any, problem: str | None) -> None: ...
    def show_cuts(self, view: EditorView) -> None: ...
    def show_stages(self, view: EditorView) -> None: ...
    def show_control(self, name: str, options: tuple | None, value: Any) -> None: ...
    def show_tab(self, index: int) -> None: ...
    def draw(self, parts: dict[str, Any]) -> None: ...


class EditorController:
    """One editor's state beside the session: the selection, the view and the stale parts of each tab.

    Front ends call `on_view(render)`, render `view()` with `rendering()` held (events that the render
    itself causes are ignored), and draw `due(tab)` for the tab in view.
    """

    def __init__(self, session: EditorSession, strategy_names: Callable[..., tuple[str, ...]] | None = None):
        self.session = session
        self.strategy_names = strategy_names
        self.selection = Selection()
        self._renderers: list[Callable[[], None]] = []
        self._rendering = False
        self._batching = False
        self._view: EditorView | None = None
        self._rows: PlanRows | None = None
        self._rows_of: tuple[Any, Any] | None = None
        self._drawn_of: tuple[Any, Any] | None = None
        self._stale: set[str] = set()
        self._predicted = None
        self._graph_view: vm.GraphView | None = None
        self._notice: tuple[bool, str] | None = None
        self._problems: dict[str, str] = {}
        self._typed: dict[str, Any] = {}
        self._preset = ""
        session.on_change(self._session_changed)

    # ---- what the front ends read ---------------------------------------------
    def on_view(self, render: Callable[[], None]) -> None:
        """Call `render()` whenever the view changes."""
        self._renderers.append(render)

    @contextlib.contextmanager
    def rendering(self) -> Iterator[None]:
        """Hold while writing the view into widgets: the change events that writing fires are not the user's."""
        held, self._rendering = self._rendering, True
        try:
            yield
        finally:
            self._rendering = held

    def render(self, front: FrontEnd) -> None:
        """Show the view on `front`, in one order for every front end, and draw the tab in view's stale parts."""
        view = self.view()
        with self.rendering():
            for name, markup in (("headline", H.bold_html(view.headline)), ("summary", self.header_html()),
                                 ("status", self.status_html())):
                front.show_markup(name, markup)
            problems = view.problem_of
            for name in WHATIF_FIELDS:
                front.show_whatif(name, getattr(view.whatif, name), problems.get(name))
            front.show_cuts(view)
            front.show_stages(view)
            for name, options, value in view.controls:
                front.show_control(name, options, value)
            front.show_tab(view.selection.tab)
            front.draw(self.due(view.selection.tab))

    def view(self) -> EditorView:
        """The current view (worked out again only after a change)."""
        if self._view is None:
            self._follow_plan()
            fields = dataclasses.replace(whatif_fields(self.session), preset=self._preset, **self._typed)
            bubble = None if self._predicted is None else self._predicted.bubble_fraction
            self._view = editor_view(self.session, self.selection, self._rows, fields, self._problems, self._notice,
                                     bubble, self.strategy_names)
        return self._view

    @property
    def graph_view(self) -> vm.GraphView | None:
        """The operator graph last drawn: what a click's point index refers to."""
        return self._graph_view

    @property
    def rows(self) -> PlanRows:
        """The sharding and strategy rows of the plan shown."""
        self.view()
        return self._rows

    @property
    def selected_operator(self) -> str | None:
        """The operator the strategy picker is for."""
        label = self.view().operator_label
        return self._rows.operator_labels.get(label) if label else None

    def due(self, tab: int) -> dict[str, Any]:
        """The stale parts of tab `tab`, built now (figures and HTML by part name); they are fresh after."""
        self.view()
        parts = {name: self._build(name) for name in sorted(self._stale) if TAB_PARTS[name] == tab}
        self._stale -= set(parts)
        return parts

    def snapshot_html(self) -> str:
        """The header and the plan's figures as static HTML, for a notebook exported to HTML (plotly.js is
        expected on the page, as the notebook renderer puts it there)."""
        s = self.session
        section = ReportSection("plan editor (a static snapshot: run the notebook to edit)", s.graph, s.plan,
                                s.measured)
        return H.snapshot_html(self.header_html(), section_html(section, first=False))

    def header_html(self) -> str:
        """The always-visible header's cards."""
        return H.header_html(self.view().header)

    def status_html(self) -> str:
        """The status line."""
        view = self.view()
        return H.message_html(view.ok, view.message)

    # ---- events --------------------------------------------------------------------
    def select(self, **changes: Any) -> None:
        """Change what the user looks at (fields of `Selection`); the parts that show it become stale."""
        if self._rendering:
            return
        selection = dataclasses.replace(self.selection, **changes)
        if selection == self.selection:
            return
        for field, value in changes.items():
            if getattr(self.selection, field) != value:
                self._stale.update(_SELECTION_PARTS.get(field, ()))
        self.selection = selection
        self._changed()

    def choose_operator(self, label: str) -> None:
        """The operator box holds `label`: pick its operator, or none while it is not a whole label."""
        self.view()
        self.select(operator=self._rows.operator_labels.get(label, label))

    def click_layer(self, indices: list[int]) -> None:
        """A click on a layer's bar lists that layer's operators."""
        if indices:
            self.select(table_layer=int(indices[0]))

    def click_graph(self, indices: list[int]) -> None:
        """A click on a layer node expands it to its operators; on an operator, selects it."""
        if not indices or self._graph_view is None:
            return
        node = self._graph_view.nodes[indices[0]]
        if self._graph_view.level == "layer":
            self.select(graph_level="op", graph_layer=int(node.key.removeprefix("layer")))
        elif node.key in self._rows.strategies:
            self.select(operator=node.key)

    def toggle_cut(self, layer: int) -> None:
        """Cycle the gap before `layer`: pinned cut, pinned no-cut, free."""
        if not self._rendering:
            self.session.toggle_cut(layer)

    def pin_submesh(self, stage: int, label: str) -> None:
        """Pin the submesh a stage row's label names (or free it)."""
        if not self._rendering and label != self._stage(stage).submesh:
            self.session.pin_submesh(stage, submesh_pin(self.session, stage, label))

    def pin_remat(self, stage: int, label: str) -> None:
        """Pin a stage's recomputation by its label in `vm.REMAT_CHOICES`."""
        if not self._rendering and label != self._stage(stage).remat:
            self.session.pin_remat(stage, vm.REMAT_CHOICES[label])

    def pin_strategy(self, value: str) -> None:
        """Pin the selected operator's strategy; SOLVER_CHOICE unpins it."""
        node = self.selected_operator
        if self._rendering or node is None or value == self.view().strategy:
            return
        self.session.pin_strategy(node, None if value == SOLVER_CHOICE else value)

    def apply_whatif(self, fields: WhatIfFields, cluster_changed: bool) -> None:
        """Apply the what-if the controls describe; refused fields keep what was typed, marked, and the
        others still apply (a new preset or host count brings its own link figures)."""
        if self._rendering:
            return
        current = self.session.whatif
        whatif, problems = whatif_from_controls(current, cluster_changed, fields.microbatches, fields.schedule,
                                                fields.preset, fields.hosts, fields.intra_bw, fields.inter_bw)
        self._problems = problems
        self._typed = {field: getattr(fields, field) for field in problems}
        self._preset = fields.preset
        self._batching = True
        try:
            if whatif != current:
                self.session.set_whatif(whatif)
        finally:
            self._batching = False
        self._notice = None if not problems else (False, "; ".join(f"{f}: {p}" for f, p in problems.items())
                                                  + " (the other fields still apply)")
        self._changed()

    def value_handlers(self) -> dict[str, Callable[[Any], None]]:
        """What a new value in each selection control does, by the control's name in both front ends."""
        handlers: dict[str, Callable[[Any], None]] = {
            name: (lambda value, field=name: self.select(**{field: value}))
            for name in ("graph_level", "graph_layer", "table_layer", "op_search")}
        return {**handlers, "tensor_select": lambda value: self.select(tensor=value),
                "op_select": self.choose_operator, "strategy_select": self.pin_strategy}

    def button_handlers(self, resolve: Callable[[], None], launch_steps: Callable[[], int]) -> dict[str, Callable[[], Any]]:
        """What each action button both front ends have does: `resolve` is the front end's own (it shows
        the outcome on its progress bar), `launch_steps` reads its step-count box."""
        s = self.session
        return {"resolve_button": resolve, "reset_button": s.reset_pins, "compare_button": s.compare,
                "search_button": s.search_microbatches, "launch_button": lambda: s.launch(launch_steps())}

    def resolve(self) -> Outcome:
        """Re-solve with the pins; the session keeps the old plan if it fails."""
        return self.session.resolve()

    # ---- internals ---------------------------------------------------------------
    def _stage(self, stage: int):
        return next(row for row in self.view().stages if row.index == stage)

    def _session_changed(self) -> None:
        self._notice = None
        self._stale.add("comparison")
        if not self._batching:
            self._changed()

    def _changed(self) -> None:
        self._view = None
        self._stale.add("text")
        for render in self._renderers:
            render()

    def _follow_plan(self) -> None:
        """Rows again when the plan or pins change; every part stale when the plan or its measurement does."""
        s = self.session
        if self._rows_of is None or self._rows_of[0] is not s.plan or self._rows_of[1] != s.pins:
            self._rows, self._rows_of = plan_rows(s), (s.plan, s.pins)
            self._stale.update(("tensor", "mesh"))
        if self._drawn_of is None or self._drawn_of[0] is not s.plan or self._drawn_of[1] is not s.measured:
            try:
                self._predicted = s.predicted_timeline()
            except Exception:  # a simulator failure must not hide the rest of the editor
                self._predicted = None
            self._stale = set(TAB_PARTS)
            self._drawn_of = (s.plan, s.measured)
            if self.selection.table_layer >= len(s.plan.layers):
                self.selection = dataclasses.replace(self.selection, table_layer=0)

    def _build(self, part: str) -> Any:
        s, view, sel = self.session, self._view, self.selection
        if part == "cluster":
            return F.cluster_map_figure(cmap.cluster_map(s.graph, s.plan))
        if part == "layers":
            return F.layer_bars_figure(layer_bars(s.graph, s.plan))
        if part == "op_table":
            return H.operator_table_html(operator_rows(s.graph, s.plan, sel.table_layer, sel.op_search))
        if part == "graph":
            layers = None if sel.graph_layer == ALL_LAYERS else [sel.graph_layer]
            self._graph_view = (vm.layer_graph_view(s.graph, s.plan) if sel.graph_level == "layer" else
                                vm.op_graph_view(s.graph, s.plan, layers, max_nodes=OPERATOR_GRAPH_LIMIT))
            return F.graph_figure(self._graph_view)
        row = self._rows.sharding.get(view.tensor)
        if part == "tensor":
            picture = None if row is None else tensor_picture(row)
            return None if picture is None else F.tensor_figure(picture)
        if part == "mesh":
            return H.mesh_html(row) if row is not None and row.blocks else H.no_sharding_html()
        if part == "timeline":
            return F.gantt_figure(*tv.timeline_panels(s.plan, self._predicted, s.measured, s.measured_prediction))
        if part == "cost":
            return F.cost_figure(vm.cost_view(s.plan, s.previous))
        if part == "diff":
            return "" if view.diff is None else H.plan_diff_html(view.diff)
        if part == "text":
            return H.plan_text_html(view_text(view))
        return H.comparison_html(view.comparison)


def trace_path_for(plan_path: str) -> str:
    """Where the editor saves the timeline: the plan file's name with .trace.json."""
    stem = plan_path[:-5] if plan_path.endswith(".json") else plan_path
    return stem + ".trace.json"
