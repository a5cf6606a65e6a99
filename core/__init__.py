"""alpaviz.core: the compiler passes, the plan data model and the runtime.

This module only re-exports.  Each pass is one subpackage and imports only the passes below it:
graph -> cost -> plan -> intra_op -> inter_op -> runtime (tests/test_layout.py checks it).
"""

# the graph pass (bottom)
from alpaviz.core.graph import (
    mark_layer as mark_layer,
    OpGraph as OpGraph,
    OpNode as OpNode,
    TensorInfo as TensorInfo,
    trace as trace,
)
# the cost pass
from alpaviz.core.cost import (
    AXIS_NAMES as AXIS_NAMES,
    Cluster as Cluster,
    CostModel as CostModel,
    CostModelProtocol as CostModelProtocol,
    DeviceSpec as DeviceSpec,
    Link as Link,
    LogicalMesh as LogicalMesh,
)
# the plan data model
from alpaviz.core.plan import (
    data_parallel_specs as data_parallel_specs,
    graph_fingerprint as graph_fingerprint,
    Layer as Layer,
    make_spec as make_spec,
    manual_plan as manual_plan,
    megatron_specs as megatron_specs,
    Pins as Pins,
    Plan as Plan,
    PlanFormatError as PlanFormatError,
    PredictedCost as PredictedCost,
    Schedule as Schedule,
    SCHEMA_VERSION as SCHEMA_VERSION,
    shard_shape as shard_shape,
    ShardingCost as ShardingCost,
    ShardingPlan as ShardingPlan,
    SolverInfo as SolverInfo,
    Spec as Spec,
    spec_name as spec_name,
    Stage as Stage,
    StageCost as StageCost,
    to_partition_spec as to_partition_spec,
)
# the intra-operator pass
from alpaviz.core.intra_op import (
    collective_counts as collective_counts,
    shard_step as shard_step,
    ShardingInfeasibleError as ShardingInfeasibleError,
    solve_sharding as solve_sharding,
    solve_sharding_auto as solve_sharding_auto,
    strategy_names as strategy_names,
)
# the inter-operator pass
from alpaviz.core.inter_op import (
    analytic_stage_cost as analytic_stage_cost,
    cluster_layers as cluster_layers,
    InfeasiblePinsError as InfeasiblePinsError,
    ModelTooLargeError as ModelTooLargeError,
    resolve as resolve,
    solve as solve,
    StageCostFn as StageCostFn,
    StageProfileCache as StageProfileCache,
)
# the runtime (top)
from alpaviz.core.runtime import (
    build_instructions as build_instructions,
    Instruction as Instruction,
    parallelize as parallelize,
    ParallelStep as ParallelStep,
    predicted_timeline as predicted_timeline,
    StageError as StageError,
    Timeline as Timeline,
    TimelineEvent as TimelineEvent,
)

__all__ = [
    "analytic_stage_cost",
    "AXIS_NAMES",
    "build_instructions",
    "Cluster",
    "cluster_layers",
    "collective_counts",
    "CostModel",
    "CostModelProtocol",
    "data_parallel_specs",
    "DeviceSpec",
    "graph_fingerprint",
    "InfeasiblePinsError",
    "Instruction",
    "Layer",
    "Link",
    "LogicalMesh",
    "make_spec",
    "manual_plan",
    "mark_layer",
    "megatron_specs",
    "ModelTooLargeError",
    "OpGraph",
    "OpNode",
    "parallelize",
    "ParallelStep",
    "Pins",
    "Plan",
    "PlanFormatError",
    "predicted_timeline",
    "PredictedCost",
    "resolve",
    "Schedule",
    "SCHEMA_VERSION",
    "shard_shape",
    "shard_step",
    "ShardingCost",
    "ShardingInfeasibleError",
    "ShardingPlan",
    "solve",
    "solve_sharding",
    "solve_sharding_auto",
    "SolverInfo",
    "Spec",
    "spec_name",
    "Stage",
    "StageCost",
    "StageCostFn",
    "StageError",
    "StageProfileCache",
    "strategy_names",
    "TensorInfo",
    "Timeline",
    "TimelineEvent",
    "to_partition_spec",
    "trace",
]
