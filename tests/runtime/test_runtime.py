import dataclasses
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import alpaviz as av
from alpaviz.core.plan._manual_plan import data_parallel_specs, manual_plan, megatron_specs
from alpaviz.core.plan._plan import Schedule
from alpaviz.core.runtime._compile import SpecDroppedWarning
from alpaviz.core.runtime._parallelize import StageError, parallelize
from alpaviz.core.plan._instructions import build_instructions, max_live_microbatches
from alpaviz.core.plan._spec import make_spec

STEPS = 3
FAST_COMPILE = {"xla_backend_optimization_level": 0}


def mlp(num_layers: int = 4, width: int = 32, batch: int = 8, tie: bool = False):
    """A tanh MLP with a layer marker between layers, and its mean-squared-error SGD step.

    With `tie`, the last layer reuses the first layer's weight (like a tied embedding).
    """
    keys = jax.random.split(jax.random.key(0), num_layers + 2)
    num_weights = num_layers - 1 if tie else num_layers
    params = {
        "w": [jax.random.normal(keys[i], (width, width)) * width**-0.5 for i in range(num_weights)],
        "b": [jnp.zeros((width,)) for _ in range(num_layers)],
    }
    data = {"x": jax.random.normal(keys[-2], (batch, width)), "y": jax.random.normal(keys[-1], (batch, width))}

    def loss(params, batch):
        x = batch["x"]
        weights = params["w"] + [params["w"][0]] if tie else params["w"]
        for i, (w, b) in enumerate(zip(weights, params["b"])):
            x = jnp.tanh(x @ w + b)
            if i < num_layers - 1:
                x = av.mark_layer(x)
        return jnp.mean((x - batch["y"]) ** 2)

    return av.models.make_train_step(loss, "mlp", "sgd", 0.1), params, data


def mlp_megatron(graph):
    """Even layers split columns on "y", odd layers split rows: one all-reduce per pair."""
    specs = {}
    for name in graph.inputs:
        parts = name.split(".")
        if parts[1] == "w":
            specs[name] = make_spec(None, "y") if int(parts[2]) % 2 == 0 else make_spec("y", None)
        elif parts[1] == "b" and int(parts[2]) % 2 == 0:
            specs[name] = make_spec("y")
    return specs


MODELS = {
    "mlp": (mlp, mlp_megatron),
    "gpt": (lambda: av.models.gpt(num_layers=4, hidden=32, seq_len=16, vocab=64), megatron_specs),
    "moe": (lambda: av.models.moe(num_layers=4, hidden=32, seq_len=16, vocab=64, moe_every=2,
                                  expert_group_size=16), megatron_specs),  # a group per sequence
}


@pytest.fixture(scope="module", params=list(MODELS))
def model(request):
    """(name, train_step, params, batch, graph, tp specs, single-device results of 3 steps)."""
    build, tp_specs = MODELS[request.param]
    step, params, batch = build()
    graph = av.trace(step, params, batch)
    return request.param, step, params, batch, graph, tp_specs(graph), _single_device_steps(step, params, batch)


def _single_device_steps(step, params, batch):
    """(params, loss) after each of STEPS plain single-device steps: what every layout must reproduce."""
    device = jax.devices()[0]
    ref = jax.jit(step, compiler_options=FAST_COMPILE)
    p, batch = jax.device_put(params, device), jax.device_put(batch, device)
    reference = []
    for _ in range(STEPS):
        p, loss = ref(p, batch)
        reference.append((jax.device_get(p), float(loss)))
    return reference


def _assert_matches(parallel_step, params, batch, reference):
    p = params
    for i in range(STEPS):
        p, loss = parallel_step(p, batch)
        ref_params, ref_loss = reference[i]
        np.testing.assert_allclose(float(loss), ref_loss, rtol=1e-5)
        got = jax.tree.leaves(parallel_step.fetch(p))
        want = jax.tree.leaves(ref_params)
        assert len(got) == len(want)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    return p


LAYOUTS = {
    "data_parallel": dict(),
    "tensor_parallel": dict(logical_meshes=(1, 8)),
    "pipeline2": dict(stage_cuts=(2,), logical_meshes=(2, 2), schedule=Schedule("1f1b", 4)),
    "pipeline4": dict(stage_cuts=(1, 2, 3), logical_meshes=(2, 1), schedule=Schedule("1f1b", 4)),
}


def _specs(layout, graph, tp):
    if layout == "data_parallel":
        return data_parallel_specs(graph)
    if layout == "tensor_parallel":
        return tp
    if layout == "pipeline2":
        return {**data_parallel_specs(graph), **tp}
    return data_parallel_specs(graph)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_parallel_step_matches_single_device_over_three_steps(model, layout):
    name, step, params, batch, graph, tp, reference = model
    plan = manual_plan(graph, av.Cluster.local(), partition_specs=_specs(layout, graph, tp), **LAYOUTS[layout])
    parallel = parallelize(step, plan, compiler_options=FAST_COMPILE)
    final = _assert_matches(parallel, params, batch, reference)
    if plan.num_stages > 1:
        # The same compiled stages under the other schedule give the same numbers.
        _assert_matches(parallel.with_schedule("gpipe"), params, batch, reference)
    # Params stay sharded on the mesh of the stage that updates them.
    runners = parallel._engine.runners
    producer = parallel.compiled.flow.producer_map
    for out_name, leaf in zip(parallel.compiled.graph.outputs, jax.tree.leaves(final)):
        stage = producer[out_name][0]
        assert leaf.sharding == runners[stage].sharding(out_name)
        assert set(leaf.sharding.device_set) == {jax.devices()[d] for d in plan.stages[stage].device_ids}
    if layout == "tensor_parallel":
        # Megatron weights really are split 8 ways on the model axis, and stay so.
        flat = dict(zip(graph.inputs, jax.tree.leaves(final)))
        assert tp and all(n in flat for n in tp)
        for n in tp:
            assert np.prod(flat[n].addressable_shards[0].data.shape) * 8 == np.prod(flat[n].shape), n


@pytest.fixture(scope="module")
def tied_pipeline():
    """A 4-stage 1F1B pipeline of a tied-weight MLP (the tie sends a gradient from stage 3 to 0)."""
    step, params, batch = mlp(tie=True)
    graph = av.trace(step, params, batch)
    plan = manual_plan(graph, av.Cluster.local(), stage_cuts=(1, 2, 3), logical_meshes=(2, 1),
                       partition_specs=data_parallel_specs(graph), schedule=Schedule("1f1b", 4))
    parallel = parallelize(step, plan, record_trace=True, compiler_options=FAST_COMPILE)
    parallel(params, batch)
    return step, params, batch, graph, plan, parallel


def test_instruction_lists_are_the_schedule_and_bound_activation_memory(tied_pipeline):
    *_, plan, parallel = tied_pipeline
    lists = parallel.instructions
    assert len(lists) == 4
    runs = [[(i.role, i.microbatch) for i in lst if i.op == "run"] for lst in lists]
    plain = [[(i.role, i.microbatch) for i in lst if i.op == "run"] for lst in build_instructions("1f1b", 4, 4)]
    # The forward/backward order is plain 1F1B; the update runs after it, in levels where it waits for another's.
    for got, want in zip(runs, plain):
        assert [r for r in got if not r[0].startswith("update")] == [r for r in want if r[0] != "update"]
    for i, lst in enumerate(lists):
        assert max_live_microbatches(lst) <= plan.num_stages - i
    gpipe = parallel.with_schedule("gpipe")
    assert all(max_live_microbatches(lst) == 4 for lst in gpipe.instructions)
    # The tied weight's gradient travels from the last stage to the first once per step, into the update.
    tie_sends = [i for i in lists[3] if i.op == "send" and i.peer == 0]
    assert len(tie_sends) == 1 and tie_sends[0].peer_role.startswith("update")


def test_measured_trace_records_every_instruction(tied_pipeline):
    step, params, batch, graph, plan, parallel = tied_pipeline
    parallel(params, batch)
    trace = parallel.last_trace()
    assert trace.source == "measured" and trace.num_stages == 4 and trace.num_microbatches == 4
    kinds = [e.kind for e in trace.events]
    assert kinds.count("forward") == kinds.count("backward") == 16
    # Every update level each stage runs (the tied gradient's sum waits for the last stage's update).
    assert kinds.count("update") == sum(1 for lst in parallel.instructions for i in lst
                                        if i.op == "run" and i.role.startswith("update")) >= 4
    n_runs = sum(1 for lst in parallel.instructions for i in lst if i.op == "run")
    n_transfers = sum(1 for lst in parallel.instructions for i in lst if i.op in ("send", "recv"))
    assert len(trace.events) == n_runs + n_transfers
    for s in range(4):
        mine = [e for e in trace.events if e.stage == s]
        assert all(e.end_s >= e.start_s >= 0 for e in mine)
        assert all(a.end_s <= b.start_s + 1e-9 for a, b in zip(mine, mine[1:]))  # one driver, in order
    chrome = json.loads(trace.to_chrome_trace())
    assert sum(1 for e in chrome["traceEvents"] if e["ph"] == "X") == len(trace.events)


def test_user_inputs_are_never_donated_or_mutated(tied_pipeline):
    step, params, batch, graph, plan, parallel = tied_pipeline
    before = jax.device_get(params)
    out1, _ = parallel(params, batch)
    kept = jax.device_get(out1)
    out2, _ = parallel(out1, batch)  # already-sharded inputs: still not donated
    for leaf in jax.tree.leaves(params) + jax.tree.leaves(out1):
        assert not leaf.is_deleted()
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(jax.device_get(params))):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(jax.tree.leaves(kept), jax.tree.leaves(jax.device_get(out1))):
        np.testing.assert_array_equal(a, b)


def test_donate_true_reuses_the_old_param_buffers():
    step, params, batch = mlp()
    graph = av.trace(step, params, batch)
    plan = manual_plan(graph, av.Cluster.local(), partition_specs=data_parallel_specs(graph))
    parallel = parallelize(step, plan, donate=True, compiler_options=FAST_COMPILE)
    out1, _ = parallel(params, batch)
    out2, _ = parallel(out1, batch)
    assert all(leaf.is_deleted() for leaf in jax.tree.leaves(out1))
    assert not any(leaf.is_deleted() for leaf in jax.tree.leaves(out2))


def test_batch_not_divisible_by_microbatches_is_a_clear_error():
    step, params, batch = mlp(batch=6)
    graph = av.trace(step, params, batch)
    plan = manual_plan(graph, av.Cluster.local(), stage_cuts=(2,), schedule=Schedule("gpipe", 4))
    with pytest.raises(ValueError, match=r"shape \(6, 32\) cannot be split into 4 microbatches"):
        parallelize(step, plan)(params, batch)


def test_a_plan_for_another_graph_is_refused():
    step, params, batch = mlp()
    other_step, other_params, other_batch = mlp(num_layers=3)
    plan = manual_plan(av.trace(other_step, other_params, other_batch), av.Cluster.local())
    with pytest.raises(ValueError, match="different operator graph"):
        parallelize(step, plan)(params, batch)


def test_a_spec_for_the_full_batch_that_a_microbatch_cannot_take_is_dropped_with_a_warning():
    step, params, batch = mlp()
    graph = av.trace(step, params, batch)
    plan = manual_plan(graph, av.Cluster.local(), stage_cuts=(2,), logical_meshes=(4, 1),
                       partition_specs=data_parallel_specs(graph), schedule=Schedule("1f1b", 4))
    with pytest.warns(SpecDroppedWarning, match=r"stage 0 \(mesh 4x1\): batch\.x \(2, 32\)"):
        parallel = parallelize(step, plan, example_args=(params, batch), compiler_options=FAST_COMPILE)
    assert "batch.x" not in parallel._engine.runners[0].specs
    ref_params, ref_loss = jax.jit(step)(params, batch)
    new_params, loss = parallel(params, batch)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)


def test_a_spec_that_fits_no_shape_names_the_stage_and_mesh():
    step, params, batch = mlp(width=6)
    graph = av.trace(step, params, batch)
    plan = manual_plan(graph, av.Cluster.local(), stage_cuts=(2,), logical_meshes=(4, 1),
                       schedule=Schedule("1f1b", 2))
    bad = dataclasses.replace(plan.stages[1], partition_specs=(("params.w.3", make_spec("x", None)),))
    plan = dataclasses.replace(plan, stages=(plan.stages[0], bad))
    with pytest.raises(ValueError, match=r"stages\[1\].*params\.w\.3.*not divisible.*mesh \(4, 1\)"):
        parallelize(step, plan)(params, batch)


def _host_failure(x):
    raise RuntimeError("host callback failed")


def test_a_stage_that_fails_to_run_names_the_stage_and_mesh():
    def loss(params, batch):
        x = av.mark_layer(batch["x"] @ params["w0"])
        side = jax.pure_callback(_host_failure, jax.ShapeDtypeStruct(x.shape, x.dtype), jax.lax.stop_gradient(x))
        return jnp.mean((x + 0.0 * side) @ params["w1"])

    step = av.models.make_train_step(loss, "fails")
    params = {"w0": jnp.ones((4, 4)), "w1": jnp.ones((4, 4))}
    batch = {"x": jnp.ones((8, 4))}
    graph = av.trace(step, params, batch)
    plan = manual_plan(graph, av.Cluster.local(), stage_cuts=(1,), devices_per_stage=1, logical_meshes=(1, 1),
                       schedule=Schedule("1f1b", 2))
    with pytest.raises(StageError, match=r"stage 1 \(mesh 1x1 on devices \[1\]\), forward"):
        parallelize(step, plan)(params, batch)


@pytest.mark.parametrize("layout", ["data_parallel", "pipeline2"])
def test_steps_are_untimed_by_default_and_record_trace_n_times_every_nth(layout):
    step, params, batch = mlp()
    graph = av.trace(step, params, batch)
    reference = _single_device_steps(step, params, batch)
    plan = manual_plan(graph, av.Cluster.local(), partition_specs=_specs(layout, graph, mlp_megatron(graph)),
                       **LAYOUTS[layout])
    untimed = parallelize(step, plan, compiler_options=FAST_COMPILE)
    _assert_matches(untimed, params, batch, reference)
    # Untimed steps run back-to-back tasks as one executable.
    fused = {roles for runner in untimed._engine.runners for roles in runner._fns}
    expected = {("forward", "backward", "update")} if layout == "data_parallel" else {("forward", "backward")}
    assert expected <= fused
    with pytest.raises(ValueError, match="no step has been timed yet: record_trace=True"):
        untimed.last_trace()
    sampled = parallelize(step, plan, record_trace=2, compiler_options=FAST_COMPILE)
    p, traces = params, []
    for i in range(STEPS):  # steps 1 and 3 untimed, step 2 timed; all three match
        p, loss = sampled(p, batch)
        np.testing.assert_allclose(float(loss), reference[i][1], rtol=1e-5)
        try:
            traces.append(sampled.last_trace())
        except ValueError:
            traces.append(None)
    assert traces[0] is None and traces[1] is not None and traces[2] is traces[1]
    runs = sum(1 for lst in sampled.instructions for i in lst if i.op == "run")
    assert sum(1 for e in traces[1].events if e.kind in ("forward", "backward", "update")) == runs
    with pytest.raises(ValueError, match="record_trace must be False, True or a step interval"):
        parallelize(step, plan, record_trace=0)


COLLECTIVE = re.compile(r"\b(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(-start)?\(")


def test_compiled_stages_hold_the_collectives_of_their_parallelism():
    step, params, batch = mlp()
    graph = av.trace(step, params, batch)
    dp = parallelize(step, manual_plan(graph, av.Cluster.local(), partition_specs=data_parallel_specs(graph)),
                     record_trace=True, compiler_options=FAST_COMPILE)  # timed: each task its own executable
    dp(params, batch)
    runner = dp._engine.runners[0]
    # Data parallel: the forward only all-reduces the scalar loss; the backward all-reduces gradients.
    forward = runner.compiled_text("forward")
    shapes = re.findall(r"= (.+?) all-reduce(?:-start)?\(", forward)
    assert shapes and set(shapes) == {"f32[]"} and len(COLLECTIVE.findall(forward)) == len(shapes)
    backward = re.findall(r"= (.+?) all-reduce(?:-start)?\(", runner.compiled_text("backward"))
    assert any("f32[32,32]" in shape for shape in backward)  # weight-sized gradients
    tp = parallelize(step, manual_plan(graph, av.Cluster.local(), logical_meshes=(1, 8),
                                       partition_specs=mlp_megatron(graph)), record_trace=True,
                     compiler_options=FAST_COMPILE)
    tp(params, batch)
    # Megatron pairs (column split, then row split): one all-reduce per pair of layers forward.
    forward = [m[0] for m in COLLECTIVE.findall(tp._engine.runners[0].compiled_text("forward"))]
    assert forward.count("all-reduce") >= 2
