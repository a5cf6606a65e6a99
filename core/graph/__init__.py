"""The graph pass: trace a training step into an operator graph (FLOPs, bytes, roles, layers).

This module only re-exports: the names other passes and users may rely on.
"""

from alpaviz.core.graph._checks import check_int as check_int
from alpaviz.core.graph._checks import check_number as check_number
from alpaviz.core.graph._op_graph import OpGraph as OpGraph
from alpaviz.core.graph._op_graph import OpNode as OpNode
from alpaviz.core.graph._op_graph import Role as Role
from alpaviz.core.graph._op_graph import TensorInfo as TensorInfo
from alpaviz.core.graph._op_graph import dtype_itemsize as dtype_itemsize
from alpaviz.core.graph._op_graph import dtype_name as dtype_name
from alpaviz.core.graph._op_graph import is_float_dtype as is_float_dtype
from alpaviz.core.graph._step_structure import StepStructureError as StepStructureError
from alpaviz.core.graph._step_structure import gradient_producers as gradient_producers
from alpaviz.core.graph._step_structure import next_step_args as next_step_args
from alpaviz.core.graph._step_structure import state_inputs as state_inputs
from alpaviz.core.graph._step_structure import tensors_depending_on as tensors_depending_on
from alpaviz.core.graph._trace import trace as trace
from alpaviz.core.graph._markers import mark_layer as mark_layer
from alpaviz.core.graph._flops import DATA_MOVEMENT as DATA_MOVEMENT
from alpaviz.core.graph._flops import ELEMENTWISE as ELEMENTWISE
from alpaviz.core.graph._flops import REDUCTIONS as REDUCTIONS
from alpaviz.core.graph._flops import primitive_flops as primitive_flops
from alpaviz.core.graph._interpret import as_function as as_function
from alpaviz.core.graph._interpret import evaluate as evaluate
from alpaviz.core.graph._interpret import step_outputs as step_outputs
from alpaviz.core.graph._layers import assign_backward_layers as assign_backward_layers
from alpaviz.core.graph._gradient_split import input_gradient_nodes as input_gradient_nodes
from alpaviz.core.graph._gradient_split import weight_gradient_nodes as weight_gradient_nodes
from alpaviz.core.graph._layers import constant_only_nodes as constant_only_nodes
from alpaviz.core.graph._layers import cut_bytes as cut_bytes
from alpaviz.core.graph._layers import step_transfer_bytes as step_transfer_bytes
from alpaviz.core.graph._layers import follow_dataflow as follow_dataflow
from alpaviz.core.graph._residuals import RECOMPUTABLE as RECOMPUTABLE
from alpaviz.core.graph._residuals import recompute_chain as recompute_chain
from alpaviz.core.graph._residuals import stored_residuals as stored_residuals
from alpaviz.core.graph._microbatch import microbatch_args as microbatch_args
from alpaviz.core.graph._microbatch_combine import MicrobatchCombination as MicrobatchCombination
from alpaviz.core.graph._microbatch_combine import PartialSums as PartialSums
from alpaviz.core.graph._microbatch_combine import batch_shaped_draws as batch_shaped_draws
from alpaviz.core.graph._microbatch_combine import combine_microbatches as combine_microbatches
from alpaviz.core.graph._scope import user_scope as user_scope
from alpaviz.core.graph._static_leaves import check_same_static as check_same_static
from alpaviz.core.graph._static_leaves import dynamic_leaves as dynamic_leaves
from alpaviz.core.graph._static_leaves import is_static_leaf as is_static_leaf
from alpaviz.core.graph._static_leaves import split_static as split_static
from alpaviz.core.graph._microbatch import split_microbatch as split_microbatch

__all__ = [
    "batch_shaped_draws",
    "check_int",
    "combine_microbatches",
    "MicrobatchCombination",
    "PartialSums",
    "user_scope",
    "check_same_static",
    "dynamic_leaves",
    "is_static_leaf",
    "split_static",
    "check_number",
    "as_function",
    "assign_backward_layers",
    "constant_only_nodes",
    "cut_bytes",
    "gradient_producers",
    "step_transfer_bytes",
    "DATA_MOVEMENT",
    "dtype_itemsize",
    "dtype_name",
    "ELEMENTWISE",
    "evaluate",
    "follow_dataflow",
    "is_float_dtype",
    "mark_layer",
    "next_step_args",
    "microbatch_args",
    "OpGraph",
    "OpNode",
    "primitive_flops",
    "REDUCTIONS",
    "Role",
    "input_gradient_nodes",
    "weight_gradient_nodes",
    "split_microbatch",
    "step_outputs",
    "StepStructureError",
    "TensorInfo",
    "recompute_chain",
    "RECOMPUTABLE",
    "state_inputs",
    "stored_residuals",
    "tensors_depending_on",
    "trace",
]
