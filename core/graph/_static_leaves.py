"""Argument and result leaves that are not arrays stay static, as `eqx.filter_jit` keeps them.

An Equinox module carries its activation functions, `inference` flags and
float hyperparameters (a dropout rate) as pytree leaves.  They are not
traced: the step is traced on its array leaves and Python ints (which
`jax.jit` traces too: a Flax `TrainState.create` holds `step=0`), the others
are put back where they were, results that are not arrays come back as the
trace returned them, and a call whose static leaves differ is refused.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np


def is_static_leaf(x: Any) -> bool:
    """Not traced: functions, booleans, Python floats, strings, other objects; arrays and Python ints are traced."""
    if isinstance(x, (bool, np.bool_)):
        return True
    return not (hasattr(x, "dtype") or isinstance(x, int))


def _is_none(x: Any) -> bool:
    return x is None


@dataclasses.dataclass(frozen=True)
class StaticLeaves:
    """The static leaves of a pytree: where they sit among its leaves (Nones counted) and their values."""

    treedef: Any = None
    values: tuple[tuple[int, Any], ...] = ()

    def merge(self, dynamic: Any) -> Any:
        """The whole pytree from its dynamic part (static positions None)."""
        if not self.values:
            return dynamic
        fill = dict(self.values)
        leaves = jax.tree.flatten(dynamic, is_leaf=_is_none)[0]
        return jax.tree.unflatten(self.treedef, [fill.get(i, x) for i, x in enumerate(leaves)])


def split_static(tree: Any) -> tuple[Any, StaticLeaves]:
    """(the pytree with each static leaf replaced by None, where those leaves were)."""
    leaves, treedef = jax.tree.flatten(tree, is_leaf=_is_none)
    values = tuple((i, x) for i, x in enumerate(leaves) if x is not None and is_static_leaf(x))
    if not values:
        return tree, StaticLeaves()
    static = {i for i, _ in values}
    dynamic = jax.tree.unflatten(treedef, [None if i in static else x for i, x in enumerate(leaves)])
    return dynamic, StaticLeaves(treedef, values)


def check_same_static(expected: StaticLeaves, args: Any) -> None:
    """A call's static leaves must be those the step was traced with (they are baked into it)."""
    got = dict(split_static(args)[1].values)
    for i, value in expected.values:
        other = got.get(i, _MISSING)
        if other is not value and not _equal(other, value):
            raise ValueError(
                f"a static argument leaf (not an array: {type(value).__name__} {value!r:.40}) is now "
                f"{other!r:.40}; the step was traced with the first value, so build a new step with "
                f"av.parallelize for the new one, or pass it as an array to have it traced"
            )


_MISSING = object()


def _equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # objects whose == is not a plain bool
        return False


def dynamic_leaves(tree: Any) -> list[Any]:
    """The leaves a traced step reads: every leaf but the static ones, in pytree order."""
    return [x for x in jax.tree.leaves(tree) if not is_static_leaf(x)]
