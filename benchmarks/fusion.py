"""How much memory traffic XLA's fusion leaves of a layer norm and a softmax, against the cost model's charge.

The cost model charges each operator its bytes read and written, but elementwise and data-movement
operators only `CostModel.fused_traffic_share` of them (XLA fuses them into their neighbours).  Whether
reductions (the mean and variance of a layer norm, the max and sum of a softmax) should be charged the
same share is a question for a measurement: this script times each pattern on one local device, converts
the time into bytes of traffic at the rate of a plain elementwise pass, and prints it beside the model's
charge with reductions charged in full (the model) and at the fused share (the alternative).

    python benchmarks/fusion.py          # a few seconds
"""

from __future__ import annotations

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from alpaviz.core import CostModel
from alpaviz.core.cost._cost_model import FUSIBLE
from alpaviz.core.graph import REDUCTIONS


def layer_norm(x):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5)


def softmax(x):
    e = jnp.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def gelu_mlp_tail(x):
    return jax.nn.gelu(x) * 0.5 + x


def median_seconds(fn, x, repeats: int = 20) -> float:
    compiled = jax.jit(fn)
    compiled(x).block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        compiled(x).block_until_ready()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def charged_bytes(fn, x, share: float, reductions_fused: bool) -> float:
    """The model's traffic for `fn`: every operator's operands and results, fusible ones at `share`."""
    total = 0.0
    for eqn in jax.make_jaxpr(fn)(x).eqns:
        nbytes = sum(v.aval.size * v.aval.dtype.itemsize for v in (*eqn.invars, *eqn.outvars) if hasattr(v, "aval"))
        fused = eqn.primitive.name in FUSIBLE or (reductions_fused and eqn.primitive.name in REDUCTIONS)
        total += nbytes * (share if fused else 1.0)
    return total


def main() -> int:
    share = CostModel().fused_traffic_share
    x = jnp.asarray(np.random.default_rng(0).random((8192, 1024), dtype=np.float32))
    size = x.nbytes
    rate = 2 * size / median_seconds(lambda v: v * 2.0, x)  # one read and one write of x
    print(f"one device ({jax.devices()[0].platform}), x = {x.shape} float32, elementwise pass at {rate / 1e9:.2f} GB/s")
    print(f"{'pattern':<14}{'measured |x|':>14}{'model |x|':>11}{'ratio':>8}{'fused red. |x|':>16}{'ratio':>8}")
    for fn in (layer_norm, softmax, gelu_mlp_tail):
        measured = median_seconds(fn, x) * rate / size
        model = charged_bytes(fn, x, share, False) / size
        alternative = charged_bytes(fn, x, share, True) / size
        print(f"{fn.__name__:<14}{measured:>14.2f}{model:>11.2f}{model / measured:>8.2f}{alternative:>16.2f}"
              f"{alternative / measured:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
