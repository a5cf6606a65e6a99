"""A Wide-ResNet (bottleneck blocks, widened) for image classification."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from alpaviz.core.graph import mark_layer
from alpaviz.core.models._common import ModelSpec, Optimizer, build, dense_init, resolve_config

_DEPTH_BLOCKS = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3), 10: (1, 1, 1, 1)}


@dataclasses.dataclass(frozen=True)
class WResNetConfig:
    """Sizes of a Wide-ResNet: depth picks the blocks per stage."""

    image_size: int = 16
    depth: int = 10
    base_channels: int = 8
    width_factor: int = 2
    num_classes: int = 10

    def __post_init__(self) -> None:
        if self.depth not in _DEPTH_BLOCKS:
            raise ValueError(f"depth must be one of {sorted(_DEPTH_BLOCKS)}, got {self.depth}")

    @property
    def blocks(self) -> tuple[int, ...]:
        return _DEPTH_BLOCKS[self.depth]


# From Alpa's Wide-ResNet suite (image, layers, base channels, width factor).
WRESNET_CONFIGS: dict[str, WResNetConfig] = {
    "250M": WResNetConfig(224, 50, 160, 2, 1024),
    "500M": WResNetConfig(224, 50, 224, 2, 1024),
    "1B": WResNetConfig(224, 50, 320, 2, 1024),
    "2B": WResNetConfig(224, 50, 448, 2, 1024),
    "4B": WResNetConfig(224, 50, 640, 2, 1024),
    "6.8B": WResNetConfig(224, 50, 320, 16, 1024),
    "13B": WResNetConfig(224, 101, 320, 16, 1024),
}


def _conv(x: jax.Array, w: jax.Array, stride: int = 1) -> jax.Array:
    return jax.lax.conv_general_dilated(
        x, w, (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )


def _norm(x: jax.Array, gain: jax.Array, bias: jax.Array) -> jax.Array:
    """Batch-statistics normalisation (training mode, no running averages)."""
    mean = jnp.mean(x, axis=(0, 1, 2), keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=(0, 1, 2), keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * gain + bias


def init_wresnet(key: jax.Array, cfg: WResNetConfig, dtype: Any = jnp.float32) -> dict[str, Any]:
    keys = iter(jax.random.split(key, 4 * sum(cfg.blocks) + 4))
    c0 = cfg.base_channels
    params: dict[str, Any] = {"stem": dense_init(next(keys), (3, 3, 3, c0), dtype, scale=(27) ** -0.5)}
    blocks = []
    in_ch = c0
    for stage, count in enumerate(cfg.blocks):
        width = cfg.base_channels * cfg.width_factor * 2**stage
        out_ch = cfg.base_channels * 4 * 2**stage
        for _ in range(count):
            blocks.append({
                "w1": dense_init(next(keys), (1, 1, in_ch, width), dtype, scale=in_ch**-0.5),
                "w2": dense_init(next(keys), (3, 3, width, width), dtype, scale=(9 * width) ** -0.5),
                "w3": dense_init(next(keys), (1, 1, width, out_ch), dtype, scale=width**-0.5),
                "proj": dense_init(next(keys), (1, 1, in_ch, out_ch), dtype, scale=in_ch**-0.5),
                "g1": jnp.ones((width,), dtype), "b1": jnp.zeros((width,), dtype),
                "g2": jnp.ones((width,), dtype), "b2": jnp.zeros((width,), dtype),
                "g3": jnp.ones((out_ch,), dtype), "b3": jnp.zeros((out_ch,), dtype),
            })
            in_ch = out_ch
    params["blocks"] = blocks
    params["head"] = dense_init(next(keys), (in_ch, cfg.num_classes), dtype)
    return params


def wresnet_loss(params: dict[str, Any], batch: dict[str, jax.Array], cfg: WResNetConfig) -> jax.Array:
    x = jax.nn.relu(_conv(batch["images"], params["stem"]))
    first_of_stage = {sum(cfg.blocks[:s]) for s in range(1, len(cfg.blocks))}
    for i, p in enumerate(params["blocks"]):
        stride = 2 if i in first_of_stage else 1
        y = jax.nn.relu(_norm(_conv(x, p["w1"]), p["g1"], p["b1"]))
        y = jax.nn.relu(_norm(_conv(y, p["w2"], stride), p["g2"], p["b2"]))
        y = _norm(_conv(y, p["w3"]), p["g3"], p["b3"])
        x = jax.nn.relu(y + _conv(x, p["proj"], stride))
        if i < len(params["blocks"]) - 1:
            x = mark_layer(x, name=f"block{i}")
    logits = jnp.mean(x, axis=(1, 2)) @ params["head"]
    logp = jax.nn.log_softmax(logits.astype(jnp.float32))
    return -jnp.mean(jnp.sum(logp * jax.nn.one_hot(batch["labels"], cfg.num_classes), axis=-1))


def wresnet(
    config: WResNetConfig | str | None = None,
    *,
    batch_size: int = 8,
    dtype: Any = jnp.float32,
    optimizer: Optimizer = "sgd",
    learning_rate: float = 1e-2,
    abstract: bool = False,
    seed: int = 0,
    **overrides: Any,
) -> ModelSpec:
    """A Wide-ResNet training step with params and a batch of NHWC images."""
    cfg = resolve_config(config, WRESNET_CONFIGS, WResNetConfig(), "Wide-ResNet", overrides)

    def make_batch(key):
        k1, k2 = jax.random.split(key)
        images = jax.random.normal(k1, (batch_size, cfg.image_size, cfg.image_size, 3), jnp.float32)
        return {"images": images.astype(dtype), "labels": jax.random.randint(k2, (batch_size,), 0, cfg.num_classes)}

    name = f"wresnet{cfg.depth}_c{cfg.base_channels}_w{cfg.width_factor}"
    return build(
        lambda k: init_wresnet(k, cfg, dtype), make_batch, lambda p, b: wresnet_loss(p, b, cfg),
        name, optimizer, learning_rate, abstract, seed,
    )
