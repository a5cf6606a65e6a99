"""Plans on one host's own GPUs (the local engine) give `jax.jit`'s numbers.

Runs only where JAX sees a GPU: `JAX_PLATFORMS=cuda,cpu .venv/bin/python -m pytest -m gpu`
(the tests' conftest otherwise pins JAX to 8 virtual CPU devices).
"""

import jax
import numpy as np
import pytest

import alpaviz as av
from alpaviz.core.plan import Schedule
from alpaviz.core.plan._manual_plan import data_parallel_specs, manual_plan


def _gpus() -> list:
    try:
        return jax.devices("gpu")
    except RuntimeError:
        return []


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not _gpus() or jax.default_backend() != "gpu",
    reason="needs a CUDA GPU as JAX's default backend: JAX_PLATFORMS=cuda,cpu pytest -m gpu")]
STEPS = 3


def _check_against_jit(step, params, batch, plan):
    parallel = av.parallelize(step, plan)
    ours, theirs = params, params
    for _ in range(STEPS):
        ours, loss = parallel(ours, batch)
        theirs, want = jax.jit(step)(theirs, batch)
        np.testing.assert_allclose(float(loss), float(want), rtol=1e-4)
    for leaf in jax.tree.leaves(ours):
        assert {d.platform for d in leaf.sharding.device_set} == {"gpu"}
    for a, b in zip(jax.tree.leaves(parallel.fetch(ours)), jax.tree.leaves(theirs), strict=True):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        assert np.max(np.abs(a - b)) <= 1e-4 * (np.max(np.abs(b)) + 1e-12)


@pytest.mark.parametrize("microbatches", [1, 4])
def test_one_stage_on_all_local_gpus_matches_jit(microbatches):
    step, params, batch = av.models.gpt(num_layers=4, hidden=64, heads=4, seq_len=32, vocab=256,
                                        batch_size=8 * len(_gpus()))
    graph = av.trace(step, params, batch)
    assert av.Cluster.local().num_devices == len(_gpus())
    plan = manual_plan(graph, av.Cluster.local(), partition_specs=data_parallel_specs(graph),
                       schedule=Schedule("1f1b", microbatches))
    _check_against_jit(step, params, batch, plan)


@pytest.mark.skipif(len(_gpus()) < 2, reason="a two-stage pipeline needs two GPUs")
def test_a_two_stage_pipeline_on_local_gpus_matches_jit():
    step, params, batch = av.models.gpt(num_layers=4, hidden=64, heads=4, seq_len=32, vocab=256, batch_size=16)
    graph = av.trace(step, params, batch)
    half = len(_gpus()) // 2
    plan = manual_plan(graph, av.Cluster.local(), stage_cuts=(graph.num_layers // 2,), logical_meshes=(half, 1),
                       partition_specs=data_parallel_specs(graph), schedule=Schedule("1f1b", 4))
    _check_against_jit(step, params, batch, plan)
