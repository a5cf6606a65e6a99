"""Training steps written the way users of Flax, optax and Equinox write them (not with our zoo).

Each builder returns a `Case`: the step, its arguments at the global batch,
and how the step's outputs become the next call's arguments.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from flax.training import train_state

import alpaviz as av

VOCAB, WIDTH, SEQ, BATCH = 64, 32, 8, 8
STEPS = 3  # steps each comparison with jax.jit runs


@dataclasses.dataclass
class Case:
    name: str
    step: Callable[..., Any]
    args: tuple[Any, ...]
    next_args: Callable[[tuple[Any, ...], Any], tuple[Any, ...]]


def _state_then_batch(num_state: int) -> Callable[[tuple, Any], tuple]:
    """Outputs (state..., loss) feed the next call's leading state arguments."""
    return lambda args, outs: (*outs[:num_state], *args[num_state:])


def _tokens(seed: int = 0) -> dict[str, jax.Array]:
    k1, k2 = jax.random.split(jax.random.key(seed))
    return {"x": jax.random.randint(k1, (BATCH, SEQ), 0, VOCAB), "y": jax.random.randint(k2, (BATCH, SEQ), 0, VOCAB)}


def lm_recipe() -> optax.GradientTransformation:
    """The optimizer of nearly every LM recipe: clip by global norm, then AdamW."""
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-2, weight_decay=0.1))


# ---- Flax linen: nn.Embed, LayerNorm, Dense --------------------------------------------------


class _Block(nn.Module):
    width: int

    @nn.compact
    def __call__(self, x):
        h = nn.Dense(2 * self.width)(nn.LayerNorm()(x))
        return x + nn.Dense(self.width)(nn.gelu(h))


class LinenLM(nn.Module):
    blocks: int = 3

    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(VOCAB, WIDTH)(tokens)
        for _ in range(self.blocks):
            x = _Block(WIDTH)(x)
        return nn.Dense(VOCAB)(nn.LayerNorm()(x))


def linen_lm() -> Case:
    model, tx, batch = LinenLM(), lm_recipe(), _tokens()
    params = model.init(jax.random.key(1), batch["x"])
    opt_state = tx.init(params)

    def train_step(params, opt_state, batch):
        def loss_fn(params):
            logits = model.apply(params, batch["x"])
            return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return Case("linen_lm", train_step, (params, opt_state, batch), _state_then_batch(2))


# ---- Flax nnx: nnx.Embed, split/merge inside a functional step --------------------------------


class NnxLM(nnx.Module):
    def __init__(self, rngs: nnx.Rngs, blocks: int = 2):
        self.embed = nnx.Embed(VOCAB, WIDTH, rngs=rngs)
        self.blocks = nnx.List([nnx.Linear(WIDTH, WIDTH, rngs=rngs) for _ in range(blocks)])
        self.norm = nnx.LayerNorm(WIDTH, rngs=rngs)
        self.head = nnx.Linear(WIDTH, VOCAB, rngs=rngs)

    def __call__(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = x + jax.nn.relu(block(x))
        return self.head(self.norm(x))


def nnx_lm() -> Case:
    graphdef, state = nnx.split(NnxLM(nnx.Rngs(2)))
    tx = lm_recipe()
    opt_state = tx.init(state)

    def train_step(state, opt_state, batch):
        def loss_fn(state):
            logits = nnx.merge(graphdef, state)(batch["x"])
            return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()

        loss, grads = jax.value_and_grad(loss_fn)(state)
        updates, opt_state = tx.update(grads, opt_state, state)
        return optax.apply_updates(state, updates), opt_state, loss

    return Case("nnx_lm", train_step, (state, opt_state, _tokens(3)), _state_then_batch(2))


# ---- Equinox: a small CNN trained with filter_value_and_grad ----------------------------------


class CNN(eqx.Module):
    conv1: eqx.nn.Conv2d
    conv2: eqx.nn.Conv2d
    head: eqx.nn.Linear

    def __init__(self, key):
        k1, k2, k3 = jax.random.split(key, 3)
        self.conv1 = eqx.nn.Conv2d(1, 4, 3, padding=1, key=k1)
        self.conv2 = eqx.nn.Conv2d(4, 4, 3, padding=1, key=k2)
        self.head = eqx.nn.Linear(4 * 8 * 8, 10, key=k3)

    def __call__(self, x):
        x = jax.nn.relu(self.conv1(x))
        x = jax.nn.relu(self.conv2(x))
        return self.head(x.reshape(-1))


def equinox_cnn() -> Case:
    params, static = eqx.partition(CNN(jax.random.key(4)), eqx.is_array)
    tx = optax.adam(1e-2)
    opt_state = tx.init(params)
    kx, ky = jax.random.split(jax.random.key(5))
    images, labels = jax.random.normal(kx, (BATCH, 1, 8, 8)), jax.random.randint(ky, (BATCH,), 0, 10)

    def train_step(params, opt_state, images, labels):
        @eqx.filter_value_and_grad
        def loss_fn(params):
            logits = jax.vmap(eqx.combine(params, static))(images)
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

        loss, grads = loss_fn(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return eqx.apply_updates(params, updates), opt_state, loss

    return Case("equinox_cnn", train_step, (params, opt_state, images, labels), _state_then_batch(2))


class DropoutMLP(eqx.Module):
    mlp: eqx.nn.MLP  # its activation functions are pytree leaves that are not arrays
    dropout: eqx.nn.Dropout  # so is its `inference` flag

    def __init__(self, key):
        self.mlp = eqx.nn.MLP(16, 4, WIDTH, 3, key=key)
        self.dropout = eqx.nn.Dropout(0.1)

    def __call__(self, x, key):
        return self.mlp(self.dropout(x, key=key))


def equinox_whole_model() -> Case:
    """The whole module is the step's argument and result, as `eqx.filter_jit` users write it."""
    model, tx = DropoutMLP(jax.random.key(14)), optax.sgd(0.1, momentum=0.9)
    opt_state = tx.init(eqx.filter(model, eqx.is_array))
    kx, ky = jax.random.split(jax.random.key(15))
    batch = {"x": jax.random.normal(kx, (BATCH, 16)), "y": jax.random.normal(ky, (BATCH, 4))}

    def train_step(model, opt_state, key, batch):
        key, draw = jax.random.split(key)

        @eqx.filter_value_and_grad
        def loss_fn(model):
            pred = jax.vmap(model)(batch["x"], jax.random.split(draw, len(batch["x"])))  # a key per example
            return jnp.mean((pred - batch["y"]) ** 2)

        loss, grads = loss_fn(model)
        updates, opt_state = tx.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), opt_state, key, loss

    return Case("equinox_whole_model", train_step, (model, opt_state, jax.random.key(16), batch), av.next_step_args)


# ---- plain JAX with jax.checkpoint on every layer ---------------------------------------------


def remat_mlp(remat: bool = True) -> Case:
    keys = jax.random.split(jax.random.key(6), 5)
    params = [{"w": jax.random.normal(k, (WIDTH, WIDTH)) / WIDTH ** 0.5, "b": jnp.zeros(WIDTH)} for k in keys[:4]]
    tx = optax.adam(1e-2)
    opt_state = tx.init(params)
    x, y = jax.random.normal(keys[4], (BATCH, WIDTH)), jnp.ones((BATCH, WIDTH))

    def layer(p, h):
        return jnp.tanh(h @ p["w"] + p["b"])

    layer = jax.checkpoint(layer) if remat else layer

    def train_step(params, opt_state, x, y):
        def loss_fn(params):
            h = x
            for p in params:
                h = layer(p, h)
            return jnp.mean((h - y) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return Case("remat_mlp", train_step, (params, opt_state, x, y), _state_then_batch(2))


# ---- dropout from a key the step threads --------------------------------------------------------


def dropout_mlp() -> Case:
    k1, k2, k3 = jax.random.split(jax.random.key(7), 3)
    params = {"w1": jax.random.normal(k1, (WIDTH, 2 * WIDTH)) / WIDTH ** 0.5,
              "w2": jax.random.normal(k2, (2 * WIDTH, WIDTH)) / WIDTH ** 0.5}
    tx = optax.sgd(0.1)
    opt_state = tx.init(params)
    x = jax.random.normal(k3, (BATCH, WIDTH))

    def train_step(params, opt_state, x, key):
        key, drop = jax.random.split(key)

        def loss_fn(params):
            h = jax.nn.relu(x @ params["w1"])
            keep = jax.random.bernoulli(drop, 0.8, h.shape)
            h = jnp.where(keep, h / 0.8, 0.0)
            return jnp.mean((h @ params["w2"] - x) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, key

    def next_args(args, outs):
        return (outs[0], outs[1], args[2], outs[3])

    return Case("dropout_mlp", train_step, (params, opt_state, x, jax.random.key(8)), next_args)


# ---- a padded LM batch, a token-normalised loss and a metrics dict, in a Flax TrainState -----------


def _padded_tokens(seed: int) -> dict[str, jax.Array]:
    lengths = jnp.array([8, 3, 5, 1, 8, 2, 6, 4])[:BATCH]
    return {**_tokens(seed), "mask": (jnp.arange(SEQ)[None, :] < lengths[:, None]).astype(jnp.float32)}


def masked_lm() -> Case:
    """`sum(ce * mask) / sum(mask)`, as t5x, MaxText and the Flax examples write an LM loss.

    SGD with momentum, not Adam: the gradients match jax.jit's to the float floor of summing microbatches
    (4e-7), and Adam's g / (|g| + eps) turns that into 1e-4 on weights whose gradient is near eps.
    """
    model, batch = LinenLM(blocks=2), _padded_tokens(4)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.1, momentum=0.9))
    state = train_state.TrainState.create(apply_fn=model.apply, params=model.init(jax.random.key(5), batch["x"]),
                                          tx=tx)

    def train_step(state, batch):
        def loss_fn(params):
            logits = state.apply_fn(params, batch["x"])
            ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"])
            return jnp.sum(ce * batch["mask"]) / jnp.sum(batch["mask"]), logits

        (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        correct = (jnp.argmax(logits, -1) == batch["y"]) * batch["mask"]
        metrics = {
            "loss": loss,
            "accuracy": jnp.sum(correct) / jnp.sum(batch["mask"]),
            "num_tokens": jnp.sum(batch["mask"].astype(jnp.int32)),
            "num_correct": jnp.sum(correct.astype(jnp.int32)),
            "perplexity": jnp.exp(loss),
            "grad_norm": optax.global_norm(grads),
        }
        return state.apply_gradients(grads=grads), metrics

    return Case("masked_lm", train_step, (state, batch), av.next_step_args)


def weight_decay_in_loss() -> Case:
    """A mean loss plus an L2 penalty on the weights: the penalty counts once per step, not per microbatch."""
    model, batch, tx = LinenLM(blocks=2), _tokens(6), optax.sgd(0.1, momentum=0.9)
    params = model.init(jax.random.key(7), batch["x"])

    def train_step(params, opt_state, batch):
        def loss_fn(params):
            ce = optax.softmax_cross_entropy_with_integer_labels(model.apply(params, batch["x"]), batch["y"])
            return ce.mean() + 1e-2 * sum(jnp.sum(w ** 2) for w in jax.tree.leaves(params))

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return Case("weight_decay_in_loss", train_step, (params, tx.init(params), batch), av.next_step_args)


# ---- bf16 compute with fp32 master weights ----------------------------------------------------------


def bf16_mlp() -> Case:
    """Masters in fp32, cast to bf16 inside the loss, as most accelerator training does."""
    k = jax.random.split(jax.random.key(8), 4)
    params = {"w1": jax.random.normal(k[0], (16, 32)) * 0.3, "w2": jax.random.normal(k[1], (32, 32)) * 0.2,
              "w3": jax.random.normal(k[2], (32, 4)) * 0.2}
    batch = {"x": jax.random.normal(k[3], (BATCH, 16)), "y": jnp.linspace(-1, 1, BATCH * 4).reshape(BATCH, 4)}
    tx = optax.sgd(0.1, momentum=0.9)

    def train_step(params, opt_state, batch):
        def loss_fn(params):
            p = jax.tree.map(lambda w: w.astype(jnp.bfloat16), params)
            h = jax.nn.relu(batch["x"].astype(jnp.bfloat16) @ p["w1"])
            h = jax.nn.relu(h @ p["w2"])
            return jnp.mean(((h @ p["w3"]).astype(jnp.float32) - batch["y"]) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return Case("bf16_mlp", train_step, (params, tx.init(params), batch), av.next_step_args)


# ---- Flax linen BatchNorm in a TrainState subclass ----------------------------------------------


class BatchNormCNN(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool):
        for width in (8, 8):
            # No conv bias, as ResNets write it: BatchNorm removes any shift, so a bias's gradient is
            # float noise (1e-9) that no relative comparison can hold to.
            x = nn.relu(nn.BatchNorm(use_running_average=not train)(nn.Conv(width, (3, 3), use_bias=False)(x)))
        return nn.Dense(10)(x.mean(axis=(1, 2)))


class BatchNormState(train_state.TrainState):
    batch_stats: Any


def batchnorm_cnn() -> Case:
    model = BatchNormCNN()
    k1, k2 = jax.random.split(jax.random.key(9))
    batch = {"image": jax.random.normal(k1, (BATCH, 8, 8, 3)), "label": jax.random.randint(k2, (BATCH,), 0, 10)}
    variables = model.init(jax.random.key(10), batch["image"], train=False)
    state = BatchNormState.create(apply_fn=model.apply, params=variables["params"],
                                  batch_stats=variables["batch_stats"], tx=optax.sgd(0.1, momentum=0.9))

    def train_step(state, batch):
        def loss_fn(params):
            logits, updates = state.apply_fn({"params": params, "batch_stats": state.batch_stats}, batch["image"],
                                             train=True, mutable=["batch_stats"])
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()
            return loss, (logits, updates)

        (loss, (logits, updates)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        state = state.apply_gradients(grads=grads).replace(batch_stats=updates["batch_stats"])
        return state, {"loss": loss, "accuracy": jnp.mean(jnp.argmax(logits, -1) == batch["label"])}

    return Case("batchnorm_cnn", train_step, (state, batch), av.next_step_args)


# ---- Flax nnx: a Transformer block with nnx.Dropout(rngs) and nnx.Optimizer, split/merge ---------------


class NnxTransformer(nnx.Module):
    def __init__(self, rngs: nnx.Rngs, blocks: int = 2):
        self.embed = nnx.Embed(VOCAB, WIDTH, rngs=rngs)
        # No biases: a key bias has a zero gradient (softmax ignores a shift), so its values are float noise
        # (1e-10) that no relative comparison can hold to.
        self.attention = nnx.List([nnx.MultiHeadAttention(2, WIDTH, decode=False, use_bias=False, rngs=rngs)
                                   for _ in range(blocks)])
        self.mlp = nnx.List([nnx.Linear(WIDTH, WIDTH, rngs=rngs) for _ in range(blocks)])
        self.norms = nnx.List([nnx.LayerNorm(WIDTH, rngs=rngs) for _ in range(blocks)])
        self.dropout = nnx.Dropout(0.1, rngs=rngs)
        self.head = nnx.Linear(WIDTH, VOCAB, rngs=rngs)

    def __call__(self, tokens):
        x = self.embed(tokens)
        for attention, mlp, norm in zip(self.attention, self.mlp, self.norms):
            x = x + self.dropout(attention(norm(x)))
            x = x + self.dropout(jax.nn.relu(mlp(x)))
        return self.head(x)


def nnx_transformer() -> Case:
    """The nnx way: the model and its optimizer split into a graph and a state pytree that the step returns."""
    model = NnxTransformer(nnx.Rngs(params=11, dropout=12))
    optimizer = nnx.Optimizer(model, optax.sgd(0.1, momentum=0.9), wrt=nnx.Param)
    graphdef, state = nnx.split((model, optimizer))

    def train_step(state, batch):
        model, optimizer = nnx.merge(graphdef, state)

        def loss_fn(model):
            logits = model(batch["x"])
            return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return nnx.state((model, optimizer)), loss

    return Case("nnx_transformer", train_step, (state, _tokens(13)), av.next_step_args)


# ---- running a case: jax.jit on the global batch against a plan --------------------------------


def run_jit(case: Case) -> list:
    fn, args, outs_all = eqx.filter_jit(case.step), case.args, []  # jax.jit where every leaf is an array
    for _ in range(STEPS):
        outs = fn(*args)
        outs_all.append(outs)
        args = case.next_args(args, outs)
    return outs_all


def run_parallel(case: Case, plan: Any, **options) -> list:
    step, args, outs_all = av.parallelize(case.step, plan, record_trace=False, **options), case.args, []
    for _ in range(STEPS):
        outs = step.fetch(step(*args))
        outs_all.append(outs)
        args = case.next_args(args, outs)
    return outs_all


def relative_error(ours, theirs) -> float:
    worst = 0.0
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        if av.core.graph.is_static_leaf(b):  # an Equinox activation or flag: the same object comes back
            assert a is b or a == b, (a, b)
            continue
        a, b = jnp.asarray(a), jnp.asarray(b)  # eqx.filter_jit hands a Python-int step back as it came
        if jax.dtypes.issubdtype(b.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        assert a.shape == b.shape
        if a.size:
            worst = max(worst, float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-12)))
    return worst


CASES = {f.__name__: f for f in (linen_lm, nnx_lm, equinox_cnn, remat_mlp, dropout_mlp, masked_lm,
                                 weight_decay_in_loss, equinox_whole_model, nnx_transformer)}
