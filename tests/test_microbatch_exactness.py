"""Microbatching gives jax.jit's numbers for any loss users write, or refuses the step with the line.

Token-normalised and penalised losses, metrics dicts, batch statistics,
bf16 masters, keys made inside the step, static leaves: each against
`jax.jit` (or `eqx.filter_jit`) on the global batch.
"""

import jax
import jax.numpy as jnp
import pytest

import alpaviz as av
from alpaviz.core import Schedule
from alpaviz.core.graph import StepStructureError
from user_models import CASES, Case, batchnorm_cnn, bf16_mlp, relative_error, run_jit, run_parallel

LAYERS = 4


def _two_stage(made, num_microbatches, cut=2, **schedule):
    graph = av.cluster_layers(av.trace(made.step, *made.args), LAYERS)
    return av.manual_plan(graph, av.Cluster.local(), stage_cuts=(cut,),
                          schedule=Schedule("1f1b", num_microbatches, **schedule))


@pytest.mark.parametrize("name, num_microbatches", [
    *[(name, m) for name in ("masked_lm", "weight_decay_in_loss") for m in (1, 2, 4)],
    ("nnx_transformer", 4), ("equinox_whole_model", 4),
])
def test_token_normalised_and_penalised_losses_match_jit_at_every_count(name, num_microbatches):
    made = CASES[name]()
    assert relative_error(run_parallel(made, _two_stage(made, num_microbatches)), run_jit(made)) <= 1e-5


def test_the_token_count_is_taken_once_and_the_loss_tail_runs_once_per_step():
    made = CASES["masked_lm"]()
    step = av.parallelize(made.step, _two_stage(made, 4), example_args=made.args)
    graph = step.compiled.graph
    assert len(step.compiled.whole) >= 2  # sum(mask) for the loss, for the accuracy and the count
    tail = {n.primitive for n in graph.nodes if n.role == "update" and n.layer == graph.num_layers - 1}
    assert {"div", "exp"} <= tail  # loss = numerator / count and the perplexity, on the summed partials
    outs, expected = run_parallel(made, _two_stage(made, 4)), run_jit(made)
    for ours, theirs in zip(outs, expected):
        assert int(ours[1]["num_tokens"]) == int(theirs[1]["num_tokens"]) == 37
        assert int(ours[1]["num_correct"]) == int(theirs[1]["num_correct"])
        assert ours[1]["num_tokens"].dtype == jnp.int32
    assert int(outs[-1][0].step) == 3  # av.next_step_args advanced TrainState.create's Python-int step


def test_a_key_made_inside_the_step_draws_the_masks_jit_draws():
    params, x = {"w": jnp.linspace(-1, 1, 32).reshape(8, 4)}, jnp.linspace(0, 1, 64).reshape(8, 8)

    def train_step(params, x):
        def loss_fn(params):
            keep = jax.random.bernoulli(jax.random.key(0), 0.5, x.shape)  # made inside the step
            return jnp.mean((jnp.where(keep, x / 0.5, 0.0) @ params["w"]) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), loss

    made = Case("key_inside", train_step, (params, x), av.next_step_args)
    plan = av.manual_plan(av.trace(train_step, params, x), av.Cluster.local(), schedule=Schedule("1f1b", 4))
    assert relative_error(run_parallel(made, plan), run_jit(made)) <= 1e-5


def test_bf16_compute_with_fp32_masters_runs_to_bf16_precision():
    made = bf16_mlp()
    plan = av.manual_plan(av.trace(made.step, *made.args), av.Cluster.local(), schedule=Schedule("1f1b", 4))
    # Each microbatch rounds its weight gradients to bf16 once more than the global batch does (2^-8 = 0.4%).
    assert relative_error(run_parallel(made, plan), run_jit(made)) <= 3e-2
    single = av.manual_plan(av.trace(made.step, *made.args), av.Cluster.local(), schedule=Schedule("1f1b", 1))
    assert relative_error(run_parallel(made, single), run_jit(made)) <= 1e-5


def test_batchnorm_statistics_are_refused_with_the_module_or_kept_exact_or_per_microbatch_on_request():
    made = batchnorm_cnn()
    with pytest.raises(StepStructureError, match=r"BatchNorm_0.*BatchNorm's mean.*num_microbatches=1.*per_microbatch"):
        av.parallelize(made.step, _two_stage(made, 2), example_args=made.args)
    assert relative_error(run_parallel(made, _two_stage(made, 1)), run_jit(made)) <= 1e-5

    ghost = _two_stage(made, 2).with_batch_statistics("per_microbatch")
    assert "batch statistics per microbatch" in ghost.summary()
    assert av.Plan.from_json(ghost.to_json()).schedule.batch_statistics == "per_microbatch"
    _, metrics = av.parallelize(made.step, ghost).fetch(av.parallelize(made.step, ghost)(*made.args))
    state, batch = made.args
    halves = [jax.jit(made.step)(state, jax.tree.map(lambda x, k=k: x[4 * k:4 * k + 4], batch))[1]["loss"]
              for k in range(2)]
    assert float(metrics["loss"]) == pytest.approx(float(sum(halves)) / 2, rel=1e-5)  # each half its own stats


def _regression_step(loss_of_errors):
    params, x = jnp.linspace(-1, 1, 12).reshape(4, 3), jnp.linspace(0, 1, 32).reshape(8, 4)

    def train_step(params, x):
        loss, grad = jax.value_and_grad(lambda p: loss_of_errors(x @ p - 1.0))(params)
        return params - 0.1 * grad, loss

    return train_step, params, x


@pytest.mark.parametrize("loss, match", [
    (lambda e: jnp.sqrt(jnp.mean(e ** 2)), r"gradient needs the sum over the whole batch.*reads it.*not linear"),
    (lambda e: jnp.mean(jax.nn.log_softmax(e @ e.T)), r"pairs examples with each other"),
    (lambda e: jnp.max(jnp.sum(e, axis=1)), r"reduce_max.*only sums combine exactly"),
], ids=["rmse", "batch_by_batch_similarity", "max_over_the_batch"])
def test_steps_microbatching_cannot_keep_exact_are_refused_with_the_line(loss, match):
    train_step, params, x = _regression_step(loss)
    plan = av.manual_plan(av.trace(train_step, params, x), av.Cluster.local(), schedule=Schedule("1f1b", 2))
    with pytest.raises(StepStructureError, match=match) as refused:
        av.parallelize(train_step, plan, example_args=(params, x))
    assert "test_microbatch_exactness.py:" in str(refused.value)  # the user's line
    single = av.manual_plan(av.trace(train_step, params, x), av.Cluster.local(), schedule=Schedule("1f1b", 1))
    assert relative_error(av.parallelize(train_step, single)(params, x), jax.jit(train_step)(params, x)) <= 1e-5


def test_an_integer_metric_that_cannot_be_averaged_is_named_by_its_path():
    def train_step(params, batch):
        loss, grad = jax.value_and_grad(lambda p: jnp.mean((batch["x"] @ p) ** 2))(params)
        return params - 0.1 * grad, {"loss": loss, "num_positive": jnp.sum((batch["x"] @ params) > 0)}

    params, batch = jnp.ones((4, 2)), {"x": jnp.linspace(-1, 1, 32).reshape(8, 4)}
    plan = av.manual_plan(av.trace(train_step, params, batch), av.Cluster.local(), schedule=Schedule("1f1b", 2))
    outs = av.parallelize(train_step, plan)(params, batch)  # derived: an integer count adds up exactly
    assert int(outs[1]["num_positive"]) == int(jax.jit(train_step)(params, batch)[1]["num_positive"])
    with pytest.raises(ValueError, match=r"output \[1\]\['num_positive'\] \(int32\).*cannot be combined by mean"):
        av.parallelize(train_step, plan, loss_reduction="mean")(params, batch)


def test_a_whole_equinox_model_keeps_its_non_array_leaves_static_and_a_changed_one_is_refused():
    import equinox as eqx
    made = CASES["equinox_whole_model"]()
    graph = av.trace(made.step, *made.args)
    assert not any("activation" in t or "inference" in t for t in graph.inputs)  # not traced, as eqx.filter_jit
    step = av.parallelize(made.step, _two_stage(made, 2, cut=1))
    outs = step(*made.args)
    assert outs[0].mlp.activation is made.args[0].mlp.activation  # static leaves come back in place
    evaluating = eqx.nn.inference_mode(made.args[0])
    with pytest.raises(ValueError, match=r"static argument leaf \(not an array: bool False\) is now True"):
        step(evaluating, *made.args[1:])
