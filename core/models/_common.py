"""Shared pieces of the model zoo: the returned triple, optimizers, init helpers."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Literal, NamedTuple

import jax
import jax.numpy as jnp

Optimizer = Literal["sgd", "adam"]


class ModelSpec(NamedTuple):
    """What every zoo builder returns: unpack as `train_step, params, batch = ...`.

    `params` is the training state the step takes first (plain params for
    SGD, a dict with Adam moments for Adam); with `abstract=True` it and the
    batch are `jax.ShapeDtypeStruct`s, so paper-sized models cost no memory.
    """

    train_step: Callable[[Any, Any], tuple[Any, jax.Array]]
    params: Any
    batch: Any


def make_train_step(
    loss_fn: Callable[[Any, Any], jax.Array],
    name: str,
    optimizer: Optimizer = "sgd",
    learning_rate: float = 1e-2,
) -> Callable[[Any, Any], tuple[Any, jax.Array]]:
    """A full training step: loss, `jax.value_and_grad`, optimizer update."""
    if optimizer == "sgd":

        def train_step(params, batch):
            loss, grads = jax.value_and_grad(loss_fn)(params, batch)
            new_params = jax.tree.map(lambda p, g: p - learning_rate * g, params, grads)
            return new_params, loss

    elif optimizer == "adam":
        b1, b2, eps = 0.9, 0.999, 1e-8

        def train_step(state, batch):
            loss, grads = jax.value_and_grad(loss_fn)(state["params"], batch)
            step = state["step"] + 1
            mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state["mu"], grads)
            nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, state["nu"], grads)
            scale = learning_rate * jnp.sqrt(1 - b2**step) / (1 - b1**step)
            params = jax.tree.map(
                lambda p, m, v: p - (scale * m / (jnp.sqrt(v) + eps)).astype(p.dtype),
                state["params"], mu, nu,
            )
            return {"params": params, "mu": mu, "nu": nu, "step": step}, loss

    else:
        raise ValueError(f"optimizer must be 'sgd' or 'adam', got {optimizer!r}")
    train_step.__name__ = name
    train_step.__qualname__ = name
    return train_step


def init_state(params: Any, optimizer: Optimizer) -> Any:
    """Wrap params in the optimizer's state."""
    if optimizer == "sgd":
        return params
    zeros = jax.tree.map(jnp.zeros_like, params)
    return {"params": params, "mu": zeros, "nu": jax.tree.map(jnp.zeros_like, params),
            "step": jnp.zeros((), jnp.float32)}


def build(
    init_fn: Callable[[jax.Array], Any],
    make_batch: Callable[[jax.Array], Any],
    loss_fn: Callable[[Any, Any], jax.Array],
    name: str,
    optimizer: Optimizer,
    learning_rate: float,
    abstract: bool,
    seed: int,
) -> ModelSpec:
    """Assemble a ModelSpec; with `abstract` nothing is allocated (eval_shape)."""
    step = make_train_step(loss_fn, name, optimizer, learning_rate)
    key_params, key_batch = jax.random.split(jax.random.key(seed))
    make_state = lambda k: init_state(init_fn(k), optimizer)  # noqa: E731
    if abstract:
        return ModelSpec(step, jax.eval_shape(make_state, key_params), jax.eval_shape(make_batch, key_batch))
    return ModelSpec(step, make_state(key_params), make_batch(key_batch))


def resolve_config(config: Any, presets: dict[str, Any], default: Any, family: str, overrides: dict[str, Any]) -> Any:
    """A preset name, a config or None (the default), with keyword overrides applied."""
    if isinstance(config, str):
        if config not in presets:
            raise ValueError(f"unknown {family} size {config!r}; choose one of {sorted(presets)}")
        config = presets[config]
    fields = {f.name for f in dataclasses.fields(default)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise TypeError(f"{family} has no setting {', '.join(unknown)}; its settings are {sorted(fields)} "
                        f"(and the builder's own keywords, such as batch_size)")
    return dataclasses.replace(config or default, **overrides)


def token_batch(batch_size: int, seq_len: int, vocab: int) -> Callable[[jax.Array], dict[str, jax.Array]]:
    """Random token ids and their next-token labels, for language models."""

    def make_batch(key: jax.Array) -> dict[str, jax.Array]:
        tokens = jax.random.randint(key, (batch_size, seq_len), 0, vocab, jnp.int32)
        return {"tokens": tokens, "labels": jnp.roll(tokens, -1, axis=1)}

    return make_batch


def dense_init(key: jax.Array, shape: tuple[int, ...], dtype: Any, scale: float | None = None) -> jax.Array:
    scale = scale if scale is not None else shape[0] ** -0.5
    return (jax.random.normal(key, shape, jnp.float32) * scale).astype(dtype)


def layer_norm(x: jax.Array, gain: jax.Array, bias: jax.Array, eps: float = 1e-5) -> jax.Array:
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * gain + bias


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean token cross-entropy, computed in float32."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    onehot = jax.nn.one_hot(labels, logits.shape[-1], dtype=jnp.float32)
    return -jnp.mean(jnp.sum(logp * onehot, axis=-1))
