"""alpaviz: plan, see, pin, re-solve and launch parallel JAX training from a notebook.

Example:
    >>> import alpaviz as av
    >>> train_step, params, microbatch = av.models.gpt()
    >>> plan = av.solve(train_step, params, microbatch, cluster=av.Cluster.local(), num_microbatches=4)
    >>> step = av.parallelize(train_step, plan)
"""

from alpaviz import baselines as baselines
from alpaviz import models as models

# the data model
from alpaviz.core import Cluster as Cluster
from alpaviz.core import CostModel as CostModel
from alpaviz.core import DeviceSpec as DeviceSpec
from alpaviz.core import Link as Link
from alpaviz.core import LogicalMesh as LogicalMesh
from alpaviz.core import OpGraph as OpGraph
from alpaviz.core import Pins as Pins
from alpaviz.core import Plan as Plan
from alpaviz.core import PlanFormatError as PlanFormatError
from alpaviz.core import make_spec as make_spec
from alpaviz.core import mark_layer as mark_layer

# compiling: trace, the intra-operator ILP, the inter-operator planner
from alpaviz.core import InfeasiblePinsError as InfeasiblePinsError
from alpaviz.core import ModelTooLargeError as ModelTooLargeError
from alpaviz.core import ShardingInfeasibleError as ShardingInfeasibleError
from alpaviz.core import ProfileWorkers as ProfileWorkers
from alpaviz.core import StageProfileCache as StageProfileCache
from alpaviz.core import StepStructureError as StepStructureError
from alpaviz.core import cluster_layers as cluster_layers
from alpaviz.core import resolve as resolve
from alpaviz.core import shard_step as shard_step
from alpaviz.core import solve as solve
from alpaviz.core import SolveOptions as SolveOptions
from alpaviz.core import solve_sharding_auto as solve_sharding
from alpaviz.core import trace as trace

# running
from alpaviz.core import manual_plan as manual_plan
from alpaviz.core import next_step_args as next_step_args
from alpaviz.core import parallelize as parallelize
from alpaviz.core import predicted_timeline as predicted_timeline

__version__ = "0.1.0"


def editor(*args, **kwargs):
    """Open the visual plan editor (`alpaviz.widgets.editor`); the UI stack is imported on first use."""
    from alpaviz.widgets import editor as _editor  # lazy: `import alpaviz` must not pull in the UI stack

    return _editor(*args, **kwargs)


__all__ = [
    "baselines", "Cluster", "cluster_layers", "CostModel", "DeviceSpec", "editor", "InfeasiblePinsError",
    "Link", "LogicalMesh", "make_spec", "manual_plan", "mark_layer", "models", "ModelTooLargeError",
    "next_step_args", "OpGraph", "parallelize", "Pins", "Plan", "PlanFormatError", "predicted_timeline", "ProfileWorkers",
    "resolve", "shard_step", "ShardingInfeasibleError", "solve", "SolveOptions", "solve_sharding", "StageProfileCache",
    "StepStructureError", "trace",
]
