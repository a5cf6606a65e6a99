"""What the schedules' numerics tests compare against: `jax.jit`'s steps on the global batch."""

import jax
import numpy as np

FAST_COMPILE = {"xla_backend_optimization_level": 0}


def jit_steps(step, params, batch, steps: int) -> list[tuple[object, float]]:
    """(params after, loss) of each of `steps` steps of `jax.jit(step)` from `params`."""
    ref = jax.jit(step, compiler_options=FAST_COMPILE)
    p, out = params, []
    for _ in range(steps):
        p, loss = ref(p, batch)
        out.append((jax.device_get(p), float(loss)))
    return out


def assert_steps_match(parallel, params, batch, expected) -> None:
    """`parallel`'s steps from `params` equal `expected` (from `jit_steps`): losses within 1e-5, every
    parameter within 1e-5 relative."""
    p = params
    for params_after, loss_after in expected:
        p, loss = parallel(p, batch)
        np.testing.assert_allclose(float(loss), loss_after, rtol=1e-5)
        for a, b in zip(jax.tree.leaves(parallel.fetch(p)), jax.tree.leaves(params_after)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
