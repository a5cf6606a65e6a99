"""The runtime: run a plan's stages on their meshes with microbatches, a pipeline schedule and transfers.

This module only re-exports: the names other passes and users may rely on.
"""

from alpaviz.core.runtime._stage_runner import StageError as StageError
from alpaviz.core.runtime._compiled_memory import CompiledMemory as CompiledMemory
from alpaviz.core.runtime._compiled_memory import compiled_stage_memory as compiled_stage_memory
from alpaviz.core.runtime._parallelize import ParallelStep as ParallelStep
from alpaviz.core.runtime._parallelize import parallelize as parallelize

__all__ = [
    "CompiledMemory",
    "compiled_stage_memory",
    "parallelize",
    "ParallelStep",
    "StageError",
]
