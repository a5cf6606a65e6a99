"""Users' own training steps (Flax linen and nnx, optax, Equinox, remat, dropout) plan and launch.

Each step is traced, planned freely and on every single-cut two-stage plan
of the 8 local devices, and run for 3 steps against `jax.jit(step)` on the
global batch.
"""

import jax
import jax.numpy as jnp
import optax
import pytest

import alpaviz as av
from alpaviz.core import Schedule
from alpaviz.core.graph import StepStructureError
from user_models import CASES, Case, relative_error, remat_mlp, run_jit, run_parallel

MICROBATCHES, LAYERS = 2, 4


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request):
    made = CASES[request.param]()
    return made, av.cluster_layers(av.trace(made.step, *made.args), LAYERS), run_jit(made)


def test_the_trace_finds_the_batch_and_the_update(case):
    made, graph, _ = case
    assert graph.batch_argnums and min(graph.batch_argnums) >= 1, graph.batch_note  # never the state
    roles = {n.role for n in graph.nodes}
    assert roles == {"forward", "backward", "update"}
    # Optimizer state (Adam's moments, a step counter) is read by the update only, never per microbatch.
    opt_state = {t for t in graph.inputs if "opt_state" in t}
    readers = {graph.node(c).role for t in opt_state for c in graph.consumers[t]}
    assert readers <= {"update"}, readers


def test_layers_follow_the_dataflow_so_every_cut_is_runnable(case):
    _, graph, _ = case
    producer = {t: n for n in graph.nodes for t in n.outputs}
    for node in graph.nodes:
        for t in node.inputs:
            p = producer.get(t)
            if p is None or p.role != node.role:
                continue
            if node.role == "forward":
                assert p.layer <= node.layer, (p.name, node.name)
            elif node.role == "backward":
                assert p.layer >= node.layer, (p.name, node.name)


def test_every_two_stage_cut_matches_jit(case):
    made, graph, expected = case
    assert graph.num_layers == LAYERS
    for cut in range(1, graph.num_layers):
        plan = av.manual_plan(graph, av.Cluster.local(), stage_cuts=(cut,), schedule=Schedule("1f1b", MICROBATCHES))
        assert relative_error(run_parallel(made, plan), expected) <= 1e-5, f"cut {cut}"


def test_the_solvers_plan_matches_jit(case):
    made, graph, expected = case
    plan = av.solve(made.step, *made.args, cluster=av.Cluster.local(), num_microbatches=MICROBATCHES,
                    num_layers=LAYERS, progress=False, global_batch_argnums=graph.batch_argnums)
    assert relative_error(run_parallel(made, plan), expected) <= 1e-5


def test_global_norm_clipping_runs_its_update_in_levels_across_stages():
    made = CASES["linen_lm"]()
    graph = av.cluster_layers(av.trace(made.step, *made.args), LAYERS)
    plan = av.manual_plan(graph, av.Cluster.local(), stage_cuts=(2,), schedule=Schedule("1f1b", MICROBATCHES))
    step = av.parallelize(made.step, plan, example_args=made.args)
    update_edges = [e for e in step.compiled.flow.edges if e.src_role.startswith("update")]
    assert step.compiled.flow.update_levels >= 2 and update_edges  # partial norms go one way, the scale back
    assert all(int(e.dst_role[6:] or 0) > int(e.src_role[6:] or 0) for e in update_edges)


def test_remat_recompute_is_priced_in_the_backward():
    plain = av.trace(remat_mlp(remat=False).step, *remat_mlp(remat=False).args).flops_by_role()
    remat = av.trace(remat_mlp().step, *remat_mlp().args).flops_by_role()
    assert remat["forward"] == pytest.approx(plain["forward"], rel=0.05)  # the tanh derivative moves to the backward
    assert remat["backward"] == pytest.approx(plain["backward"] + plain["forward"], rel=0.05)


def test_dropout_draws_the_masks_jit_draws():
    made = CASES["dropout_mlp"]()
    graph = av.trace(made.step, *made.args)
    plan = av.manual_plan(graph, av.Cluster.local(), stage_cuts=(), schedule=Schedule("1f1b", 4))
    step = av.parallelize(made.step, plan, example_args=made.args)
    assert step.compiled.generated  # the mask's bits, drawn once per step at the global batch
    assert relative_error(run_parallel(made, plan), run_jit(made)) <= 1e-5


# ---- outputs and losses ----------------------------------------------------------------------


def _regression(reduce):
    params = {"w": jnp.linspace(-1, 1, 12).reshape(4, 3)}
    x = jax.random.normal(jax.random.key(0), (8, 4))

    def train_step(params, x):
        def loss_fn(params):
            pred = x @ params["w"]
            return reduce((pred - 1.0) ** 2), pred

        (loss, pred), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads), loss, pred

    return Case("regression", train_step, (params, x), lambda args, outs: (outs[0], args[1]))


@pytest.mark.parametrize("reduce", [jnp.mean, jnp.sum], ids=["mean_loss", "sum_loss"])
def test_losses_gradients_and_per_example_outputs_match_jit(reduce):
    made = _regression(reduce)
    graph = av.trace(made.step, *made.args)
    plan = av.manual_plan(graph, av.Cluster.local(), schedule=Schedule("1f1b", 4))
    outs = run_parallel(made, plan)
    assert outs[0][2].shape == (8, 3)  # per-example predictions come back whole, in order
    assert relative_error(outs, run_jit(made)) <= 1e-5


def test_an_explicit_loss_reduction_overrides_the_guess():
    made = _regression(jnp.sum)
    plan = av.manual_plan(av.trace(made.step, *made.args), av.Cluster.local(), schedule=Schedule("1f1b", 4))
    summed = run_parallel(made, plan, loss_reduction="sum")
    averaged = run_parallel(made, plan, loss_reduction="mean")
    assert relative_error(summed, run_jit(made)) <= 1e-5
    assert float(averaged[0][1]) == pytest.approx(float(summed[0][1]) / 4)
    with pytest.raises(ValueError, match="loss_reduction must be"):
        av.parallelize(made.step, plan, loss_reduction="avg")


def test_the_batch_is_checked_on_every_call():
    made = _regression(jnp.mean)
    plan = av.manual_plan(av.trace(made.step, *made.args), av.Cluster.local(), schedule=Schedule("1f1b", 4))
    step = av.parallelize(made.step, plan)
    params, _, _ = step(*made.args)
    with pytest.raises(ValueError, match=r"argument 'x' is float32\[6, 4\].*float32\[8, 4\].*4 microbatches of 2"):
        step(params, made.args[1][:6])


# ---- what cannot be split, said at trace time ----------------------------------------------------


def test_an_update_that_reads_the_loss_is_refused_with_the_line():
    params, x = jnp.ones((4, 4)), jnp.ones((8, 4))

    def train_step(params, x):
        loss, grad = jax.value_and_grad(lambda p: jnp.mean((x @ p) ** 2))(params)
        return params - 0.1 * loss * grad, loss  # the update scales by this microbatch's loss

    with pytest.raises(StepStructureError, match=r"runs once per step.*reads .*forward value.*test_user_code\.py"):
        av.trace(train_step, params, x)


def test_the_batch_is_found_or_asked_for():
    made = CASES["linen_lm"]()
    graph = av.trace(made.step, *made.args)
    assert graph.batch_argnums == (2,) and "not returned updated" in graph.batch_note

    def two_candidates(params, a, b):  # two unreturned arguments with different leading dims
        return params - jnp.mean(a) - jnp.mean(b)

    graph = av.trace(two_candidates, jnp.ones(3), jnp.ones((4, 2)), jnp.ones((6, 2)))
    assert graph.batch_argnums == () and "pass batch_argnums" in graph.batch_note
    plan = av.manual_plan(graph, av.Cluster.local(), schedule=Schedule("1f1b", 2))
    with pytest.raises(ValueError, match="cannot split 'two_candidates' into 2 microbatches.*batch_argnums"):
        av.parallelize(two_candidates, plan, example_args=(jnp.ones(3), jnp.ones((4, 2)), jnp.ones((6, 2))))


def test_optax_adam_moments_are_update_operators():
    params = {"w": jnp.ones((4, 4))}
    tx = optax.adam(1e-3)

    def train_step(params, opt_state, x):
        grads = jax.grad(lambda p: jnp.mean(x @ p["w"]))(params)
        updates, opt_state = tx.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state

    graph = av.trace(train_step, params, tx.init(params), jnp.ones((8, 4)))
    muls = [n for n in graph.nodes if n.primitive == "mul" and n.role != "backward"]
    assert muls and all(n.role == "update" for n in muls)
