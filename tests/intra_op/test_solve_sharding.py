"""The sharding ILP: optimal against brute force, the parallelism it picks, pins, limits and errors."""

import itertools
import re

import jax
import jax.numpy as jnp
import pytest

import alpaviz as av
from alpaviz.core.intra_op._apply_sharding import shard_step
from alpaviz.core.intra_op._solve_sharding import (
    ShardingInfeasibleError, collective_counts, solve_sharding, strategy_names,
)
from alpaviz.core.intra_op._simplify import candidate_specs

CLUSTER = av.Cluster.local()
F32 = jnp.float32


def _mesh(shape):
    return CLUSTER.logical_mesh((1, shape[0] * shape[1]), shape)


def _sds(*shape):
    return jax.ShapeDtypeStruct(shape, F32)


def mlp_step(params, batch):
    def loss(p, b):
        h = jax.nn.relu(b["x"] @ p["w1"])
        return jnp.mean((h @ p["w2"] - b["y"]) ** 2)

    value, grads = jax.value_and_grad(loss)(params, batch)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value


def mlp(batch_size, d, h):
    return av.trace(mlp_step, {"w1": _sds(d, h), "w2": _sds(h, d)}, {"x": _sds(batch_size, d), "y": _sds(batch_size, d)})


# ---- optimality --------------------------------------------------------------------------------

SMALL = {
    "matmul_tanh_sum": (lambda x, w: jnp.sum(jnp.tanh(x @ w)), (_sds(8, 4), _sds(4, 6))),
    "two_matmuls": (lambda x, a, b: (x @ a) @ b, (_sds(6, 4), _sds(4, 4), _sds(4, 3))),
    "residual": (lambda x, w: x + jnp.exp(x @ w), (_sds(4, 8), _sds(8, 8))),
}


def _brute_force(graph, mesh, merge_followers):
    """Min over every assignment, each priced by pinning all of it (the ILP skips the solver then)."""
    if merge_followers:
        deciders = [n.name for n in graph.nodes if n.primitive in ("dot_general",)]
    else:
        deciders = [n.name for n in graph.nodes]
    node_options = [[(n, s) for s in strategy_names(graph, n, mesh)] for n in deciders]
    input_options = [[(t, s) for s in candidate_specs(graph.tensor(t), mesh)] for t in graph.inputs]
    space = node_options + input_options
    assert 1 < len(list(itertools.product(*space))) <= 4000
    best = float("inf")
    for combo in itertools.product(*space):
        pins = av.Pins(strategies=combo[: len(node_options)], partition_specs=combo[len(node_options):])
        plan = solve_sharding(graph, mesh, CLUSTER, pins=pins, merge_followers=merge_followers)
        assert plan.status == "pinned"
        best = min(best, plan.objective)
    return best


@pytest.mark.parametrize("merge_followers", [False, True], ids=["every_node", "merged"])
@pytest.mark.parametrize("case", list(SMALL), ids=list(SMALL))
def test_ilp_matches_brute_force(case, merge_followers):
    fn, args = SMALL[case]
    graph = av.trace(fn, *args)
    assert len(graph.nodes) <= 8
    mesh = _mesh((1, 2))
    plan = solve_sharding(graph, mesh, CLUSTER, merge_followers=merge_followers)
    assert plan.status == "optimal"
    assert plan.objective == pytest.approx(_brute_force(graph, mesh, merge_followers), rel=1e-9)


def _pinned_to(graph, plan):
    """Pins that fix every strategy and input spec of `plan`."""
    return av.Pins(strategies=plan.strategies, partition_specs=[(t, plan.spec_map[t]) for t in graph.inputs])


def test_full_pins_reproduce_a_solved_plan():
    step, params, batch = av.models.gpt(num_layers=1, abstract=True)
    graph = av.trace(step, params, batch)
    mesh = _mesh((2, 2))
    plan = solve_sharding(graph, mesh, CLUSTER)
    pins = _pinned_to(graph, plan)
    pinned = solve_sharding(graph, mesh, CLUSTER, pins=pins)
    assert pinned.status == "pinned"
    assert pinned.objective == pytest.approx(plan.objective, rel=1e-9)
    assert pinned.strategy_map == plan.strategy_map
    # and pinning a worse strategy costs more
    dot = next(n for n in graph.nodes if n.primitive == "dot_general")
    replicated = strategy_names(graph, dot.name, mesh)[0]
    worse = pins.with_strategy(dot.name, replicated)
    if plan.strategy_map[dot.name] != replicated:
        assert solve_sharding(graph, mesh, CLUSTER, pins=worse).objective > plan.objective


def test_partial_pins_solve_the_rest():
    graph = mlp(4096, 64, 256)
    mesh = _mesh((1, 4))
    free = solve_sharding(graph, mesh, CLUSTER)
    first = next(n.name for n in graph.nodes if n.primitive == "dot_general")
    pins = av.Pins().with_strategy(first, "RS1 = RR x RS1")
    plan = solve_sharding(graph, mesh, CLUSTER, pins=pins)
    assert plan.strategy_map[first] == "RS1 = RR x RS1"
    assert plan.objective >= free.objective
    assert plan.status == "optimal"


# ---- the parallelism it finds ---------------------------------------------------------------------

REDUCTION_OPERANDS = re.compile(r"\b(all-reduce|reduce-scatter)(?:-start)?\(([^)]*)\)")
OTHER = re.compile(r"\b(all-gather|all-to-all)(?:-start)?\(")


def _hlo_counts(graph, plan):
    """Collectives in the compiled step; a combined (tuple) all-reduce counts once per operand."""
    args = [jax.ShapeDtypeStruct(graph.tensor(t).shape, graph.tensor(t).dtype) for t in graph.inputs]
    args = jax.tree.unflatten(graph.in_tree, args)
    text = shard_step(mlp_step, graph, plan).lower(*args).compile().as_text()
    reductions = sum(len(m.group(2).split(",")) for m in REDUCTION_OPERANDS.finditer(text))
    others = {"all-gather": 0, "all-to-all": 0}
    for m in OTHER.finditer(text):
        others[m.group(1)] += 1
    return reductions, others


def _forward_dots(graph, plan):
    dots = [n for n in graph.nodes if n.primitive == "dot_general" and n.role == "forward"]
    return [(n, plan.strategy_map[n.name]) for n in dots]


def _operand_specs(graph, plan, node, mesh):
    from alpaviz.core.intra_op._strategies import enumerate_strategies

    strategy = next(s for s in enumerate_strategies(graph, node, mesh, av.CostModel(), CLUSTER.device)
                    if s.name == plan.strategy_map[node.name])
    return strategy


def _check_hlo_matches_plan(graph, plan, mesh):
    predicted = collective_counts(graph, plan, mesh)
    reductions, others = _hlo_counts(graph, plan)
    assert reductions == predicted["all-reduce"] + predicted["reduce-scatter"]
    assert others["all-gather"] == predicted["all-gather"]
    assert others["all-to-all"] == predicted["all-to-all"]


def test_large_batch_mlp_gets_data_parallelism():
    graph = mlp(4096, 64, 256)
    mesh = _mesh((1, 4))
    plan = solve_sharding(graph, mesh, CLUSTER)
    for node, _ in _forward_dots(graph, plan):
        s = _operand_specs(graph, plan, node, mesh)
        lhs, rhs = s.in_specs
        assert lhs[0] == ("y",) and rhs == ((), ()), s.name  # batch split, weights whole
        assert not s.collectives
    # the weight gradients are reduced over the batch split
    backward = [n for n in graph.nodes if n.primitive == "dot_general" and n.role == "backward"]
    reduced = [n for n in backward if _operand_specs(graph, plan, n, mesh).collectives]
    assert len(reduced) == 2
    _check_hlo_matches_plan(graph, plan, mesh)


def test_weight_heavy_mlp_gets_megatron_tensor_parallelism():
    graph = mlp(16, 1024, 4096)
    mesh = _mesh((1, 4))
    plan = solve_sharding(graph, mesh, CLUSTER)
    (first, _), (second, _) = _forward_dots(graph, plan)
    s1, s2 = _operand_specs(graph, plan, first, mesh), _operand_specs(graph, plan, second, mesh)
    assert s1.in_specs[1] == ((), ("y",)) and not s1.collectives        # w1 split by columns
    assert s2.in_specs[1] == (("y",), ()) and len(s2.collectives) == 1  # w2 by rows, one reduction
    assert s2.collectives[0].kind in ("all-reduce", "reduce-scatter")
    assert plan.spec_map["params.w1"] == ((), ("y",)) and plan.spec_map["params.w2"] == (("y",), ())
    _check_hlo_matches_plan(graph, plan, mesh)


def test_2x2_mesh_mixes_data_and_tensor_parallelism():
    graph = mlp(4096, 512, 2048)
    mesh = _mesh((2, 2))
    plan = solve_sharding(graph, mesh, CLUSTER)
    (first, _), _ = _forward_dots(graph, plan)
    lhs, rhs = _operand_specs(graph, plan, first, mesh).in_specs
    batch_axes, weight_axes = set(lhs[0]), set(rhs[1])
    assert batch_axes and weight_axes and not batch_axes & weight_axes, (lhs, rhs)
    data_only = solve_sharding(graph, mesh, CLUSTER, pins=av.Pins().with_strategy(first.name, "S01R = S01R x RR"))
    assert data_only.objective > plan.objective
    predicted = collective_counts(graph, plan, mesh)
    reductions, others = _hlo_counts(graph, plan)
    assert others["all-gather"] == predicted["all-gather"] and others["all-to-all"] == predicted["all-to-all"]
    # XLA may reduce over both mesh axes in two steps (one per axis), never fewer than planned.
    assert reductions >= predicted["all-reduce"] + predicted["reduce-scatter"]


# ---- memory, sub-graphs and the result record -----------------------------------------------------


def test_memory_limit_is_respected_and_below_minimum_is_an_error():
    graph = mlp(512, 128, 512)
    mesh = _mesh((1, 4))
    with pytest.raises(ShardingInfeasibleError, match="memory limit") as err:
        solve_sharding(graph, mesh, CLUSTER, memory_limit_bytes=1e3)
    lowest = err.value.min_memory_bytes
    free = solve_sharding(graph, mesh, CLUSTER)
    assert lowest < free.cost.memory_bytes
    limit = (lowest + free.cost.memory_bytes) / 2
    plan = solve_sharding(graph, mesh, CLUSTER, memory_limit_bytes=limit)
    assert plan.cost.memory_bytes <= limit
    assert plan.objective >= free.objective
    assert solve_sharding(graph, mesh, CLUSTER, memory_limit_bytes=lowest * (1 + 1e-9)).cost.memory_bytes \
        == pytest.approx(lowest)


def test_stage_subset_and_cost_split_by_role():
    step, params, batch = av.models.gpt(num_layers=2, abstract=True)
    graph = av.trace(step, params, batch)
    nodes = [n.name for n in graph.nodes if n.layer == 1]
    plan = solve_sharding(graph, _mesh((1, 4)), CLUSTER, nodes=nodes)
    assert {name for name, _ in plan.strategies} == set(nodes)
    specs = plan.spec_map
    produced = {t for n in nodes for t in graph.node(n).outputs}
    read = {t for n in nodes for t in graph.node(n).inputs if graph.tensor(t).kind != "constant"}
    assert (read - produced) <= set(specs), "every input of the stage has a spec"
    assert {t for t in produced if t in graph.outputs} <= set(specs)
    c = plan.cost
    assert c.forward_s + c.backward_s + c.update_s == pytest.approx(plan.objective, rel=1e-9)
    assert c.total_s == pytest.approx(plan.objective, rel=1e-9)
    assert c.forward_s > 0 and c.backward_s > 0 and c.update_s > 0
    assert 0 < c.activation_bytes < c.memory_bytes


def test_facade_traces_and_builds_the_mesh():
    step, params, batch = av.models.gpt(num_layers=1, abstract=True)
    plan = av.solve_sharding(step, params, batch, mesh_shape=(2, 2))
    assert plan.mesh_shape == (2, 2) and plan.status == "optimal"
    assert set(plan.cost_breakdown) == {"compute_s", "communication_s", "resharding_s"}
    with pytest.raises(ValueError, match="needs 9 devices"):
        av.solve_sharding(step, params, batch, mesh_shape=(3, 3))


# ---- errors -------------------------------------------------------------------------------------


def test_non_dividing_pinned_spec_is_a_clear_error():
    graph = mlp(6, 8, 8)
    pins = av.Pins().with_partition_spec("batch.x", (("y",), ()))
    with pytest.raises(ValueError, match="not divisible by the 4 devices"):
        solve_sharding(graph, _mesh((1, 4)), CLUSTER, pins=pins)


def test_unknown_pins_are_clear_errors():
    graph = mlp(8, 8, 8)
    dot = next(n.name for n in graph.nodes if n.primitive == "dot_general")
    with pytest.raises(av.InfeasiblePinsError, match="choose one of"):
        solve_sharding(graph, _mesh((1, 4)), CLUSTER, pins=av.Pins().with_strategy(dot, "SS = SS x SS"))
    # The same error, from the same check, as av.solve gives for a pin that names nothing.
    with pytest.raises(av.InfeasiblePinsError, match="there is no operator 'n999_dot' in the graph"):
        solve_sharding(graph, _mesh((1, 4)), CLUSTER, pins=av.Pins().with_strategy("n999_dot", "RR = RR x RR"))
    with pytest.raises(av.InfeasiblePinsError, match="there is no tensor 'params.nope' in the graph"):
        solve_sharding(graph, _mesh((1, 4)), CLUSTER, pins=av.Pins().with_partition_spec("params.nope", ((), ())))


def test_conflicting_pins_name_the_culprits():
    graph = mlp(8, 8, 8)
    updated_w1 = graph.outputs[0]
    pins = (av.Pins().with_partition_spec("params.w1", ((), ("y",)))
            .with_partition_spec(updated_w1, (("y",), ()))
            .with_partition_spec("batch.x", (("y",), ())))
    with pytest.raises(ShardingInfeasibleError) as err:
        solve_sharding(graph, _mesh((1, 4)), CLUSTER, pins=pins)
    message = str(err.value)
    assert "params.w1" in message and updated_w1 in message
    assert "batch.x" not in message  # not part of the conflict


def test_time_limit_gives_a_marked_plan_not_an_optimum_claim():
    step, params, batch = av.models.gpt(num_layers=1, abstract=True)
    graph = av.trace(step, params, batch)
    mesh = _mesh((2, 2))
    best = solve_sharding(graph, mesh, CLUSTER)
    rushed = solve_sharding(graph, mesh, CLUSTER, time_limit_s=1e-3)
    assert rushed.status in ("time_limited", "heuristic")
    assert rushed.objective >= best.objective * (1 - 1e-9)


def test_gradient_sync_is_once_per_step_and_many_microbatches_favour_data_parallelism():
    """A weight's gradient is accumulated over the microbatches and reduced once: the ILP weighs
    B x (forward + backward) + the update, so the same layer goes from Megatron at B=1 to data parallel at B=64."""
    cluster = av.Cluster.a100_node(1)
    graph = mlp(1024, 1024, 4096)
    mesh = cluster.logical_mesh((1, 4), (1, 4))
    one = solve_sharding(graph, mesh, cluster, num_microbatches=1)
    many = solve_sharding(graph, mesh, cluster, num_microbatches=64)
    for plan, b in ((one, 1), (many, 64)):
        c = plan.cost
        assert plan.objective == pytest.approx(b * (c.forward_s + c.backward_s) + c.update_s, rel=1e-9)
    forward = [n for n in graph.nodes if n.primitive == "dot_general" and n.role == "forward"]
    specs = lambda plan, n: _operand_specs(graph, plan, n, mesh).in_specs  # noqa: E731
    assert all(specs(one, n)[1] != ((), ()) for n in forward)  # Megatron: weights split
    assert all(specs(many, n)[0][0] == ("y",) and specs(many, n)[1] == ((), ()) for n in forward)  # batch split
    # Each is optimal for its own count: the other's choice, pinned and priced at that count, is no cheaper.
    for plan, other, b in ((one, many, 1), (many, one, 64)):
        repriced = solve_sharding(graph, mesh, cluster, pins=_pinned_to(graph, other), num_microbatches=b)
        assert repriced.status == "pinned" and repriced.objective >= plan.objective * (1 - 1e-9)
    # Data parallel at B=64: the gradients' reductions are update time, not backward time.
    backward_sync = [n for n in graph.nodes if n.role == "backward" and n.primitive == "dot_general"
                     and _operand_specs(graph, many, n, mesh).collectives]
    assert backward_sync
    at_one = solve_sharding(graph, mesh, cluster, pins=_pinned_to(graph, many), num_microbatches=1)
    assert many.cost.backward_s < at_one.cost.backward_s
    assert many.cost.update_s > at_one.cost.update_s
    assert many.cost.backward_s + many.cost.update_s == pytest.approx(
        at_one.cost.backward_s + at_one.cost.update_s, rel=1e-9)
