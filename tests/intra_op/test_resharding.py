"""Resharding: which collective a conversion needs, checked against XLA, and its alpha-beta price."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding

import alpaviz as av
from alpaviz.core.intra_op._resharding import plan_resharding, resharding_cost
from alpaviz.core.plan._spec import to_partition_spec

COLLECTIVE = re.compile(r"\b(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(-start)?\(")
X, Y = ("x",), ("y",)
CASES = {
    "slice_is_free": (((), ()), (X, ())),
    "gather_one_axis": ((X, ()), ((), ())),
    "gather_both_axes": ((("x", "y"), ()), ((), ())),
    "move_between_dims": ((X, ()), ((), X)),
    "gather_one_keep_other": ((X, Y), ((), Y)),
    "swap_axes": ((X, Y), (Y, X)),
}


def _xla_collectives(src, dst):
    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("x", "y"))
    a = jnp.ones((16, 16))
    fn = jax.jit(lambda v: v, in_shardings=NamedSharding(mesh, to_partition_spec(src)),
                 out_shardings=NamedSharding(mesh, to_partition_spec(dst)))
    return {m.group(1) for m in COLLECTIVE.finditer(fn.lower(a).compile().as_text())}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_planned_collectives_match_xla(case):
    src, dst = CASES[case]
    step = plan_resharding(src, dst)
    found = _xla_collectives(src, dst)
    if step.is_free:
        assert not found
    if step.gather_axes and not step.all_to_all_axes:
        assert "all-gather" in found and "all-to-all" not in found
    if step.all_to_all_axes:
        assert found & {"all-to-all", "collective-permute"}


def test_costs_follow_the_alpha_beta_model():
    cluster = av.Cluster.local()
    mesh = cluster.logical_mesh((1, 4), (2, 2))
    cm = av.CostModel()
    nbytes = 1 << 20
    assert resharding_cost(nbytes, ((), ()), (X, ()), mesh, cm) == 0.0
    assert resharding_cost(nbytes, (X, ()), (X, ()), mesh, cm) == 0.0
    assert resharding_cost(nbytes, None, (X, ()), mesh, cm) == 0.0
    # all-gather over x: the message is the gathered per-device tensor (full size here).
    assert resharding_cost(nbytes, (X, ()), ((), ()), mesh, cm) == pytest.approx(cm.all_gather(nbytes, mesh, 0))
    # gathering x while y stays split: a quarter per device, half after the gather.
    assert resharding_cost(nbytes, (X, Y), ((), Y), mesh, cm) == pytest.approx(cm.all_gather(nbytes / 2, mesh, 0))
    moved = resharding_cost(nbytes, (X, ()), ((), X), mesh, cm)
    assert moved == pytest.approx(cm.all_to_all(nbytes, mesh, 0))
    assert moved < resharding_cost(nbytes, (X, ()), ((), ()), mesh, cm)
