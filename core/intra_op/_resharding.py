"""The cost of converting a tensor from one sharding to another.

Per mesh axis: a split that appears is a free local slice, a split that
disappears is an all-gather, and a split that moves to another dim is an
all-to-all.  The all-to-alls run first, while the data is still split.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Sequence

import numpy as np

from alpaviz.core.cost import CostModelProtocol, LogicalMesh
from alpaviz.core.graph import OpGraph
from alpaviz.core.intra_op._strategies import tensor_bytes
from alpaviz.core.plan import Spec


@dataclasses.dataclass(frozen=True)
class Resharding:
    """The collectives one conversion needs: axes gathered and axes moved between dims."""

    gather_axes: tuple[str, ...]
    all_to_all_axes: tuple[str, ...]

    @property
    def is_free(self) -> bool:
        return not self.gather_axes and not self.all_to_all_axes


def plan_resharding(src: Spec, dst: Spec) -> Resharding:
    """Which axes must be gathered or moved to go from `src` to `dst`."""
    removed: set[str] = set()
    added: set[str] = set()
    for s_axes, d_axes in zip(src, dst):
        keep = 0
        while keep < min(len(s_axes), len(d_axes)) and s_axes[keep] == d_axes[keep]:
            keep += 1
        removed.update(s_axes[keep:])
        added.update(d_axes[keep:])
    moved = removed & added
    return Resharding(tuple(sorted(removed - moved)), tuple(sorted(moved)))


def resharding_cost(nbytes: float, src: Spec | None, dst: Spec | None, mesh: LogicalMesh,
                    cost_model: CostModelProtocol) -> float:
    """Seconds to turn a tensor of `nbytes` (full size) sharded as `src` into `dst`.

    None on either side means "free" (a constant, or an operand that takes
    any sharding) and costs nothing.  Memoised per process: every problem on
    a mesh asks for the same few thousand pairs.
    """
    try:
        return _memoised_cost(nbytes, src, dst, mesh, cost_model)
    except TypeError:  # a cost model that cannot be hashed
        return _cost(nbytes, src, dst, mesh, cost_model)


class ReshardingPrices:
    """`resharding_cost` of one problem's tensors, by tensor name and spec pair.

    The process-wide memo behind `resharding_cost` hashes the mesh and cost
    model on every call; one problem makes millions of lookups, so it keeps
    its own first level.
    """

    def __init__(self, graph: OpGraph, mesh: LogicalMesh, cost_model: CostModelProtocol):
        self._graph, self._mesh, self._model = graph, mesh, cost_model
        self._by_tensor: dict[str, tuple[float, dict]] = {}
        self._by_size: dict[float, dict] = {}
        self._tables: dict[tuple, np.ndarray] = {}

    def _memo(self, tensor: str) -> tuple[float, dict]:
        """The tensor's bytes and the memo of its size's prices."""
        found = self._by_tensor.get(tensor)
        if found is None:
            nbytes = tensor_bytes(self._graph.tensor(tensor))
            found = self._by_tensor[tensor] = (nbytes, self._by_size.setdefault(nbytes, {}))
        return found

    def __call__(self, tensor: str, src: Spec | None, dst: Spec | None) -> float:
        nbytes, memo = self._memo(tensor)
        cost = memo.get((src, dst))
        if cost is None:
            cost = memo[src, dst] = resharding_cost(nbytes, src, dst, self._mesh, self._model)
        return cost

    def pairs(self, tensor: str, sources: Sequence[Spec | None], targets: Sequence[Spec | None]) -> list[float]:
        """`self(tensor, s, d)` for each (s, d) of `zip(sources, targets)`, in one call (assembly asks for a
        group's every option at once)."""
        nbytes, memo = self._memo(tensor)
        out = []
        for pair in zip(sources, targets):
            cost = memo.get(pair)
            if cost is None:
                cost = memo[pair] = resharding_cost(nbytes, pair[0], pair[1], self._mesh, self._model)
            out.append(cost)
        return out

    def table(self, tensor: str, sources: Sequence[Spec], targets: Sequence[Spec]) -> np.ndarray:
        """The [source, target] costs of `tensor`; the same specs on a tensor of the same size are priced once
        (a layer's readers ask for the same few tables thousands of times)."""
        nbytes = self._by_tensor[tensor][0] if tensor in self._by_tensor else tensor_bytes(self._graph.tensor(tensor))
        key = (nbytes, tuple(sources), tuple(targets))
        found = self._tables.get(key)
        if found is None:
            found = self._tables[key] = np.array([[self(tensor, s, d) for d in targets] for s in sources])
        return found


@functools.lru_cache(maxsize=1 << 17)
def _memoised_cost(nbytes: float, src: Spec | None, dst: Spec | None, mesh: LogicalMesh,
                   cost_model: CostModelProtocol) -> float:
    return _cost(nbytes, src, dst, mesh, cost_model)


def _cost(nbytes: float, src: Spec | None, dst: Spec | None, mesh: LogicalMesh,
          cost_model: CostModelProtocol) -> float:
    if src is None or dst is None or src == dst:
        return 0.0
    plan = plan_resharding(src, dst)
    if plan.is_free:
        return 0.0
    sizes = dict(zip(mesh.axis_names, mesh.shape))
    per_device = nbytes / math.prod(sizes[a] for axes in src for a in axes)
    cost = 0.0
    if plan.all_to_all_axes:
        n = math.prod(sizes[a] for a in plan.all_to_all_axes)
        cost += cost_model.all_to_all(per_device * n, mesh, _ids(mesh, plan.all_to_all_axes))
    if plan.gather_axes:
        n = math.prod(sizes[a] for a in plan.gather_axes)
        cost += cost_model.all_gather(per_device * n, mesh, _ids(mesh, plan.gather_axes))
    return cost


def _ids(mesh: LogicalMesh, axes: tuple[str, ...]) -> int | tuple[int, ...]:
    ids = tuple(mesh.axis_names.index(a) for a in axes)
    return ids[0] if len(ids) == 1 else ids
