"""A GShard-style MoE transformer: attention blocks whose MLP is a top-1 routed expert layer."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from alpaviz.core.graph import mark_layer
from alpaviz.core.models._common import (
    ModelSpec, Optimizer, build, cross_entropy, dense_init, layer_norm, resolve_config, token_batch,
)
from alpaviz.core.models._gpt import attention


@dataclasses.dataclass(frozen=True)
class MoEConfig:
    """Sizes of an MoE model; every `moe_every`-th block has an expert MLP."""

    num_layers: int = 2
    hidden: int = 64
    heads: int = 4
    seq_len: int = 32
    vocab: int = 256
    num_experts: int = 4
    expert_group_size: int = 64
    capacity_factor: float = 2.0
    moe_every: int = 1


# From Alpa's MoE suite (S, H, L, heads, V, experts, expert group size).
MOE_CONFIGS: dict[str, MoEConfig] = {
    "380M": MoEConfig(8, 768, 16, 1024, 32000, 8, 2048),
    "690M": MoEConfig(8, 768, 16, 1024, 32000, 16, 2048),
    "1.3B": MoEConfig(16, 768, 16, 1024, 32000, 16, 2048),
    "2.4B": MoEConfig(16, 1024, 16, 1024, 32000, 16, 2048),
    "10B": MoEConfig(16, 1536, 16, 1024, 32000, 32, 2048),
    "27B": MoEConfig(16, 2048, 16, 1024, 32000, 48, 2048),
    "70B": MoEConfig(16, 2048, 32, 1024, 32000, 64, 2048),
}


def _init_block(key: jax.Array, cfg: MoEConfig, moe: bool, dtype: Any) -> dict[str, jax.Array]:
    h, e = cfg.hidden, cfg.num_experts
    k = jax.random.split(key, 5)
    p = {
        "ln1_g": jnp.ones((h,), dtype), "ln1_b": jnp.zeros((h,), dtype),
        "w_qkv": dense_init(k[0], (h, 3 * h), dtype), "b_qkv": jnp.zeros((3 * h,), dtype),
        "w_out": dense_init(k[1], (h, h), dtype), "b_out": jnp.zeros((h,), dtype),
        "ln2_g": jnp.ones((h,), dtype), "ln2_b": jnp.zeros((h,), dtype),
    }
    if moe:
        p["w_gate"] = dense_init(k[2], (h, e), dtype)
        p["w_in"] = dense_init(k[3], (e, h, 4 * h), dtype, scale=h**-0.5)
        p["w_outer"] = dense_init(k[4], (e, 4 * h, h), dtype, scale=(4 * h) ** -0.5)
    else:
        p["w_fc"] = dense_init(k[3], (h, 4 * h), dtype)
        p["w_proj"] = dense_init(k[4], (4 * h, h), dtype)
    return p


def init_moe(key: jax.Array, cfg: MoEConfig, dtype: Any = jnp.float32) -> dict[str, Any]:
    keys = jax.random.split(key, cfg.num_layers + 1)
    return {
        "wte": dense_init(keys[0], (cfg.vocab, cfg.hidden), dtype, scale=0.02),
        "blocks": [
            _init_block(keys[i + 1], cfg, (i % cfg.moe_every) == cfg.moe_every - 1, dtype)
            for i in range(cfg.num_layers)
        ],
        "lnf_g": jnp.ones((cfg.hidden,), dtype),
        "lnf_b": jnp.zeros((cfg.hidden,), dtype),
    }


def expert_layer(x: jax.Array, p: dict[str, jax.Array], cfg: MoEConfig) -> jax.Array:
    """Top-1 routing with a capacity per expert, dispatched and combined with einsums."""
    b, s, h = x.shape
    tokens = b * s
    group = min(cfg.expert_group_size, tokens)
    if tokens % group:
        raise ValueError(f"batch*seq ({tokens}) must be divisible by expert_group_size ({group})")
    g = tokens // group
    e = cfg.num_experts
    capacity = max(1, int(cfg.capacity_factor * group / e))
    xg = x.reshape(g, group, h)
    gates = jax.nn.softmax((xg @ p["w_gate"]).astype(jnp.float32), axis=-1)  # (g, t, e)
    expert = jnp.argmax(gates, axis=-1)
    expert_mask = jax.nn.one_hot(expert, e, dtype=jnp.float32)  # (g, t, e)
    position = jnp.cumsum(expert_mask, axis=1) * expert_mask - 1.0
    keep = expert_mask * (position < capacity)
    slot = jax.nn.one_hot(position.astype(jnp.int32), capacity, dtype=jnp.float32)  # (g, t, e, c)
    dispatch = keep[..., None] * slot
    combine = (gates * keep)[..., None] * slot
    expert_in = jnp.einsum("gtec,gth->egch", dispatch.astype(x.dtype), xg)
    hidden = jax.nn.gelu(jnp.einsum("egch,ehf->egcf", expert_in, p["w_in"]), approximate=True)
    expert_out = jnp.einsum("egcf,efh->egch", hidden, p["w_outer"])
    out = jnp.einsum("gtec,egch->gth", combine.astype(x.dtype), expert_out)
    return out.reshape(b, s, h)


def moe_loss(params: dict[str, Any], batch: dict[str, jax.Array], cfg: MoEConfig) -> jax.Array:
    x = jnp.take(params["wte"], batch["tokens"], axis=0)
    for i, p in enumerate(params["blocks"]):
        x = x + attention(layer_norm(x, p["ln1_g"], p["ln1_b"]), p, cfg.heads)
        y = layer_norm(x, p["ln2_g"], p["ln2_b"])
        if "w_gate" in p:
            x = x + expert_layer(y, p, cfg)
        else:
            x = x + jax.nn.gelu(y @ p["w_fc"], approximate=True) @ p["w_proj"]
        if i < len(params["blocks"]) - 1:
            x = mark_layer(x, name=f"block{i}")
    x = layer_norm(x, params["lnf_g"], params["lnf_b"])
    return cross_entropy(x @ params["wte"].T, batch["labels"])


def moe(
    config: MoEConfig | str | None = None,
    *,
    batch_size: int = 8,
    dtype: Any = jnp.float32,
    optimizer: Optimizer = "sgd",
    learning_rate: float = 1e-2,
    abstract: bool = False,
    seed: int = 0,
    **overrides: Any,
) -> ModelSpec:
    """An MoE transformer training step with params and a batch.

    Example:
        >>> train_step, params, batch = av.models.moe(num_experts=4)
    """
    cfg = resolve_config(config, MOE_CONFIGS, MoEConfig(), "MoE", overrides)
    make_batch = token_batch(batch_size, cfg.seq_len, cfg.vocab)

    name = f"moe_l{cfg.num_layers}_h{cfg.hidden}_e{cfg.num_experts}"
    return build(
        lambda k: init_moe(k, cfg, dtype), make_batch, lambda p, b: moe_loss(p, b, cfg),
        name, optimizer, learning_rate, abstract, seed,
    )
