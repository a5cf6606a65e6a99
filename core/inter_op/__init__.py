"""The inter-operator pass: layers, stage profiles and the stage DP that slices them onto submeshes.

This module only re-exports: the names other passes and users may rely on.
"""

from alpaviz.core.inter_op._layer_clustering import cluster_layers as cluster_layers
from alpaviz.core.inter_op._stage_cost import StageCostFn as StageCostFn
from alpaviz.core.inter_op._stage_cost import analytic_stage_cost as analytic_stage_cost
from alpaviz.core.inter_op._profile_cache import StageProfileCache as StageProfileCache
from alpaviz.core.inter_op._profile_workers import ProfileWorkers as ProfileWorkers
from alpaviz.core.plan import InfeasiblePinsError as InfeasiblePinsError
from alpaviz.core.inter_op._infeasible import ModelTooLargeError as ModelTooLargeError
from alpaviz.core.inter_op._options import SolveOptions as SolveOptions
from alpaviz.core.inter_op._prepare import prefetch as prefetch
from alpaviz.core.inter_op._solve import resolve as resolve
from alpaviz.core.inter_op._solve import solve as solve
from alpaviz.core.inter_op._baselines import data_parallel as data_parallel
from alpaviz.core.inter_op._baselines import grid_configs as grid_configs
from alpaviz.core.inter_op._baselines import grid_pins as grid_pins
from alpaviz.core.inter_op._baselines import inter_op_only as inter_op_only
from alpaviz.core.inter_op._baselines import intra_op_only as intra_op_only
from alpaviz.core.inter_op._baselines import megatron_grid as megatron_grid

__all__ = [
    "analytic_stage_cost",
    "cluster_layers",
    "data_parallel",
    "grid_configs",
    "grid_pins",
    "InfeasiblePinsError",
    "inter_op_only",
    "intra_op_only",
    "megatron_grid",
    "ModelTooLargeError",
    "prefetch",
    "ProfileWorkers",
    "resolve",
    "solve",
    "SolveOptions",
    "StageCostFn",
    "StageProfileCache",
]
