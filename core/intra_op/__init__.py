"""The intra-operator pass: one sharding strategy per operator on a logical mesh, chosen by an ILP.

This module only re-exports: the names other passes and users may rely on.
"""

from alpaviz.core.intra_op._strategies import check_plan_strategies as check_plan_strategies
from alpaviz.core.intra_op._strategies import Strategy as Strategy
from alpaviz.core.intra_op._strategies import enumerate_strategies as enumerate_strategies
from alpaviz.core.intra_op._strategies import strategy_names as strategy_names
from alpaviz.core.intra_op._strategies import validate_plan as validate_plan
from alpaviz.core.intra_op._solve_sharding import ShardingInfeasibleError as ShardingInfeasibleError
from alpaviz.core.intra_op._solve_sharding import collective_counts as collective_counts
from alpaviz.core.intra_op._solve_sharding import solve_sharding as solve_sharding
from alpaviz.core.intra_op._solve_sharding import solve_sharding_auto as solve_sharding_auto
from alpaviz.core.intra_op._apply_sharding import shard_step as shard_step

__all__ = [
    "check_plan_strategies",
    "collective_counts",
    "enumerate_strategies",
    "shard_step",
    "ShardingInfeasibleError",
    "solve_sharding",
    "solve_sharding_auto",
    "Strategy",
    "strategy_names",
    "validate_plan",
]
