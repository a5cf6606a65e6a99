"""Baseline plans under the planner's cost model (re-exported from `alpaviz.core.inter_op._baselines`)."""

from alpaviz.core.inter_op import data_parallel as data_parallel
from alpaviz.core.inter_op import grid_configs as grid_configs
from alpaviz.core.inter_op import grid_pins as grid_pins
from alpaviz.core.inter_op import inter_op_only as inter_op_only
from alpaviz.core.inter_op import intra_op_only as intra_op_only
from alpaviz.core.inter_op import megatron_grid as megatron_grid

__all__ = ["data_parallel", "grid_configs", "grid_pins", "inter_op_only", "intra_op_only", "megatron_grid"]
