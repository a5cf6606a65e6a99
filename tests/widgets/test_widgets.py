"""The ipywidgets editor driven through its own event path (button clicks, dropdown values), no kernel."""

import pytest
from test_view_model import hand_plan, hand_solver, tiny_graph

import alpaviz as av
from alpaviz.widgets import PlanEditor
from alpaviz.widgets._editor import SOLVER_CHOICE
from alpaviz.widgets._session import EditorSession
from alpaviz.widgets._view_model import TAB_TITLES


def _editor(cuts=(2,), solver=hand_solver, strategy_names=None):
    graph = tiny_graph()
    return PlanEditor(EditorSession(graph, hand_plan(graph, cuts=cuts), solver=solver), strategy_names)


def _show(ed, title: str):
    """Open a tab as a user would: its figures draw when it is shown."""
    from alpaviz.widgets._view_model import TAB_TITLES

    ed.tabs.selected_index = TAB_TITLES.index(title)
    return ed


def test_clicking_a_gap_pins_a_cut_and_resolve_honours_it():
    ed = _editor()
    assert ed.session.plan.stage_cuts == (2,)
    assert "cuts at layers: 2" in ed.headline.value
    ed.cut_buttons[1].click()
    assert ed.session.pins.stage_cuts == (1,)
    assert "pinned cut" in ed.cut_buttons[1].description  # the cut row redrew from the new pins
    ed.resolve_button.click()
    assert ed.session.plan.stage_cuts == (1,)
    assert "cuts at layers: 1 " in ed.headline.value
    assert ed.cut_buttons[1].button_style == "danger" and ed.cut_buttons[2].button_style == ""
    assert ed.progress.bar_style == "success"
    # the cluster map (the tab in view) follows: every device drawn, labelled with its new stage
    devices = ed.session.plan.cluster.num_devices
    assert len(ed.cluster_figure.layout.shapes) == devices
    labels = ed.cluster_figure.data[0].text
    assert [f"S{s.index} " in " ".join(labels) for s in ed.session.plan.stages] == [True] * ed.session.plan.num_stages
    # the tabs out of view redraw when shown: the layer-level graph is recoloured, layer 1 now starts stage 1
    before = [t.marker.color for t in ed.graph_figure.data[1:2]]
    node_colours = _show(ed, "Graph").graph_figure.data[1].marker.color
    assert [node_colours] != before
    assert node_colours[0] != node_colours[1] and node_colours[1] == node_colours[2]
    # the cost panel compares against the previous plan
    assert "vs previous plan" in _show(ed, "Cost").cost_figure.layout.title.text
    # the diff says what the re-solve changed
    diff = _show(ed, "Why this plan").diff.value
    assert "cuts before layers" in diff and "<td>2</td><td>1</td>" in diff


def test_second_and_third_click_cycle_no_cut_then_free():
    ed = _editor()
    ed.cut_buttons[2].click()
    ed.cut_buttons[2].click()
    assert ed.session.pins.forbidden_cuts == (2,)
    ed.resolve_button.click()
    assert 2 not in ed.session.plan.stage_cuts
    ed.cut_buttons[2].click()
    assert ed.session.pins.is_empty


def test_submesh_dropdown_pins_and_infeasible_pin_is_explained():
    ed = _editor()
    dropdown = ed.submesh_dropdowns[0]
    dropdown.value = "1x4 as 4x1"
    assert ed.session.pins.submesh_map == {0: (1, 4)}
    good = ed.session.plan
    ed.resolve_button.click()  # the second stage takes the other 4 devices
    ed.submesh_dropdowns[1].value = "1x8 as 8x1"  # 4 + 8 devices do not fit the 8 there are
    ed.resolve_button.click()
    assert "infeasible" in ed.status.value and "#b00020" in ed.status.value
    assert ed.progress.bar_style == "danger"
    assert ed.session.plan.stages[0].submesh == (1, 4)  # the first re-solve's plan is still shown
    assert ed.session.plan is not good
    ed.reset_button.click()
    assert ed.session.pins.is_empty and ed.submesh_dropdowns[0].value == SOLVER_CHOICE


def _strategy_names(graph, node, mesh):
    assert isinstance(mesh, av.LogicalMesh) and mesh.num_devices == 4  # the stage's mesh, with its links
    return ("RR = RS x SR @ {0} (allreduce @ 0)", "SR = SR x RR")


def test_strategy_dropdown_pins_a_strategy_and_tensor_picker_draws_the_mesh():
    ed = _editor(strategy_names=_strategy_names)
    node = ed.selected_operator
    assert "SR = SR x RR" in [value for _, value in ed.strategy_select.options]
    assert node is not None and ed.strategy_select.value == SOLVER_CHOICE
    ed.strategy_select.value = "SR = SR x RR"
    assert ed.session.pins.strategy_map == {node: "SR = SR x RR"}
    assert ed.strategy_select.value == "SR = SR x RR" and ed.selected_operator == node
    ed.strategy_select.value = SOLVER_CHOICE
    assert ed.session.pins.strategy_map == {}
    ed.tensor_select.value = "stage 0: params.wte"
    assert "params.wte" in _show(ed, "Sharding").mesh_picture.value and "dev 3 [48:64, 0:32]" in ed.mesh_picture.value


def test_each_strategy_is_offered_with_its_cost_and_the_solvers_choice_is_named():
    from alpaviz.core.intra_op import enumerate_strategies

    ed = _editor()
    s = ed.session
    row = ed.controller.rows.strategies[ed.selected_operator]
    labels = list(ed.strategy_select.options)
    assert labels[0] == (f"(solver's choice: {row.strategy})", SOLVER_CHOICE)
    stage = s.plan.stages[row.stage]
    mesh = s.plan.cluster.logical_mesh(stage.submesh, stage.logical_mesh, stage.device_ids[0])
    priced = {x.name: x for x in enumerate_strategies(s.graph, s.graph.node(row.node), mesh, s.plan.cost_model,
                                                      s.plan.cluster.device)}
    costed = [(label, value) for label, value in labels[1:] if value in priced]
    assert len(costed) == len(priced) > 1
    totals = [priced[value].cost_s for _, value in costed]
    assert totals == sorted(totals)  # cheapest first
    label, value = costed[0]
    assert label.startswith(f"{value}: ") and " compute + " in label and label.endswith(" comm")


@pytest.mark.parametrize("front_end", ["ipywidgets", "panel"])
def test_the_operator_to_pin_is_found_by_typing_where_it_comes_from_in_the_users_code(front_end):
    from alpaviz.widgets._app import PanelEditor
    from alpaviz.widgets._view_model import user_scope

    graph = tiny_graph()
    session = EditorSession(graph, hand_plan(graph), solver=hand_solver)
    ed = PlanEditor(session) if front_end == "ipywidgets" else PanelEditor(session)
    labels = list(ed.op_select.options)
    assert len(labels) == len(ed.controller.rows.strategies) > 50  # every operator with a strategy, by a label
    target = next(n for n in graph.nodes if n.primitive == "dot_general" and n.role == "backward" and n.layer == 2)
    scope = user_scope(target)
    assert scope and "jvp" not in scope and "(" in scope  # plain functions: the function and line that made it
    matches = [text for text in labels if scope.lower() in text.lower() and target.name in text]
    assert len(matches) == 1 and matches[0].startswith(scope)
    ed.op_select.value = matches[0][:-3]  # half typed: not yet an operator, nothing is pinned
    assert ed.selected_operator is None and session.pins.strategy_map == {}
    ed.op_select.value = matches[0]
    assert ed.selected_operator == target.name
    choice = next(v for _, v in (ed.strategy_select.options if front_end == "ipywidgets"
                                 else ed.strategy_select.options.items()) if v != SOLVER_CHOICE)
    ed.strategy_select.value = choice
    assert session.pins.strategy_map == {target.name: choice}


def test_graph_level_toggle_expands_one_layer():
    ed = _show(_editor(), "Graph")
    assert len(ed.graph_figure.data[1].x) == tiny_graph().num_layers
    ed.graph_level.value = "op"
    ed.graph_layer.value = 1
    keys = ed.graph_figure.data[1].customdata
    assert len(keys) > 10 and {tiny_graph().node(k).layer for k in keys} == {1}


def test_clicking_a_layer_node_expands_it_and_an_operator_selects_it():
    ed = _show(_editor(), "Graph")
    ed.on_graph_click([2])  # what the node trace's on_click hands over: the clicked point indices
    assert ed.graph_level.value == "op" and ed.graph_layer.value == 2
    keys = list(ed.graph_figure.data[1].customdata)
    dot = next(i for i, k in enumerate(keys) if k in ed.controller.rows.strategies)
    ed.on_graph_click([dot])
    assert ed.selected_operator == keys[dot] and f"{keys[dot]} (stage " in ed.op_select.value


def test_whatif_controls_replan():
    ed = _editor()
    ed.microbatches.value = 16
    assert ed.session.plan.schedule.num_microbatches == 16
    ed.hosts.value = 2  # the current (A100) hosts, two of them
    assert ed.session.plan.cluster.num_devices == 16 and ed.session.plan.cluster.device.name == "A100-40GB"
    ed.preset.value = "h100"
    h100 = av.Cluster.h100_node(2)
    assert ed.session.plan.cluster.num_devices == 16 and ed.session.plan.cluster.device == h100.device
    assert ed.session.plan.cluster.intra_host == h100.intra_host  # the preset's links, not the old fields
    assert ed.intra_bw.value == pytest.approx(h100.intra_host.bandwidth_bytes_per_s / 1e9)
    ed.inter_bw.value = 1.0
    assert ed.session.plan.cluster.inter_host.bandwidth_bytes_per_s == pytest.approx(1e9)
    assert ed.session.plan.cluster.intra_host == h100.intra_host


def test_missing_solver_and_launch_show_messages_not_tracebacks():
    graph = tiny_graph()
    session = EditorSession(graph, hand_plan(graph), solver=hand_solver)
    session.solver = None
    ed = PlanEditor(session)
    ed.resolve_button.click()
    assert "Re-solve not available" in ed.status.value
    ed.launch_button.click()
    assert "Launch needs the training step" in ed.status.value and ed.session.plan.stage_cuts == (2,)


def test_failed_launch_is_a_message_and_the_plan_stays():
    graph = tiny_graph()

    def broken_step(params, batch):
        raise RuntimeError("out of device memory (simulated)")

    _, params, batch = av.models.gpt(num_layers=4, hidden=32, heads=2, seq_len=16, vocab=64, batch_size=4)
    session = EditorSession(graph, hand_plan(graph), solver=hand_solver, step_fn=broken_step,
                            example_args=(params, batch))
    ed = PlanEditor(session)
    shown = session.plan
    ed.launch_button.click()
    assert "launch failed: RuntimeError: out of device memory (simulated)" in ed.status.value
    assert "#b00020" in ed.status.value and session.plan is shown and session.measured is None


def test_save_and_load_buttons(tmp_path):
    ed = _editor()
    ed.path.value = str(tmp_path / "p.json")
    ed.cut_buttons[3].click()
    ed.save_button.click()
    assert "saved" in ed.status.value
    other = _editor(cuts=(1,))
    other.path.value = ed.path.value
    other.load_button.click()
    assert other.session.plan.stage_cuts == (2,) and other.session.pins.stage_cuts == (3,)
    assert "pinned cut" in other.cut_buttons[3].description


def test_the_timeline_saves_as_a_perfetto_trace_from_both_front_ends(tmp_path):
    import json

    from alpaviz.widgets._app import PanelEditor

    ed = _editor()
    ed.path.value = str(tmp_path / "p.json")
    ed.trace_button.click()
    assert "predicted timeline saved to" in ed.status.value
    trace = json.loads((tmp_path / "p.trace.json").read_text())
    runs = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] in ("forward", "backward")]
    timeline = ed.session.predicted_timeline()
    assert len(runs) == sum(e.kind in ("forward", "backward") for e in timeline.events)
    app = PanelEditor(ed.session)
    assert json.loads(app.trace_download.callback().getvalue()) == trace


def test_editor_facade_on_a_plan_needs_a_graph():
    with pytest.raises(ValueError, match="needs the graph"):
        av.editor(hand_plan(tiny_graph()))
    ed = av.editor(hand_plan(tiny_graph()), graph=tiny_graph(), solver=hand_solver)
    assert isinstance(ed, PlanEditor) and ed.session.plan.stage_cuts == (2,)


def test_panel_editor_pins_a_cut_through_its_buttons():
    from alpaviz.widgets._app import PanelEditor

    graph = tiny_graph()
    app = PanelEditor(EditorSession(graph, hand_plan(graph), solver=hand_solver))
    gap = next(b for b in app.cut_row.objects if getattr(b, "name", "").startswith("gap 2|3"))
    gap.clicks += 1  # what a browser click does to a panel Button
    assert app.session.pins.stage_cuts == (3,)
    # the same button, restyled: a quick second click on the page still reaches it
    assert gap in app.cut_row.objects and gap.name == "gap 2|3 pinned cut" and gap.button_style == "solid"
    gap.clicks += 1
    assert app.session.pins.forbidden_cuts == (3,) and gap.name == "gap 2|3 no cut"
    gap.clicks += 1
    gap.clicks += 1
    assert app.session.pins.stage_cuts == (3,)
    app.resolve_button.clicks += 1
    assert app.session.plan.stage_cuts == (3,) and "cuts at layers: 3 " in app.headline.object
    select = next(row[0] for row in app.submesh_column.objects)
    select.value = "1x8 as 8x1"
    assert app.session.pins.submesh_map == {0: (1, 8)}
    remat = next(row[1] for row in app.submesh_column.objects)
    remat.value = "recompute forward"
    assert app.session.pins.remat_map == {0: True}


@pytest.fixture(scope="module")
def solved_editor():
    import alpaviz.core as core

    graph = tiny_graph()
    # the analytic stage cost keeps this fast; the browser test runs the default (ILP) stage cost
    session = EditorSession(graph, whatif=av.widgets.WhatIf(4, "1f1b", av.Cluster.a100_node(1)),
                            solve_options={"stage_cost": core.analytic_stage_cost})
    return PlanEditor(session)


def test_real_solver_honours_a_cut_pinned_through_the_editor(solved_editor):
    ed = solved_editor
    ed.reset_button.click()
    ed.resolve_button.click()
    before = ed.session.plan.stage_cuts
    free = [layer for layer in range(1, 4) if layer not in before]
    gap, clicks = (free[0], 1) if free else (2, 2)  # pin a cut, or a no-cut where the solver cut everywhere
    for _ in range(clicks):
        ed.cut_buttons[gap].click()
    hits = ed.session.cache.hits
    ed.resolve_button.click()
    assert ed.session.ok, ed.session.message
    assert (gap in ed.session.plan.stage_cuts) == bool(free)
    assert ed.session.plan.pins == ed.session.pins  # the plan records the pins it honours
    assert ed.session.cache.hits > hits  # the re-solve reused stage profiles
    assert ed.cut_buttons[gap].button_style == ("danger" if free else "")


def test_remat_dropdown_pins_recomputation_and_the_solver_honours_it(solved_editor):
    ed = solved_editor
    ed.reset_button.click()
    ed.cut_buttons[2].click()  # two stages
    ed.resolve_button.click()
    assert not ed.session.plan.stages[0].remat  # recomputing only costs time when memory is ample
    ed.remat_dropdowns[0].value = "recompute forward"
    assert ed.session.pins.remat_map == {0: True}
    ed.resolve_button.click()
    assert ed.session.ok, ed.session.message
    first, second = ed.session.plan.stages[:2]
    assert first.remat and not second.remat
    assert "recomputed" in ed.submesh_box.children[0].children[2].value
    assert ed.remat_dropdowns[0].value == "recompute forward"  # the redrawn control shows the pin


def test_compare_prices_the_grid_and_data_parallelism_beside_the_plan(solved_editor):
    ed = solved_editor
    ed.reset_button.click()
    ed.resolve_button.click()
    assert "press Compare" in _show(ed, "Why this plan").comparison.value
    ed.compare_button.click()
    entries = dict(ed.session.comparison)
    counts = ed.session.runner_up_stage_counts()
    n = ed.session.plan.num_stages
    assert counts == tuple(k for k in (n - 1, n + 1) if 1 <= k <= 4) and counts
    assert list(entries) == ["this plan", *(f"best with {k} stages" for k in counts), "Megatron grid (best)",
                             "data parallel"]
    plan, grid = entries["this plan"], entries["Megatron grid (best)"]
    # the grid and the runner-ups are corners of the planner's search space, priced from the same profiles
    for name, other in entries.items():
        if isinstance(other, av.Plan):
            assert plan.predicted.step_time_s <= other.predicted.step_time_s * (1 + 1e-9), name
    for k in counts:
        runner_up = entries[f"best with {k} stages"]
        assert isinstance(runner_up, str) or runner_up.num_stages == k
    assert isinstance(grid, av.Plan)
    assert ed.comparison.value.count("<tr>") == len(entries) + 1 and "bubble ms" in ed.comparison.value
    ed.resolve_button.click()  # a new plan: the old comparison is dropped
    assert ed.session.comparison == () and "press Compare" in ed.comparison.value


def test_real_solver_infeasible_pin_keeps_the_plan(solved_editor):
    ed = solved_editor
    ed.reset_button.click()
    ed.cut_buttons[1].click()  # at least two stages
    ed.resolve_button.click()
    shown = ed.session.plan
    assert shown.num_stages >= 2 and 1 in shown.stage_cuts
    for stage in (0, 1):  # two stages on a full 8-device host each: more devices than the cluster has
        ed.submesh_dropdowns[stage].value = "1x8 as 8x1"
    ed.resolve_button.click()
    assert not ed.session.ok and "infeasible" in ed.status.value, ed.session.message
    assert ed.session.plan is shown
    assert "cuts at layers: " + ", ".join(map(str, shown.stage_cuts)) in ed.headline.value


@pytest.mark.slow
def test_launch_runs_the_plan_and_fills_the_measured_timeline():
    step, params, batch = av.models.gpt(num_layers=4, hidden=32, heads=2, seq_len=16, vocab=64, batch_size=4)
    graph = tiny_graph()
    plan = av.manual_plan(graph, av.Cluster.a100_node(1), stage_cuts=(2,), schedule=av.core.Schedule("1f1b", 2))
    session = EditorSession(graph, plan, solver=hand_solver, step_fn=step, example_args=(params, batch))
    ed = PlanEditor(session)
    ed.launch_steps.value = 1
    ed.launch_button.click()
    assert session.ok, session.message
    measured = session.measured
    assert measured.source == "measured" and measured.num_stages == 2
    runs = [(e.stage, e.kind, e.microbatch) for e in measured.events if e.kind in ("forward", "backward")]
    assert sorted(runs) == sorted((s, k, m) for s in range(2) for k in ("forward", "backward") for m in range(2))
    drawn = [t for t in _show(ed, "Timeline").timeline_figure.data
             if t.xaxis == "x2" and t.name in ("forward", "backward", "update")]
    bars = [e for e in measured.events if e.kind in ("forward", "backward", "update")]
    assert bars and sum(len(t.x) for t in drawn) == len(bars)
    title = ed.timeline_figure.layout.annotations[1].text  # its own hardware, its bubble, and how far off
    assert title.startswith("measured on this machine: 8 CPU devices: ") and "bubble" in title
    # The hand plan carries no costs; the launch priced its layout for this machine, as calibrated.
    local = session.measured_prediction
    assert local is not None and "calibrated" in local.hardware and local.total_s > 0
    assert f"measured / predicted for {local.hardware}" in title and "per stage: 0: " in title


def test_panel_editor_pins_a_strategy_and_expands_a_layer():
    from alpaviz.widgets._app import PanelEditor

    graph = tiny_graph()
    app = PanelEditor(EditorSession(graph, hand_plan(graph), solver=hand_solver))
    node = app.selected_operator
    assert node is not None and app.strategy_select.value == "(solver's choice)"
    choice = list(app.strategy_select.options.values())[1]
    app.strategy_select.value = choice
    assert app.session.pins.strategy_map == {node: choice}
    app.tabs.active = TAB_TITLES.index("Graph")  # its figures draw when it is shown
    app.graph_level.value = "op"
    app.graph_layer.value = 3
    assert {graph.node(k).layer for k in app.graph_pane.object.data[1].customdata} == {3}


def test_panel_whatif_controls_replan():
    from alpaviz.widgets._app import PanelEditor

    graph = tiny_graph()
    app = PanelEditor(EditorSession(graph, hand_plan(graph), solver=hand_solver))
    app.preset.value = "v100"
    v100 = av.Cluster.v100_node(1)
    assert app.session.plan.cluster.device == v100.device and app.session.plan.cluster.intra_host == v100.intra_host
    assert app.intra_bw.value == pytest.approx(100.0)
    app.microbatches.value = 8
    app.schedule.value = "gpipe"
    assert app.session.plan.schedule.num_microbatches == 8 and app.session.whatif.schedule == "gpipe"
    app.microbatches.value = 0
    assert "num_microbatches must be &gt;= 1, got 0" in app.status.object  # said before any solve
    assert app.session.plan.schedule.num_microbatches == 8 and app.session.whatif.num_microbatches == 8


@pytest.mark.slow
def test_launch_runs_a_users_optax_step_with_its_own_signature():
    """Launch works for any step parallelize accepts: here step(params, opt_state, batch) from Flax + optax."""
    from user_models import linen_lm

    made = linen_lm()
    graph = av.cluster_layers(av.trace(made.step, *made.args), 4)
    plan = av.manual_plan(graph, av.Cluster.local(), stage_cuts=(2,), schedule=av.core.Schedule("1f1b", 2))
    session = EditorSession(graph, plan, solver=hand_solver, step_fn=made.step, example_args=made.args)
    ed = PlanEditor(session)
    ed.launch_steps.value = 2
    ed.launch_button.click()
    assert session.ok, session.message
    assert session.measured.num_stages == 2 and "launched 2 steps" in ed.status.value


@pytest.mark.parametrize("front_end", ["ipywidgets", "panel"])
def test_search_count_button_plans_the_global_batch_at_its_fastest_microbatch_count(front_end):
    from alpaviz.core.inter_op._stage_cost import analytic_stage_cost
    from alpaviz.widgets._app import PanelEditor
    from alpaviz.widgets._session import repeat_batch

    step, params, batch = av.models.mlp((64, 256, 256, 64), batch_size=8)
    cluster = av.Cluster.a100_node(1, 4)
    session = EditorSession(av.trace(step, params, batch), whatif=av.widgets.WhatIf(4, "1f1b", cluster),
                            solve_options={"stage_cost": analytic_stage_cost}, step_fn=step, example_args=(params, batch))
    ed = PlanEditor(session) if front_end == "ipywidgets" else PanelEditor(session)
    if front_end == "ipywidgets":
        ed.search_button.click()
    else:
        ed.search_button.clicks += 1
    assert session.ok, session.message
    # The same search through core, on the global batch of 4 x 8 examples.
    want = av.solve(step, params, repeat_batch(batch, 4), cluster=cluster, num_microbatches="auto",
                    global_batch_argnums=(1,), stage_cost=analytic_stage_cost, progress=False)
    count = session.plan.schedule.num_microbatches
    assert count == want.schedule.num_microbatches and 32 % count == 0
    assert session.plan.predicted.step_time_s == pytest.approx(want.predicted.step_time_s, rel=1e-9)
    assert "microbatch counts searched" in session.plan.solver.notes[-1]
    # The session now holds the step traced at the chosen microbatch, and the control shows the count.
    session.plan.check_graph(session.graph)
    assert session.example_args[1]["x"].shape[0] == 32 // count
    assert ed.microbatches.value == count and session.whatif.num_microbatches == count
    assert session.resolve().ok, session.message  # the what-if stays consistent with the new graph


@pytest.mark.parametrize("front_end", ["ipywidgets", "panel"])
def test_controls_are_disabled_and_progress_is_shown_while_the_solver_works(front_end):
    from alpaviz.widgets._app import PanelEditor

    graph = tiny_graph()
    seen = {}

    def watched_solver(graph, **options):
        options["options"].progress("profiling layers", 3, 7)  # the solver reports as it goes
        seen["disabled"] = [c.disabled for c in ed.controls()]
        seen["status"] = ed.status.value if front_end == "ipywidgets" else ed.status.object
        seen["progress"] = ((ed.progress.value, ed.progress.max) if front_end == "ipywidgets"
                            else (ed.progress.value, ed.progress.name))
        return hand_solver(graph, **options)

    session = EditorSession(graph, hand_plan(graph), solver=watched_solver)
    ed = PlanEditor(session) if front_end == "ipywidgets" else PanelEditor(session)
    assert not any(c.disabled for c in ed.controls())
    ed.resolve()
    assert session.ok, session.message
    assert seen["disabled"] and all(seen["disabled"]), "every control is disabled during the solve"
    assert "re-solving" in seen["status"]
    assert seen["progress"] == ((3, 7) if front_end == "ipywidgets" else (42, "profiling layers: 3 of 7"))
    assert not any(c.disabled for c in ed.controls()), "and enabled again after it"


def test_a_bad_whatif_field_marks_itself_and_the_other_fields_still_apply():
    from alpaviz.widgets._app import PanelEditor  # the ipywidgets boxes clamp to valid bounds; panel's do not

    graph = tiny_graph()
    session = EditorSession(graph, hand_plan(graph), solver=hand_solver)
    ed = PanelEditor(session)
    ed.inter_bw.value = -5.0
    assert "inter_bw" in ed.status.object and "#b00020" in ed.inter_bw.styles.get("border", "")
    ed.microbatches.value = 8  # another field still applies
    assert session.whatif.num_microbatches == 8 and session.plan.schedule.num_microbatches == 8
    assert "other fields still apply" in ed.status.object and ed.inter_bw.value == -5.0  # still there to fix
    assert session.whatif.cluster.inter_host.bandwidth_bytes_per_s > 0  # the bad value never reached the plan
    ed.inter_bw.value = 12.5  # fixed: the mark goes and the value applies
    assert not ed.inter_bw.styles.get("border")
    assert session.whatif.cluster.inter_host.bandwidth_bytes_per_s == pytest.approx(12.5e9)


def test_the_editor_carries_a_static_snapshot_for_notebooks_exported_to_html():
    ed = _editor()
    bundle = ed._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle  # the live editor where a kernel runs
    snapshot = bundle["text/html"]  # what an HTML export without widget state shows
    assert ">step time<" in snapshot and "a static snapshot" in snapshot
    assert snapshot.count('class="plotly-graph-div"') == 4 and "plotly.min.js" not in snapshot


def test_layer_bars_add_up_to_the_stages_and_a_click_lists_a_layers_operators(solved_editor):
    from alpaviz.widgets._layer_view import layer_bars, operator_rows

    ed = solved_editor
    ed.reset_button.click()
    ed.cut_buttons[2].click()
    ed.resolve_button.click()
    s = ed.session
    bars = layer_bars(s.graph, s.plan)
    assert [b.layer for b in bars] == list(range(len(s.plan.layers)))
    for stage in s.plan.stages:  # a stage's compute and resharding are its layers' (remat off)
        mine = [b for b in bars if b.stage == stage.index]
        assert not stage.remat and sum(b.compute_s for b in mine) == pytest.approx(stage.cost.compute_s)
        assert sum(b.resharding_s for b in mine) == pytest.approx(stage.cost.resharding_s)
        assert all(b.total_s > 0 and b.memory_bytes > 0 for b in mine)
    assert [t.name for t in _show(ed, "Graph").layer_figure.data[:3]] == ["compute", "communication", "resharding"]
    ed.on_layer_click([1])
    assert ed.table_layer.value == 1
    rows = operator_rows(s.graph, s.plan, 1)
    assert len(rows) == len(s.plan.layers[1].nodes) and ed.op_table.value.count("<tr>") == min(len(rows), 200) + 1
    assert [r.time_s for r in rows] == sorted((r.time_s for r in rows), reverse=True)  # costliest first
    ed.op_search.value = "dot_general"
    dots = [r for r in rows if "dot_general" in r.primitive]
    assert dots and ed.op_table.value.count("<tr>") == len(dots) + 1
    ed.op_search.value = "no operator is called this"
    assert "no operator matches" in ed.op_table.value


def test_panel_layer_bars_click_and_operator_search():
    import types

    from alpaviz.widgets._app import PanelEditor

    graph = tiny_graph()
    app = PanelEditor(EditorSession(graph, hand_plan(graph), solver=hand_solver))
    assert app.layer_pane.object.data == ()  # an empty figure until its tab is shown
    app.tabs.active = 1
    assert len(app.layer_pane.object.data) > 0  # drawn now
    app._on_layer_click(types.SimpleNamespace(new={"points": [{"customdata": 2, "x": "L2"}]}))
    assert app.table_layer.value == 2
    assert app.op_table.object.count("<tr>") == min(len(app.session.plan.layers[2].nodes), 200) + 1
    app.op_search.value = "dot_general"
    assert 1 < app.op_table.object.count("<tr>") < 40


def test_the_schedule_control_replans_under_zb_h1_and_the_timeline_draws_its_w_apart():
    graph = tiny_graph()
    plan = hand_plan(graph, cuts=(2,), pins=av.Pins().with_cut(2))
    ed = _show(PlanEditor(EditorSession(graph, plan, solve_options={"progress": False})), "Timeline")
    assert "zb-h1" in ed.schedule.options and "auto" in ed.schedule.options
    ed.schedule.value = "zb-h1"
    assert ed.session.plan.schedule.kind == "zb-h1" and ed.session.plan.num_stages >= 2
    ed.render()
    drawn = {trace.name for trace in ed.timeline_figure.data}
    assert {"forward", "backward", "weight_grad"} <= drawn
    ed.schedule.value = "auto"
    notes = ed.session.plan.solver.notes
    assert any(note.startswith(f"schedule: {ed.session.plan.schedule.kind} chosen") for note in notes)


def test_the_schedule_control_interleaves_and_the_timeline_rows_become_submeshes():
    graph = tiny_graph()
    plan = hand_plan(graph, cuts=(2,), pins=av.Pins().with_cut(2))
    ed = _show(PlanEditor(EditorSession(graph, plan, solve_options={"progress": False})), "Timeline")
    assert "interleaved-1f1b" in ed.schedule.options
    ed.schedule.value = "interleaved-1f1b"
    new = ed.session.plan
    assert new.schedule.kind == "interleaved-1f1b" and new.schedule.chunks >= 2 and 2 in new.stage_cuts
    ed.render()
    lanes = {y for trace in ed.timeline_figure.data for y in trace.y}
    assert {f"submesh {d}" for d in range(new.num_submeshes)} <= lanes
    assert not any(lane.startswith("stage ") for lane in lanes)
