"""A GPT-style decoder: embeddings, pre-norm blocks (attention + MLP), tied head."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from alpaviz.core.graph import mark_layer
from alpaviz.core.models._common import (
    ModelSpec, Optimizer, build, cross_entropy, dense_init, layer_norm, resolve_config, token_batch,
)


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    """Sizes of a GPT model; `GPT_CONFIGS` holds the Alpa benchmark sizes."""

    num_layers: int = 2
    hidden: int = 64
    heads: int = 4
    seq_len: int = 32
    vocab: int = 256

    def __post_init__(self) -> None:
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads})")

    @property
    def num_params(self) -> int:
        h, v = self.hidden, self.vocab
        per_block = 12 * h * h + 13 * h
        return v * h + self.seq_len * h + self.num_layers * per_block + 2 * h


# (seq, hidden, layers, heads, vocab) from Alpa's GPT benchmark suite.
GPT_CONFIGS: dict[str, GPTConfig] = {
    "125M": GPTConfig(12, 768, 12, 1024, 51200),
    "350M": GPTConfig(24, 1024, 16, 1024, 51200),
    "760M": GPTConfig(24, 1536, 16, 1024, 51200),
    "1.3B": GPTConfig(24, 2048, 32, 1024, 51200),
    "2.6B": GPTConfig(32, 2560, 32, 1024, 51200),
    "6.7B": GPTConfig(32, 4096, 32, 1024, 51200),
    "15B": GPTConfig(48, 5120, 40, 1024, 51200),
    "39B": GPTConfig(48, 8192, 64, 1024, 51200),
}


def _init_block(key: jax.Array, h: int, dtype: Any) -> dict[str, jax.Array]:
    k = jax.random.split(key, 4)
    ones, zeros = jnp.ones((h,), dtype), jnp.zeros((h,), dtype)
    return {
        "ln1_g": ones, "ln1_b": zeros,
        "w_qkv": dense_init(k[0], (h, 3 * h), dtype), "b_qkv": jnp.zeros((3 * h,), dtype),
        "w_out": dense_init(k[1], (h, h), dtype), "b_out": zeros,
        "ln2_g": ones, "ln2_b": zeros,
        "w_fc": dense_init(k[2], (h, 4 * h), dtype), "b_fc": jnp.zeros((4 * h,), dtype),
        "w_proj": dense_init(k[3], (4 * h, h), dtype), "b_proj": zeros,
    }


def init_gpt(key: jax.Array, cfg: GPTConfig, dtype: Any = jnp.float32, scan_layers: bool = False) -> dict[str, Any]:
    """GPT parameters; with `scan_layers` the blocks' parameters are stacked along a leading layer axis."""
    keys = jax.random.split(key, cfg.num_layers + 2)
    blocks = [_init_block(keys[i + 2], cfg.hidden, dtype) for i in range(cfg.num_layers)]
    return {
        "wte": dense_init(keys[0], (cfg.vocab, cfg.hidden), dtype, scale=0.02),
        "wpe": dense_init(keys[1], (cfg.seq_len, cfg.hidden), dtype, scale=0.02),
        "blocks": jax.tree.map(lambda *xs: jnp.stack(xs), *blocks) if scan_layers else blocks,
        "lnf_g": jnp.ones((cfg.hidden,), dtype),
        "lnf_b": jnp.zeros((cfg.hidden,), dtype),
    }


def attention(x: jax.Array, p: dict[str, jax.Array], heads: int) -> jax.Array:
    b, s, h = x.shape
    qkv = x @ p["w_qkv"] + p["b_qkv"]
    q, k, v = jnp.split(qkv.reshape(b, s, 3, heads, h // heads), 3, axis=2)
    q, k, v = (t.reshape(b, s, heads, h // heads) for t in (q, k, v))
    scores = jnp.einsum("bqnd,bknd->bnqk", q, k) / jnp.sqrt(jnp.asarray(h // heads, x.dtype))
    causal = jnp.tril(jnp.ones((s, s), bool))
    scores = jnp.where(causal, scores, jnp.asarray(-1e4, scores.dtype))
    probs = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(x.dtype)
    out = jnp.einsum("bnqk,bknd->bqnd", probs, v).reshape(b, s, h)
    return out @ p["w_out"] + p["b_out"]


def block(x: jax.Array, p: dict[str, jax.Array], heads: int) -> jax.Array:
    x = x + attention(layer_norm(x, p["ln1_g"], p["ln1_b"]), p, heads)
    hidden = jax.nn.gelu(layer_norm(x, p["ln2_g"], p["ln2_b"]) @ p["w_fc"] + p["b_fc"], approximate=True)
    return x + hidden @ p["w_proj"] + p["b_proj"]


def gpt_loss(params: dict[str, Any], batch: dict[str, jax.Array], cfg: GPTConfig) -> jax.Array:
    """Next-token loss; a layer boundary after every block but the last."""
    tokens = batch["tokens"]
    x = jnp.take(params["wte"], tokens, axis=0) + params["wpe"][None, : tokens.shape[1]]
    if isinstance(params["blocks"], dict):  # stacked: one scan over the layers, as large JAX models write it
        x, _ = jax.lax.scan(lambda h, p: (block(h, p, cfg.heads), None), x, params["blocks"])
    else:
        for i, p in enumerate(params["blocks"]):
            x = block(x, p, cfg.heads)
            if i < len(params["blocks"]) - 1:
                x = mark_layer(x, name=f"block{i}")
    x = layer_norm(x, params["lnf_g"], params["lnf_b"])
    logits = x @ params["wte"].T
    return cross_entropy(logits, batch["labels"])


def gpt(
    config: GPTConfig | str | None = None,
    *,
    batch_size: int = 8,
    dtype: Any = jnp.float32,
    optimizer: Optimizer = "sgd",
    learning_rate: float = 1e-2,
    abstract: bool = False,
    seed: int = 0,
    scan_layers: bool = False,
    **overrides: int,
) -> ModelSpec:
    """A GPT training step with params and a batch; `scan_layers` stacks the blocks and scans over them.

    Example:
        >>> train_step, params, batch = av.models.gpt(num_layers=2, hidden=64)
        >>> step, params, batch = av.models.gpt("1.3B", batch_size=1024, abstract=True)
    """
    cfg = resolve_config(config, GPT_CONFIGS, GPTConfig(), "GPT", overrides)
    make_batch = token_batch(batch_size, cfg.seq_len, cfg.vocab)

    name = f"gpt_l{cfg.num_layers}_h{cfg.hidden}" + ("_scan" if scan_layers else "")
    return build(
        lambda k: init_gpt(k, cfg, dtype, scan_layers), make_batch, lambda p, b: gpt_loss(p, b, cfg),
        name, optimizer, learning_rate, abstract, seed,
    )
