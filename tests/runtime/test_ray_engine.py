import jax
import numpy as np
import pytest

import alpaviz as av
from alpaviz.core.runtime._cross_mesh import check_transport
from alpaviz.core.plan._manual_plan import data_parallel_specs, manual_plan
from alpaviz.core.plan._plan import Schedule
from alpaviz.core.runtime._ray_engine import RemoteValue

ray = pytest.importorskip("ray")

FAST_COMPILE = {"xla_backend_optimization_level": 0}


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.mark.slow
def test_two_stage_pipeline_across_two_ray_actors_matches_single_device(local_ray):
    step, params, batch = av.models.gpt(num_layers=2, hidden=32, seq_len=16, vocab=64)
    graph = av.trace(step, params, batch)
    cluster = av.Cluster.ray(num_hosts=2, devices_per_host=4)
    plan = manual_plan(graph, cluster, stage_cuts=(1,), logical_meshes=(4, 1),
                       partition_specs=data_parallel_specs(graph), schedule=Schedule("1f1b", 2))
    assert [s.device_ids for s in plan.stages] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    parallel = av.parallelize(step, plan, engine="ray", example_args=(params, batch),
                              compiler_options=FAST_COMPILE)
    try:
        actors = parallel._engine.actors
        assert len(actors) == 2
        assert ray.get([a.num_devices.remote() for a in actors.values()]) == [4, 4]
        ref = jax.jit(step, compiler_options=FAST_COMPILE)
        p_ref, p = params, params
        for _ in range(3):
            p_ref, loss_ref = ref(p_ref, batch)
            p, loss = parallel(p, batch)
            assert all(isinstance(leaf, RemoteValue) for leaf in jax.tree.leaves(p))
            np.testing.assert_allclose(np.asarray(loss), float(loss_ref), rtol=1e-5)
        got = jax.tree.leaves(parallel.fetch(p))
        for a, b in zip(got, jax.tree.leaves(jax.device_get(p_ref))):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        trace = parallel.last_trace()
        assert trace.source == "measured"
        assert [e.kind for e in trace.events].count("forward") == 2 * 2
        assert any(e.kind == "send" for e in trace.events)
    finally:
        parallel.close()


def test_nccl_transport_without_a_gpu_is_a_clear_error():
    with pytest.raises(ValueError, match="transport='nccl' needs"):
        check_transport("nccl")
    with pytest.raises(ValueError, match="unknown transport 'carrier pigeon'"):
        check_transport("carrier pigeon")
