"""The runtime: run a plan's stages on their meshes with microbatches, a pipeline schedule and transfers.

This module only re-exports: the names other passes and users may rely on.
"""

from alpaviz.core.runtime._timeline import Timeline as Timeline
from alpaviz.core.runtime._timeline import TimelineEvent as TimelineEvent
from alpaviz.core.runtime._schedule import Instruction as Instruction
from alpaviz.core.runtime._schedule import build_instructions as build_instructions
from alpaviz.core.runtime._predict import predicted_timeline as predicted_timeline
from alpaviz.core.runtime._stage_runner import StageError as StageError
from alpaviz.core.runtime._compiled_memory import CompiledMemory as CompiledMemory
from alpaviz.core.runtime._compiled_memory import compiled_stage_memory as compiled_stage_memory
from alpaviz.core.runtime._parallelize import ParallelStep as ParallelStep
from alpaviz.core.runtime._parallelize import parallelize as parallelize

__all__ = [
    "build_instructions",
    "CompiledMemory",
    "compiled_stage_memory",
    "Instruction",
    "parallelize",
    "ParallelStep",
    "predicted_timeline",
    "StageError",
    "Timeline",
    "TimelineEvent",
]
