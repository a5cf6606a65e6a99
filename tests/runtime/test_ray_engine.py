"""The Ray engine on two host actors of 4 virtual CPU devices each: numerics against `jax.jit`, the bytes
that cross the host boundary, and the errors a user gets when a host dies or a transfer never arrives."""

import subprocess

import jax
import numpy as np
import pytest

import alpaviz as av
from alpaviz.core.plan._manual_plan import data_parallel_specs, manual_plan
from alpaviz.core.plan._plan import Schedule
import ray

from alpaviz.core.runtime import StageError
from alpaviz.core.runtime._ray_engine import RemoteValue, actor_platform
from alpaviz.core.runtime._transport import check_transport

FAST_COMPILE = {"xla_backend_optimization_level": 0}
STEPS = 3
TWO_STAGES, FOUR_STAGES = "2 stages, 4x1 then 1x4", "4 stages, two per host"
INTERLEAVED_STAGES = "4 stages, interleaved: two chunks on each host's submesh"


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _model(name: str):
    if name == "gpt":
        return av.models.gpt(num_layers=4, hidden=32, seq_len=16, vocab=64, batch_size=8)
    return av.models.mlp((16, 32, 32, 32, 16), batch_size=16)


def _plan(graph, layout: str, schedule: str = "1f1b"):
    cluster = av.Cluster.ray(num_hosts=2, devices_per_host=4)
    specs = data_parallel_specs(graph)
    if layout == TWO_STAGES:  # stage 1 holds the batch whole on each device: tile-once matters
        return manual_plan(graph, cluster, stage_cuts=(2,), logical_meshes=[(4, 1), (1, 4)],
                           partition_specs=specs, schedule=Schedule(schedule, 2))
    if layout == INTERLEAVED_STAGES:  # stages 0 and 2 on host 0, 1 and 3 on host 1: every cut crosses
        return manual_plan(graph, cluster, stage_cuts=(1, 2, 3), logical_meshes=(4, 1), partition_specs=specs,
                           schedule=Schedule("interleaved-1f1b", 2, chunks=2))
    return manual_plan(graph, cluster, stage_cuts=(1, 2, 3), logical_meshes=(2, 1), devices_per_stage=2,
                       partition_specs=specs, schedule=Schedule(schedule, 4))


def _launch(model: str, layout: str, schedule: str = "1f1b", **options):
    """The model, its plan on two hosts, and the step built for the Ray engine (close it when done)."""
    step, params, batch = _model(model)
    plan = _plan(av.trace(step, params, batch), layout, schedule)
    parallel = av.parallelize(step, plan, engine="ray", example_args=(params, batch), compiler_options=FAST_COMPILE,
                              record_trace=True, **options)
    return step, params, batch, plan, parallel


def _run_against_jit(step, params, batch, parallel):
    ref = jax.jit(step, compiler_options=FAST_COMPILE)
    p_ref, p = params, params
    for _ in range(STEPS):
        p_ref, loss_ref = ref(p_ref, batch)
        p, loss = parallel(p, batch)
        assert all(isinstance(leaf, RemoteValue) for leaf in jax.tree.leaves(p))
        np.testing.assert_allclose(np.asarray(loss), float(loss_ref), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(parallel.fetch(p)), jax.tree.leaves(jax.device_get(p_ref))):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("model, layout, transport", [
    *[(m, layout, "xla") for m in ("gpt", "mlp") for layout in (TWO_STAGES, FOUR_STAGES)],
    ("gpt", TWO_STAGES, "object_store"), ("mlp", FOUR_STAGES, "object_store"),  # the fallback, both layouts
])
def test_stages_on_two_hosts_match_jit(local_ray, model, layout, transport):
    step, params, batch, plan, parallel = _launch(model, layout, transport=transport)
    try:
        hosts = [s.device_ids[0] // 4 for s in plan.stages]
        assert hosts == ([0, 1] if plan.num_stages == 2 else [0, 0, 1, 1])
        engine = parallel._engine
        assert ray.get([a.num_devices.remote() for a in engine.actors.values()]) == [4, 4]
        if transport == "xla":  # one JAX world; the transfer sockets listen on Ray's node address only
            node = ray.nodes()[0]["NodeManagerAddress"]
            assert [a.rsplit(":", 1)[0] for a in engine.listen] == [node, node] and node != "0.0.0.0"
        _run_against_jit(step, params, batch, parallel)
        trace = parallel.last_trace()
        assert trace.source == "measured" and transport in trace.hardware
        assert [e.kind for e in trace.events].count("forward") == plan.num_stages * plan.schedule.num_microbatches
        assert any(e.kind == "recv" for e in trace.events)
    finally:
        parallel.close()


@pytest.mark.slow
def test_zero_bubble_h1_on_two_hosts_matches_jit_and_runs_every_w(local_ray):
    step, params, batch, plan, parallel = _launch("gpt", FOUR_STAGES, schedule="zb-h1")
    try:
        _run_against_jit(step, params, batch, parallel)
        kinds = [e.kind for e in parallel.last_trace().events]
        # Stage 0's backward is all W (no stage waits on it); the other three run a B and a W per microbatch.
        assert kinds.count("weight_grad") == plan.num_stages * plan.schedule.num_microbatches
    finally:
        parallel.close()


@pytest.mark.slow
def test_interleaved_1f1b_on_two_hosts_matches_jit(local_ray):
    step, params, batch, plan, parallel = _launch("gpt", INTERLEAVED_STAGES)
    try:
        assert [s.device_ids[0] // 4 for s in plan.stages] == [0, 1, 0, 1]
        _run_against_jit(step, params, batch, parallel)
        trace = parallel.last_trace()
        assert trace.num_stages == 2 and {(e.stage, e.chunk) for e in trace.events if e.kind == "forward"} == {
            (d, c) for d in range(2) for c in range(2)}
    finally:
        parallel.close()


@pytest.mark.slow
def test_each_byte_crosses_the_host_boundary_once_and_the_receiver_completes_its_layout(local_ray):
    step, params, batch, _, direct = _launch("gpt", TWO_STAGES, ray_options={"tile_once": False})
    try:
        once, each = direct._engine.crossing_bytes(tile_once=True), direct._engine.crossing_bytes()
        # stage 1 holds the activations and their gradients whole on each of its 4 devices: sent directly,
        # every device's copy crosses; tile-once sends the tensor once and all-gathers it inside the host
        assert each == 4 * once > 0
        _run_against_jit(step, params, batch, direct)  # the direct path is also right, only dearer
    finally:
        direct.close()


@pytest.mark.slow
def test_a_host_actor_that_dies_gives_a_clear_error_and_the_params_are_untouched(local_ray):
    _, params, batch, _, parallel = _launch("mlp", TWO_STAGES)
    before = [np.array(leaf) for leaf in jax.tree.leaves(params)]
    parallel(params, batch)
    ray.kill(parallel._engine.actors[1])
    with pytest.raises(StageError, match=r"actor of host 1 \(stages \[1\]\) died during step 1.*untouched"):
        parallel(params, batch)
    for a, b in zip(before, jax.tree.leaves(params)):
        np.testing.assert_array_equal(a, np.asarray(b))
    with pytest.raises(StageError, match="build it again"):
        parallel(params, batch)


@pytest.mark.slow
def test_a_transfer_that_never_arrives_names_the_stage_pair_and_tensor(local_ray):
    _, params, batch, _, parallel = _launch("mlp", TWO_STAGES, ray_options={"transfer_timeout_s": 3})
    try:
        parallel(params, batch)  # a step that works: both hosts' transfer servers are up
        engine = parallel._engine
        c = engine.compiled
        send = next(ins for ins in c.order if ins.op == "send" and engine.host_of[ins.peer] != engine.host_of[ins.stage])
        transfer = engine.transfer(send.transfer_key, c.edge(send).tensors)
        receiver = engine.actors[engine.host_of[send.peer]]
        receiver.expect.remote(transfer)  # the receive is posted, but host 0 never sends
        with pytest.raises(ray.exceptions.RayTaskError, match=rf"transfer of {transfer.tensors[0]} from stage 0 "
                                                                 rf"to stage 1 .* did not complete within 3 s"):
            ray.get(receiver.recv.remote(send.transfer_key, transfer, None, False), timeout=60)
    finally:
        parallel.close()


def test_transport_names_and_nccl_without_a_gpu_are_clear_errors():
    with pytest.raises(ValueError, match="transport='nccl' needs"):
        check_transport("nccl")
    with pytest.raises(ValueError, match="unknown transport 'carrier pigeon'"):
        check_transport("carrier pigeon")
    step, params, batch = _model("mlp")
    graph = av.trace(step, params, batch)
    with pytest.raises(ValueError, match="unknown transport 'pigeon'"):
        av.parallelize(step, manual_plan(graph, av.Cluster.ray(2, 4)), engine="ray", transport="pigeon")


@pytest.mark.slow
def test_nccl_on_hosts_without_a_gpu_is_a_clear_error_naming_the_alternatives(local_ray):
    with pytest.raises(StageError, match=r"transport='nccl' needs cupy .* use transport='xla'"):
        _launch("mlp", TWO_STAGES, transport="nccl")


def _gpus() -> int:
    """CUDA GPUs on this machine (the driver's JAX runs on CPU in the tests; Ray hands GPUs to actors)."""
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in listed.splitlines() if line.startswith("GPU "))


def test_host_actors_run_on_the_gpus_they_ask_ray_for_and_on_cpus_otherwise():
    assert actor_platform(None) == actor_platform({"num_cpus": 2}) == "cpu"
    assert actor_platform({"num_gpus": 1}) == "gpu"  # the README's recipe
    assert actor_platform({"runtime_env": {"env_vars": {"JAX_PLATFORMS": "cuda"}}}) == "gpu"
    with pytest.raises(ValueError, match="JAX_PLATFORMS=cpu"):
        actor_platform({"num_gpus": 1, "runtime_env": {"env_vars": {"JAX_PLATFORMS": "cpu"}}})


@pytest.mark.gpu
@pytest.mark.skipif(_gpus() < 2, reason="two host actors of one GPU each need two CUDA GPUs")
@pytest.mark.parametrize("transport", ["xla", "nccl"])
def test_two_gpu_hosts_as_the_readme_launches_them_match_jit(local_ray, transport):
    if transport == "nccl":
        pytest.importorskip("cupy", reason="the nccl transport needs the optional gpu extra (cupy)")
    step, params, batch = _model("mlp")
    graph = av.trace(step, params, batch)
    plan = manual_plan(graph, av.Cluster.ray(num_hosts=2, devices_per_host=1), stage_cuts=(2,),
                       schedule=Schedule("1f1b", 2))
    gpu_actor = {"num_gpus": 1}  # the README's recipe: the actor runs JAX on the GPU Ray gives it
    parallel = av.parallelize(step, plan, engine="ray", transport=transport, example_args=(params, batch),
                              ray_options={"actor_options": gpu_actor})
    try:
        assert "GPU devices" in parallel._engine.hardware
        _run_against_jit(step, params, batch, parallel)
    finally:
        parallel.close()
