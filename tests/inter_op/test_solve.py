"""av.solve end to end: optimality through pins, balance, pins, memory, cache, errors."""

import itertools

import jax
import jax.numpy as jnp
import pytest

import alpaviz as av
from alpaviz.core.inter_op._stage_cost import analytic_stage_cost
from alpaviz.core.inter_op import InfeasiblePinsError, ModelTooLargeError, solve
from alpaviz.core.inter_op import StageProfileCache
from alpaviz.core.inter_op._stage_profile import mesh_choices


def _marked_mlp(widths, batch=16, marks=True):
    """A stack of dense layers with a marker after each one but the last."""
    return av.trace(*av.models.mlp(widths, batch_size=batch, marks=marks, abstract=True))


def _blocks(inner, hidden=1024, batch=1024):
    """Marked residual-free MLP blocks h -> inner[i] -> h: boundaries all (batch, hidden)."""

    def loss(params, data):
        x = data["x"]
        for i, (a, b) in enumerate(params):
            x = jnp.tanh(jnp.tanh(x @ a) @ b)
            if i < len(params) - 1:
                x = av.mark_layer(x)
        return jnp.mean(x**2)

    def step(params, data):
        value, grads = jax.value_and_grad(loss)(params, data)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value

    f32 = jnp.float32
    params = [(jax.ShapeDtypeStruct((hidden, w), f32), jax.ShapeDtypeStruct((w, hidden), f32)) for w in inner]
    return av.trace(step, params, {"x": jax.ShapeDtypeStruct((batch, hidden), f32)})


@pytest.fixture(scope="module")
def gpt4():
    step, params, batch = av.models.gpt(num_layers=4, hidden=256, heads=4, seq_len=64, vocab=512,
                                        batch_size=8, abstract=True)
    return av.trace(step, params, batch)


def _brute_force_through_pins(graph, cluster, cache, B, stage_cost, **options):
    """Every slicing x every submesh/logical assignment covering the cluster, each solved fully pinned."""
    L = graph.num_layers
    meshes = mesh_choices(cluster)
    best = None
    for r in range(L):
        for cuts in itertools.combinations(range(1, L), r):
            n = r + 1
            for assignment in itertools.product(meshes, repeat=n):
                if sum(m.num_devices for m in assignment) != cluster.num_devices:
                    continue
                pins = av.Pins(stage_cuts=cuts, num_stages=n)
                for i, m in enumerate(assignment):
                    pins = pins.with_submesh(i, m.submesh, m.logical_shape)
                try:
                    plan = solve(graph, cluster=cluster, pins=pins, cache=cache, num_microbatches=B,
                                 progress=False, stage_cost=stage_cost, **options)
                except ValueError:
                    continue
                assert plan.stage_cuts == cuts
                if best is None or plan.predicted.step_time_s < best.predicted.step_time_s:
                    best = plan
    return best


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_dp_equals_brute_force_through_pins_on_4_layers_4_devices(gpt4, schedule):
    cluster = av.Cluster.a100_node(1, 4)
    cache = StageProfileCache()
    replicas = av.baselines.data_parallel(gpt4, cluster=cluster, stage_cost=analytic_stage_cost, progress=False,
                                          schedule=schedule, num_microbatches=4)
    limit = 0.9 * replicas.predicted.max_memory_bytes  # data parallel itself does not fit
    options = dict(schedule=schedule, memory_limit=limit)
    plan = solve(gpt4, cluster=cluster, cache=cache, num_microbatches=4, progress=False,
                 stage_cost=analytic_stage_cost, **options)
    best = _brute_force_through_pins(gpt4, cluster, cache, 4, analytic_stage_cost, **options)
    assert plan.predicted.step_time_s == pytest.approx(best.predicted.step_time_s, rel=1e-9)
    assert plan.predicted.max_memory_bytes <= limit
    assert sum(len(s.device_ids) for s in plan.stages) == 4
    assert sorted(d for s in plan.stages for d in s.device_ids) == [0, 1, 2, 3]


@pytest.mark.slow
def test_dp_equals_brute_force_through_pins_with_the_ilp(gpt4):
    cluster = av.Cluster.a100_node(1, 4)
    cache = StageProfileCache()
    plan = solve(gpt4, cluster=cluster, cache=cache, num_microbatches=4, progress=False)
    best = _brute_force_through_pins(gpt4, cluster, cache, 4, None)
    assert plan.predicted.step_time_s == pytest.approx(best.predicted.step_time_s, rel=1e-9)
    assert any(s.strategies for s in plan.stages), "the ILP's strategies reach the plan"


def test_uniform_layers_get_balanced_stages():
    graph = _blocks([4096] * 8)
    cluster = av.Cluster.a100_node(1, 4)
    pins = av.Pins(num_stages=4)
    plan = solve(graph, cluster=cluster, num_microbatches=8, pins=pins, progress=False,
                 stage_cost=analytic_stage_cost)
    sizes = [s.layer_stop - s.layer_start for s in plan.stages]
    assert sizes == [2, 2, 2, 2]
    times = [s.cost.microbatch_s for s in plan.stages]
    assert max(times) / min(times) < 1.2


def test_a_heavy_layer_gets_an_uneven_cut():
    graph = _blocks([1024, 1024, 8192, 1024, 1024, 1024])  # layer 2 does 8x the work
    cluster = av.Cluster.a100_node(1, 4)
    pins = av.Pins(num_stages=4)
    for s in range(4):
        pins = pins.with_submesh(s, (1, 1))
    plan = solve(graph, cluster=cluster, num_microbatches=16, pins=pins, progress=False,
                 stage_cost=analytic_stage_cost)
    sizes = [s.layer_stop - s.layer_start for s in plan.stages]
    heavy = plan.stage_of_layer(2)
    assert (heavy.layer_start, heavy.layer_stop) == (2, 3), f"the heavy layer should be alone, got {sizes}"
    assert max(sizes) >= 2, f"light layers should share stages, got {sizes}"


def test_pinning_a_cut_moves_only_what_it_must():
    graph = _blocks([4096] * 8)
    cluster = av.Cluster.a100_node(1, 4)
    cache = StageProfileCache()
    options = dict(cluster=cluster, num_microbatches=8, progress=False, stage_cost=analytic_stage_cost, cache=cache)
    plan = solve(graph, pins=av.Pins(num_stages=4), **options)
    assert plan.stage_cuts == (2, 4, 6)
    moved = av.resolve(plan.with_pins(plan.pins.with_cut(3)), graph, stage_cost=analytic_stage_cost,
                       cache=cache, progress=False)
    assert 3 in moved.stage_cuts and moved.pins.stage_cuts == (3,)
    old = {(s.layer_start, s.layer_stop) for s in plan.stages}
    new = {(s.layer_start, s.layer_stop) for s in moved.stages}
    assert {(4, 6), (6, 8)} <= new & old, f"untouched stages moved: {sorted(old)} -> {sorted(new)}"
    free = solve(graph, pins=av.Pins(num_stages=4, stage_cuts=(3,)), **options)
    assert moved.predicted.step_time_s == pytest.approx(free.predicted.step_time_s, rel=1e-6)


def test_too_big_for_data_parallel_is_pipelined_or_sharded():
    graph = _marked_mlp([1024] * 5, batch=64)
    cluster = av.Cluster.a100_node(1, 4)
    state = sum(graph.tensor(t).nbytes for t in graph.inputs if t.startswith("params"))
    limit = 1.2 * state  # params + grads replicated (2x state) do not fit on one device
    options = dict(cluster=cluster, num_microbatches=4, progress=False, stage_cost=analytic_stage_cost,
                   memory_limit=limit)
    with pytest.raises(ModelTooLargeError):
        av.baselines.data_parallel(graph, **options)
    plan = solve(graph, **options)
    assert plan.num_stages > 1 or any(s.logical_mesh[1] > 1 for s in plan.stages)
    assert plan.predicted.max_memory_bytes <= limit


def test_too_big_for_the_cluster_names_need_and_limit():
    graph = _marked_mlp([1024] * 5, batch=64)
    with pytest.raises(ModelTooLargeError, match=r"the best plan needs .* but the limit is 64.00 KiB per device"):
        solve(graph, cluster=av.Cluster.a100_node(1, 4), memory_limit=64 * 1024, progress=False,
              stage_cost=analytic_stage_cost)


@pytest.mark.parametrize(
    "pins,names",
    [
        (av.Pins(num_stages=2).with_submesh(0, (1, 4)), ["2 stages", "stage 0 on submesh (1, 4)"]),
        (av.Pins(stage_cuts=(1, 2, 3)).with_submesh(1, (1, 2)), ["cut before layer 1", "stage 1 on submesh (1, 2)"]),
    ],
    ids=["stages-vs-mesh", "cuts-vs-mesh"],
)
def test_conflicting_pins_are_named(gpt4, pins, names):
    with pytest.raises(InfeasiblePinsError) as info:
        solve(gpt4, cluster=av.Cluster.a100_node(1, 4), pins=pins, progress=False, stage_cost=analytic_stage_cost)
    for name in names:
        assert name in str(info.value)


@pytest.mark.parametrize(
    "pins,message",
    [
        (av.Pins(stage_cuts=(9,)), r"cut before layer 9: the graph has layers 0\.\.3, so a cut is 1\.\.3"),
        (av.Pins(forbidden_cuts=(4,)), r"cut before layer 4: the graph has layers 0\.\.3"),
        (av.Pins(num_stages=7), r"7 stages: at most 4 \(one layer and one device per stage"),
        (av.Pins().with_submesh(0, (1, 3)), r"stage 0 on submesh \(1, 3\)"),
        (av.Pins().with_submesh(0, (1, 2), (4, 1)), r"stage 0 logical mesh \(4, 1\): not a view of submesh"),
        (av.Pins().with_submesh(4, (1, 1)), r"stage 4 is pinned but there can be at most 4 stages \(0\.\.3\)"),
        (av.Pins(num_stages=2, stage_logical_meshes=((2, (1, 1)),)), "stage 2 is pinned but there can be at most 2"),
        (av.Pins().with_remat(99, True), r"stage 99 is pinned but there can be at most 4 stages"),
        (av.Pins().with_strategy("n999999_dot_general", "SR"), "there is no operator 'n999999_dot_general'"),
        (av.Pins().with_partition_spec("params.nope", ((),)), "there is no tensor 'params.nope'"),
    ],
    ids=["cut", "no-cut", "stages", "mesh", "logical-mesh", "submesh-stage", "logical-stage", "remat-stage",
         "node", "tensor"],
)
def test_impossible_pins_are_rejected_with_the_reason(gpt4, pins, message):
    """Every kind of pin out of range is refused before any profiling, naming the pin and the range."""
    with pytest.raises(InfeasiblePinsError, match=message):
        solve(gpt4, cluster=av.Cluster.a100_node(1, 4), pins=pins, progress=False, stage_cost=analytic_stage_cost)


def test_cache_makes_a_resolve_after_a_pin_fast_and_plans_round_trip(gpt4):
    cluster = av.Cluster.a100_node(1, 4)
    cache = StageProfileCache()
    plan = solve(gpt4, cluster=cluster, cache=cache, num_microbatches=4, progress=True,
                 stage_cost=analytic_stage_cost)
    size = len(cache)
    assert size == 3 * len(mesh_choices(cluster)), "the identical middle blocks share profiles"
    again = solve(gpt4, cluster=cluster, cache=cache, num_microbatches=4, progress=False,
                  pins=av.Pins(stage_cuts=(2,)), stage_cost=analytic_stage_cost)
    # No new profile: the re-solve is the DP alone (its seconds are in benchmarks/bench_plan.py).
    assert len(cache) == size and 2 in again.stage_cuts
    assert av.Plan.from_json(plan.to_json()) == plan
    # The same problem solved again, all from the cache: an equal plan; only the run's timings differ.
    same = solve(gpt4, cluster=cluster, cache=cache, num_microbatches=4, progress=False,
                 stage_cost=analytic_stage_cost)
    assert same == plan and same.to_json() != plan.to_json()
    assert "0 layer profiles computed" in same.solver.timings[0] and "0 layer" not in plan.solver.timings[0]
    assert "timing: profiling" in same.summary()
    assert av.Plan.from_json(same.to_json()).solver.timings == same.solver.timings
    assert plan.graph_fingerprint == av.core.graph_fingerprint(gpt4)
    text = plan.summary()
    assert "stage" in text and "predicted step" in text
    assert plan.predicted.step_time_s == pytest.approx(
        sum(s.cost.microbatch_s + s.cost.update_s for s in plan.stages)
        + 3 * max(s.cost.microbatch_s for s in plan.stages), rel=1e-9)


def test_unmarked_graph_is_clustered_and_solve_accepts_a_function():
    step_graph = _marked_mlp([64] * 7, marks=False)
    plan = solve(step_graph, cluster=av.Cluster.a100_node(1, 2), num_layers=3, progress=False,
                 stage_cost=analytic_stage_cost)
    assert len(plan.layers) == 3
    step, params, batch = av.models.gpt(num_layers=2, abstract=True)
    plan2 = av.solve(step, params, batch, cluster=av.Cluster.a100_node(1, 2), progress=False,
                     stage_cost=analytic_stage_cost)
    assert len(plan2.layers) == 2


def test_profile_true_measures_layers_on_local_devices():
    graph = _marked_mlp([32, 32, 32], batch=8)  # small: XLA's CPU compile dominates the measurement
    link = av.Link(alpha_s=1e-5, bandwidth_bytes_per_s=5e9)
    cluster = av.Cluster(1, 2, av.DeviceSpec("cpu", 5e10, 2e9, 2e10), link, link)
    cache = StageProfileCache()
    plan = solve(graph, cluster=cluster, num_microbatches=2, progress=False, profile=True,
                 stage_cost=analytic_stage_cost, cache=cache)
    analytic = solve(graph, cluster=cluster, num_microbatches=2, progress=False, stage_cost=analytic_stage_cost)
    assert any("measured" in note for note in plan.solver.notes)
    assert all(s.cost.microbatch_s > 0 for s in plan.stages)
    # Wall-clock on CPU is far slower than the nominal device the analytic model assumes.
    assert plan.predicted.step_time_s != pytest.approx(analytic.predicted.step_time_s, rel=0.1)
    size = len(cache)
    solve(graph, cluster=cluster, num_microbatches=2, progress=False, profile=True,
          stage_cost=analytic_stage_cost, cache=cache, pins=av.Pins(num_stages=1))
    assert len(cache) == size, "measured profiles are reused from the cache"


@pytest.mark.slow
def test_an_intra_op_pin_reaches_its_stage_and_reprofiles_only_its_layer(gpt4):
    from alpaviz.core.intra_op._solve_sharding import strategy_names

    cluster = av.Cluster.a100_node(1, 2)
    cache = StageProfileCache()
    pins = av.Pins(num_stages=1).with_submesh(0, (1, 2), (1, 2))
    plan = solve(gpt4, cluster=cluster, cache=cache, pins=pins, progress=False)
    size = len(cache)
    node = next(n for n in gpt4.nodes if n.layer == 1 and n.role == "forward" and n.primitive == "dot_general")
    chosen = plan.strategies[node.name]
    others = [s for s in strategy_names(gpt4, node.name, cluster.logical_mesh((1, 2), (1, 2))) if s != chosen]
    assert others, "a dot on a 2-device mesh has more than one strategy"
    pinned = solve(gpt4, cluster=cluster, cache=cache, pins=pins.with_strategy(node.name, others[0]), progress=False)
    assert pinned.strategies[node.name] == others[0]
    # Only the pinned layer is profiled again: on every mesh, plus the data-parallel candidate.
    assert len(cache) - size <= len(mesh_choices(cluster)) + 1
    untouched = [n.name for n in gpt4.nodes if n.layer == 3 and n.name in plan.strategies]
    assert all(pinned.strategies[n] == plan.strategies[n] for n in untouched)
    assert pinned.predicted.step_time_s >= plan.predicted.step_time_s * (1 - 1e-9)


def test_each_stage_says_which_operand_of_which_operator_its_resharding_time_is_spent_on(gpt4):
    from alpaviz.core.intra_op._solve_sharding import strategy_names

    cluster = av.Cluster.a100_node(1, 2)
    pins = av.Pins(num_stages=1).with_submesh(0, (1, 2), (1, 2))
    node = next(n for n in gpt4.nodes if n.layer == 1 and n.role == "forward" and n.primitive == "dot_general")
    names = strategy_names(gpt4, node.name, cluster.logical_mesh((1, 2), (1, 2)))
    plans = [solve(gpt4, cluster=cluster, pins=pins.with_strategy(node.name, name), progress=False)
             for name in names[:4]]
    reshards = [p for p in plans if p.stages[0].cost.resharding_s > 0]
    assert reshards, "some pinned strategy of a dot needs its operands resharded"
    for plan in plans:
        stage = plan.stages[0]
        assert sum(s for _, _, s in stage.resharding_edges) == pytest.approx(stage.cost.resharding_s)
        for op, tensor, seconds in stage.resharding_edges:
            assert seconds > 0 and tensor in gpt4.node(op).inputs
    assert av.Plan.from_json(reshards[0].to_json()).stages[0].resharding_edges == reshards[0].stages[0].resharding_edges


@pytest.mark.slow
def test_profiling_in_worker_processes_gives_the_same_plan(gpt4):
    cluster = av.Cluster.a100_node(2, 4)
    options = dict(cluster=cluster, num_microbatches=4, progress=False, stage_cost=analytic_stage_cost)
    serial = solve(gpt4, **options)
    parallel = solve(gpt4, workers=2, **options)
    assert parallel.stages == serial.stages
    assert parallel.predicted == serial.predicted


@pytest.mark.slow
def test_a_solved_plan_runs_and_matches_a_single_device_step():
    import numpy as np

    m = 2
    step, params, batch = av.models.gpt(num_layers=2, hidden=32, heads=2, seq_len=8, vocab=64, batch_size=8)
    micro = jax.tree.map(lambda x: jax.ShapeDtypeStruct((x.shape[0] // m, *x.shape[1:]), x.dtype), batch)
    graph = av.trace(step, params, micro)
    cluster = av.Cluster.local()
    pins = av.Pins(num_stages=2, stage_cuts=(1,))
    plan = solve(graph, cluster=cluster, num_microbatches=m, pins=pins, progress=False, stage_cost=analytic_stage_cost)
    assert plan.num_stages == 2
    parallel = av.parallelize(step, plan, example_args=(params, batch), record_trace=False)
    got_params, got_loss = parallel(params, batch)
    want_params, want_loss = jax.jit(step)(params, batch)
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5, atol=1e-6)
    for g, w in zip(jax.tree.leaves(got_params), jax.tree.leaves(want_params)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-6)


def test_stages_sit_in_pipeline_order_and_each_cut_is_priced_on_the_link_it_crosses():
    from alpaviz.core.inter_op._prepare import prepare

    graph = _blocks([512] * 4, hidden=512, batch=256)
    cluster = av.Cluster.a100_node(2, 4)
    one_link = cluster.with_links(inter_host=cluster.intra_host)
    pins = av.Pins(num_stages=4)
    for stage in range(4):
        pins = pins.with_submesh(stage, (1, 2), (2, 1))
    options = dict(pins=pins, num_microbatches=4, progress=False, stage_cost=analytic_stage_cost)
    plan, same_links = solve(graph, cluster=cluster, **options), solve(graph, cluster=one_link, **options)
    assert [s.device_ids for s in plan.stages] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    profiles = prepare(graph, cluster=cluster, options=av.SolveOptions(stage_cost=analytic_stage_cost)).profiles
    cm = plan.cost_model
    extra = lambda nbytes: cm.send_recv(nbytes, cluster.inter_host) - cm.send_recv(nbytes, cluster.intra_host)  # noqa: E731
    # Only the cut before stage 2 falls between the hosts: its activations (received by stage 2) and its
    # gradients (received by stage 1) cross the network; the other cuts stay on NVLink.
    forward = [a.cost.forward_s - b.cost.forward_s for a, b in zip(plan.stages, same_links.stages)]
    backward = [a.cost.backward_s - b.cost.backward_s for a, b in zip(plan.stages, same_links.stages)]
    assert forward == pytest.approx([0.0, 0.0, extra(profiles.forward_cut_bytes[2]), 0.0], abs=1e-12)
    assert backward == pytest.approx([0.0, extra(profiles.backward_cut_bytes[2]), 0.0, 0.0], abs=1e-12)
    assert extra(profiles.forward_cut_bytes[2]) > 0


def test_a_cross_host_cut_pays_the_receivers_local_all_gather_when_it_replicates_the_batch():
    from alpaviz.core.inter_op._prepare import prepare

    graph = _blocks([512] * 4, hidden=512, batch=256)
    cluster = av.Cluster.a100_node(2, 4)
    profiles = prepare(graph, cluster=cluster, options=av.SolveOptions(stage_cost=analytic_stage_cost)).profiles
    cm = av.CostModel()
    plans = {}
    for logical in ((2, 1), (1, 2)):  # the batch split over the stage's 2 devices, or whole on each
        pins = av.Pins(num_stages=4)
        for stage in range(4):
            pins = pins.with_submesh(stage, (1, 2), logical)
        plans[logical] = solve(graph, cluster=cluster, pins=pins, num_microbatches=4, progress=False,
                               stage_cost=analytic_stage_cost, cost_model=cm)
    # The tensor crosses hosts once, one slab per device (the runtime's boundary layout); a receiver that
    # keeps the batch whole on each device then all-gathers inside its mesh, on NVLink.
    gather = lambda nbytes: cm.all_gather(nbytes, cluster.logical_mesh((1, 2), (1, 2)), 1)  # noqa: E731
    split, whole = plans[(2, 1)].stages, plans[(1, 2)].stages
    assert whole[2].cost.recv_forward_s - split[2].cost.recv_forward_s == pytest.approx(
        gather(profiles.forward_cut_bytes[2]))
    assert whole[1].cost.recv_backward_s - split[1].cost.recv_backward_s == pytest.approx(
        gather(profiles.backward_cut_bytes[2]))
    inside = [(a.cost.recv_forward_s, b.cost.recv_forward_s) for i, (a, b) in enumerate(zip(split, whole)) if i != 2]
    assert all(a == pytest.approx(b) for a, b in inside)  # cuts inside a host: one device_put, no gather
    assert gather(profiles.forward_cut_bytes[2]) > 0


def test_a_stage_layout_that_would_straddle_two_hosts_is_refused_with_the_reason():
    graph = _blocks([512] * 3, hidden=512, batch=256)
    pins = av.Pins(num_stages=3).with_submesh(0, (1, 2)).with_submesh(1, (1, 4)).with_submesh(2, (1, 2))
    with pytest.raises(InfeasiblePinsError, match="may not straddle two hosts.*stage 1 on submesh"):
        solve(graph, cluster=av.Cluster.a100_node(2, 4), pins=pins, num_microbatches=2, progress=False,
              stage_cost=analytic_stage_cost)


@pytest.mark.parametrize(
    "options,message",
    [(dict(num_microbatches=0), "num_microbatches"), (dict(schedule="zigzag"), "schedule"),
     (dict(memory_limit=-1.0), "memory_limit")],
    ids=["microbatches", "schedule", "memory"],
)
def test_bad_solve_options_are_rejected(gpt4, options, message):
    with pytest.raises(ValueError, match=message):
        solve(gpt4, cluster=av.Cluster.a100_node(1, 2), progress=False, stage_cost=analytic_stage_cost, **options)


def test_options_are_one_value_checked_once_and_passed_whole(gpt4):
    """The keywords and an av.SolveOptions are the same options; a misspelt one is named, not dropped."""
    import inspect

    cluster = av.Cluster.a100_node(1, 4)
    options = av.SolveOptions(num_microbatches=4, schedule="gpipe", progress=False, stage_cost=analytic_stage_cost)
    by_value = solve(gpt4, cluster=cluster, options=options)
    assert by_value == solve(gpt4, cluster=cluster, num_microbatches=4, schedule="gpipe", progress=False,
                             stage_cost=analytic_stage_cost)
    assert by_value.schedule.kind == "gpipe" and by_value.schedule.num_microbatches == 4
    # Keywords change the value's fields; the pins' count wins over the option's.
    pinned = solve(gpt4, cluster=cluster, options=options, pins=av.Pins(num_microbatches=2))
    assert pinned.schedule.num_microbatches == 2 and pinned.schedule.kind == "gpipe"
    with pytest.raises(TypeError, match=r"unknown solve option\(s\) \['num_microbatch'\]; the options are"):
        solve(gpt4, cluster=cluster, num_microbatch=4)
    with pytest.raises(TypeError, match="options must be an av.SolveOptions"):
        solve(gpt4, cluster=cluster, options={"num_microbatches": 4})
    assert {"num_microbatches", "pins", "cache", "tolerance"} <= set(inspect.signature(av.solve).parameters)
    # A baseline sets its own layout: pins given to it would be ignored, so they are refused.
    with pytest.raises(TypeError, match=r"the data-parallel baseline does not take \['pins'\]"):
        av.baselines.data_parallel(gpt4, cluster=cluster, options=options.replace(pins=av.Pins(num_stages=2)))
    assert av.baselines.data_parallel(gpt4, cluster=cluster, options=options).schedule == by_value.schedule


def test_global_batch_argnums_plans_the_same_as_tracing_one_microbatch():
    step, params, batch = av.models.mlp((32, 64, 64, 32), batch_size=32, abstract=True)
    micro = jax.tree.map(lambda x: jax.ShapeDtypeStruct((x.shape[0] // 4, *x.shape[1:]), x.dtype), batch)
    options = dict(cluster=av.Cluster.a100_node(1, 4), num_microbatches=4, progress=False,
                   stage_cost=analytic_stage_cost)
    from_global = solve(step, params, batch, global_batch_argnums=(1,), **options)
    from_micro = solve(step, params, micro, **options)
    assert from_global.graph_fingerprint == from_micro.graph_fingerprint
    assert from_global.predicted.step_time_s == pytest.approx(from_micro.predicted.step_time_s)
    with pytest.raises(ValueError, match="cannot be split into 3 microbatches"):
        solve(step, params, batch, global_batch_argnums=(1,), **{**options, "num_microbatches": 3})
