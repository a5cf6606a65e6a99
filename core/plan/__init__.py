"""The plan data model: frozen, JSON-serialisable plans, pins and partition specs that every pass shares.

This module only re-exports: the names other passes and users may rely on.
"""

from alpaviz.core.plan._spec import Spec as Spec
from alpaviz.core.plan._spec import check_spec as check_spec
from alpaviz.core.plan._spec import from_partition_spec as from_partition_spec
from alpaviz.core.plan._spec import make_spec as make_spec
from alpaviz.core.plan._spec import replicated as replicated
from alpaviz.core.plan._spec import shard_shape as shard_shape
from alpaviz.core.plan._spec import spec_name as spec_name
from alpaviz.core.plan._spec import to_partition_spec as to_partition_spec
from alpaviz.core.plan._serde import MAX_DOCUMENT_BYTES as MAX_DOCUMENT_BYTES
from alpaviz.core.plan._serde import PlanFormatError as PlanFormatError
from alpaviz.core.plan._pins import InfeasiblePinsError as InfeasiblePinsError
from alpaviz.core.plan._pins import Pins as Pins
from alpaviz.core.plan._pins import minimal_conflict as minimal_conflict
from alpaviz.core.plan._pin_check import check_pin_names as check_pin_names
from alpaviz.core.plan._pin_check import check_pins as check_pins
from alpaviz.core.plan._memory import MemoryBreakdown as MemoryBreakdown
from alpaviz.core.plan._plan import Layer as Layer
from alpaviz.core.plan._plan import Plan as Plan
from alpaviz.core.plan._plan import PredictedCost as PredictedCost
from alpaviz.core.plan._plan import SCHEMA_VERSION as SCHEMA_VERSION
from alpaviz.core.plan._plan import Schedule as Schedule
from alpaviz.core.plan._plan import ScheduleKind as ScheduleKind
from alpaviz.core.plan._plan import SolverInfo as SolverInfo
from alpaviz.core.plan._plan import SolverStatus as SolverStatus
from alpaviz.core.plan._plan import Stage as Stage
from alpaviz.core.plan._plan import StageCost as StageCost
from alpaviz.core.plan._plan import format_bytes as format_bytes
from alpaviz.core.plan._plan import graph_fingerprint as graph_fingerprint
from alpaviz.core.plan._sharding_plan import ShardingCost as ShardingCost
from alpaviz.core.plan._sharding_plan import ShardingPlan as ShardingPlan
from alpaviz.core.plan._manual_plan import UNKNOWN_COSTS_NOTE as UNKNOWN_COSTS_NOTE
from alpaviz.core.plan._manual_plan import data_parallel_specs as data_parallel_specs
from alpaviz.core.plan._manual_plan import manual_plan as manual_plan
from alpaviz.core.plan._manual_plan import megatron_specs as megatron_specs
from alpaviz.core.plan._timeline import Timeline as Timeline
from alpaviz.core.plan._timeline import TimelineEvent as TimelineEvent
from alpaviz.core.plan._instructions import Instruction as Instruction
from alpaviz.core.plan._instructions import build_instructions as build_instructions
from alpaviz.core.plan._simulate import predicted_timeline as predicted_timeline
from alpaviz.core.plan._dataflow import Dataflow as Dataflow
from alpaviz.core.plan._dataflow import TensorEdge as TensorEdge
from alpaviz.core.plan._dataflow import analyze as analyze
from alpaviz.core.plan._instructions import ONCE as ONCE
from alpaviz.core.plan._instructions import SCHEDULE_KINDS as SCHEDULE_KINDS
from alpaviz.core.plan._instructions import WEIGHT_GRAD as WEIGHT_GRAD
from alpaviz.core.plan._instructions import INTERLEAVED as INTERLEAVED
from alpaviz.core.plan._instructions import mesh_order as mesh_order
from alpaviz.core.plan._instructions import max_live_microbatches as max_live_microbatches
from alpaviz.core.plan._instructions import Program as Program
from alpaviz.core.plan._instructions import fusable_runs as fusable_runs
from alpaviz.core.plan._instructions import interleave as interleave
from alpaviz.core.plan._instructions import is_update as is_update
from alpaviz.core.plan._instructions import timeline_kind as timeline_kind

__all__ = [
    "Dataflow",
    "TensorEdge",
    "analyze",
    "ONCE",
    "Program",
    "fusable_runs",
    "interleave",
    "is_update",
    "timeline_kind",
    "build_instructions",
    "Instruction",
    "predicted_timeline",
    "Timeline",
    "TimelineEvent",
    "MAX_DOCUMENT_BYTES",
    "check_pin_names",
    "check_pins",
    "check_spec",
    "data_parallel_specs",
    "format_bytes",
    "from_partition_spec",
    "graph_fingerprint",
    "InfeasiblePinsError",
    "Layer",
    "make_spec",
    "manual_plan",
    "megatron_specs",
    "minimal_conflict",
    "MemoryBreakdown",
    "Pins",
    "Plan",
    "PlanFormatError",
    "PredictedCost",
    "replicated",
    "Schedule",
    "ScheduleKind",
    "WEIGHT_GRAD",
    "INTERLEAVED",
    "mesh_order",
    "max_live_microbatches",
    "SCHEDULE_KINDS",
    "SCHEMA_VERSION",
    "shard_shape",
    "ShardingCost",
    "ShardingPlan",
    "SolverInfo",
    "SolverStatus",
    "Spec",
    "spec_name",
    "Stage",
    "StageCost",
    "to_partition_spec",
    "UNKNOWN_COSTS_NOTE",
]
