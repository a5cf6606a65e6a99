"""alpaviz.core: the compiler passes, the plan data model and the runtime.

This module only re-exports; each concept lives in one private module.
"""

# data model
from alpaviz.core._cluster import AXIS_NAMES as AXIS_NAMES
from alpaviz.core._cluster import Cluster as Cluster
from alpaviz.core._cluster import DeviceSpec as DeviceSpec
from alpaviz.core._cluster import Link as Link
from alpaviz.core._cluster import LogicalMesh as LogicalMesh
from alpaviz.core._cost_model import CostModel as CostModel
from alpaviz.core._cost_model import CostModelProtocol as CostModelProtocol
from alpaviz.core._graph import OpGraph as OpGraph
from alpaviz.core._graph import OpNode as OpNode
from alpaviz.core._graph import TensorInfo as TensorInfo
from alpaviz.core._markers import mark_layer as mark_layer
from alpaviz.core._pins import Pins as Pins
from alpaviz.core._plan import graph_fingerprint as graph_fingerprint
from alpaviz.core._plan import Layer as Layer
from alpaviz.core._plan import Plan as Plan
from alpaviz.core._plan import PredictedCost as PredictedCost
from alpaviz.core._plan import Schedule as Schedule
from alpaviz.core._plan import SCHEMA_VERSION as SCHEMA_VERSION
from alpaviz.core._plan import SolverInfo as SolverInfo
from alpaviz.core._plan import Stage as Stage
from alpaviz.core._plan import StageCost as StageCost
from alpaviz.core._serde import PlanFormatError as PlanFormatError
from alpaviz.core._sharding_plan import ShardingCost as ShardingCost
from alpaviz.core._sharding_plan import ShardingPlan as ShardingPlan
from alpaviz.core._spec import make_spec as make_spec
from alpaviz.core._spec import shard_shape as shard_shape
from alpaviz.core._spec import Spec as Spec
from alpaviz.core._spec import spec_name as spec_name
from alpaviz.core._spec import to_partition_spec as to_partition_spec
from alpaviz.core._timeline import Timeline as Timeline
from alpaviz.core._timeline import TimelineEvent as TimelineEvent

# tracing
from alpaviz.core._trace import trace as trace

# intra-operator pass
from alpaviz.core._strategies import strategy_names as strategy_names
from alpaviz.core._intra_op import collective_counts as collective_counts
from alpaviz.core._intra_op import ShardingInfeasibleError as ShardingInfeasibleError
from alpaviz.core._intra_op import solve_sharding as solve_sharding
from alpaviz.core._intra_op import solve_sharding_auto as solve_sharding_auto
from alpaviz.core._apply_sharding import shard_step as shard_step

# inter-operator pass and planning
from alpaviz.core._layer_clustering import cluster_layers as cluster_layers
from alpaviz.core._analytic_cost import analytic_stage_cost as analytic_stage_cost
from alpaviz.core._analytic_cost import StageCostFn as StageCostFn
from alpaviz.core._stage_profile import StageProfileCache as StageProfileCache
from alpaviz.core._solve import InfeasiblePinsError as InfeasiblePinsError
from alpaviz.core._solve import ModelTooLargeError as ModelTooLargeError
from alpaviz.core._solve import resolve as resolve
from alpaviz.core._solve import solve as solve

# runtime
from alpaviz.core._manual_plan import data_parallel_specs as data_parallel_specs
from alpaviz.core._manual_plan import manual_plan as manual_plan
from alpaviz.core._manual_plan import megatron_specs as megatron_specs
from alpaviz.core._schedule import build_instructions as build_instructions
from alpaviz.core._schedule import Instruction as Instruction
from alpaviz.core._schedule import predicted_timeline as predicted_timeline
from alpaviz.core._runtime import parallelize as parallelize
from alpaviz.core._runtime import ParallelStep as ParallelStep
from alpaviz.core._stage_runner import StageError as StageError

__all__ = [
    "analytic_stage_cost", "AXIS_NAMES", "build_instructions", "Cluster", "cluster_layers",
    "collective_counts", "CostModel", "CostModelProtocol", "data_parallel_specs", "DeviceSpec",
    "graph_fingerprint", "InfeasiblePinsError", "Instruction", "Layer", "Link", "LogicalMesh",
    "make_spec", "manual_plan", "mark_layer", "megatron_specs", "ModelTooLargeError", "OpGraph",
    "OpNode", "parallelize", "ParallelStep", "Pins", "Plan", "PlanFormatError",
    "predicted_timeline", "PredictedCost", "resolve", "Schedule", "SCHEMA_VERSION", "shard_shape",
    "shard_step", "ShardingCost", "ShardingInfeasibleError", "ShardingPlan", "solve",
    "solve_sharding", "solve_sharding_auto", "SolverInfo", "Spec", "spec_name", "Stage",
    "StageCost", "StageCostFn", "StageError", "StageProfileCache", "strategy_names", "TensorInfo",
    "Timeline", "TimelineEvent", "to_partition_spec", "trace",
]
