"""Baselines under the planner's cost model: what they fix, and that the planner never loses."""

import jax
import jax.numpy as jnp
import pytest

import alpaviz as av
from alpaviz.core.inter_op._stage_cost import analytic_stage_cost
from alpaviz.core.inter_op._data_parallel import data_parallel_pins
from alpaviz.core.inter_op import StageProfileCache


@pytest.fixture(scope="module")
def gpt():
    step, params, batch = av.models.gpt(num_layers=4, hidden=512, heads=8, seq_len=128, vocab=1024,
                                        batch_size=16, abstract=True)
    return av.trace(step, params, batch)


CLUSTERS = {"1x8": av.Cluster.a100_node(1, 8), "2x4": av.Cluster.a100_node(2, 4)}


@pytest.mark.parametrize("name", list(CLUSTERS), ids=list(CLUSTERS))
def test_planner_never_loses_to_the_grid_or_data_parallel(gpt, name):
    cluster = CLUSTERS[name]
    cache = StageProfileCache()
    options = dict(cluster=cluster, num_microbatches=8, stage_cost=analytic_stage_cost, cache=cache, progress=False)
    plan = av.solve(gpt, **options)
    grid = av.baselines.megatron_grid(gpt, return_all=True, **options)
    assert len(grid) >= 4
    best_grid = min(p.predicted.step_time_s for _, p in grid)
    assert av.baselines.megatron_grid(gpt, **options).predicted.step_time_s == best_grid
    assert plan.predicted.step_time_s <= best_grid * (1 + 1e-9)
    dp = av.baselines.data_parallel(gpt, **options)
    assert plan.predicted.step_time_s <= dp.predicted.step_time_s * (1 + 1e-9)
    for label, p in grid:  # each grid plan is what its label says: uniform stages, equal (dp, tp) meshes
        dp_deg, tp_deg, pp = (int(part[2:]) for part in label.split(" x "))
        assert p.num_stages == pp
        assert {s.logical_mesh for s in p.stages} == {(dp_deg, tp_deg)}
        sizes = [s.layer_stop - s.layer_start for s in p.stages]
        assert max(sizes) - min(sizes) <= 1


def test_data_parallel_is_one_replicated_stage(gpt):
    cluster = av.Cluster.a100_node(1, 4)
    plan = av.baselines.data_parallel(gpt, cluster=cluster, stage_cost=analytic_stage_cost, progress=False)
    assert plan.num_stages == 1
    (stage,) = plan.stages
    assert stage.logical_mesh == (4, 1) and stage.device_ids == (0, 1, 2, 3)
    specs = stage.spec_map
    assert specs["batch.tokens"] == (("x",), ())
    assert all(not any(axes for axes in specs[t]) for t in specs if t.startswith("params"))
    # For the ILP, data parallelism is pinned: every parameter replicated, the batch split.
    dp_pins = data_parallel_pins(gpt, cluster)
    assert dp_pins.num_stages == 1 and dp_pins.submesh_map == {0: (1, 4)}
    assert all(not any(axes for axes in s) for t, s in dp_pins.partition_specs if t.startswith("params"))


def test_ablations_fix_what_they_claim(gpt):
    cluster = av.Cluster.a100_node(1, 4)
    options = dict(cluster=cluster, num_microbatches=4, stage_cost=analytic_stage_cost, progress=False)
    intra = av.baselines.intra_op_only(gpt, **options)
    assert intra.num_stages == 1 and intra.stages[0].submesh == (1, 4)
    inter = av.baselines.inter_op_only(gpt, **options)
    assert inter.num_stages == 4 and all(s.submesh == (1, 1) for s in inter.stages)
    full = av.solve(gpt, **options)
    assert full.predicted.step_time_s <= min(intra.predicted.step_time_s, inter.predicted.step_time_s) * (1 + 1e-9)
    with pytest.raises(ValueError):
        av.baselines.inter_op_only(gpt, cluster=av.Cluster.a100_node(1, 8), stage_cost=analytic_stage_cost,
                                   progress=False)


def test_data_parallel_that_does_not_fit_says_so():
    def loss(w, x):
        return jnp.mean(jnp.tanh(x @ w) ** 2)

    def step(w, x):
        value, grad = jax.value_and_grad(loss)(w, x)
        return w - 0.1 * grad, value

    graph = av.trace(step, jax.ShapeDtypeStruct((2048, 2048), jnp.float32), jax.ShapeDtypeStruct((64, 2048), jnp.float32))
    with pytest.raises(av.ModelTooLargeError, match="limit is 16.00 MiB"):
        av.baselines.data_parallel(graph, cluster=av.Cluster.a100_node(1, 4), memory_limit=16 * 2**20,
                                   stage_cost=analytic_stage_cost, progress=False)


def test_grid_plans_equal_the_dp_under_the_same_pins(gpt):
    cluster = av.Cluster.a100_node(1, 4)
    cache = StageProfileCache()
    options = dict(cluster=cluster, num_microbatches=4, stage_cost=analytic_stage_cost, cache=cache, progress=False)
    direct = dict(av.baselines.megatron_grid(gpt, return_all=True, **options))
    for label, pins in av.baselines.grid_pins(gpt, cluster):
        if label not in direct:
            continue
        pinned = av.solve(gpt, pins=pins, **options)
        assert pinned.predicted.step_time_s == pytest.approx(direct[label].predicted.step_time_s, rel=1e-12)
        assert pinned.stages == direct[label].stages


@pytest.mark.slow
@pytest.mark.parametrize("model", ["gpt", "wresnet"])
def test_planner_never_loses_to_data_parallel_under_the_ilp(model):
    if model == "gpt":
        step, params, batch = av.models.gpt(num_layers=2, hidden=64, vocab=128, batch_size=8, abstract=True)
    else:
        step, params, batch = av.models.wresnet(batch_size=8, abstract=True)
    graph = av.trace(step, params, batch)
    cache = StageProfileCache()
    options = dict(cluster=av.Cluster.a100_node(1, 2), num_microbatches=64, cache=cache, progress=False)
    plan = av.solve(graph, **options)
    dp = av.baselines.data_parallel(graph, **options)
    assert plan.predicted.step_time_s <= dp.predicted.step_time_s * (1 + 1e-9)


@pytest.mark.parametrize("stage_cost", ["ilp", "analytic"])
def test_the_breakdown_counts_per_microbatch_work_per_microbatch_and_sums_to_the_step(gpt, stage_cost):
    """Data parallel and a pipeline do the same FLOPs per device: their compute agrees, and the gradient
    all-reduce paid once per step is not booked against it."""
    options = dict(cluster=av.Cluster.a100_node(1, 8), num_microbatches=32, cache=StageProfileCache(),
                   progress=False, stage_cost=analytic_stage_cost if stage_cost == "analytic" else None)
    dp = av.baselines.data_parallel(gpt, **options)
    grid = dict(av.baselines.megatron_grid(gpt, return_all=True, **options))
    pipeline = grid["dp4 x tp1 x pp2"]
    for plan in (dp, pipeline):
        p = plan.predicted
        parts = p.compute_s + p.communication_s + p.resharding_s + p.cross_stage_s + p.bubble_s
        assert parts == pytest.approx(p.step_time_s, rel=1e-6)
    assert dp.predicted.compute_s == pytest.approx(pipeline.predicted.compute_s, rel=0.2)
    assert dp.predicted.compute_s > dp.predicted.communication_s  # hidden 512 on NVLink: compute-bound
