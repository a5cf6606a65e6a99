"""A stack of dense tanh layers: the smallest model that still has layers, for teaching and tests."""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp

from alpaviz.core.graph import mark_layer
from alpaviz.core.models._common import ModelSpec, Optimizer, build, dense_init


def mlp_loss(params: list[jax.Array], batch: dict[str, jax.Array], marks: bool = True) -> jax.Array:
    """Mean square of the last activation; a layer boundary after every layer but the last."""
    x = batch["x"]
    for i, w in enumerate(params):
        x = jnp.tanh(x @ w)
        if marks and i < len(params) - 1:
            x = mark_layer(x, name=f"dense{i}")
    return jnp.mean(x**2)


def mlp(
    widths: Sequence[int] = (16, 32, 32, 16),
    *,
    batch_size: int = 8,
    marks: bool = True,
    dtype: Any = jnp.float32,
    optimizer: Optimizer = "sgd",
    learning_rate: float = 0.1,
    abstract: bool = False,
    seed: int = 0,
) -> ModelSpec:
    """A dense stack `widths[0] -> ... -> widths[-1]` with a training step.

    Example:
        >>> train_step, params, batch = av.models.mlp((1024, 4096, 1024), batch_size=64)
    """
    if len(widths) < 2:
        raise ValueError(f"an MLP needs at least an input and an output width, got widths={tuple(widths)}")

    def init(key):
        keys = jax.random.split(key, len(widths) - 1)
        return [dense_init(k, (a, b), dtype) for k, a, b in zip(keys, widths[:-1], widths[1:])]

    def make_batch(key):
        return {"x": jax.random.normal(key, (batch_size, widths[0]), jnp.float32).astype(dtype)}

    name = "mlp_" + "x".join(map(str, widths))
    return build(init, make_batch, lambda p, b: mlp_loss(p, b, marks), name, optimizer, learning_rate,
                 abstract, seed)
