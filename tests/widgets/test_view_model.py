"""The editor's view model, edits and session, on a traced tiny GPT and hand-made plans."""

import dataclasses
import functools

import pytest

import alpaviz as av
from alpaviz.core import Layer, PredictedCost, Schedule, SolverInfo, Stage, StageCost, graph_fingerprint
from alpaviz.core.plan._spec import shard_shape
from alpaviz.core.plan._timeline import Timeline, TimelineEvent
from alpaviz.widgets import _edits
from alpaviz.widgets import _html as markup
from alpaviz.widgets import _cluster_map as cmap
from alpaviz.widgets import _plan_compare as compare
from alpaviz.widgets import _timeline_view as tv
from alpaviz.widgets import _view_model as vm
from alpaviz.widgets._session import EditorSession, WhatIf


@functools.lru_cache(maxsize=None)
def tiny_graph(num_layers: int = 4):
    return av.trace(*av.models.gpt(num_layers=num_layers, hidden=32, heads=2, seq_len=16, vocab=64, batch_size=4))


def hand_plan(graph, cuts=(2,), cluster=None, pins=av.Pins(), submeshes=None, microbatches=4, step_scale=1.0):
    """A plan built by hand (no solver): stages split at `cuts`, params sharded on dim 0 where it divides."""
    cluster = cluster or av.Cluster.a100_node(1)
    bounds = (0, *sorted(cuts), graph.num_layers)
    num = len(bounds) - 1
    pinned = sum(m[0] * m[1] for m, _ in (submeshes or {}).values())
    unpinned = num - len(submeshes or {})
    per = (cluster.num_devices - pinned) // unpinned if unpinned else 0
    if unpinned and per < 1:
        raise ValueError(f"pinned submeshes use {pinned} of {cluster.num_devices} devices, leaving none for the rest")
    layers = tuple(Layer(i, tuple(n.name for n in graph.nodes if n.layer == i), graph.layer_flops()[i])
                   for i in range(graph.num_layers))
    stages, first = [], 0
    for i in range(num):
        submesh, logical = (submeshes or {}).get(i, ((1, per), (per, 1)))
        count = submesh[0] * submesh[1]
        nodes = [n for n in graph.nodes if bounds[i] <= n.layer < bounds[i + 1]]
        mesh = av.LogicalMesh(logical, tuple(range(first, first + count)), (cluster.intra_host, cluster.intra_host))
        strategies = tuple((n.name, av.core.strategy_names(graph, n.name, mesh)[-1])
                           for n in nodes if n.primitive == "dot_general")
        specs = []
        for name in sorted({t for n in nodes for t in n.inputs if t.startswith("params.")}):
            shape = graph.tensor(name).shape
            spec = tuple((("x",) if d == 0 and shape[0] % logical[0] == 0 else ()) for d in range(len(shape)))
            specs.append((name, spec))
        flops = sum(layers[l].flops for l in range(bounds[i], bounds[i + 1]))
        t = step_scale * flops / 1e12
        cost = StageCost(t, 2 * t, 0.0, 3 * t, 0.1 * t, 0.0, 1e8 * (i + 1), 1e7)
        stages.append(Stage(i, bounds[i], bounds[i + 1], submesh, tuple(range(first, first + count)), logical,
                            strategies, tuple(specs), cost))
        first += count
    slowest = max(s.cost.microbatch_s for s in stages)
    step = sum(s.cost.microbatch_s for s in stages) + (microbatches - 1) * slowest
    return av.Plan(
        model=graph.name, graph_fingerprint=graph_fingerprint(graph), cluster=cluster, cost_model=av.CostModel(),
        layers=layers, stages=tuple(stages), schedule=Schedule("1f1b", microbatches),
        predicted=PredictedCost(step, 0.8 * step, 0.1 * step, 0.0, 0.0, 0.1 * step, 3e8, cluster.device.memory_bytes),
        pins=pins, solver=SolverInfo("heuristic", 0.0, step, ("hand made for tests",)),
    )


def hand_solver(graph, *, cluster, options):
    """A test double standing in for `av.solve`: honours pinned cuts and submeshes, else cuts in the middle."""
    pins, num_microbatches = options.pins, options.num_microbatches
    cuts = set(pins.stage_cuts) or {graph.num_layers // 2}
    cuts -= set(pins.forbidden_cuts)
    if pins.num_stages is not None and len(cuts) + 1 != pins.num_stages:
        raise ValueError(f"hand solver: {len(cuts) + 1} stages but {pins.num_stages} pinned")
    submeshes = {s: (m, pins.logical_mesh_map.get(s, (m[0] * m[1], 1))) for s, m in pins.submesh_map.items()}
    used = sum(m[0] * m[1] for m, _ in submeshes.values())
    if used > cluster.num_devices:
        raise ValueError(f"pinned submeshes use {used} devices but the cluster has {cluster.num_devices}")
    return hand_plan(graph, tuple(sorted(cuts)), cluster, pins, submeshes, num_microbatches)


def test_layer_graph_view_colours_by_stage_and_links_layers():
    graph = tiny_graph()
    plan = hand_plan(graph, cuts=(1, 3))
    view = vm.layer_graph_view(graph, plan)
    assert [n.stage for n in view.nodes] == [0, 1, 1, 2]
    assert [n.flops for n in view.nodes] == list(graph.layer_flops())
    assert (0, 1) in view.edges and (1, 2) in view.edges  # the forward activations
    assert all(a != b for a, b in view.edges)


def test_op_graph_view_is_layered_and_truncates_big_graphs():
    graph = tiny_graph()
    plan = hand_plan(graph)
    view = vm.op_graph_view(graph, plan, layers=[1])
    assert {graph.node(n.key).layer for n in view.nodes} == {1}
    # every edge goes from an earlier generation (smaller x) to a later one
    assert view.edges and all(view.nodes[a].x < view.nodes[b].x for a, b in view.edges)
    dot = next(n for n in view.nodes if n.label == "dot_general")
    assert "strategy: RR" in dot.hover and "in: (" in dot.hover
    small = vm.op_graph_view(graph, plan, max_nodes=50)
    assert len(small.nodes) == 50 and small.truncated == len(graph.nodes) - 50
    assert min(n.flops for n in small.nodes) >= sorted((n.flops for n in graph.nodes), reverse=True)[49]


@pytest.mark.parametrize(
    "shape,spec,mesh",
    [((8, 6), (("x",), ()), (2, 2)), ((8, 6), (("x",), ("y",)), (2, 3)), ((8, 6), (("x", "y"), ()), (2, 2)),
     ((8,), ((),), (4, 1))],
    ids=["rows-on-x", "both-axes", "two-axes-one-dim", "replicated"],
)
def test_device_blocks_tile_the_tensor(shape, spec, mesh):
    import numpy as np

    devices = tuple(range(10, 10 + mesh[0] * mesh[1]))
    blocks = vm.device_blocks(shape, spec, mesh, devices)
    block = shard_shape(shape, spec, mesh)
    cover = np.zeros(shape, int)
    for b in blocks:
        assert tuple(stop - start for start, stop in b.slices) == block
        cover[tuple(slice(a, z) for a, z in b.slices)] += 1
    replicas = (mesh[0] * mesh[1] * int(np.prod(block))) // int(np.prod(shape))
    assert (cover == replicas).all()  # each element held by the same number of devices
    assert [b.device_id for b in blocks] == list(devices)


def test_cut_slots_and_stage_bands_show_plan_and_pins():
    graph = tiny_graph()
    pins = av.Pins().with_cut(1).with_no_cut(2).with_submesh(0, (1, 4), (2, 2))
    plan = hand_plan(graph, cuts=(1, 3), pins=pins)
    slots = vm.cut_slots(plan, pins)
    assert [(s.layer, s.is_cut, s.pinned) for s in slots] == [(1, True, "cut"), (2, False, "no_cut"), (3, True, None)]
    assert "pinned cut" in slots[0].label and "no cut" in slots[1].label
    bands = vm.stage_bands(plan, pins)
    assert [b.pinned_submesh for b in bands] == [(1, 4), None, None]
    assert ((1, 4), (2, 2)) in bands[0].submesh_options


def test_sharding_and_strategy_rows():
    graph = tiny_graph()
    plan = hand_plan(graph)
    pins = av.Pins().with_partition_spec("params.wte", (("x",), ()))
    rows = vm.sharding_rows(graph, plan, pins)
    assert rows[0].tensor.startswith("params.")
    wte = next(r for r in rows if r.tensor == "params.wte")
    assert wte.pinned and wte.name == "S0R" and wte.shard_shape == (64 // 4, 32) and len(wte.blocks) == 4
    from alpaviz.core import to_partition_spec

    assert wte.partition_spec == str(to_partition_spec(wte.spec)).replace("PartitionSpec", "P")
    strategies = vm.strategy_rows(graph, plan, pins, lambda node, stage: ("RR", "SR"))
    chosen = plan.strategies
    assert strategies and all(r.options[0] == chosen[r.node] and "SR" in r.options for r in strategies)
    top = vm.costliest_operator(graph, strategies)
    assert graph.node(top).flops == max(graph.node(r.node).flops for r in strategies)


def test_gantt_bars_and_cost_view():
    timeline = Timeline((TimelineEvent(1, 0, "forward", 1.0, 2.0), TimelineEvent(0, 0, "forward", 0.0, 1.0),
                         TimelineEvent(0, 0, "send", 1.0, 1.1)), 2, 1, "gpipe", "predicted")
    bars = tv.gantt_bars(timeline)
    assert [(b.stage, b.kind) for b in bars] == [(0, "forward"), (1, "forward")] and bars[0].label == "F0"
    assert [(b.stage, b.kind) for b in tv.transfer_bars(timeline)] == [(0, "send")]
    graph = tiny_graph()
    old, new = hand_plan(graph), hand_plan(graph, step_scale=0.5)
    view = vm.cost_view(new, old)
    assert view.delta_s == pytest.approx(new.predicted.step_time_s - old.predicted.step_time_s)
    assert "-50.0%" in view.headline and view.over_memory == ()
    assert dict(view.breakdown)["bubble"] == new.predicted.bubble_s


@pytest.mark.parametrize("start,expected", [((), "cut"), ((2,), "no_cut"), ("no", None)], ids=["free", "cut", "no-cut"])
def test_cycle_cut(start, expected):
    pins = av.Pins().with_no_cut(2) if start == "no" else av.Pins(stage_cuts=start)
    after = _edits.cycle_cut(pins, 2)
    state = "cut" if 2 in after.stage_cuts else "no_cut" if 2 in after.forbidden_cuts else None
    assert state == expected


def test_session_resolve_honours_pins_and_keeps_plan_on_failure():
    graph = tiny_graph()
    session = EditorSession(graph, hand_plan(graph), solver=hand_solver)
    assert session.plan.stage_cuts == (2,)
    session.toggle_cut(1)
    session.toggle_cut(3)
    assert session.pins.stage_cuts == (1, 3)
    outcome = session.resolve()
    assert outcome.ok and session.plan.stage_cuts == (1, 3) and session.previous.stage_cuts == (2,)
    good = session.plan
    session.pin_submesh(0, ((1, 8), (8, 1)))
    session.pin_submesh(1, ((1, 8), (8, 1)))
    outcome = session.resolve()
    assert not outcome.ok and "infeasible" in outcome.message and "16 devices" in outcome.message
    assert session.plan is good  # the previous plan stays shown


def test_session_whatif_replans_and_without_solver_says_so():
    graph = tiny_graph()
    session = EditorSession(graph, hand_plan(graph), solver=hand_solver)
    session.set_whatif(WhatIf(8, "gpipe", av.Cluster.v100_node(1)).with_bandwidths(10, 1))
    assert session.plan.schedule.num_microbatches == 8 and session.plan.cluster.device.name == "V100-16GB"
    assert session.plan.cluster.intra_host.bandwidth_bytes_per_s == 10e9
    with pytest.raises(ValueError, match="unknown cluster preset"):
        WhatIf().with_preset("tpu", 1)
    lonely = EditorSession(graph, hand_plan(graph), solver=None)
    lonely.solver = None
    assert "not available" in lonely.resolve().message


def test_session_keeps_the_cache_it_is_given():
    class EmptyCache:
        def __len__(self):
            return 0

    cache = EmptyCache()
    graph = tiny_graph()
    seen = []
    session = EditorSession(graph, hand_plan(graph), solver=lambda g, **kw: seen.append(kw["options"].cache) or hand_plan(g),
                            solve_options={"cache": cache})
    assert session.resolve().ok and seen == [cache]


def test_session_save_and_load_round_trip(tmp_path):
    graph = tiny_graph()
    session = EditorSession(graph, hand_plan(graph), solver=hand_solver)
    session.toggle_cut(3)
    path = str(tmp_path / "plan.json")
    assert session.save(path).ok
    other = EditorSession(graph, hand_plan(graph, cuts=(1,)), solver=hand_solver)
    assert other.load(path).ok and other.plan.stage_cuts == (2,) and other.pins.stage_cuts == (3,)
    (tmp_path / "bad.json").write_text("{oops")
    bad = other.load(str(tmp_path / "bad.json"))
    assert not bad.ok and "not valid JSON" in bad.message and other.plan.stage_cuts == (2,)


def test_memory_chart_stacks_each_stages_parts_in_a_unit_that_fits():
    from alpaviz.core import MemoryBreakdown
    from alpaviz.widgets import _figures as F

    graph = tiny_graph()
    plan = hand_plan(graph)
    parts = MemoryBreakdown(params=3e6, optimizer_state=6e6, gradients=3e6, activations=2e6, temporaries=1e6,
                            in_flight=2)
    stages = tuple(dataclasses.replace(s, cost=dataclasses.replace(s.cost, memory_bytes=parts.peak, memory=parts))
                   for s in plan.stages)
    plan = dataclasses.replace(plan, stages=stages)
    view = vm.cost_view(plan)
    split = dict(dict(view.memory_parts)[0])
    assert split["activations in flight"] == 2 * 2e6  # per microbatch x in flight
    assert sum(split.values()) == pytest.approx(dict(view.memory_per_stage)[0])
    fig = F.cost_figure(view)
    bars = {t.name: t for t in fig.data if t.type == "bar" and t.name}
    assert set(bars) == set(vm.MEMORY_PARTS) and fig.layout.barmode == "stack"
    # 21 MB per device against a 40 GB limit: MiB on the axis, no limit line stretching it, the limit in the title.
    assert bars["optimizer state"].y[0] == pytest.approx(6e6 / 2**20)
    assert fig.layout.yaxis2.title.text == "MiB" and not fig.layout.shapes
    assert "limit 37.3 GiB" in fig.layout.annotations[1].text
    assert vm.byte_unit(512) == ("B", 1.0) and vm.byte_unit(3 * 2**30)[0] == "GiB"


def test_cluster_map_places_every_device_and_prices_what_crosses_each_cut():
    from alpaviz.core.graph import cut_bytes
    from alpaviz.widgets import _figures as F

    graph = tiny_graph()
    cluster = av.Cluster.a100_node(2, 2)
    plan = hand_plan(graph, cuts=(2,), cluster=cluster)
    view = cmap.cluster_map(graph, plan)
    assert [c.device for c in view.cells] == list(range(4)) and {c.host for c in view.cells} == {0, 1}
    for stage in plan.stages:
        cells = [c for c in view.cells if c.stage == stage.index]
        assert sorted(c.device for c in cells) == sorted(stage.device_ids)
        rows, cols = stage.logical_mesh
        assert sorted(c.coordinate for c in cells) == [(r, c) for r in range(rows) for c in range(cols)]
    forward = {(t.src, t.dst): t for t in view.transfers if t.kind == "forward"}
    backward = {(t.src, t.dst): t for t in view.transfers if t.kind == "backward"}
    fwd_cut, bwd_cut = cut_bytes(graph)
    assert forward[(0, 1)].nbytes == fwd_cut[2] and backward[(1, 0)].nbytes == bwd_cut[2]
    assert forward[(0, 1)].inter_host  # stage 0 fills host 0, stage 1 host 1
    assert forward[(0, 1)].seconds == pytest.approx(cluster.inter_host.transfer_time(fwd_cut[2]))
    assert "across hosts" in forward[(0, 1)].label
    fig = F.cluster_map_figure(view)
    assert len(fig.layout.shapes) == 4 and any(a.arrowcolor == "#B00020" for a in fig.layout.annotations)


def test_plan_diff_names_what_a_resolve_changed():
    graph = tiny_graph()
    old, new = hand_plan(graph, cuts=(2,)), hand_plan(graph, cuts=(1,), step_scale=0.5)
    changes = {c.what: c for c in compare.plan_diff(old, new)}
    assert changes["cuts before layers"].before == "2" and changes["cuts before layers"].after == "1"
    assert changes["stage 0"].before.startswith("layers 0-1") and changes["stage 0"].after.startswith("layers 0-0")
    change = 100 * (new.predicted.step_time_s / old.predicted.step_time_s - 1)
    assert f"{change:+.1f}%" in changes["step time"].after
    assert compare.plan_diff(old, old) == () and "same plan" in markup.plan_diff_html(())
    assert "<td>cuts before layers</td>" in markup.plan_diff_html(compare.plan_diff(old, new))


def test_the_timeline_shades_each_stages_idle_time_and_writes_the_bubble_share():
    from alpaviz.widgets import _figures as F

    events = (TimelineEvent(0, 0, "forward", 0.0, 1.0), TimelineEvent(0, 1, "forward", 2.0, 3.0),
              TimelineEvent(1, 0, "forward", 1.0, 2.0), TimelineEvent(0, 0, "send", 1.0, 1.25))
    timeline = Timeline(events, 2, 2, "1f1b", "predicted", hardware="1x8 A100")
    bars = tv.gantt_bars(timeline)
    assert tv.idle_gaps(bars) == ((0, 1.0, 2.0), (1, 0.0, 1.0), (1, 2.0, 3.0))
    assert tv.bubble_fractions(timeline, None) == (pytest.approx(1 - 3.25 / 6), None)
    fig = F.gantt_figure(tv.timeline_panel(timeline, "predicted"), tv.timeline_panel(None, "measured", missing="press Launch"))
    assert fig.layout.annotations[0].text == "predicted on 1x8 A100: 3000 ms, bubble 46%"
    assert fig.layout.annotations[1].text == "measured (press Launch)"
    assert fig.layout.xaxis.title.text == "ms on 1x8 A100"
    idle = next(t for t in fig.data if t.name == "idle (bubble)")
    assert list(idle.x) == [1e3, 1e3, 1e3] and list(idle.y) == ["stage 0", "stage 1", "stage 1"]
    send = next(t for t in fig.data if t.name == "send")  # its own lane under the stage that sends
    assert list(send.y) == ["stage 0 transfers"] and list(send.x) == [250.0]
    assert list(fig.layout.yaxis.categoryarray) == ["stage 0", "stage 0 transfers", "stage 1"]


def test_the_timeline_panels_name_their_hardware_and_relate_to_the_plan():
    graph = tiny_graph()
    plan = hand_plan(graph)
    predicted = av.predicted_timeline(plan)
    measured = dataclasses.replace(predicted, source="measured", hardware="this machine: 8 CPU devices",
                                   events=tuple(dataclasses.replace(e, start_s=3 * e.start_s, end_s=3 * e.end_s)
                                                for e in predicted.events))
    left, right = tv.timeline_panels(plan, predicted, measured)
    assert left.hardware == plan.cluster.name and right.hardware.startswith("this machine")
    assert "measured / predicted<br>per stage: 0: 3x, 1: 3x" in right.title
    if abs(predicted.total_s - plan.predicted.step_time_s) > 0.01 * plan.predicted.step_time_s:
        assert "the plan's step time" in left.title
    else:
        assert "<sup>" not in left.title


def test_the_header_gives_step_time_throughput_bubble_memory_and_solver():
    graph = tiny_graph()
    plan = hand_plan(graph)
    step, p = plan.predicted.step_time_s, plan.predicted
    per_device = graph.total_flops * plan.schedule.num_microbatches / step / plan.cluster.num_devices
    items = {i.label: i for i in vm.header_items(graph, plan, bubble=0.25)}
    assert list(items) == ["step time", "throughput", "bubble", "peak memory", "solver"]
    assert items["step time"].value == f"{step * 1e3:.4g} ms"
    assert items["throughput"].value == f"{per_device / 1e12:.3g} TFLOP/s"
    share = per_device / plan.cluster.device.peak_flops_for("float32")
    assert items["throughput"].detail == f"per device, {share:.0%} of the float32 peak"  # the tiny GPT is fp32
    assert items["bubble"].value == "25%" and "idle share" in items["bubble"].detail
    assert items["peak memory"].detail == f"{p.max_memory_bytes / p.memory_limit_bytes:.0%} of the limit"
    assert items["solver"].value == plan.solver.status
    fill = {i.label: i for i in vm.header_items(graph, plan)}["bubble"]
    assert fill.value == f"{p.bubble_s / step:.0%}" and "fill and drain" in fill.detail
    assert markup.header_html(vm.header_items(graph, plan)).count("<div style=\"border") == 5
    assert "batch statistics" not in items["step time"].detail
    ghost = {i.label: i for i in vm.header_items(graph, plan.with_batch_statistics("per_microbatch"))}
    assert ghost["step time"].detail.endswith("batch statistics per microbatch")  # the opt-in is shown


@pytest.mark.parametrize(
    "shape,spec,mesh,drawn,regions",
    [((64, 32), (("x",), ()), (4, 2), ("dim 0", "dim 1"), 4),
     ((64, 32), (("x",), ("y",)), (4, 2), ("dim 0", "dim 1"), 8),
     ((8, 16, 32), ((), (), ("x", "y")), (2, 4), ("dim 0", "dim 2"), 8),
     ((8, 16, 32), (("x",), ("y",), ()), (2, 4), ("dim 0", "dim 1"), 8),
     ((96,), (("y",),), (2, 4), ("(one row)", "dim 0"), 4)],
    ids=["rows", "grid", "3d-last", "3d-first-two", "vector"],
)
def test_the_tensor_picture_splits_the_rectangle_into_the_regions_devices_hold(shape, spec, mesh, drawn, regions):
    from alpaviz.widgets._tensor_picture import tensor_picture

    row = vm.ShardingRow("t", 0, shape, spec, "S", mesh, tuple(range(mesh[0] * mesh[1])), False)
    picture = tensor_picture(row)
    assert (picture.row_label.split(" (")[0], picture.col_label.split(" (")[0]) == drawn
    assert len(picture.regions) == regions
    # The regions tile the drawn rectangle exactly, and every device holds exactly one.
    area = sum((r.rows[1] - r.rows[0]) * (r.cols[1] - r.cols[0]) for r in picture.regions)
    assert area == picture.height * picture.width
    assert sorted(d for r in picture.regions for d in r.devices) == list(range(mesh[0] * mesh[1]))
    replicas = mesh[0] * mesh[1] // regions
    assert all(len(r.devices) == replicas for r in picture.regions)


def test_any_tensor_of_the_plan_can_be_pictured_intermediates_included():
    from alpaviz.widgets import _figures as F
    from alpaviz.widgets._tensor_picture import tensor_picture

    graph = tiny_graph(2)
    plan = av.solve(graph, cluster=av.Cluster.a100_node(1, 4), num_microbatches=2, progress=False,
                    pins=av.Pins(num_stages=1))  # the ILP specs every tensor it shards, intermediates included
    rows = vm.sharding_rows(graph, plan, av.Pins())
    inputs = set(graph.inputs)
    intermediate = next(r for r in rows if r.tensor not in inputs and len(r.shape) >= 2)
    fig = F.tensor_figure(tensor_picture(intermediate))
    assert len(fig.layout.shapes) == len(tensor_picture(intermediate).regions)
    assert intermediate.tensor in fig.layout.title.text and fig.layout.xaxis.title.text.startswith("dim ")


@pytest.mark.parametrize("strategy,mesh,ways", [("RR", (4, 2), 1), ("S0R", (4, 2), 4), ("RS1", (4, 2), 2),
                                                 ("S0S1", (4, 2), 8), ("S01R", (4, 2), 8), ("S1R", (1, 8), 8)])
def test_an_operators_hover_divides_its_work_only_by_the_ways_its_strategy_splits_it(strategy, mesh, ways):
    assert vm.split_ways(strategy, mesh) == ways
    assert vm.format_seconds(5.95e-8) == "59.5 ns" and vm.format_seconds(1.5e-3) == "1.5 ms"


def test_an_operators_hover_time_follows_its_strategy():
    graph = tiny_graph()
    plan = hand_plan(graph)
    view = vm.op_graph_view(graph, plan, max_nodes=len(graph.nodes))
    seen = set()
    for shown in view.nodes:
        node, strategy = graph.node(shown.key), plan.strategies.get(shown.key)
        if strategy is None:
            continue
        ways = vm.split_ways(strategy, plan.stages[shown.stage].logical_mesh)
        time = plan.cost_model.op_time(node.primitive, node.flops / ways, (node.bytes_read + node.bytes_written) / ways,
                                       plan.cluster.device, graph.operand_dtype(node))
        assert f"~{vm.format_seconds(time)} of compute per device" in shown.hover
        assert ("(whole on every device of its stage)" if ways == 1 else f"(split {ways} ways)") in shown.hover
        seen.add(shown.key)
    assert len(seen) > 20


def test_the_operator_table_says_where_the_ilps_resharding_time_goes_in_and_out():
    from alpaviz.core.intra_op import strategy_names
    from alpaviz.widgets._layer_view import OPERATOR_COLUMNS, operator_rows

    graph = tiny_graph()
    cluster = av.Cluster.a100_node(1, 2)
    pins = av.Pins(num_stages=1).with_submesh(0, (1, 2), (1, 2))
    node = next(n for n in graph.nodes if n.layer == 1 and n.role == "forward" and n.primitive == "dot_general")
    for name in strategy_names(graph, node.name, cluster.logical_mesh((1, 2), (1, 2))):
        plan = av.solve(graph, cluster=cluster, pins=pins.with_strategy(node.name, name), progress=False)
        if plan.stages[0].cost.resharding_s > 0:
            break
    else:
        pytest.fail("no pinned strategy of the dot needs a resharding")
    rows = [r for layer in range(len(plan.layers)) for r in operator_rows(graph, plan, layer)]
    producers = {t for n in graph.nodes for t in n.outputs}
    read_from_inputs = sum(s for _, t, s in plan.stages[0].resharding_edges if t not in producers)
    assert sum(r.reshard_in_s for r in rows) == pytest.approx(plan.stages[0].cost.resharding_s)
    assert sum(r.reshard_out_s for r in rows) == pytest.approx(plan.stages[0].cost.resharding_s - read_from_inputs)
    moved = next(r for r in rows if r.reshard_in_s > 0)
    cells = dict(zip(OPERATOR_COLUMNS, moved.cells))
    assert cells["reshard in"] == vm.format_seconds(moved.reshard_in_s) and "jvp" not in cells["scope"]
