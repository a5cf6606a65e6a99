"""The editor's presenter and controller: one view, the same from both front ends, golden as text."""

import os
import pathlib
import re

import pytest
from test_view_model import hand_plan, hand_solver, tiny_graph

from alpaviz.widgets import PlanEditor
from alpaviz.widgets._app import PanelEditor
from alpaviz.widgets._editor_controller import TAB_PARTS, EditorController
from alpaviz.widgets._editor_view import SOLVER_CHOICE, view_text
from alpaviz.widgets._session import EditorSession
from alpaviz.widgets._view_model import TAB_TITLES

GOLDEN = pathlib.Path(__file__).parent / "golden"
# Sections without wall-clock seconds: both front ends must agree on them exactly.
PLAN_SECTIONS = ("headline", "cuts", "stages", "whatif", "selection", "diff")


def _session(cuts=(2,)):
    graph = tiny_graph()
    return EditorSession(graph, hand_plan(graph, cuts=cuts), solver=hand_solver)


def _golden(name: str, text: str) -> None:
    """Compare with tests/widgets/golden/<name>.txt; ALPAVIZ_UPDATE_GOLDEN=1 rewrites it (then read the diff)."""
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("ALPAVIZ_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.exists(), f"{path} is missing: run with ALPAVIZ_UPDATE_GOLDEN=1 once and review it"
    assert text == path.read_text()


def _without_seconds(text: str) -> str:
    return re.sub(r"\d+\.\d+ s\b", "<seconds> s", text)


def test_golden_text_of_the_header_the_stage_rows_and_the_diff():
    controller = EditorController(_session())
    before = view_text(controller.view(), ("headline", "header", "cuts", "stages", "diff"))
    controller.toggle_cut(1)
    controller.pin_submesh(0, "1x4 as 2x2")
    controller.pin_remat(1, "recompute forward")
    controller.resolve()
    after = view_text(controller.view(), ("headline", "header", "status", "cuts", "stages", "diff"))
    _golden("editor_before", _without_seconds(before))
    _golden("editor_after_pins_and_resolve", _without_seconds(after))


def _pin_and_resolve_in_the_notebook(ed: PlanEditor) -> PlanEditor:
    ed.cut_buttons[1].click()
    ed.submesh_dropdowns[0].value = "1x4 as 2x2"
    ed.remat_dropdowns[1].value = "recompute forward"
    ed.resolve_button.click()
    ed.op_select.value = ed.op_select.options[3]
    ed.strategy_select.value = next(v for _, v in ed.strategy_select.options if v != SOLVER_CHOICE)
    ed.microbatches.value = 8
    return ed


def _pin_and_resolve_in_the_app(app: PanelEditor) -> PanelEditor:
    next(b for b in app.cut_row.objects if getattr(b, "name", "").startswith("gap 0|1")).clicks += 1
    app.submesh_column.objects[0][0].value = "1x4 as 2x2"
    app.submesh_column.objects[1][1].value = "recompute forward"
    app.resolve_button.clicks += 1
    app.op_select.value = app.op_select.options[3]
    app.strategy_select.value = next(v for v in app.strategy_select.options.values() if v != SOLVER_CHOICE)
    app.microbatches.value = 8
    return app


def test_both_front_ends_driven_through_their_widgets_show_the_same_view():
    ed = _pin_and_resolve_in_the_notebook(PlanEditor(_session()))
    app = _pin_and_resolve_in_the_app(PanelEditor(_session()))
    notebook, web = (view_text(x.controller.view(), PLAN_SECTIONS) for x in (ed, app))
    assert notebook == web
    assert "L0[s0] <0|1 pinned cut> L1[s1]" in web and "submesh: 1x4 as 2x2" in web
    assert "what-if: 8 microbatches" in web and "-> (solver's choice)" not in web  # the strategy pin shows
    assert ed.session.pins == app.session.pins and ed.session.plan.stage_cuts == app.session.plan.stage_cuts
    # the same markup too: one module escapes it for both
    assert ed.headline.value == app.headline.object and ed.summary.value == app.summary.object


def test_only_the_tab_in_view_is_drawn_and_a_new_plan_makes_every_part_stale():
    controller = EditorController(_session())
    shown = {tab: set(controller.due(tab)) for tab in range(len(TAB_TITLES))}
    assert shown[3] == {"timeline"} and shown[1] == {"layers", "op_table", "graph"}
    assert all(controller.due(tab) == {} for tab in range(len(TAB_TITLES)))  # fresh now
    controller.select(graph_layer=1, graph_level="op")
    assert set(controller.due(1)) == {"graph"}  # the selection redraws only what shows it
    controller.select(table_layer=2)
    assert set(controller.due(1)) == {"op_table"}
    controller.toggle_cut(1)  # a pin: the plan's figures stay
    assert set(controller.due(3)) == set()
    controller.resolve()
    assert {name for tab in range(len(TAB_TITLES)) for name in controller.due(tab)} == set(TAB_PARTS)


def test_a_render_fires_change_events_that_pin_nothing():
    ed = PlanEditor(_session())
    for title in TAB_TITLES:  # every tab drawn, every control rewritten several times
        ed.tabs.selected_index = TAB_TITLES.index(title)
        ed.render()
    assert ed.session.pins.is_empty and ed.session.message == "plan loaded"


def test_a_refused_whatif_field_keeps_what_was_typed_and_the_others_apply():
    controller = EditorController(_session())
    view = controller.view()
    fields = view.whatif.__class__(16, "gpipe", "", view.whatif.hosts, -1.0, view.whatif.inter_bw)
    controller.apply_whatif(fields, cluster_changed=False)
    view = controller.view()
    assert controller.session.whatif.num_microbatches == 16 and controller.session.whatif.schedule == "gpipe"
    assert view.whatif.intra_bw == -1.0 and set(view.problem_of) == {"intra_bw"}
    assert not view.ok and "intra_bw" in view.message and "the other fields still apply" in view.message


@pytest.mark.parametrize("front_end", [PlanEditor, PanelEditor])
def test_clicking_an_operator_in_the_graph_selects_it_in_the_strategy_picker(front_end):
    ed = front_end(_session())
    controller = ed.controller
    controller.select(tab=1)
    controller.click_graph([2])  # a layer node: its operators
    assert controller.selection.graph_level == "op" and controller.selection.graph_layer == 2
    controller.due(1)
    node = next(n.key for n in controller.graph_view.nodes if n.key in controller.rows.strategies)
    controller.click_graph([[n.key for n in controller.graph_view.nodes].index(node)])
    assert ed.selected_operator == node and node in ed.op_select.value
