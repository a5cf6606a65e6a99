"""Gradients are reduced across the data-parallel devices once per step, as the plan prices them.

Counts the collectives in the compiled executables one step runs (each
per-microbatch executable counted once per microbatch) and checks the
numbers against `jax.jit` of the step on the global batch.
"""

import re

import jax
import numpy as np
import pytest

import alpaviz as av
from alpaviz.core.plan import Schedule
from alpaviz.core.plan._manual_plan import data_parallel_specs, manual_plan, megatron_specs
from alpaviz.core.plan._instructions import is_update

COLLECTIVE = re.compile(r"\b(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(-start)?\(")
ALL_REDUCE_SHAPE = re.compile(r"= (.+?) all-reduce(?:-start)?\(")
STEPS = 2


def _jit_steps(step, state, batch):
    out = []
    for _ in range(STEPS):
        state, loss = jax.jit(step)(state, batch)
        out.append((state, loss))
    return out


def _assert_matches_jit(parallel, state, batch, reference):
    for want_state, want_loss in reference:
        state, loss = parallel(state, batch)
        got = jax.tree.leaves(parallel.fetch((state, loss)))
        for a, b in zip(got, jax.tree.leaves((want_state, want_loss)), strict=True):
            a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)  # relative to the leaf's scale
            assert np.max(np.abs(a - b)) <= 1e-5 * (np.max(np.abs(b)) + 1e-12), np.max(np.abs(a - b))


def _collectives_per_step(parallel, m):
    """Collective ops one step runs: a per-microbatch executable's count once per microbatch."""
    total = 0
    for runner in parallel._engine.runners:
        for roles in runner._fns:
            runs = 1 if any(map(is_update, roles)) or m == 1 else m
            total += runs * len(COLLECTIVE.findall(runner.compiled_text(roles)))
    return total


def _per_microbatch_all_reduces(parallel):
    return [shape for runner in parallel._engine.runners for roles in runner._fns if not any(map(is_update, roles))
            for shape in ALL_REDUCE_SHAPE.findall(runner.compiled_text(roles))]


@pytest.fixture(scope="module")
def adam_mlp():
    step, state, batch = av.models.mlp((32, 64, 64, 32), batch_size=128, optimizer="adam", learning_rate=1e-3)
    return step, state, batch, av.trace(step, state, batch), _jit_steps(step, state, batch)


def test_data_parallel_gradient_collectives_do_not_grow_with_the_microbatch_count(adam_mlp):
    step, state, batch, graph, reference = adam_mlp
    counts = {}
    for m in (1, 4, 16):  # microbatches of 128, 32 and 8 examples on 8 devices
        plan = manual_plan(graph, av.Cluster.local(), partition_specs=data_parallel_specs(graph),
                           schedule=Schedule("1f1b", m))
        parallel = av.parallelize(step, plan)
        _assert_matches_jit(parallel, state, batch, reference)
        counts[m] = _collectives_per_step(parallel, m)
        if m > 1:  # the microbatches' executables keep their partial sums: no all-reduce at all
            assert _per_microbatch_all_reduces(parallel) == [], m
    assert counts[1] >= 1 and counts[16] == counts[4] <= counts[1] + 1, counts


def _tied_mlp(width=32, batch=128):
    """Three tanh layers whose last reuses the first layer's weight (as a tied embedding does).

    Plain SGD: the update is linear in the gradient, so the check reads the gradient sum itself
    (Adam's first step is `sign(g)` wherever |g| is near eps, which amplifies rounding).
    """
    keys = jax.random.split(jax.random.key(1), 4)
    params = {"w0": jax.random.normal(keys[0], (width, width)) / width**0.5,
              "w1": jax.random.normal(keys[1], (width, width)) / width**0.5}
    data = {"x": jax.random.normal(keys[2], (batch, width)), "y": jax.random.normal(keys[3], (batch, width))}

    def loss(params, batch):
        x = av.mark_layer(jax.numpy.tanh(batch["x"] @ params["w0"]))
        x = av.mark_layer(jax.numpy.tanh(x @ params["w1"]))
        return jax.numpy.mean((jax.numpy.tanh(x @ params["w0"].T) - batch["y"]) ** 2)

    return av.models.make_train_step(loss, "tied_mlp", "sgd", 0.1), params, data


def test_a_tied_weight_sums_its_gradient_across_stages_once_per_step():
    """Two data-parallel stages of 4 devices; the tied weight's gradient crosses from the last stage to the first."""
    step, state, batch = _tied_mlp()
    graph = av.trace(step, state, batch)
    reference = _jit_steps(step, state, batch)
    update_counts = {}
    for m in (4, 16):
        plan = manual_plan(graph, av.Cluster.local(), stage_cuts=(graph.num_layers - 1,), logical_meshes=(4, 1),
                           partition_specs=data_parallel_specs(graph), schedule=Schedule("1f1b", m))
        parallel = av.parallelize(step, plan)
        _assert_matches_jit(parallel, state, batch, reference)
        assert _per_microbatch_all_reduces(parallel) == [], m
        update_counts[m] = sum(len(COLLECTIVE.findall(r.compiled_text(roles))) for r in parallel._engine.runners
                               for roles in r._fns if any(map(is_update, roles)))
    assert update_counts[4] == update_counts[16] >= 2, update_counts  # one reduction per stage's gradients


def test_data_and_tensor_parallel_reduce_only_over_the_batch_axis():
    """A (2, 4) mesh: batch on x, Megatron weights on y; the y all-reduces stay, the x ones move to the update."""
    step, params, batch = av.models.gpt(num_layers=2, hidden=32, seq_len=16, vocab=64, batch_size=16)
    graph = av.trace(step, params, batch)
    reference = _jit_steps(step, params, batch)
    specs = {**data_parallel_specs(graph), **megatron_specs(graph)}
    counts = {}
    for m in (2, 4):
        plan = manual_plan(graph, av.Cluster.local(), logical_meshes=(2, 4), partition_specs=specs,
                           schedule=Schedule("1f1b", m))
        parallel = av.parallelize(step, plan)
        _assert_matches_jit(parallel, params, batch, reference)
        runner = parallel._engine.runners[0]
        assert runner.parts is not None and runner.parts.axes == ("x",)
        update = sum(len(COLLECTIVE.findall(runner.compiled_text(roles))) for roles in runner._fns
                     if any(map(is_update, roles)))
        counts[m] = update
    assert counts[2] == counts[4] >= 1, counts
