"""The result of the intra-operator pass for one stage on one logical mesh."""

from __future__ import annotations

import dataclasses
from typing import Mapping

from alpaviz.core.plan._memory import MemoryBreakdown
from alpaviz.core.plan._plan import SolverStatus
from alpaviz.core.plan._spec import Spec


@dataclasses.dataclass(frozen=True)
class ShardingCost:
    """Predicted per-microbatch times by role and category, and per-device memory.

    `memory_bytes` is the peak with one microbatch in flight (`memory.peak`);
    `activation_bytes` what one microbatch keeps for its backward pass.
    `update_s` and `compute_s` include the update's work, and `update_s` and
    `communication_s` the reductions paid once per step (`step_communication_s`:
    data parallelism's gradient all-reduces), so the step's breakdown can
    count the rest once per microbatch and these once.
    """

    compute_s: float
    communication_s: float
    resharding_s: float
    forward_s: float
    backward_s: float
    update_s: float
    memory_bytes: float
    activation_bytes: float
    memory: MemoryBreakdown = MemoryBreakdown()
    step_communication_s: float = 0.0
    weight_grad_s: float = 0.0  # the part of `backward_s` that only computes weight gradients (zero-bubble's W)

    @property
    def total_s(self) -> float:
        """Compute, communication and resharding seconds added up."""
        return self.compute_s + self.communication_s + self.resharding_s


@dataclasses.dataclass(frozen=True)
class ShardingPlan:
    """One strategy per operator and a spec per tensor, with the ILP's objective and status."""

    mesh_shape: tuple[int, int]
    strategies: tuple[tuple[str, str], ...]
    partition_specs: tuple[tuple[str, Spec], ...]
    objective: float
    cost: ShardingCost
    status: SolverStatus
    seconds: float
    num_variables: int = 0
    notes: tuple[str, ...] = ()
    # (operator, operand tensor, seconds per microbatch) for each operand the operator's strategy reshards
    resharding_edges: tuple[tuple[str, str, float], ...] = ()

    @property
    def strategy_map(self) -> Mapping[str, str]:
        """The chosen strategies as a dict, operator name to strategy name."""
        return dict(self.strategies)

    @property
    def spec_map(self) -> Mapping[str, Spec]:
        """The chosen partition specs as a dict, tensor name to spec."""
        return dict(self.partition_specs)

    @property
    def cost_breakdown(self) -> Mapping[str, float]:
        """The cost's parts by name (compute, communication, resharding, total), for tables and views."""
        return {
            "compute_s": self.cost.compute_s,
            "communication_s": self.cost.communication_s,
            "resharding_s": self.cost.resharding_s,
        }
