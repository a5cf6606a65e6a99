"""Applying a sharding plan: the sharded step matches one device, and XLA sees the plan's layouts."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import alpaviz as av
from alpaviz.core.intra_op._apply_sharding import shard_step
from alpaviz.core.intra_op._solve_sharding import solve_sharding

CLUSTER = av.Cluster.local()


def mlp_builder():
    def step(params, batch):
        def loss(p, b):
            h = jax.nn.relu(b["x"] @ p["w1"])
            return jnp.mean((h @ p["w2"] - b["y"]) ** 2)

        value, grads = jax.value_and_grad(loss)(params, batch)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value

    k = jax.random.split(jax.random.key(0), 4)
    params = {"w1": jax.random.normal(k[0], (32, 64)) / 6, "w2": jax.random.normal(k[1], (64, 32)) / 8}
    batch = {"x": jax.random.normal(k[2], (64, 32)), "y": jax.random.normal(k[3], (64, 32))}
    return step, params, batch


MODELS = {
    "mlp": mlp_builder,
    "gpt": lambda: av.models.gpt(num_layers=2, hidden=32, heads=2, seq_len=16, vocab=64),
    "moe": lambda: av.models.moe(num_layers=2, hidden=32, heads=2, seq_len=16, vocab=64, expert_group_size=32),
}
CASES = [
    pytest.param("mlp", (2, 4), id="mlp-2x4"),
    pytest.param("mlp", (8, 1), id="mlp-8x1"),
    pytest.param("gpt", (2, 4), id="gpt-2x4", marks=pytest.mark.slow),
    pytest.param("moe", (2, 4), id="moe-2x4", marks=pytest.mark.slow),
]


def _assert_close(got, want):
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        a, b = np.asarray(a), np.asarray(b)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(np.max(np.abs(b))))


@pytest.mark.parametrize("model, mesh_shape", CASES)
def test_sharded_step_matches_single_device(model, mesh_shape):
    step, params, batch = MODELS[model]()
    graph = av.trace(step, params, batch)
    mesh = CLUSTER.logical_mesh((1, 8), mesh_shape)
    plan = solve_sharding(graph, mesh, CLUSTER)
    sharded = shard_step(step, graph, plan)
    got = sharded(params, batch)
    want = jax.jit(step)(params, batch)
    _assert_close(got, want)
    # results come back in the plan's layouts
    new_params, _ = got
    for name, leaf in zip(graph.outputs, jax.tree.leaves(new_params)):
        assert leaf.sharding.spec == av.core.to_partition_spec(plan.spec_map[name]) or all(
            not axes for axes in plan.spec_map[name])


def test_intermediates_carry_the_plans_constraints():
    step, params, batch = mlp_builder()
    graph = av.trace(step, params, batch)
    mesh = CLUSTER.logical_mesh((1, 4), (1, 4))
    plan = solve_sharding(graph, mesh, CLUSTER)
    text = shard_step(step, graph, plan).lower(params, batch).as_text()
    constraints = len(re.findall(r"sdy\.sharding_constraint|mhlo\.sharding|custom_call @Sharding", text))
    intermediates = [t for t in plan.spec_map if t not in graph.inputs and graph.tensor(t).shape]
    assert constraints >= len(intermediates) > 0


def test_plan_needing_more_devices_than_present_is_a_clear_error():
    step, params, batch = mlp_builder()
    graph = av.trace(step, params, batch)
    plan = solve_sharding(graph, CLUSTER.logical_mesh((1, 4), (2, 2)), CLUSTER)
    with pytest.raises(ValueError, match="needs 4 devices but 2 are available"):
        shard_step(step, graph, plan, devices=jax.devices()[:2])


def test_plan_for_another_graph_is_rejected():
    step, params, batch = mlp_builder()
    graph = av.trace(step, params, batch)
    other = av.trace(lambda x: jnp.tanh(x) * 2, jnp.ones((8, 8)))
    plan = solve_sharding(other, CLUSTER.logical_mesh((1, 4), (1, 4)), CLUSTER)
    with pytest.raises(ValueError, match="no spec for"):
        shard_step(step, graph, plan)
