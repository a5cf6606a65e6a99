"""Baseline plans under the planner's cost model (re-exported from `alpaviz.core._baselines`)."""

from alpaviz.core._baselines import data_parallel as data_parallel
from alpaviz.core._baselines import grid_configs as grid_configs
from alpaviz.core._baselines import grid_pins as grid_pins
from alpaviz.core._baselines import inter_op_only as inter_op_only
from alpaviz.core._baselines import intra_op_only as intra_op_only
from alpaviz.core._baselines import megatron_grid as megatron_grid

__all__ = ["data_parallel", "grid_configs", "grid_pins", "inter_op_only", "intra_op_only", "megatron_grid"]
